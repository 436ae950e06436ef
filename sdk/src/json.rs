//! Lazy, zero-copy access to JSON text, and the few edits plugins need.
//!
//! A [`Json`] is a view of one JSON value inside the record's text: nothing is parsed
//! until it is read, and reading a field only scans the text up to that field (and
//! skips nested values without looking inside them). Strings are unescaped only when
//! they contain an escape. [`Json::to_value`] and [`Json::parse`] turn a value into a
//! `serde_json` value or a type of your own when you need the whole thing. A record's
//! own top-level fields ([`Record::get`](crate::Record::get),
//! [`Record::fields`](crate::Record::fields)) are found without any scan: through the
//! field index the agent sends with each record.
//!
//! ```
//! use floe_sdk::json::{Json, Kind};
//!
//! let record = Json::new(br#"{"id": 7, "user": {"name": "Ann \u00e9", "tags": ["a", "b"]}, "ok": true}"#);
//! assert_eq!(record.get("id").and_then(|v| v.as_i64()), Some(7));
//! assert_eq!(record.get("user.name").unwrap().as_str().unwrap(), "Ann é");
//! assert_eq!(record.get("user.tags").unwrap().kind(), Kind::Array);
//! assert_eq!(record.get(["user", "tags"]).unwrap().items().count(), 2);
//! assert_eq!(record.get("ok").and_then(|v| v.as_bool()), Some(true));
//! assert!(record.get("missing").is_none());
//! let keys: Vec<String> = record.fields().map(|(k, _)| k.as_str().unwrap().into_owned()).collect();
//! assert_eq!(keys, ["id", "user", "ok"]);
//! ```
//!
//! Keys are looked up by their first occurrence: the agent refuses records in which an
//! object names a key twice, so a plugin never sees one.
//!
//! [`ObjectWriter`] builds a new object from pieces (raw JSON text of existing values
//! or serializable values), and [`set`] / [`remove`] edit object text the way the
//! agent applies a [`Patch`](crate::Patch).

use std::borrow::Cow;
use std::fmt;

use floe_json_scan::{
    Member, Members, bytes_eq, has_backslash, is_ws, object_members, skip_ws, value_end,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, wire};

/// The kind of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `null`
    Null,
    /// `true` or `false`
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl Kind {
    /// The kind with its article, for messages: `"a string"`, `"an object"`, `"null"`.
    pub fn described(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// A path of object keys: something [`Json::get`], [`Patch::set`](crate::Patch::set)
/// and friends accept.
///
/// - `&str`: a dotted path, `"user.name"` is the `name` key of the object under
///   `user` (as in plugin configs: a key containing a dot cannot be named this way);
/// - [`FieldPath`](crate::path::FieldPath): a path parsed once (in your config);
/// - an array or slice of keys, `["user", "name"]`, taken literally (dots included).
pub trait FieldRef {
    /// The keys, outermost first.
    fn keys(&self) -> impl Iterator<Item = &str> + Clone;
}

impl FieldRef for str {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.split('.')
    }
}

impl FieldRef for String {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.split('.')
    }
}

impl FieldRef for crate::path::FieldPath {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.segments().iter().map(String::as_str)
    }
}

impl<const N: usize> FieldRef for [&str; N] {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.iter().copied()
    }
}

impl FieldRef for [&str] {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.iter().copied()
    }
}

impl FieldRef for [String] {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        self.iter().map(String::as_str)
    }
}

impl<T: FieldRef + ?Sized> FieldRef for &T {
    fn keys(&self) -> impl Iterator<Item = &str> + Clone {
        (**self).keys()
    }
}

/// A view of one JSON value in a text (see the [module docs](self)).
///
/// The text is trusted to be valid JSON (the agent only hands plugins valid objects);
/// on malformed text, lookups find nothing rather than panic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Json<'a> {
    text: &'a [u8],
}

impl fmt::Debug for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json({})", String::from_utf8_lossy(self.text))
    }
}

impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.text))
    }
}

impl<'a> Json<'a> {
    /// A view of the JSON value in `text` (surrounding whitespace is ignored).
    pub fn new(text: &'a [u8]) -> Json<'a> {
        let start = skip_ws(text, 0);
        let mut end = text.len();
        while end > start && is_ws(text[end - 1]) {
            end -= 1;
        }
        Json {
            text: &text[start..end],
        }
    }

    /// The raw JSON text of the value, exactly as it appears in the record.
    pub fn bytes(&self) -> &'a [u8] {
        self.text
    }

