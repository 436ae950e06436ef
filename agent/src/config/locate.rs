//! Where in the file a problem is: line and column of a TOML syntax error, or of the
//! value a config path (`pipelines[0].sink.commit_interval`) names, and the wording that
//! turns serde's messages into the config's own words.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A 1-based line and column in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` of `text`.
    pub fn of(text: &str, offset: usize) -> Position {
        let before = &text[..offset.min(text.len())];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Position {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

/// Every TOML syntax error of `text`, each with its position (the parser recovers and
/// goes on, so a file with three typos shows three errors).
pub fn syntax_errors(text: &str) -> Vec<(Option<Position>, String)> {
    let (_, errors) = DeTable::parse_recoverable(text);
    let mut out: Vec<_> = errors
        .iter()
        .map(|e| {
            let at = e.span().map(|span| Position::of(text, span.start));
            (at, e.message().trim().to_string())
        })
        .collect();
    out.sort_by_key(|(at, _)| at.map(|p| (p.line, p.column)));
    out
}

/// The parsed file, to find where a config path points.
pub struct Locator<'t> {
    text: &'t str,
    root: Option<Spanned<DeTable<'t>>>,
}

impl<'t> Locator<'t> {
    /// Parses `text` for lookups (a file that does not parse locates nothing).
    pub fn new(text: &'t str) -> Locator<'t> {
        Locator {
            text,
            root: DeTable::parse(text).ok(),
        }
    }

    /// Where `path` points: its key if it names a key (the deepest part of it found in the
    /// file otherwise), or the table or array element it names.
    pub fn find(&self, path: &str) -> Option<Position> {
        let root = self.root.as_ref()?;
        let segments = split_path(path);
        let span = find_in_table(root.get_ref(), &segments)?;
        Some(Position::of(self.text, span.start))
    }
}

/// `a.b[2].c` as `["a", "b", "[2]", "c"]`.
fn split_path(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        match part.find('[') {
            Some(i) => {
                if i > 0 {
                    out.push(&part[..i]);
                }
                let mut rest = &part[i..];
                while let Some(end) = rest.find(']') {
                    out.push(&rest[..=end]);
                    rest = &rest[end + 1..];
                }
            }
            None => out.push(part),
        }
    }
    out
}

/// The span of the deepest part of `segments` found under `table`. A key may itself hold
/// dots (`properties."sasl.jaas.config"`), so the longest run of segments that names a
/// key wins.
fn find_in_table(table: &DeTable<'_>, segments: &[&str]) -> Option<Range<usize>> {
    let first = segments.first()?;
    if first.starts_with('[') {
        return None;
    }
    for take in (1..=segments.len()).rev() {
        let name = segments[..take].join(".");
        let Some((key, value)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == name) else {
            continue;
        };
        let deeper = find_in_value(value, &segments[take..]);
        return Some(deeper.unwrap_or_else(|| key.span()));
    }
    None
}

fn find_in_value(value: &Spanned<DeValue<'_>>, segments: &[&str]) -> Option<Range<usize>> {
    let first = segments.first()?;
    match value.get_ref() {
        DeValue::Table(t) => find_in_table(t, segments),
        DeValue::Array(items) => {
            let index: usize = first.strip_prefix('[')?.strip_suffix(']')?.parse().ok()?;
            let item = items.get(index)?;
            Some(find_in_value(item, &segments[1..]).unwrap_or_else(|| item.span()))
        }
        _ => None,
    }
}

/// serde's message in the words of a config file: TOML type names instead of Rust's
/// (`a list` for `a sequence`, `a whole number` for `u32`), and `unknown key` with the
/// closest known key for a misspelling.
pub fn plain_words(message: &str) -> String {
    if let Some(unknown) = unknown_key(message) {
        return unknown;
    }
    let mut out = message.trim().to_string();
    // "expected struct SinkConfig": the Rust type name means nothing in a config file.
    if let Some(i) = out.find("expected struct ") {
        let end = out[i + 16..]
            .find([',', ' ', '\n'])
            .map_or(out.len(), |e| i + 16 + e);
        out.replace_range(i..end, "expected a table");
    }
    for (rust, plain) in [
        ("a sequence", "a list (`[...]`)"),
        ("sequence", "list"),
        ("a map", "a table"),
        ("map", "table"),
        ("a nonzero u32", "a whole number above 0"),
        ("nonzero u32", "a whole number above 0"),
        ("nonzero u64", "a whole number above 0"),
        ("nonzero usize", "a whole number above 0"),
        ("u8", "a whole number"),
        ("u16", "a whole number"),
        ("u32", "a whole number"),
        ("u64", "a whole number"),
        ("usize", "a whole number"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("f64", "a number"),
        ("a boolean", "true or false"),
    ] {
        out = replace_word(&out, rust, plain);
    }
    // toml's own errors add a blank line and an "in `key`" line the path already says.
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_key_note(l))
        .collect::<Vec<_>>()
        .join("; ")
}

/// toml's "in `key`" line under a message.
fn is_key_note(line: &str) -> bool {
    line.starts_with("in `") && line.ends_with('`')
}

/// `text` with `word` replaced where it stands as a word (not inside another word).
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + word.len()..].chars().next();
        let inner = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let starts_word = word.starts_with(|c: char| !c.is_alphanumeric()) || !inner(before);
        let ends_word = word.ends_with(|c: char| !c.is_alphanumeric()) || !inner(after);
        out.push_str(&rest[..i]);
        out.push_str(if starts_word && ends_word { with } else { word });
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

