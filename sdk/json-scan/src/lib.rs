//! Byte-level scanning of JSON text, shared by `floe-sdk` (inside plugins, compiled to
//! WebAssembly) and the Floe agent, so that both find the same bytes the same way.
//!
//! - [`has_byte`], [`bytes_eq`] and [`has_backslash`] work eight bytes at a time;
//! - [`skip_ws`], [`string_end`], [`string_end_escaped`] and [`value_end`] find where
//!   whitespace, a string or a whole value ends, without checking or decoding it;
//! - [`Members`] and [`object_members`] walk the members of an object's text, skipping
//!   nested values without looking inside them.
//!
//! The text is trusted to be valid JSON: on malformed text the scanners stop (return
//! `None` or end the walk) rather than panic, and what they find then is unspecified.
//! Positions are byte offsets into the slice given.
//!
//! ```
//! use floe_json_scan::{Member, object_members};
//!
//! let text = br#" {"a": 1, "b\"": [2, {"c": "}"}]}"#;
//! let members: Vec<Member> = object_members(text).collect();
//! assert_eq!(members.len(), 2);
//! let b = members[1];
//! assert_eq!(&text[b.key.0..b.key.1], br#""b\"""#);
//! assert!(b.escaped);
//! assert_eq!(&text[b.value.0..b.value.1], br#"[2, {"c": "}"}]"#);
//! ```
//!
//! No dependencies, so that it builds wherever `floe-sdk` does.

/// Whether any byte of `word` is `byte` (non-zero if so). The lowest flagged byte is
/// always a real match (a false flag only ever sits above a real one), so
/// `trailing_zeros() / 8` of the result is the first match's index in a little-endian
/// word.
///
/// ```
/// use floe_json_scan::has_byte;
///
/// let word = u64::from_le_bytes(*b"ab\"cd\"ef");
/// assert_eq!(has_byte(word, b'"').trailing_zeros() / 8, 2);
/// assert_eq!(has_byte(word, b'\\'), 0);
/// ```
#[inline]
pub fn has_byte(word: u64, byte: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & (ONES << 7)
}

/// `a == b`, eight bytes at a time: names and short strings are compared in a few
/// instructions, without a call to `memcmp` (an out-of-line call in a WebAssembly guest,
/// and one per field in the agent's patches).
#[inline]
pub fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a, mut b) = (a, b);
    while let (Some((x, a_rest)), Some((y, b_rest))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if x != y {
            return false;
        }
        (a, b) = (a_rest, b_rest);
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Whether `b` holds a backslash, eight bytes at a time.
#[inline]
pub fn has_backslash(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    words
        .by_ref()
        .any(|w| has_byte(u64::from_le_bytes(w.try_into().expect("8")), b'\\') != 0)
        || words.remainder().contains(&b'\\')
}

/// Whether `b` is JSON whitespace: space, line feed, carriage return or tab.
#[inline]
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The first non-whitespace position at or after `i` (`b.len()` or `i`, whichever is
/// greater, when there is none).
#[inline]
pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    // Compact JSON (what the agent writes) has none: one comparison then.
    while let Some(&c) = b.get(i) {
        if c > b' ' || !is_ws(c) {
            break;
        }
        i += 1;
    }
    i
}

/// The position after the closing quote of the string whose opening quote is at `i`;
/// `None` if the text ends first.
#[inline]
pub fn string_end(b: &[u8], i: usize) -> Option<usize> {
    string_end_escaped(b, i).map(|(end, _)| end)
}

/// [`string_end`], and whether the string holds a backslash escape.
#[inline]
pub fn string_end_escaped(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    let mut j = i + 1;
    loop {
        // Eight bytes at a time: the lowest flagged byte of `has_byte` is always a
        // real match (a false flag only ever sits above a real one), so it is the
        // first quote or backslash, found without looking at the bytes one by one.
        match b.get(j..j + 8) {
            Some(chunk) => {
                let word = u64::from_le_bytes(chunk.try_into().ok()?);
                let found = has_byte(word, b'"') | has_byte(word, b'\\');
                if found == 0 {
                    j += 8;
                    continue;
                }
                j += (found.trailing_zeros() / 8) as usize;
            }
            None => {
                while j < b.len() && !matches!(b[j], b'"' | b'\\') {
                    j += 1;
                }
            }
        }
        match *b.get(j)? {
            b'"' => return Some((j + 1, escaped)),
            // A backslash: the byte after it is escaped.
            _ => {
                escaped = true;
                j += 2;
            }
        }
    }
}

/// What a byte means to [`value_end`].
mod class {
    pub const OTHER: u8 = 0;
    pub const QUOTE: u8 = 1;
    pub const OPEN: u8 = 2;
    pub const CLOSE: u8 = 3;
    /// A comma or whitespace: like `CLOSE`, it ends a number, `true`, `false` or `null`.
    pub const SEPARATOR: u8 = 4;
}

/// [`value_end`]'s class of every byte: one table lookup per byte instead of a chain
/// of comparisons (this scan runs over every field a plugin skips).
const CLASS: [u8; 256] = {
    let mut table = [class::OTHER; 256];
    table[b'"' as usize] = class::QUOTE;
    table[b'{' as usize] = class::OPEN;
    table[b'[' as usize] = class::OPEN;
    table[b'}' as usize] = class::CLOSE;
    table[b']' as usize] = class::CLOSE;
    table[b',' as usize] = class::SEPARATOR;
    table[b' ' as usize] = class::SEPARATOR;
    table[b'\n' as usize] = class::SEPARATOR;
    table[b'\r' as usize] = class::SEPARATOR;
    table[b'\t' as usize] = class::SEPARATOR;
    table
};

/// The position after the value starting at `i` (a string, an array or object with
/// everything nested in it, or a number, `true`, `false` or `null`); `None` if no value
/// starts there or the text ends inside it.
#[inline]
pub fn value_end(b: &[u8], i: usize) -> Option<usize> {
    let first = *b.get(i)?;
    match CLASS[first as usize] {
        class::QUOTE => string_end(b, i),
        class::OPEN => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match CLASS[b[j] as usize] {
                    class::QUOTE => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    class::OPEN => depth += 1,
                    class::CLOSE => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ if matches!(first, b',' | b'}' | b']' | b':') => None,
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(CLASS[b[j] as usize], class::CLOSE | class::SEPARATOR) {
                j += 1;
            }
            Some(j)
        }
    }
}

/// Byte ranges of one object member: key (with quotes), value, in the text scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Byte range of the key, quotes included.
    pub key: (usize, usize),
    /// The key holds a backslash escape (only then can its text differ from its name).
    pub escaped: bool,
    /// Byte range of the value.
    pub value: (usize, usize),
}