    /// The raw JSON text of the value as a string (it is UTF-8 if the record is).
    pub fn text(&self) -> Result<&'a str, Error> {
        std::str::from_utf8(self.text).map_err(|e| Error::msg(format!("not UTF-8: {e}")))
    }

    /// What kind of value this is.
    #[inline]
    pub fn kind(&self) -> Kind {
        match self.text.first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// Whether the value is `null`.
    #[inline]
    pub fn is_null(&self) -> bool {
        self.text == b"null"
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self.text {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    /// The string, unescaped (borrowed from the record unless it holds escapes).
    pub fn as_str(&self) -> Option<Cow<'a, str>> {
        if self.kind() != Kind::String {
            return None;
        }
        unescape(self.text)
    }

    /// Whether this is the string `s`. Cheaper than comparing [`Json::as_str`]: nothing
    /// is unescaped or checked unless the text holds an escape.
    ///
    /// ```
    /// use floe_sdk::json::Json;
    ///
    /// assert!(Json::new(br#""paid""#).is_str("paid"));
    /// assert!(Json::new(br#""p\u0061id""#).is_str("paid"));
    /// assert!(!Json::new(b"1").is_str("1"));
    /// ```
    pub fn is_str(&self, s: &str) -> bool {
        let t = self.text;
        if t.len() < 2 || t[0] != b'"' {
            return false;
        }
        // An escape always takes more bytes than the character it stands for, so text
        // as long as `s` is `s` only byte for byte.
        let inner = &t[1..t.len() - 1];
        match inner.len().cmp(&s.len()) {
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => bytes_eq(inner, s.as_bytes()),
            // Longer: only escapes can make it `s`. Up to the first backslash the text
            // must be `s` byte for byte (usually the first byte already differs).
            std::cmp::Ordering::Greater => {
                let same = inner
                    .iter()
                    .zip(s.as_bytes())
                    .take_while(|(a, b)| a == b && **a != b'\\')
                    .count();
                inner.get(same) == Some(&b'\\') && key_eq(t, s)
            }
        }
    }

    /// The text between a string's quotes when it holds no escape, so that it is the
    /// string itself (UTF-8 if the record is, not checked here); `None` for a string
    /// with escapes and for other values. For code that only needs the bytes, such as
    /// a hash: cheaper than [`Json::as_str`].
    ///
    /// ```
    /// use floe_sdk::json::Json;
    ///
    /// assert_eq!(Json::new(br#""ann""#).plain_str(), Some(&b"ann"[..]));
    /// assert_eq!(Json::new(br#""a\nb""#).plain_str(), None);
    /// assert_eq!(Json::new(b"12").plain_str(), None);
    /// ```
    pub fn plain_str(&self) -> Option<&'a [u8]> {
        let t = self.text;
        if t.len() < 2 || t[0] != b'"' {
            return None;
        }
        let inner = &t[1..t.len() - 1];
        (!has_backslash(inner)).then_some(inner)
    }

    /// The number as an `i64`, if it is an integer in range (`1.0` and `1e3` are not).
    pub fn as_i64(&self) -> Option<i64> {
        if self.kind() != Kind::Number {
            return None;
        }
        std::str::from_utf8(self.text).ok()?.parse().ok()
    }

    /// The number as a `u64`, if it is a non-negative integer in range.
    pub fn as_u64(&self) -> Option<u64> {
        if self.kind() != Kind::Number {
            return None;
        }
        std::str::from_utf8(self.text).ok()?.parse().ok()
    }

    /// The number as an `f64` (the nearest one).
    pub fn as_f64(&self) -> Option<f64> {
        if self.kind() != Kind::Number {
            return None;
        }
        std::str::from_utf8(self.text).ok()?.parse().ok()
    }

    /// The value at a path of object keys below this value (see [`FieldRef`]).
    pub fn get(&self, path: impl FieldRef) -> Option<Json<'a>> {
        let mut current = *self;
        for key in path.keys() {
            current = current.field(key)?;
        }
        Some(current)
    }

    /// The value of one key of this object; `None` if this is not an object or has no
    /// such key. The key is taken literally. Only the text up to the key is scanned.
    pub fn field(&self, key: &str) -> Option<Json<'a>> {
        if self.kind() != Kind::Object {
            return None;
        }
        Members::new(self.text)
            .find(|m| key_is(m, self.text, key))
            .map(|m| Json {
                text: &self.text[m.value.0..m.value.1],
            })
    }

    /// The members of this object in text order (nothing if it is not an object).
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            text: self.text,
            members: Members::new(if self.kind() == Kind::Object {
                self.text
            } else {
                b""
            }),
            index: None,
        }
    }

    /// The elements of this array in order (nothing if it is not an array).
    pub fn items(&self) -> Items<'a> {
        let is_array = self.kind() == Kind::Array;
        Items {
            text: if is_array { self.text } else { b"" },
            pos: if is_array { 1 } else { 0 },
            done: !is_array,
        }
    }

    /// The value as a `serde_json` value (parses this value, and only this one).
    pub fn to_value(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_slice(self.text).map_err(Error::from)
    }

    /// Deserializes this value into a type of your own.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(self.text).map_err(Error::from)
    }
}

