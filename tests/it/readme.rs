//! The README's and the book's (`docs/`) examples, checked so they cannot go stale: every
//! `tidemark …` command line in their shell, systemd and Kubernetes examples parses with today's
//! CLI; each kind's reference loads, runs, and names every key the config types accept; the
//! `bundle validate` transcript is what the binary prints; every field of the run-summary table
//! is in a real run's JSON summary; every path of the layout exists; every link resolves and
//! every page is in the book's table of contents. The README's five steps and the tutorial run
//! as a script (`docs_walkthrough.rs`).

use crate::common;

use std::path::{Path, PathBuf};

use clap::Parser;
use common::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// A page of the book, by its path under `docs/`.
fn page(path: &str) -> String {
    let path = root().join("docs").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README and every Markdown page under `docs/`: (path, text).
pub(crate) fn all_pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("page");
            (p, text)
        })
        .collect()
}

/// The fenced blocks of the README: (info string, body).
pub(crate) fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => current = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// A command line as a shell would split it (no quoting is used in the README's examples).
fn words(line: &str) -> Vec<String> {
    let line = line.split(" #").next().unwrap_or(line);
    line.split_whitespace().map(str::to_string).collect()
}

fn parses(args: &[String]) {
    if let Err(e) = tidemark::cli::Cli::try_parse_from(args) {
        panic!("README example `{}` does not parse: {e}", args.join(" "));
    }
}