/// Walks the members of an object's text, in text order.
///
/// Any malformation ends the walk: a member is only returned whole.
#[derive(Debug, Clone)]
pub struct Members<'a> {
    text: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Members<'a> {
    /// The members of the object `text`, which starts with `{` (nothing otherwise, also
    /// when whitespace comes first: see [`object_members`]). Offsets are into `text`.
    #[inline]
    pub fn new(text: &'a [u8]) -> Members<'a> {
        let ok = text.first() == Some(&b'{');
        Members {
            text,
            pos: 1,
            done: !ok,
        }
    }
}

impl Iterator for Members<'_> {
    type Item = Member;

    #[inline]
    fn next(&mut self) -> Option<Member> {
        if self.done {
            return None;
        }
        // Any malformation ends the walk: a member is only returned whole.
        self.done = true;
        let b = self.text;
        let key_start = skip_ws(b, self.pos);
        if b.get(key_start) != Some(&b'"') {
            return None;
        }
        let (key_end, escaped) = string_end_escaped(b, key_start)?;
        let colon = skip_ws(b, key_end);
        if b.get(colon) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(b, colon + 1);
        let value_end = value_end(b, value_start)?;
        let after = skip_ws(b, value_end);
        if b.get(after) == Some(&b',') {
            self.pos = after + 1;
            self.done = false;
        }
        Some(Member {
            key: (key_start, key_end),
            escaped,
            value: (value_start, value_end),
        })
    }
}

