//! The README's examples, checked so they cannot go stale: every `tidemark …` command line in
//! its shell, systemd and Kubernetes examples parses with today's CLI; the pipeline reference
//! loads as a pipeline; the `bundle validate` transcript is what the binary prints; every field
//! of the run-summary table is in a real run's JSON summary; every path of the layout exists.

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

/// The fenced blocks of the README: (info string, body).
fn blocks(text: &str) -> Vec<(String, String)> {
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
fn every_command_line_in_the_readme_parses() {
    let text = readme();
    let mut checked = 0;
    for (info, body) in blocks(&text) {
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
    assert!(checked >= 12, "only {checked} README command lines found");
}

#[test]
fn the_pipeline_reference_loads() {
    let text = readme();
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
    let text = readme();
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
    let text = readme();
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
        .find("### The run summary")
        .expect("run summary section");
    let mut fields = Vec::new();
    for line in text[start..].lines().skip(1) {
        if line.starts_with("###") || line.starts_with("## ") {
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
    let fields = summary_fields(&readme());
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
    let text = readme();
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
        "{\"payment_id\":\"p1\",\"amount_cents\":5,\"updated_at\":\"2025-01-06T10:00:00Z\"}\n",
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
    let text = readme();
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
    let text = readme();
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
    let text = readme();
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
