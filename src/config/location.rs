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
pub fn explain_serde_message(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
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