/// An object key as it appears in the text.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    raw: &'a [u8],
    /// The scan saw a backslash in it: only then can its text differ from its name.
    escaped: bool,
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", String::from_utf8_lossy(self.raw))
    }
}

impl<'a> Key<'a> {
    /// The key, unescaped (borrowed unless it holds escapes); `None` if the text is
    /// malformed.
    pub fn as_str(&self) -> Option<Cow<'a, str>> {
        match self.escaped {
            false => std::str::from_utf8(self.raw.get(1..self.raw.len().wrapping_sub(1))?)
                .ok()
                .map(Cow::Borrowed),
            true => unescape(self.raw),
        }
    }

    /// The key's JSON text, quotes included.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether the key is `key` (compared without unescaping when possible).
    #[inline]
    pub fn is(&self, key: &str) -> bool {
        name_is(self.raw, self.escaped, key)
    }
}

/// The members of an object: see [`Json::fields`].
#[derive(Clone)]
pub struct Fields<'a> {
    text: &'a [u8],
    members: Members<'a>,
    /// The entries not read yet of the record's field index, when reading one.
    index: Option<&'a [u8]>,
}

impl<'a> Fields<'a> {
    /// The members a record's field index lists (see [`crate::wire::FieldSpan`]),
    /// offsets into `text`. An entry that does not fit the text ends them: nothing
    /// panics on a broken index.
    pub(crate) fn indexed(text: &'a [u8], index: &'a [u8]) -> Fields<'a> {
        Fields {
            text,
            members: Members::new(b""),
            index: Some(index),
        }
    }

    /// The next member of the field index.
    #[inline]
    fn next_indexed(&mut self, index: &'a [u8]) -> Option<(Key<'a>, Json<'a>)> {
        self.index = Some(&[]);
        let (entry, rest) = index.split_first_chunk::<{ wire::FIELD_ENTRY }>()?;
        let word = |i: usize| {
            u32::from_le_bytes([entry[i], entry[i + 1], entry[i + 2], entry[i + 3]]) as usize
        };
        let start = word(0);
        let key = self
            .text
            .get(start & !(wire::ESCAPED_KEY as usize)..word(4))?;
        let value = self.text.get(word(8)..word(12))?;
        self.index = Some(rest);
        Some((
            Key {
                raw: key,
                escaped: start & wire::ESCAPED_KEY as usize != 0,
            },
            Json { text: value },
        ))
    }
}

/// The field index of an object's text, found by scanning it (what the test harness
/// sends; the agent writes it from its own parse). Offsets are into `text`, which may
/// start with whitespace.
pub(crate) fn field_spans(text: &[u8]) -> Vec<wire::FieldSpan> {
    let at = |i: usize| i as u32;
    object_members(text)
        .map(|m| wire::FieldSpan {
            key: (at(m.key.0), at(m.key.1)),
            escaped: m.escaped,
            value: (at(m.value.0), at(m.value.1)),
        })
        .collect()
}

impl<'a> Iterator for Fields<'a> {
    type Item = (Key<'a>, Json<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(index) = self.index {
            return self.next_indexed(index);
        }
        let m = self.members.next()?;
        Some((
            Key {
                raw: &self.text[m.key.0..m.key.1],
                escaped: m.escaped,
            },
            Json {
                text: &self.text[m.value.0..m.value.1],
            },
        ))
    }
}

/// The elements of an array: see [`Json::items`].
#[derive(Clone)]
pub struct Items<'a> {
    text: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Iterator for Items<'a> {
    type Item = Json<'a>;

    fn next(&mut self) -> Option<Json<'a>> {
        if self.done {
            return None;
        }
        let b = self.text;
        let start = skip_ws(b, self.pos);
        if b.get(start) == Some(&b']') {
            self.done = true;
            return None;
        }
        let Some(end) = value_end(b, start) else {
            self.done = true;
            return None;
        };
        let after = skip_ws(b, end);
        match b.get(after) {
            Some(b',') => self.pos = after + 1,
            _ => self.done = true,
        }
        Some(Json {
            text: &b[start..end],
        })
    }
}

/// Whether `member`'s key (in `text`, the object's text) is `key`.
fn key_is(member: &Member, text: &[u8], key: &str) -> bool {
    name_is(&text[member.key.0..member.key.1], member.escaped, key)
}

/// Whether the JSON string `raw` (quotes included), which holds a backslash escape
/// only if `escaped`, is `key`.
#[inline]
fn name_is(raw: &[u8], escaped: bool, key: &str) -> bool {
    if escaped {
        return key_eq(raw, key);
    }
    // Unescaped: the text between the quotes is the name.
    raw.len() == key.len() + 2 && bytes_eq(&raw[1..raw.len() - 1], key.as_bytes())
}

