//! Finding where a key or a text sits in a YAML file, for error messages.
//!
//! serde_yaml reports positions only for syntax and shape errors; semantic errors found after
//! parsing (a column missing from the source, a bad duration) are located by searching the text.

use std::path::{Component, Path, PathBuf};

/// 1-based line of the first non-comment line that defines `key:` (at any indentation, also
/// inside a flow mapping like `source: { uri: ... }`). Falls back to line 1.
pub fn line_of_key(text: &str, key: &str) -> usize {
    lines_of_key(text, key).next().unwrap_or(1)
}

/// Like [`line_of_key`], but the first definition at or after line `from` (1-based): finds a
/// key inside one job or task of a file that defines several.
pub fn line_of_key_from(text: &str, key: &str, from: usize) -> usize {
    lines_of_key(text, key)
        .find(|line| *line >= from)
        .unwrap_or(1)
}

/// 1-based lines of every definition of `key:`, in order (see [`line_of_key`]).
pub fn lines_of_key<'t>(text: &'t str, key: &str) -> impl Iterator<Item = usize> + 't {
    let needle = format!("{key}:");
    text.lines().enumerate().filter_map(move |(i, line)| {
        let code = strip_comment(line);
        let trimmed = code.trim_start();
        (trimmed.starts_with(&needle)
            || trimmed.starts_with(&format!("- {needle}"))
            || code.contains(&format!("{{ {needle}"))
            || code.contains(&format!(", {needle}"))
            || code.contains(&format!("{{{needle}")))
        .then_some(i + 1)
    })
}

/// 1-based line of the first non-comment occurrence of `fragment`. Falls back to line 1.
pub fn line_of_text(text: &str, fragment: &str) -> usize {
    line_of_text_from(text, fragment, 1)
}

/// Like [`line_of_text`], but the first occurrence at or after line `from` (1-based).
pub fn line_of_text_from(text: &str, fragment: &str, from: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find(|(_, l)| strip_comment(l).contains(fragment))
        .map(|(i, _)| i + 1)
        .unwrap_or(1)
}

fn strip_comment(line: &str) -> &str {
    // A '#' starts a comment when it begins the line or follows whitespace (YAML's rule).
    let bytes = line.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// The valid key closest to `unknown`, if any is close enough to be a plausible typo: one edit
/// or swap of neighbouring letters away (`dya` → `day`, which Jaro-Winkler alone misses on short
/// keys), else the most similar key by Jaro-Winkler.
pub fn nearest<'a>(unknown: &str, valid: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let valid: Vec<&str> = valid.into_iter().collect();
    let one_edit = valid
        .iter()
        // One edit is a typo only in a name long enough for the rest to identify it.
        .filter(|v| unknown.chars().count() >= 3 && strsim::osa_distance(unknown, v) <= 1)
        .min_by(|a, b| {
            strsim::jaro_winkler(unknown, b).total_cmp(&strsim::jaro_winkler(unknown, a))
        });
    if let Some(v) = one_edit {
        return Some(v);
    }
    valid
        .into_iter()
        .map(|v| (strsim::jaro_winkler(unknown, v), v))
        .filter(|(score, _)| *score >= 0.75)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, v)| v)
}

/// Rewrites serde's "unknown field `x`, expected one of `a`, `b`" into a message with a hint,
/// and drops serde_yaml's trailing "at line N column M" (the caller prints the line itself).
/// A YAML file's parse error in the user's words: a tab where YAML wants spaces is named as
/// such (the parser says "found character that cannot start any token"); anything else as
/// [`explain_serde_message`] says it.
pub fn explain_yaml_error(e: &serde_yaml::Error, text: &str) -> String {
    let message = e.to_string();
    let line = e.location().map(|l| l.line()).unwrap_or(1);
    let source = text.lines().nth(line.saturating_sub(1)).unwrap_or_default();
    let about_tab = message.contains("tab") || message.contains("cannot start any token");
    if about_tab && source.contains('\t') {
        let indented =
            source.trim_start_matches([' ', '\t']).len() < source.trim_start_matches(' ').len();
        let place = if indented {
            "is indented with a tab"
        } else {
            "has a tab"
        };
        return format!(
            "line {line} {place}: YAML indents with spaces only; replace the tab with spaces"
        );
    }
    explain_serde_message(&message)
}