#[test]
fn every_command_line_in_the_readme_and_the_book_parses() {
    let mut checked = 0;
    let pages = all_pages();
    for (info, body) in pages.iter().flat_map(|(_, text)| blocks(text)) {
        for line in body.lines() {
            let line = line.trim();
            if info == "sh" && line.starts_with("tidemark ") {
                parses(&words(line));
                checked += 1;
            } else if info == "sh" && line.starts_with("cargo run -- ") {
                let mut args = vec!["tidemark".to_string()];
                args.extend(words(line.trim_start_matches("cargo run -- ")));
                parses(&args);
                checked += 1;
            } else if info == "sh" && line.starts_with("scripts/") {
                let script = words(line)[0].clone();
                assert!(root().join(&script).is_file(), "README names {script}");
                checked += 1;
            } else if let Some(rest) = line.strip_prefix("ExecStart=") {
                let mut args = words(rest);
                args[0] = "tidemark".into();
                parses(&args);
                checked += 1;
            } else if let Some(list) = line.strip_prefix("args: ") {
                let args: Vec<String> = serde_json::from_str(list).expect("args list");
                parses(&[vec!["tidemark".to_string()], args].concat());
                checked += 1;
            } else if let Some(cmd) = line.strip_prefix("$ tidemark ") {
                parses(&words(&format!("tidemark {cmd}")));
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 40,
        "only {checked} command lines found in the docs"
    );
}

#[test]
fn the_pipeline_reference_loads() {
    let text = page("kinds/cdc_merge.md");
    let (_, yaml) = blocks(&text)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.contains("kind: cdc_merge"))
        .expect("the pipeline reference block");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("payments.yml");
    std::fs::write(&path, &yaml).expect("write");
    let mut vars = tidemark::config::Vars::new();
    vars.set("lake", &dir.path().join("lake").display().to_string());
    if let Err(e) = tidemark::config::Pipeline::load(&path, &vars) {
        panic!("the README's pipeline reference does not load: {e}\n{yaml}");
    }
}

#[test]
fn the_bundle_validate_transcript_is_what_the_binary_prints() {
    let text = page("bundle.md");
    let lines: Vec<&str> = text.lines().collect();
    let mut checked = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(cmd) = line.strip_prefix("$ tidemark bundle validate") else {
            continue;
        };
        let args: Vec<String> = words(cmd);
        let out = exec(
            assert_cmd::Command::cargo_bin("tidemark")
                .expect("binary")
                .current_dir(root())
                .env("NO_COLOR", "1")
                .args(["bundle", "validate"])
                .args(&args),
        );
        let printed = format!("{}{}", out.stdout, out.stderr);
        for expected in lines[i + 1..]
            .iter()
            .take_while(|l| !l.starts_with('$') && !l.starts_with("```"))
        {
            let expected = expected.trim_start_matches('…');
            assert!(
                printed.lines().any(|l| l.ends_with(expected)),
                "README says `{expected}` after `$ tidemark bundle validate{cmd}`; the binary printed:\n{printed}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} transcript lines found");
}

#[test]
fn the_layout_names_real_paths() {
    let text = page("contributing.md");
    let (_, layout) = blocks(&text)
        .into_iter()
        .find(|(_, body)| body.starts_with("src/main.rs"))
        .expect("the layout block");
    for word in layout.split_whitespace() {
        let word = word.trim_end_matches([',', '.', ';']);
        if word.starts_with("src/") || word.starts_with("tests/") {
            assert!(
                root().join(word).exists(),
                "the README's layout names {word}, which does not exist"
            );
        }
    }
}

/// The first column of the run-summary table: every field a person may look for.
fn summary_fields(text: &str) -> Vec<String> {
    let start = text
        .find("## The run summary")
        .expect("run summary section");
    let mut fields = Vec::new();
    for line in text[start..].lines().skip(1) {
        if line.starts_with('#') {
            break;
        }
        let Some(first) = line.strip_prefix("| ").and_then(|l| l.split(" |").next()) else {
            continue;
        };
        for part in first.split(", ") {
            if let Some(name) = part
                .trim()
                .strip_prefix('`')
                .and_then(|p| p.strip_suffix('`'))
            {
                fields.push(name.to_string());
            }
        }
    }
    fields
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_the_run_summary_table_is_in_the_json_summary() {
    let fields = summary_fields(&page("run.md"));
    assert!(fields.len() >= 20, "{fields:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "15m", "soft", "");
    append(&bronze(dir.path()), &[Change::upsert("a", T0, T0, 1)]).await;
    let out = exec(
        assert_cmd::Command::cargo_bin("tidemark")
            .expect("binary")
            .current_dir(dir.path())
            .env("TIDEMARK_FAKE_NOW", rfc3339(T0 + HOUR))
            .args(["run"])
            .arg(Path::new(&pipeline))
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    for f in &fields {
        assert!(
            summary.get(f).is_some(),
            "the README's run-summary table lists `{f}`, which the JSON summary lacks: {summary}"
        );
    }
}

#[test]
fn the_ingest_reference_loads_and_runs_and_names_real_summary_fields() {
    let text = page("kinds/ingest.md");
    let (_, yaml) = blocks(&text)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.contains("kind: ingest"))
        .expect("the ingest reference block");
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("payments_events.yml");
    std::fs::write(&path, &yaml).expect("write");
    let events = lake.join("landing/payments/events");
    std::fs::create_dir_all(&events).expect("landing");
    std::fs::write(
        events.join("2025-01-06T10.jsonl"),
        "{\"payment_id\":\"p1\",\"amount_cents\":5,\"amount\":0.10,\"updated_at\":\"2025-01-06T10:00:00Z\"}\n",
    )
    .expect("land");
    let out = exec(tidemark_at(T0).arg("run").arg(&path).args([
        "--var",
        &format!("lake={}", lake.display()),
        "--output",
        "json",
    ]));
    assert_eq!(
        out.code, 0,
        "the README's ingest reference does not run: {}",
        out.stderr
    );
    let summary: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(summary["num_rows_written"], 1);
    let start = text
        .find("- Summary (`--output json`)")
        .expect("the ingest summary bullet");
    let bullet = &text[start..start + text[start..].find("\n- ").unwrap_or(400)];
    let mut named = 0;
    for (i, part) in bullet.split('`').enumerate() {
        if i % 2 == 1
            && (part.starts_with("num_") || part == "ingested_at" || part == "columns_added")
        {
            assert!(
                summary.get(part).is_some(),
                "the README names `{part}`, not in the summary: {summary}"
            );
            named += 1;
        }
    }
    assert!(named >= 9, "only {named} summary fields named");
}

#[test]
fn the_aggregate_reference_loads_and_runs_and_names_real_summary_fields() {
    let text = page("kinds/aggregate.md");
    let (_, yaml) = blocks(&text)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.contains("kind: aggregate"))
        .expect("the aggregate reference block");
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("daily_payments.yml");
    std::fs::write(&path, &yaml).expect("write");
    // A silver payments table, as the merge writes it: the chain's own pipeline builds it.
    let merge = root().join("pipelines/payments.yml");
    let bronze = lake.join("bronze/payments_raw");
    let out = exec(
        tidemark_at(T0)
            .args(["generate", "--payments", "500", "--days", "5", "--out"])
            .arg(&bronze),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let var = format!("lake={}", lake.display());
    let out = exec(tidemark_at(T0).arg("run").arg(&merge).args(["--var", &var]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = exec(tidemark_at(T0).arg("run").arg(&path).args([
        "--var",
        &var,
        "--logical-date",
        "2024-01-05",
        "--output",
        "json",
    ]));
    assert_eq!(
        out.code, 0,
        "the README's aggregate reference does not run: {}",
        out.stderr
    );
    let summary: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert!(
        summary["num_rows_written"].as_u64().unwrap_or(0) > 0,
        "{summary}"
    );
    let start = text
        .find("the summary (`--output json`) has the same counts plus")
        .expect("the aggregate summary sentence");
    let sentence = &text[start..start + text[start..].find(". ").unwrap_or(600)];
    let mut named = 0;
    for (i, part) in sentence.split('`').enumerate() {
        if i % 2 == 1 && (part.starts_with("num_") || part.ends_with("_version")) {
            assert!(
                summary.get(part).is_some(),
                "the README names `{part}`, not in the summary: {summary}"
            );
            named += 1;
        }
    }
    assert!(named >= 8, "only {named} summary fields named");
    let status = exec(
        tidemark_at(T0)
            .arg("status")
            .arg(&path)
            .args(["--var", &var]),
    );
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(status.stdout.contains("day status"), "{}", status.stdout);
}

/// The `--output json` failure example is what the binary prints for that command line (run
/// from the checkout, where `payments` names `pipelines/payments.yml`).
#[test]
fn the_json_failure_example_is_what_the_binary_prints() {
    let text = page("operations/exit-codes.md");
    let prompt = "$ tidemark run payments --var lake=/nowhere --output json";
    let body = blocks(&text)
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.starts_with(prompt))
        .expect("the JSON failure example");
    let want = body.lines().nth(1).expect("its output line");
    let args = words(&prompt[2..]);
    let out = exec(
        assert_cmd::Command::cargo_bin("tidemark")
            .expect("tidemark binary")
            .current_dir(root())
            .env("RUST_LOG", "warn")
            .env_remove("TIDEMARK_FAILPOINTS")
            .args(&args[1..]),
    );
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), want);
}

/// The dimension reference loads and runs over a small merchants feed, and the summary fields
/// the README names are in the run's JSON summary.
#[test]
fn the_dimension_reference_loads_and_runs_and_names_real_summary_fields() {
    let text = page("kinds/dimension.md");
    let (_, yaml) = blocks(&text)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.contains("kind: dimension"))
        .expect("the dimension reference block");
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("merchants.yml");
    std::fs::write(&path, &yaml).expect("write");
    let raw = lake.join("bronze/merchants_raw");
    let ts = |h: i64| {
        arrow::array::TimestampMicrosecondArray::from(vec![T0 + h * HOUR; 2]).with_timezone("UTC")
    };
    let tsf = |n: &str| {
        arrow::datatypes::Field::new(
            n,
            arrow::datatypes::DataType::Timestamp(
                arrow::datatypes::TimeUnit::Microsecond,
                Some("UTC".into()),
            ),
            false,
        )
    };
    let s = |v: [&str; 2]| std::sync::Arc::new(arrow::array::StringArray::from(v.to_vec()));
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("merchant_id", arrow::datatypes::DataType::Utf8, true),
        tsf("updated_at"),
        tsf("_ingested_at"),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("segment", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("country", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("op", arrow::datatypes::DataType::Utf8, true),
    ]));
    let batch = arrow::array::RecordBatch::try_new(
        schema,
        vec![
            s(["m1", "m1"]),
            std::sync::Arc::new(
                arrow::array::TimestampMicrosecondArray::from(vec![T0, T0 + HOUR])
                    .with_timezone("UTC"),
            ),
            std::sync::Arc::new(ts(2)),
            s(["Acme", "Acme"]),
            s(["small", "large"]),
            s(["NL", "NL"]),
            s(["U", "U"]),
        ],
    )
    .expect("batch");
    let payments = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("merchant_id", arrow::datatypes::DataType::Utf8, true),
        ])),
        vec![s(["m1", "m2"])],
    )
    .expect("payments");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(append_batch(&raw, batch));
    rt.block_on(append_batch(&lake.join("silver/payments"), payments));
    let var = format!("lake={}", lake.display());
    let out = exec(
        tidemark_at(T0 + 3 * HOUR)
            .arg("run")
            .arg(&path)
            .args(["--var", &var, "--output", "json"]),
    );
    assert_eq!(
        out.code, 0,
        "the README's dimension reference does not run: {}",
        out.stderr
    );
    let summary: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(
        summary["num_rows_total"], 3,
        "two versions of m1, a placeholder for m2: {summary}"
    );
    assert_eq!(summary["num_inferred_new"], 1, "{summary}");
    let start = text
        .find("The summary's `num_keys_read`")
        .expect("the dimension summary sentence");
    let sentence = &text[start..start + text[start..].find("in the commit's facts").unwrap_or(400)];
    let mut named = 0;
    for (i, part) in sentence.split('`').enumerate() {
        if i % 2 == 1 && part.starts_with("num_") {
            assert!(
                summary.get(part).is_some(),
                "the README names `{part}`, not in the summary: {summary}"
            );
            named += 1;
        }
    }
    assert_eq!(named, 10, "{sentence}");
}