/// Whether the JSON string `raw` (quotes included) is `key`.
fn key_eq(raw: &[u8], key: &str) -> bool {
    if raw.len() < 2 {
        return false;
    }
    let inner = &raw[1..raw.len() - 1];
    // An escape always takes more bytes than the character it stands for: a text as
    // long as the key has none, and a shorter one cannot be the key.
    if inner.len() <= key.len() {
        return bytes_eq(inner, key.as_bytes());
    }
    has_backslash(inner) && unescape(raw).is_some_and(|s| s == key)
}

/// The string a JSON string literal (quotes included) stands for.
fn unescape(raw: &[u8]) -> Option<Cow<'_, str>> {
    if raw.len() < 2 || raw[0] != b'"' || raw[raw.len() - 1] != b'"' {
        return None;
    }
    let inner = &raw[1..raw.len() - 1];
    if !has_backslash(inner) {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
}

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Builds a JSON object from pieces, without a DOM.
///
/// ```
/// use floe_sdk::json::{Json, ObjectWriter};
///
/// let record = Json::new(br#"{"a": {"b": 1}, "c": [true]}"#);
/// let mut out = ObjectWriter::new();
/// out.raw("a_b", record.get("a.b").unwrap());
/// out.raw("c", record.get("c").unwrap());
/// out.value("d", "text").unwrap();
/// assert_eq!(out.finish(), br#"{"a_b":1,"c":[true],"d":"text"}"#);
/// ```
#[derive(Debug, Clone)]
pub struct ObjectWriter {
    buf: Vec<u8>,
    empty: bool,
}

impl Default for ObjectWriter {
    fn default() -> Self {
        ObjectWriter::new()
    }
}

impl ObjectWriter {
    /// An empty object.
    pub fn new() -> ObjectWriter {
        ObjectWriter::with_capacity(64)
    }

    /// An empty object with room for `bytes` bytes of text.
    pub fn with_capacity(bytes: usize) -> ObjectWriter {
        let mut buf = Vec::with_capacity(bytes.max(2));
        buf.push(b'{');
        ObjectWriter { buf, empty: true }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.buf.push(b',');
        }
        self.empty = false;
        write_str(&mut self.buf, key);
        self.buf.push(b':');
    }

    /// Adds a member whose value is an existing JSON value, copied as it is.
    pub fn raw(&mut self, key: &str, value: Json<'_>) -> &mut Self {
        self.key(key);
        self.buf.extend_from_slice(value.bytes());
        self
    }

    /// Adds a member whose key is an existing key (copied as it is, escapes included).
    pub fn raw_member(&mut self, key: Key<'_>, value: Json<'_>) -> &mut Self {
        if !self.empty {
            self.buf.push(b',');
        }
        self.empty = false;
        self.buf.extend_from_slice(key.raw());
        self.buf.push(b':');
        self.buf.extend_from_slice(value.bytes());
        self
    }

    /// Adds a member whose value is serialized with serde.
    pub fn value(&mut self, key: &str, value: impl Serialize) -> Result<&mut Self, Error> {
        self.key(key);
        serde_json::to_writer(&mut self.buf, &value)?;
        Ok(self)
    }

    /// Whether nothing was added yet.
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// The object's text.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

/// Why an edit could not be made: a parent on the path is not an object.
///
/// Displays as ``cannot write `user.name`: `user` is a string, not an object``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditError {
    path: String,
    parent: String,
    kind: Kind,
}

impl EditError {
    /// The dotted path that could not be written.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The dotted path of the parent in the way.
    pub fn parent(&self) -> &str {
        &self.parent
    }

    /// What that parent holds instead of an object.
    pub fn kind(&self) -> Kind {
        self.kind
    }
}

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot write `{}`: `{}` is {}, not an object",
            self.path,
            self.parent,
            self.kind.described()
        )
    }
}

impl std::error::Error for EditError {}

/// The object text with the value at `path` set to `value` (one JSON value's text),
/// as the agent applies a patch's `set`: a replaced value keeps its position, a new
/// key goes at the end of its object, missing or `null` parents become objects, and a
/// parent holding anything else is an [`EditError`] (nothing is changed).
///
/// ```
/// let out = floe_sdk::json::set(br#"{"a": 1, "b": {"c": 2}}"#, "b.d", b"true").unwrap();
/// assert_eq!(out, br#"{"a": 1, "b": {"c": 2,"d":true}}"#);
/// let err = floe_sdk::json::set(br#"{"a": 1}"#, "a.x", b"0").unwrap_err();
/// assert_eq!(err.to_string(), "cannot write `a.x`: `a` is a number, not an object");
/// ```
pub fn set(object: &[u8], path: impl FieldRef, value: &[u8]) -> Result<Vec<u8>, EditError> {
    let keys: Vec<&str> = path.keys().collect();
    let object = Json::new(object);
    let mut out = Vec::with_capacity(object.text.len() + value.len() + 16);
    set_into(&mut out, object.text, &keys, 0, value)?;
    Ok(out)
}