/// serde's `path.key: invalid type: string "two", expected i64` in a person's words:
/// `` `key` is the text "two"; it must be a whole number ``.
fn plain_type_error(message: &str) -> Option<String> {
    let (path, what) = ["invalid type: ", "invalid value: "].iter().find_map(|p| {
        message
            .find(p)
            .map(|i| (&message[..i], &message[i + p.len()..]))
    })?;
    let (found, expected) = what.rsplit_once(", expected ")?;
    let key = path
        .trim_end_matches(": ")
        .rsplit('.')
        .next()
        .unwrap_or_default();
    let key = key.split('[').next().unwrap_or(key);
    let found = match found.split_once(' ') {
        Some(("string", v)) => format!("the text {v}"),
        Some(("integer" | "floating", v)) => format!(
            "the number {}",
            v.trim_start_matches("point ").trim_matches('`')
        ),
        Some(("boolean", v)) => v.trim_matches('`').to_string(),
        _ => match found {
            "sequence" => "a list".to_string(),
            "map" => "a mapping (keys under it)".to_string(),
            "unit value" => "empty".to_string(),
            other => other.to_string(),
        },
    };
    let expected = match expected {
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number",
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number, 0 or more",
        "f32" | "f64" => "a number",
        "a boolean" | "bool" => "true or false",
        "a string" | "a borrowed string" | "string" => "text",
        "a sequence" => "a list (`[a, b]` or `- a` lines)",
        e if e.starts_with("struct ") || e == "a map" => "a mapping (keys under it)",
        e => e,
    };
    let subject = match key.is_empty() {
        true => "the file".to_string(),
        false => format!("`{key}`"),
    };
    Some(format!("{subject} is {found}; it must be {expected}"))
}