/// serde's "unknown field `x`, expected one of `a`, `b`" as "unknown key `x`; did you
/// mean `a`?" (or the list of keys when none is close).
fn unknown_key(message: &str) -> Option<String> {
    let rest = message.trim().strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let expected: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    Some(unknown(key, &expected))
}

/// "unknown key", with the closest of `known` or else the list of them.
pub fn unknown(key: &str, known: &[&str]) -> String {
    match (did_you_mean(key, known), known.is_empty()) {
        (Some(k), _) => format!("unknown key `{key}`; did you mean `{k}`?"),
        (None, false) => format!("unknown key `{key}` (known keys: {})", known.join(", ")),
        (None, true) => format!("unknown key `{key}`"),
    }
}

/// The closest of `known` to a misspelled `key`, if one is close enough to suggest.
pub fn did_you_mean<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .filter(|(distance, k)| *distance <= (k.len() / 3).max(2))
        .min()
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[agent]\nx = 1\n\n[[pipelines]]\nname = \"a\"\n[pipelines.sink]\ncommit_interval = \"5s\"\n\n[[pipelines]]\nname = \"b\"\n[pipelines.source.properties]\n\"ssl.key.password\" = \"p\"\n";

    #[test]
    fn paths_are_found_by_line() {
        let at = Locator::new(TEXT);
        let line = |path: &str| at.find(path).map(|p| p.line);
        assert_eq!(line("agent.x"), Some(2));
        assert_eq!(line("pipelines[0].sink.commit_interval"), Some(7));
        assert_eq!(line("pipelines[1].name"), Some(10));
        assert_eq!(
            line("pipelines[1].source.properties.ssl.key.password"),
            Some(12)
        );
        assert_eq!(
            line("pipelines[0].sink.nothing"),
            Some(6),
            "the deepest part found"
        );
        assert_eq!(line("nothing"), None);
    }

    #[test]
    fn syntax_errors_have_positions() {
        let errors = syntax_errors("[a]\nx = 1\ny = \"open\nz = [1, 2\n");
        assert!(!errors.is_empty());
        assert_eq!(errors[0].0.map(|p| p.line), Some(3), "{errors:?}");
    }

    #[test]
    fn messages_use_the_words_of_a_config_file() {
        assert_eq!(
            plain_words("invalid type: string \"x\", expected a sequence\n\nin `topics`\n"),
            "invalid type: string \"x\", expected a list (`[...]`)"
        );
        assert_eq!(
            plain_words("invalid value: integer `0`, expected a nonzero u32"),
            "invalid value: integer `0`, expected a whole number above 0"
        );
        assert_eq!(
            plain_words(
                "unknown field `comit_interval`, expected one of `catalog`, `commit_interval`"
            ),
            "unknown key `comit_interval`; did you mean `commit_interval`?"
        );
        assert_eq!(
            plain_words("unknown field `zzz`, expected `a` or `b`"),
            "unknown key `zzz` (known keys: a, b)"
        );
        assert_eq!(
            did_you_mean("pipeline", &["agent", "pipelines"]),
            Some("pipelines")
        );
    }
}