fn dotted(keys: &[&str]) -> String {
    keys.join(".")
}

fn set_into(
    out: &mut Vec<u8>,
    object: &[u8],
    keys: &[&str],
    depth: usize,
    value: &[u8],
) -> Result<(), EditError> {
    let key = keys[depth];
    let last = depth + 1 == keys.len();
    let found = Members::new(object)
        .filter(|m| key_is(m, object, key))
        .last();
    match found {
        Some(m) => {
            let current = &object[m.value.0..m.value.1];
            out.extend_from_slice(&object[..m.value.0]);
            if last {
                out.extend_from_slice(value);
            } else {
                match (Json { text: current }).kind() {
                    Kind::Object => set_into(out, current, keys, depth + 1, value)?,
                    Kind::Null => write_nested(out, &keys[depth + 1..], value),
                    kind => {
                        return Err(EditError {
                            path: dotted(keys),
                            parent: dotted(&keys[..=depth]),
                            kind,
                        });
                    }
                }
            }
            out.extend_from_slice(&object[m.value.1..]);
        }
        None => {
            // Insert before the closing brace, after the last member.
            let close = object.len().saturating_sub(1);
            let members_end = Members::new(object).last().map(|m| m.value.1);
            match members_end {
                Some(end) => {
                    out.extend_from_slice(&object[..end]);
                    out.push(b',');
                }
                None => out.push(b'{'),
            }
            write_str(out, key);
            out.push(b':');
            if last {
                out.extend_from_slice(value);
            } else {
                write_nested(out, &keys[depth + 1..], value);
            }
            match members_end {
                Some(end) => out.extend_from_slice(&object[end..]),
                None => out.extend_from_slice(&object[close..]),
            }
        }
    }
    Ok(())
}

/// Writes `{"k1":{"k2":value}}` for the keys.
fn write_nested(out: &mut Vec<u8>, keys: &[&str], value: &[u8]) {
    for key in keys {
        out.push(b'{');
        write_str(out, key);
        out.push(b':');
    }
    out.extend_from_slice(value);
    out.extend(std::iter::repeat_n(b'}', keys.len()));
}

/// The object text with the field at `path` renamed to `to`, as the agent applies a
/// patch's `rename`: the field keeps its place in its object and a field already named
/// `to` there goes; `None` when there is nothing to rename (a missing key, or a parent
/// that is missing or not an object).
///
/// ```
/// let out = floe_sdk::json::rename(br#"{"a": 1, "b": {"c": 2, "d": 3}}"#, "b.c", "e").unwrap();
/// assert_eq!(out, br#"{"a": 1, "b": {"e":2,"d":3}}"#);
/// assert!(floe_sdk::json::rename(br#"{"a": 1}"#, "x", "y").is_none());
/// ```
pub fn rename(object: &[u8], path: impl FieldRef, to: &str) -> Option<Vec<u8>> {
    let keys: Vec<&str> = path.keys().collect();
    let (name, parent) = keys.split_last()?;
    let root = Json::new(object);
    let inner = if parent.is_empty() {
        root
    } else {
        root.get(parent).filter(|o| o.kind() == Kind::Object)?
    };
    if inner.kind() != Kind::Object {
        return None;
    }
    let fields: Vec<(Key<'_>, Json<'_>)> = inner.fields().collect();
    let source = fields.iter().position(|(k, _)| k.is(name))?;
    let mut out = ObjectWriter::with_capacity(inner.text.len() + to.len());
    for (i, (key, value)) in fields.iter().enumerate() {
        if i == source {
            out.raw(to, *value);
        } else if !key.is(to) {
            out.raw_member(*key, *value);
        }
    }
    let rewritten = out.finish();
    if parent.is_empty() {
        Some(rewritten)
    } else {
        set(object, parent, &rewritten).ok()
    }
}

/// The object text without the value at `path`, as the agent applies a patch's
/// `remove`; `None` when there is nothing to remove (a missing key, or a parent that
/// is missing or not an object). Every occurrence of a repeated key goes.
///
/// ```
/// let out = floe_sdk::json::remove(br#"{"a": 1, "b": {"c": 2, "d": 3}}"#, "b.c").unwrap();
/// assert_eq!(out, br#"{"a": 1, "b": {"d": 3}}"#);
/// assert!(floe_sdk::json::remove(br#"{"a": 1}"#, "a.b").is_none());
/// ```
pub fn remove(object: &[u8], path: impl FieldRef) -> Option<Vec<u8>> {
    let keys: Vec<&str> = path.keys().collect();
    let object = Json::new(object);
    let mut out = Vec::with_capacity(object.text.len());
    remove_into(&mut out, object.text, &keys, 0).then_some(out)
}