/// serde's `path.mode: unknown variant `fast`, expected `incremental` or `full_reload`` as
/// `` `mode: fast` is not one of: incremental, full_reload `` (with the nearest one).
fn plain_variant_error(message: &str) -> Option<String> {
    let i = message.find("unknown variant `")?;
    // the key with its parent (`target.apply`, `pipeline_task.mode`), without list indexes
    let path: Vec<&str> = message[..i]
        .trim_end_matches(": ")
        .split('.')
        .filter(|s| !s.is_empty())
        .map(|s| s.split('[').next().unwrap_or(s))
        .collect();
    let key = path[path.len().saturating_sub(2)..].join(".");
    let rest = &message[i + "unknown variant `".len()..];
    let (value, tail) = rest.split_once('`')?;
    let choices: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    let near = nearest(value, choices.iter().copied())
        .map(|n| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default();
    let subject = match key.is_empty() {
        true => format!("`{value}`"),
        false => format!("`{key}: {value}`"),
    };
    let quoted: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    let choices = match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Some(format!("{subject} is not one of {choices}{near}"))
}

pub fn explain_serde_message(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    if let Some(plain) = plain_type_error(message).or_else(|| plain_variant_error(message)) {
        return plain;
    }
    if let Some(rest) = message.strip_prefix("duplicate field `") {
        let field = rest.split('`').next().unwrap_or_default();
        return format!("`{field}` is given more than once; keep one of them");
    }
    let Some(start) = message.find("unknown field `") else {
        return message.to_string();
    };
    let (prefix, rest) = message.split_at(start);
    let rest = &rest["unknown field `".len()..];
    let Some((field, tail)) = rest.split_once('`') else {
        return message.to_string();
    };
    let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    let mut out = format!("{prefix}unknown key `{field}`");
    // Keys that belong one level down, when written at the top.
    const NESTED: [(&str, &str); 8] = [
        ("apply", "target"),
        ("file_size", "target"),
        ("row_group_rows", "target"),
        ("change_data_feed", "target"),
        ("on_recreate", "source"),
        ("max_rows", "quarantine"),
        ("max_fraction", "quarantine"),
        ("retain", "deletes"),
    ];
    let parent = NESTED
        .iter()
        .find(|(k, p)| *k == field && expected.contains(p) && !expected.contains(k))
        .map(|(_, p)| *p);
    match (nearest(field, expected.iter().copied()), parent) {
        (Some(hint), _) => out.push_str(&format!(" (did you mean `{hint}`?)")),
        (None, Some(p)) => out.push_str(&format!(" here: it belongs under `{p}:` (`{p}.{field}`)")),
        (None, None) if !expected.is_empty() => {
            out.push_str(&format!("; valid keys here: {}", expected.join(", ")))
        }
        (None, None) => {}
    }
    out
}

/// Removes `.` and `..` components lexically, so messages show `pipelines/x.yml`, not
/// `bundle/resources/../../pipelines/x.yml`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let last = out.components().next_back();
                match last {
                    Some(Component::Normal(_)) => {
                        out.pop();
                    }
                    Some(Component::RootDir) => {}
                    _ => out.push(".."),
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_and_variant_errors_read_in_plain_words() {
        assert_eq!(
            explain_serde_message("a.tasks[0].max_retries: invalid type: string \"two\", expected i64 at line 4 column 18"),
            "`max_retries` is the text \"two\"; it must be a whole number"
        );
        assert_eq!(
            explain_serde_message(
                "x.retry_on_timeout: invalid type: integer `3`, expected a boolean"
            ),
            "`retry_on_timeout` is the number 3; it must be true or false"
        );
        assert_eq!(
            explain_serde_message("tasks: invalid type: map, expected a sequence"),
            "`tasks` is a mapping (keys under it); it must be a list (`[a, b]` or `- a` lines)"
        );
        assert_eq!(
            explain_serde_message("p.mode: unknown variant `ful_reload`, expected `incremental` or `full_reload`"),
            "`p.mode: ful_reload` is not one of `incremental` or `full_reload` (did you mean `full_reload`?)"
        );
    }

    #[test]
    fn a_tab_is_named_as_such() {
        let text = "name: t\nsource:\n\turi: x\n";
        let e = serde_yaml::from_str::<serde_yaml::Value>(text).expect_err("a tab");
        assert_eq!(
            explain_yaml_error(&e, text),
            "line 3 is indented with a tab: YAML indents with spaces only; replace the tab with spaces"
        );
    }

    #[test]
    fn finds_keys_in_block_and_flow_style() {
        let text = "# keys: not this\nname: x\nsource: { uri: a }\n  keys: [id]\n";
        assert_eq!(line_of_key(text, "keys"), 4);
        assert_eq!(line_of_key(text, "uri"), 3);
        assert_eq!(line_of_key(text, "name"), 2);
    }

    #[test]
    fn suggests_the_nearest_key() {
        let msg = "unknown field `overlaps`, expected one of `name`, `overlap`, `keys`";
        assert_eq!(
            explain_serde_message(msg),
            "unknown key `overlaps` (did you mean `overlap`?)"
        );
        let msg = "unknown field `dya`, expected one of `day`, `group_by`, `sum`, `count_by`";
        assert_eq!(
            explain_serde_message(msg),
            "unknown key `dya` (did you mean `day`?)"
        );
        let msg = "unknown field `zzz`, expected `uri`";
        assert_eq!(
            explain_serde_message(msg),
            "unknown key `zzz`; valid keys here: uri"
        );
    }

    #[test]
    fn a_target_key_written_at_the_top_is_sent_under_target() {
        let msg =
            "unknown field `apply`, expected one of `name`, `kind`, `source`, `target`, `keys`";
        assert_eq!(
            explain_serde_message(msg),
            "unknown key `apply` here: it belongs under `target:` (`target.apply`)"
        );
    }
}
