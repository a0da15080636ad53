//! The README's "your own data in five steps" and the tutorial (`docs/tutorial.md`), run as the
//! newcomer runs them: in an empty folder, with `tidemark` on the PATH and the real clock. Each
//! YAML block whose first line is `# <path>` is written to that file; each `sh` block runs in
//! bash (`-euo pipefail`), so every command must succeed; each `text` block after a `sh` block
//! shows lines of its output, whose labels (the words before the value) must be in it.

use std::path::{Path, PathBuf};

use crate::readme::blocks;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README's section `## Your own data in five steps`, up to the next `## `.
fn five_steps() -> String {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let start = text
        .find("## Your own data in five steps")
        .expect("the five steps section");
    let rest = &text[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// Runs one `sh` block in `dir`; returns stdout and stderr together.
fn run_sh(dir: &Path, script: &str) -> String {
    let bin = assert_cmd::cargo::cargo_bin("tidemark");
    let bin_dir = bin.parent().expect("binary's folder");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .env_remove("TIDEMARK_FAKE_NOW")
        .env_remove("TIDEMARK_FAILPOINTS")
        .env_remove("RUST_LOG")
        .output()
        .expect("bash");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "this block failed ({}):\n{script}\nit printed:\n{printed}",
        out.status
    );
    printed
}

/// What must be in the output for a shown line: the line up to a `…` (where the docs leave out
/// what changes from run to run: run ids, times), with runs of spaces as one.
fn shown(line: &str) -> Option<String> {
    let line = line.split('…').next()?;
    let words = line.split_whitespace().collect::<Vec<_>>().join(" ");
    (words.len() > 3 && !words.contains('│') && !words.contains('─')).then_some(words)
}

fn squeeze(text: &str) -> String {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn walk(dir: &Path, text: &str) -> usize {
    let mut last_output: Option<String> = None;
    let mut steps = 0;
    for (info, body) in blocks(text) {
        match info.as_str() {
            "yaml" => {
                let Some(file) = body.lines().next().and_then(|l| l.strip_prefix("# ")) else {
                    continue;
                };
                let path = dir.join(file.trim());
                std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
                std::fs::write(&path, &body).expect("write the block's file");
                steps += 1;
            }
            "sh" => {
                last_output = Some(run_sh(dir, &body));
                steps += 1;
            }
            "text" => {
                let Some(printed) = &last_output else {
                    continue;
                };
                let squeezed = squeeze(printed);
                for shown in body.lines().filter_map(shown) {
                    assert!(
                        squeezed.contains(&shown),
                        "the docs show `{shown}` after a command; it printed:\n{printed}"
                    );
                }
            }
            _ => {}
        }
    }
    steps
}

#[test]
fn the_readme_five_steps_and_the_tutorial_run_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = walk(dir.path(), &five_steps());
    assert!(steps >= 5, "only {steps} steps in the README's five steps");
    assert!(
        dir.path()
            .join("lake/gold/daily_payments/_delta_log")
            .is_dir(),
        "the five steps build gold"
    );
    let tutorial = std::fs::read_to_string(root().join("docs/tutorial.md")).expect("tutorial");
    let steps = walk(dir.path(), &tutorial);
    assert!(steps >= 8, "only {steps} steps in the tutorial");
    assert!(
        dir.path().join("lake/_tidemark/runs/_delta_log").is_dir(),
        "the tutorial's job wrote the run ledger"
    );
}

#[test]
fn the_debezium_walkthrough_runs_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = std::fs::read_to_string(root().join("docs/debezium.md")).expect("debezium.md");
    let steps = walk(dir.path(), &page);
    assert!(steps >= 6, "only {steps} steps in the Debezium walkthrough");
    assert!(
        dir.path()
            .join("lake/gold/daily_payments/_delta_log")
            .is_dir(),
        "the walkthrough builds gold"
    );
}

#[test]
fn the_windows_walkthrough_runs_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = std::fs::read_to_string(root().join("docs/windows.md")).expect("windows.md");
    let steps = walk(dir.path(), &page);
    assert!(steps >= 8, "only {steps} steps in the windows walkthrough");
    for gold in ["lake/gold/minutes", "lake/gold/hourly"] {
        assert!(
            dir.path().join(gold).join("_delta_log").is_dir(),
            "the walkthrough builds {gold}"
        );
    }
}