/// The keys a mapping of a pipeline file may hold, as the config types say: the loader's
/// "valid keys here" list for an unknown key planted in that mapping. `None` for a mapping whose
/// keys are the user's own names (`schema:`'s columns, a placeholder's attributes).
fn valid_keys_at(dir: &Path, doc: &serde_yaml::Value, path: &[PathStep]) -> Option<Vec<String>> {
    let mut probe = doc.clone();
    let mut at = &mut probe;
    for step in path {
        at = match step {
            PathStep::Key(k) => at.get_mut(k.as_str()).expect("key on the path"),
            PathStep::First => at.get_mut(0).expect("first item on the path"),
        };
    }
    at.as_mapping_mut()
        .expect("a mapping")
        .insert("zz_probe".into(), 1.into());
    let file = dir.join("probe.yml");
    std::fs::write(&file, serde_yaml::to_string(&probe).expect("yaml")).expect("write");
    let mut vars = tidemark::config::Vars::new();
    vars.set("lake", &dir.join("lake").display().to_string());
    // (a mapping that takes any key loads: its keys are checked against the data at run time)
    let err = tidemark::config::Pipeline::load(&file, &vars)
        .err()?
        .to_string();
    let list = err.split("valid keys here: ").nth(1)?;
    Some(
        list.split([',', ' ', ')', ';'])
            .map(str::trim)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .map(str::to_string)
            .collect(),
    )
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    First,
}