fn remove_into(out: &mut Vec<u8>, object: &[u8], keys: &[&str], depth: usize) -> bool {
    let key = keys[depth];
    let members: Vec<Member> = Members::new(object).collect();
    if depth + 1 < keys.len() {
        let Some(m) = members.iter().rfind(|m| key_is(m, object, key)) else {
            return false;
        };
        let inner = &object[m.value.0..m.value.1];
        if (Json { text: inner }).kind() != Kind::Object {
            return false;
        }
        out.extend_from_slice(&object[..m.value.0]);
        if !remove_into(out, inner, keys, depth + 1) {
            return false;
        }
        out.extend_from_slice(&object[m.value.1..]);
        return true;
    }
    let keep: Vec<&Member> = members.iter().filter(|m| !key_is(m, object, key)).collect();
    if keep.len() == members.len() {
        return false;
    }
    // Rebuild the member list from the kept members' own text, keeping the
    // whitespace of the object's edges.
    let first = members.first().map_or(1, |m| m.key.0);
    let last = members.last().map_or(1, |m| m.value.1);
    out.extend_from_slice(&object[..first]);
    for (i, m) in keep.iter().enumerate() {
        if i > 0 {
            // The separator that followed the previous kept member in the text.
            let prev = keep[i - 1];
            let sep_end = members
                .iter()
                .find(|n| n.key.0 > prev.value.1)
                .map_or(m.key.0, |n| n.key.0);
            out.extend_from_slice(&object[prev.value.1..sep_end]);
        }
        out.extend_from_slice(&object[m.key.0..m.value.1]);
    }
    out.extend_from_slice(&object[last..]);
    true
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn j(text: &str) -> Json<'_> {
        Json::new(text.as_bytes())
    }

    fn value(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn reads_scalars_and_kinds() {
        let r = j(
            r#" {"s": "a\"b", "n": -1.5e3, "i": 42, "t": true, "f": false, "z": null, "a": [1, {"x": "]"}], "o": {}} "#,
        );
        assert_eq!(r.kind(), Kind::Object);
        assert_eq!(r.get("s").unwrap().as_str().unwrap(), "a\"b");
        assert_eq!(r.get("n").unwrap().as_f64(), Some(-1500.0));
        assert_eq!(r.get("n").unwrap().as_i64(), None);
        assert_eq!(r.get("i").unwrap().as_i64(), Some(42));
        assert_eq!(r.get("i").unwrap().as_u64(), Some(42));
        assert_eq!(r.get("t").unwrap().as_bool(), Some(true));
        assert_eq!(r.get("f").unwrap().as_bool(), Some(false));
        assert!(r.get("z").unwrap().is_null());
        assert_eq!(r.get("a").unwrap().items().count(), 2);
        assert_eq!(
            r.get("a")
                .unwrap()
                .items()
                .nth(1)
                .unwrap()
                .get("x")
                .unwrap()
                .as_str()
                .unwrap(),
            "]"
        );
        assert_eq!(r.get("o").unwrap().fields().count(), 0);
        assert_eq!(r.get("o").unwrap().kind(), Kind::Object);
        assert_eq!(r.fields().count(), 8);
        assert!(r.get("s.x").is_none(), "paths only go through objects");
        assert!(r.get("a.0").is_none());
        assert_eq!(
            r.get("a").unwrap().to_value().unwrap(),
            json!([1, {"x": "]"}])
        );
    }

    #[test]
    fn escaped_keys_and_repeated_keys() {
        let r = j(r#"{"a\u0062": 1, "x": 1, "x": 2, "é": 3}"#);
        assert_eq!(r.get(["ab"]).unwrap().as_i64(), Some(1));
        assert_eq!(
            r.get("x").unwrap().as_i64(),
            Some(1),
            "the first one is found"
        );
        assert_eq!(r.get("é").unwrap().as_i64(), Some(3));
        let keys: Vec<String> = r
            .fields()
            .map(|(k, _)| k.as_str().unwrap().into_owned())
            .collect();
        assert_eq!(keys, ["ab", "x", "x", "é"]);
    }

    #[test]
    fn long_strings_with_escapes_are_skipped_whole() {
        let long = format!(
            r#"{{"a": "{}\"{}\\", "b": "{}", "c": 1}}"#,
            "x".repeat(37),
            "y".repeat(9),
            "é".repeat(20)
        );
        let r = j(&long);
        assert_eq!(r.get("c").unwrap().as_i64(), Some(1));
        assert!(
            r.get("a")
                .unwrap()
                .as_str()
                .unwrap()
                .ends_with("yyyyyyyyy\\")
        );
        assert_eq!(r.get("b").unwrap().as_str().unwrap().chars().count(), 20);
        assert_eq!(r.fields().count(), 3);
    }

    /// Random objects whose strings are full of quotes, backslashes, escapes and
    /// multi-byte characters at every offset of the 8-byte scan: every field found is
    /// the one serde_json reads, with the same value, in the same order, with and
    /// without whitespace between tokens.
    #[test]
    fn scanning_agrees_with_serde_json() {
        const PIECES: [&str; 12] = [
            "a",
            "\"",
            "\\",
            "é",
            "\n",
            ",",
            "}",
            "]",
            " ",
            "xyz",
            "\u{1F600}",
            ":",
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for case in 0..2000 {
            let text = |next: &mut dyn FnMut(u64) -> u64| -> String {
                (0..next(20)).map(|_| PIECES[next(12) as usize]).collect()
            };
            let mut object = serde_json::Map::new();
            for _ in 0..1 + next(6) {
                let key = text(&mut next);
                let v = match next(6) {
                    0 => Value::String(text(&mut next)),
                    1 => json!(next(1_000_000) as i64 - 500_000),
                    2 => json!([text(&mut next), {"k": text(&mut next)}, [1.5, null]]),
                    3 => json!({"n": {"m": text(&mut next)}, "t": true}),
                    4 => Value::Null,
                    _ => json!(false),
                };
                object.insert(key, v);
            }
            let value = Value::Object(object);
            let compact = value.to_string();
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            for text in [&compact, &pretty] {
                let found: Vec<(String, Value)> = j(text)
                    .fields()
                    .map(|(k, v)| (k.as_str().unwrap().into_owned(), v.to_value().unwrap()))
                    .collect();
                let want: Vec<(String, Value)> = value
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(found, want, "case {case}: {text}");
                for (k, v) in &want {
                    assert_eq!(
                        j(text).field(k).map(|f| f.to_value().unwrap()).as_ref(),
                        Some(v)
                    );
                }
                // The same through the field index, as a plugin reads a record.
                let buf = indexed_input(text.as_bytes());
                let record = read_indexed(&buf);
                let found: Vec<(String, Value)> = record
                    .fields()
                    .map(|(k, v)| {
                        let name = k.as_str().unwrap().into_owned();
                        assert!(k.is(&name), "case {case}: {name:?}");
                        (name, v.to_value().unwrap())
                    })
                    .collect();
                assert_eq!(found, want, "case {case}, indexed: {text}");
                for (k, v) in &want {
                    assert_eq!(
                        record
                            .get([k.as_str()])
                            .map(|f| f.to_value().unwrap())
                            .as_ref(),
                        Some(v)
                    );
                }
            }
        }
    }

    /// An input buffer of one record, `text`, with its field index.
    fn indexed_input(text: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        let spans = field_spans(text);
        let mut w = wire::InputWriter::indexed(&mut buf, 1, &["t"]);
        w.push(text, None, 0, 0, 0, None, Some(spans));
        buf
    }

    /// The record in a buffer of [`indexed_input`], read as a plugin reads it.
    fn read_indexed(buf: &[u8]) -> crate::Record<'_> {
        let r = wire::InputReader::new(buf)
            .unwrap()
            .next_record()
            .unwrap()
            .unwrap();
        assert!(r.fields.is_some());
        crate::Record::new(r.value, r.topic, 0, 0, None, None).with_index(r.fields)
    }

    #[test]
    fn strings_compare_equal_exactly_when_their_text_means_the_same() {
        // Lengths around the eight-byte steps, escapes at every position, written by
        // serde_json and with each character spelled as a `\u` escape in turn.
        for len in 0..=18 {
            for at in 0..len.max(1) {
                for special in ["a", "\"", "\\", "\n", "é", "\u{1F600}", "/"] {
                    let mut s: String =
                        (0..len).map(|i| char::from(b'a' + (i % 7) as u8)).collect();
                    if len > 0 {
                        s.replace_range(at..at + 1, special);
                    }
                    let mut texts = vec![serde_json::to_string(&s).unwrap()];
                    for (i, c) in s.char_indices() {
                        if (c as u32) < 0x10000 {
                            let before = serde_json::to_string(&s[..i]).unwrap();
                            let after = serde_json::to_string(&s[i + c.len_utf8()..]).unwrap();
                            texts.push(format!(
                                "{}\\u{:04x}{}",
                                before.strip_suffix('"').unwrap(),
                                c as u32,
                                after.strip_prefix('"').unwrap()
                            ));
                        }
                    }
                    for text in &texts {
                        let v = j(text);
                        assert_eq!(v.as_str().as_deref(), Some(s.as_str()), "{text}");
                        assert!(v.is_str(&s), "{text} is {s:?}");
                        assert!(!v.is_str(&format!("{s}x")), "{text}");
                        assert!(!v.is_str(&format!("x{s}")), "{text}");
                        if let Some(shorter) = s.char_indices().last().map(|(i, _)| &s[..i]) {
                            assert!(!v.is_str(shorter), "{text} is not {shorter:?}");
                        }
                        let plain = !text.contains('\\');
                        assert_eq!(v.plain_str(), plain.then_some(s.as_bytes()), "{text}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_broken_field_index_ends_the_fields_without_panicking() {
        let text = br#" {"a":1,"bb":"x"}"#;
        let good = indexed_input(text);
        let record = read_indexed(&good);
        assert_eq!(record.get("bb").unwrap().bytes(), br#""x""#);
        assert_eq!(record.fields().count(), 2);
        // The index is the buffer's last 32 bytes: `good` with one of its words changed.
        let broken = |at: usize, word: u32| {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&word.to_le_bytes());
            bad
        };
        // The second entry's value end out of the text.
        let bad = broken(good.len() - 16 + 12, 1000);
        let record = read_indexed(&bad);
        assert_eq!(record.fields().count(), 1);
        assert!(record.get("bb").is_none());
        assert_eq!(record.get("a").unwrap().bytes(), b"1");
        // The first entry's key ending before it starts.
        let bad = broken(good.len() - 32 + 4, 0);
        let record = read_indexed(&bad);
        assert_eq!(record.fields().count(), 0);
        assert!(record.get("a").is_none());
    }

    #[test]
    fn malformed_text_finds_nothing() {
        for bad in ["", "{", r#"{"a""#, r#"{"a":}"#, r#"{"a" 1}"#, "[1,", "nul"] {
            let v = j(bad);
            assert!(v.get("a").is_none(), "{bad}");
            let _ = v.fields().count();
            let _ = v.items().count();
        }
    }

    #[test]
    fn set_replaces_appends_and_creates_parents() {
        let r = br#"{"a": 1, "geo": {"lat": 0}, "n": null, "z": 2}"#;
        assert_eq!(
            value(&set(r, "a", b"9").unwrap()),
            json!({"a": 9, "geo": {"lat": 0}, "n": null, "z": 2})
        );
        let out = set(r, "b", b"\"x\"").unwrap();
        assert_eq!(
            out,
            br#"{"a": 1, "geo": {"lat": 0}, "n": null, "z": 2,"b":"x"}"#
        );
        assert_eq!(
            value(&set(r, "geo.lon", b"5").unwrap())["geo"],
            json!({"lat": 0, "lon": 5})
        );
        assert_eq!(
            value(&set(r, "n.a.b", b"1").unwrap())["n"],
            json!({"a": {"b": 1}})
        );
        assert_eq!(value(&set(r, "m.a", b"1").unwrap())["m"], json!({"a": 1}));
        assert_eq!(set(b"{}", "k", b"1").unwrap(), br#"{"k":1}"#);
        assert_eq!(set(b"{ }", "k", b"1").unwrap(), br#"{"k":1}"#);
        assert_eq!(
            set(br#"{"q\"": 1}"#, ["q\""], b"2").unwrap(),
            br#"{"q\"": 2}"#
        );
        let err = set(r, "z.x.y", b"1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot write `z.x.y`: `z` is a number, not an object"
        );
        assert_eq!(
            (err.path(), err.parent(), err.kind()),
            ("z.x.y", "z", Kind::Number)
        );
        // Keys in order: a replaced value keeps its place.
        let out = value(&set(r, "geo", b"[]").unwrap());
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "geo", "n", "z"]);
    }

    #[test]
    fn remove_takes_members_out_cleanly() {
        let r = br#"{"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}"#;
        assert_eq!(
            remove(r, "a").unwrap(),
            br#"{"b": {"c": 2, "d": 3}, "e": [1]}"#
        );
        assert_eq!(
            remove(r, "e").unwrap(),
            br#"{"a": 1, "b": {"c": 2, "d": 3}}"#
        );
        assert_eq!(remove(r, "b").unwrap(), br#"{"a": 1, "e": [1]}"#);
        assert_eq!(
            remove(r, "b.d").unwrap(),
            br#"{"a": 1, "b": {"c": 2}, "e": [1]}"#
        );
        assert_eq!(remove(br#"{"only": 1}"#, "only").unwrap(), b"{}");
        assert_eq!(
            remove(br#"{"x": 1, "x": 2, "y": 3}"#, "x").unwrap(),
            br#"{"y": 3}"#
        );
        assert!(remove(r, "missing").is_none());
        assert!(remove(r, "a.b").is_none());
        assert!(remove(r, "q.b").is_none());
        for out in [remove(r, "a"), remove(r, "b.c"), remove(r, "e")] {
            let _: Value = serde_json::from_slice(&out.unwrap()).unwrap();
        }
    }

    #[test]
    fn strings_are_escaped_like_serde_json() {
        for s in [
            "plain",
            "q\"b\\s",
            "line\nfeed\ttab\r",
            "\u{1}\u{1f}",
            "é ✓",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            assert_eq!(serde_json::from_slice::<String>(&out).unwrap(), s);
            assert_eq!(out, serde_json::to_vec(s).unwrap());
        }
    }
}