/// The members of the object in `text`, which may start with whitespace: what a
/// record's field index lists. Offsets are into `text`.
pub fn object_members(text: &[u8]) -> impl Iterator<Item = Member> + '_ {
    let start = skip_ws(text, 0);
    Members::new(&text[start..]).map(move |m| Member {
        key: (start + m.key.0, start + m.key.1),
        escaped: m.escaped,
        value: (start + m.value.0, start + m.value.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans of `text`'s members as text: (key, escaped, value).
    fn members(text: &str) -> Vec<(&str, bool, &str)> {
        object_members(text.as_bytes())
            .map(|m| {
                (
                    &text[m.key.0..m.key.1],
                    m.escaped,
                    &text[m.value.0..m.value.1],
                )
            })
            .collect()
    }

    #[test]
    fn has_byte_flags_the_first_match_exactly() {
        let bytes = [b'a', b'"', b'\\', 0x00, 0x80, 0xff, 0x22 ^ 0x80, b'"'];
        for mask in 0u32..256 {
            let mut word = [b'x'; 8];
            for (i, b) in word.iter_mut().enumerate() {
                if mask & (1 << i) != 0 {
                    *b = bytes[i];
                }
            }
            for needle in [b'"', b'\\', 0x00, 0xff, b'x'] {
                let found = has_byte(u64::from_le_bytes(word), needle);
                let first = word.iter().position(|&b| b == needle);
                assert_eq!(found != 0, first.is_some(), "{word:?} {needle}");
                if let Some(first) = first {
                    assert_eq!((found.trailing_zeros() / 8) as usize, first, "{word:?}");
                }
            }
        }
    }

    #[test]
    fn bytes_eq_is_slice_equality() {
        for len in 0..=19usize {
            let a: Vec<u8> = (0..len).map(|i| b'a' + (i % 7) as u8).collect();
            assert!(bytes_eq(&a, &a));
            if len > 0 {
                assert!(!bytes_eq(&a, &a[..len - 1]));
            }
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 1;
                assert!(!bytes_eq(&a, &b), "{len} {at}");
                assert_eq!(has_backslash(&b), b.contains(&b'\\'));
                b[at] = b'\\';
                assert!(has_backslash(&b), "{len} {at}");
            }
            assert!(!has_backslash(&a));
        }
    }

    #[test]
    fn whitespace_is_skipped_and_nothing_else() {
        assert_eq!(skip_ws(b" \n\r\t1", 0), 4);
        assert_eq!(skip_ws(b"  ", 0), 2);
        assert_eq!(skip_ws(b"1 ", 1), 2);
        assert_eq!(skip_ws(b"a", 5), 5);
        assert_eq!(
            skip_ws(b"\x0b1", 0),
            0,
            "vertical tab is not JSON whitespace"
        );
        assert!((0..=255u8).filter(|&b| is_ws(b)).eq(*b"\t\n\r "));
    }

    #[test]
    fn long_strings_with_escapes_are_skipped_whole() {
        let long = format!(
            r#"{{"a": "{}\"{}\\", "b": "{}", "c": 1}}"#,
            "x".repeat(37),
            "y".repeat(9),
            "é".repeat(20)
        );
        let found = members(&long);
        assert_eq!(found.len(), 3);
        assert!(found[0].2.ends_with(r#"yyyyyyyyy\\""#));
        assert_eq!(found[1].2.len(), 2 + 40);
        assert_eq!(found[2], (r#""c""#, false, "1"));
        // The string ends at every offset of the eight-byte steps.
        for len in 0..20 {
            for escape in [r#"\""#, r#"\\"#, "é"] {
                let s = format!("\"{}{escape}\" ", "z".repeat(len));
                let escaped = escape.starts_with('\\');
                assert_eq!(
                    string_end_escaped(s.as_bytes(), 0),
                    Some((s.len() - 1, escaped)),
                    "{s}"
                );
                assert_eq!(value_end(s.as_bytes(), 0), Some(s.len() - 1), "{s}");
            }
        }
    }

    #[test]
    fn values_end_where_json_says() {
        for (text, end) in [
            (r#""a\"b", 1"#, 6),
            ("[1, [2, {\"x\": \"]\"}]], 3", 20),
            ("{}", 2),
            ("-1.5e3,", 6),
            ("true}", 4),
            ("null]", 4),
            ("12 ", 2),
            ("7", 1),
        ] {
            assert_eq!(value_end(text.as_bytes(), 0), Some(end), "{text}");
        }
        for bad in ["", ",", "}", "]", ":", "[1, 2", r#""open"#, r#"{"a": "}"#] {
            assert_eq!(value_end(bad.as_bytes(), 0), None, "{bad}");
        }
    }

    #[test]
    fn members_in_text_order_with_escaped_keys() {
        let text = r#" {"a\u0062": 1, "x" : {"y": [1, "}"]}, "x": "2", "é":null} "#;
        assert_eq!(
            members(text),
            [
                (r#""a\u0062""#, true, "1"),
                (r#""x""#, false, r#"{"y": [1, "}"]}"#),
                (r#""x""#, false, r#""2""#),
                (r#""é""#, false, "null"),
            ]
        );
        assert_eq!(Members::new(text.as_bytes()).count(), 0, "whitespace first");
        assert_eq!(Members::new(text.trim().as_bytes()).count(), 4);
        let pretty = "{\n  \"a\": 1,\n  \"b\": [\n    true\n  ]\n}";
        assert_eq!(
            members(pretty),
            [
                (r#""a""#, false, "1"),
                (r#""b""#, false, "[\n    true\n  ]")
            ]
        );
    }

    #[test]
    fn malformed_text_ends_the_walk_after_the_whole_members() {
        for (bad, whole) in [
            ("", 0),
            ("{", 0),
            ("[1]", 0),
            (r#"{"a""#, 0),
            (r#"{"a":}"#, 0),
            (r#"{"a" 1}"#, 0),
            (r#"{"a": 1, "b"}"#, 1),
            (r#"{"a": 1, "b": "open}"#, 1),
            (r#"{"a": 1 "b": 2}"#, 1),
            ("nul", 0),
        ] {
            assert_eq!(members(bad).len(), whole, "{bad}");
        }
    }
}