/// Every mapping of a YAML document, by its path (into the first item of a list of mappings).
fn mapping_paths(value: &serde_yaml::Value, path: Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    match value {
        serde_yaml::Value::Mapping(m) => {
            out.push(path.clone());
            for (k, v) in m {
                if let Some(k) = k.as_str() {
                    let mut p = path.clone();
                    p.push(PathStep::Key(k.to_string()));
                    mapping_paths(v, p, out);
                }
            }
        }
        serde_yaml::Value::Sequence(items) => {
            if let Some(first) = items.first() {
                let mut p = path;
                p.push(PathStep::First);
                mapping_paths(first, p, out);
            }
        }
        _ => {}
    }
}

/// Each kind's reference names every key its config types accept, at every level it shows (the
/// types are the truth: a key added to them and not to the page fails here), and loads (a key
/// the page names that the types do not accept fails `*_reference_loads*`).
#[test]
fn every_kind_reference_names_every_key_the_config_types_accept() {
    for (page_path, kind) in [
        ("kinds/cdc_merge.md", "cdc_merge"),
        ("kinds/ingest.md", "ingest"),
        ("kinds/aggregate.md", "aggregate"),
        ("kinds/dimension.md", "dimension"),
    ] {
        let text = page(page_path);
        let (_, yaml) = blocks(&text)
            .into_iter()
            .find(|(info, body)| info == "yaml" && body.contains(&format!("kind: {kind}")))
            .unwrap_or_else(|| panic!("{page_path}: no reference block"));
        let doc: serde_yaml::Value = serde_yaml::from_str(&yaml).expect("the reference is YAML");
        let mut paths = Vec::new();
        mapping_paths(&doc, Vec::new(), &mut paths);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut checked = 0;
        for path in &paths {
            for key in valid_keys_at(dir.path(), &doc, path).unwrap_or_default() {
                assert!(
                    yaml.contains(&format!("{key}:")),
                    "{page_path}: the reference does not name `{key}`, which the config accepts at {path:?}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 15, "{page_path}: only {checked} keys checked");
    }
}

/// Every relative link of the README and the book leads to a file that exists and, with an
/// `#anchor`, to a heading of that page (mdBook's and GitHub's slugs agree for these headings).
#[test]
fn every_link_in_the_docs_resolves() {
    let pages = all_pages();
    let mut checked = 0;
    for (path, text) in &pages {
        let mut fence = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fence = !fence;
            }
            if fence {
                continue;
            }
            for target in link_targets(line) {
                if target.starts_with("http") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
                let resolved = if file.is_empty() {
                    path.clone()
                } else {
                    path.parent().expect("dir").join(file)
                };
                assert!(
                    resolved.exists(),
                    "{}:{}: link to {target}, which does not exist",
                    path.display(),
                    n + 1
                );
                if !anchor.is_empty() && (file.is_empty() || file.ends_with(".md")) {
                    let body = std::fs::read_to_string(&resolved).expect("linked page");
                    assert!(
                        headings(&body).iter().any(|h| slug(h) == anchor),
                        "{}:{}: link to {target}: no heading with that anchor",
                        path.display(),
                        n + 1
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 60, "only {checked} links checked");
}

fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &line[i + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .filter(|t| !t.contains(' '))
        .collect()
}

fn headings(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(line.trim_start_matches('#').trim().to_string());
        }
    }
    out
}

/// A heading's anchor as mdBook and GitHub make it: lower case, spaces to `-`, other
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The book's table of contents lists every page under `docs/`, and every page it lists exists.
#[test]
fn the_book_lists_every_page() {
    let summary = page("SUMMARY.md");
    let listed: Vec<&str> = summary.lines().flat_map(link_targets).collect();
    for target in &listed {
        assert!(
            root().join("docs").join(target).is_file(),
            "SUMMARY.md lists {target}"
        );
    }
    for (path, _) in all_pages() {
        let Ok(rel) = path.strip_prefix(root().join("docs")) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel == "SUMMARY.md" || rel.starts_with("src/") {
            continue;
        }
        assert!(
            listed.contains(&rel.as_str()),
            "docs/{rel} is not in the book's table of contents (docs/SUMMARY.md)"
        );
    }
    assert!(
        readme().lines().count() <= 200,
        "the README is the front door: at most 200 lines"
    );
}
