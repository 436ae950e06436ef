//! JSON records parsed once: the text and a flat token tape over it.
//!
//! Every stage after decoding reads a record through this representation: the schema
//! stage walks the tape to check and learn types, the batch stage walks it again to
//! append Arrow values, the upsert key is read from it, and plugins get its text. The
//! bytes are parsed exactly once per record; no tree of allocated values is built.
//!
//! The tokenizer is iterative (an explicit stack, no recursion on untrusted depth) and
//! strict (RFC 8259: no trailing commas, no leading zeros, no control characters in
//! strings, escapes and surrogate pairs checked). Duplicate keys in one object are an
//! error: readers disagree on which one wins, so such a record is rejected with the
//! key's name rather than stored one way or the other.
//!
//! [`JsonWriter`] builds text and tape together (decoders of other formats, patches).

use std::borrow::Cow;
use std::fmt;

/// Nesting deeper than this is refused by the tokenizer (a hard limit; the schema stage
/// applies the configurable, lower one).
pub const MAX_DEPTH: usize = 128;

/// Why bytes are not one acceptable JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// Not valid JSON, with where and why.
    #[error("value is not valid JSON: {reason} at byte {at}")]
    Syntax {
        /// What is wrong.
        reason: &'static str,
        /// Byte offset.
        at: usize,
    },
    /// Valid JSON, but not an object, so it cannot be a row.
    #[error("value is a JSON {0}, expected an object")]
    NotAnObject(&'static str),
    /// One object names a key twice.
    #[error("value has the key {0:?} twice in one object")]
    DuplicateKey(String),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("value is nested more than {MAX_DEPTH} levels deep")]
    TooDeep,
    /// The text is longer than 4 GiB (offsets are 32-bit).
    #[error("value is larger than 4 GiB")]
    TooLarge,
    /// A patch names a path through a value that is not an object.
    #[error("cannot set {0}: a value on the path is not an object")]
    PatchPath(String),
}

fn syntax(reason: &'static str, at: usize) -> JsonError {
    JsonError::Syntax { reason, at }
}

/// The kind of one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// `{`; `len` is the tape index of the matching [`Kind::End`].
    Object,
    /// `[`; `len` is the tape index of the matching [`Kind::End`].
    Array,
    /// `}` or `]`.
    End,
    /// An object key (a string token whose value follows).
    Key,
    /// A string value.
    String,
    /// A number value.
    Number,
    /// `true`.
    True,
    /// `false`.
    False,
    /// `null`.
    Null,
}

/// One token: its kind, where its text starts and how long it is (for containers, the
/// index of the closing token instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tok {
    kind: Kind,
    /// Strings and keys: contains a backslash escape. Numbers: has a fraction or exponent.
    flag: bool,
    pos: u32,
    len: u32,
}

impl Tok {
    /// The token of `kind` whose text is `bytes[start..end]`.
    #[inline]
    fn spanning(kind: Kind, flag: bool, start: usize, end: usize) -> Tok {
        Tok {
            kind,
            flag,
            pos: start as u32,
            len: (end - start) as u32,
        }
    }
}

/// A parsed JSON object that owns its text and tape.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonObject {
    /// Checked to be UTF-8 once, when parsed or written, so that reading a token's text
    /// is a slice, not a check.
    text: String,
    tape: Vec<Tok>,
}

impl fmt::Debug for JsonObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonObject({})", self.text)
    }
}

/// A tape that can be reused from record to record (no allocation per record).
#[derive(Debug, Default)]
pub struct Tape {
    toks: Vec<Tok>,
    stack: Vec<usize>,
}

impl Tape {
    /// An empty tape.
    pub fn new() -> Tape {
        Tape::default()
    }

    /// Parses `bytes` (one JSON object) into this tape and returns a view of it.
    pub fn parse<'a>(&'a mut self, bytes: &'a [u8]) -> Result<JsonView<'a>, JsonError> {
        let text = utf8(bytes)?;
        tokenize(text, &mut self.toks, &mut self.stack)?;
        Ok(JsonView {
            text,
            tape: &self.toks,
        })
    }
}

/// The tapes of many records in one buffer, each record's text left where it is: what
/// the pipeline parses a batch into for the plugins, with no copy of the text and no
/// allocation per record (a [`JsonObject`] per record cost the pipeline thread a copy,
/// two allocations and two frees each).
#[derive(Debug, Default)]
pub struct Tapes {
    toks: Vec<Tok>,
    scratch: Tape,
}

/// One record parsed into [`Tapes`]: its text and where its tape lies there.
#[derive(Debug, Clone, Copy)]
pub struct Parsed<'a> {
    text: &'a str,
    start: usize,
    end: usize,
}

impl Tapes {
    /// Empty tapes.
    pub fn new() -> Tapes {
        Tapes::default()
    }

    /// Forgets every record parsed so far. The memory is kept for the next batch,
    /// unless a batch of unusually large records made it grow past
    /// [`Tapes::KEEP_TOKENS`] tokens: a spike is not held for the agent's life.
    pub fn clear(&mut self) {
        self.toks.clear();
        if self.toks.capacity() > Tapes::KEEP_TOKENS {
            self.toks = Vec::new();
        }
        if self.scratch.toks.capacity() > Tapes::KEEP_TOKENS {
            self.scratch = Tape::new();
        }
    }

    /// Tokens whose memory is kept from batch to batch (12 bytes each: 12 MiB).
    pub const KEEP_TOKENS: usize = 1 << 20;

    /// Parses `bytes` (one JSON object) and appends its tape.
    pub fn parse<'a>(&mut self, bytes: &'a [u8]) -> Result<Parsed<'a>, JsonError> {
        let text = utf8(bytes)?;
        // Tokenized on its own first: a container's token holds the index of its end
        // within the record's tape, which the record's slice of `toks` keeps.
        tokenize(text, &mut self.scratch.toks, &mut self.scratch.stack)?;
        let start = self.toks.len();
        self.toks.extend_from_slice(&self.scratch.toks);
        Ok(Parsed {
            text,
            start,
            end: self.toks.len(),
        })
    }

    /// A view of a record parsed into these tapes since they were last cleared.
    ///
    /// # Panics
    /// If `parsed` lies beyond these tapes (it came from other tapes, or from before a
    /// [`Tapes::clear`]).
    pub fn view<'a>(&'a self, parsed: Parsed<'a>) -> JsonView<'a> {
        JsonView {
            text: parsed.text,
            tape: &self.toks[parsed.start..parsed.end],
        }
    }
}

impl JsonObject {
    /// Parses one JSON object.
    pub fn parse(bytes: Vec<u8>) -> Result<JsonObject, JsonError> {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Tape> = std::cell::RefCell::new(Tape::new());
        }
        if bytes.len() > u32::MAX as usize {
            return Err(JsonError::TooLarge);
        }
        // Checked once here; the tokenizer then reads text known to be UTF-8.
        let text = String::from_utf8(bytes)
            .map_err(|e| syntax("invalid UTF-8", e.utf8_error().valid_up_to()))?;
        // Tokenized into a reused tape, then copied at its exact size: one allocation per
        // object instead of a growing vector's several.
        SCRATCH.with_borrow_mut(|scratch| {
            tokenize(&text, &mut scratch.toks, &mut scratch.stack)?;
            let tape = scratch.toks.clone();
            Ok(JsonObject { text, tape })
        })
    }

    /// The object's JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        self.text.as_bytes()
    }

    /// Its JSON text, without the tape.
    pub fn into_bytes(self) -> Vec<u8> {
        self.text.into_bytes()
    }

    /// A borrowed view for reading.
    pub fn view(&self) -> JsonView<'_> {
        JsonView {
            text: &self.text,
            tape: &self.tape,
        }
    }

    /// Bytes held (text plus tape), for memory accounting.
    pub fn memory_bytes(&self) -> usize {
        self.text.capacity() + self.tape.capacity() * std::mem::size_of::<Tok>()
    }

    /// The same object with `ops` applied; `self` is unchanged.
    pub fn apply(&self, ops: &[PatchOp]) -> Result<JsonObject, JsonError> {
        let paths = PatchOp::paths(ops);
        patch::apply(self.view(), &PatchOp::borrowed(ops, &paths))
    }

    /// The object as a `serde_json` value (tests, tools; not on the hot path).
    pub fn to_serde(&self) -> serde_json::Value {
        Value::Object(self.view().root()).to_serde()
    }

    /// An object from a `serde_json` map (tests, tools; not on the hot path).
    pub fn from_map(map: &serde_json::Map<String, serde_json::Value>) -> JsonObject {
        let bytes = serde_json::to_vec(map).expect("JSON values serialize");
        JsonObject::parse(bytes).expect("serde_json writes valid JSON")
    }
}

/// One edit of a patch (a plugin's answer that changes a few fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOp {
    /// Sets the field at `path` to one JSON value given as text; missing or `null`
    /// intermediate objects are created, another non-object on the path is an error.
    Set {
        /// Field names from the top level down.
        path: Vec<String>,
        /// JSON text of the value.
        value: Vec<u8>,
    },
    /// Removes the field at `path` if it is there.
    Remove {
        /// Field names from the top level down.
        path: Vec<String>,
    },
    /// Renames the field at `path` to `to` within its object, keeping its place; a
    /// field already named `to` there goes. Nothing happens when `path` is absent.
    Rename {
        /// Field names from the top level down.
        path: Vec<String>,
        /// The new name.
        to: String,
    },
}

impl PatchOp {
    /// The field names from the top level down.
    pub fn path(&self) -> &Vec<String> {
        match self {
            PatchOp::Set { path, .. } | PatchOp::Remove { path } | PatchOp::Rename { path, .. } => {
                path
            }
        }
    }

    /// Whether no path of `ops` equals another or is a prefix of another (then the
    /// order of the ops does not matter and they apply in one pass).
    pub fn are_disjoint(ops: &[PatchOp]) -> bool {
        let paths = PatchOp::paths(ops);
        PatchRef::are_disjoint(&PatchOp::borrowed(ops, &paths))
    }

    fn paths(ops: &[PatchOp]) -> Vec<Vec<&str>> {
        ops.iter()
            .map(|op| op.path().iter().map(String::as_str).collect())
            .collect()
    }

    fn borrowed<'a>(ops: &'a [PatchOp], paths: &'a [Vec<&'a str>]) -> Vec<PatchRef<'a>> {
        ops.iter()
            .zip(paths)
            .map(|(op, path)| match op {
                PatchOp::Set { value, .. } => PatchRef::Set { path, value },
                PatchOp::Remove { .. } => PatchRef::Remove { path },
                PatchOp::Rename { to, .. } => PatchRef::Rename { path, to },
            })
            .collect()
    }
}

/// A [`PatchOp`] that borrows its names and value (a plugin's answer, read in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchRef<'a> {
    /// Sets the field at `path` to one JSON value given as text.
    Set {
        /// Field names from the top level down.
        path: &'a [&'a str],
        /// JSON text of the value.
        value: &'a [u8],
    },
    /// Removes the field at `path` if it is there.
    Remove {
        /// Field names from the top level down.
        path: &'a [&'a str],
    },
    /// Renames the field at `path` to `to` within its object.
    Rename {
        /// Field names from the top level down.
        path: &'a [&'a str],
        /// The new name.
        to: &'a str,
    },
}

impl<'a> PatchRef<'a> {
    /// The field names from the top level down.
    pub fn path(&self) -> &'a [&'a str] {
        match *self {
            PatchRef::Set { path, .. }
            | PatchRef::Remove { path }
            | PatchRef::Rename { path, .. } => path,
        }
    }

    /// See [`PatchOp::are_disjoint`].
    pub fn are_disjoint(ops: &[PatchRef<'_>]) -> bool {
        patch::disjoint(ops)
    }
}

/// A borrowed, parsed JSON object (a [`JsonObject`] or a reused [`Tape`]).
#[derive(Clone, Copy)]
pub struct JsonView<'a> {
    text: &'a str,
    tape: &'a [Tok],
}

impl fmt::Debug for JsonView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonView({})", self.text)
    }
}

impl<'a> JsonView<'a> {
    /// The top-level object.
    pub fn root(&self) -> Obj<'a> {
        Obj { view: *self, at: 0 }
    }

    /// The whole text.
    pub fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The same object with `ops` applied, as a new object: [`JsonObject::apply`] with
    /// borrowed ops, what the agent uses to apply a plugin's answer without copying its
    /// names and values, to a record parsed into shared tapes or owned alike.
    pub fn apply_borrowed(&self, ops: &[PatchRef<'_>]) -> Result<JsonObject, JsonError> {
        patch::apply(*self, ops)
    }

    /// Where each top-level member lies in the text (what a plugin's field index
    /// lists): read off the tape, a few instructions per member.
    pub fn field_spans(&self) -> impl Iterator<Item = floe_sdk::wire::FieldSpan> + 'a {
        let view = *self;
        let end = view.tape.first().map_or(0, |t| t.len as usize);
        let mut at = 1;
        std::iter::from_fn(move || {
            if at + 1 >= end {
                return None;
            }
            let key = view.tape[at];
            let value = view.span(at + 1);
            at = view.skip(at + 1);
            Some(floe_sdk::wire::FieldSpan {
                key: (key.pos, key.pos + key.len),
                escaped: key.flag,
                value: (value.start as u32, value.end as u32),
            })
        })
    }

    /// An owned copy.
    pub fn to_object(&self) -> JsonObject {
        JsonObject {
            text: self.text.to_string(),
            tape: self.tape.to_vec(),
        }
    }

    /// The object key at `i`, if the token there is one.
    fn key_at(&self, i: usize) -> Option<Str<'a>> {
        let t = self.tape[i];
        (t.kind == Kind::Key).then(|| self.str_of(t))
    }

    /// The string (or key) token `t`.
    fn str_of(&self, t: Tok) -> Str<'a> {
        Str {
            quoted: self.text(t.pos as usize, t.len as usize),
            escaped: t.flag,
        }
    }

    fn value_at(&self, i: usize) -> Value<'a> {
        let t = self.tape[i];
        match t.kind {
            Kind::Object => Value::Object(Obj { view: *self, at: i }),
            Kind::Array => Value::Array(Arr { view: *self, at: i }),
            Kind::String | Kind::Key => Value::String(self.str_of(t)),
            Kind::Number => Value::Number(Num {
                text: self.text(t.pos as usize, t.len as usize),
                fraction: t.flag,
            }),
            Kind::True => Value::Bool(true),
            Kind::False => Value::Bool(false),
            Kind::Null | Kind::End => Value::Null,
        }
    }

    fn text(&self, pos: usize, len: usize) -> &'a str {
        // The text is UTF-8 and token boundaries are ASCII characters, so every token's
        // span is a slice of it (the fallback is for a broken invariant, not for input).
        self.text.get(pos..pos + len).unwrap_or_default()
    }

    /// Index after the value starting at `i`.
    fn skip(&self, i: usize) -> usize {
        match self.tape[i].kind {
            Kind::Object | Kind::Array => self.tape[i].len as usize + 1,
            _ => i + 1,
        }
    }

    /// Byte range of the value at `i` in the text.
    fn span(&self, i: usize) -> std::ops::Range<usize> {
        let t = self.tape[i];
        match t.kind {
            Kind::Object | Kind::Array => {
                let end = self.tape[t.len as usize];
                t.pos as usize..end.pos as usize + 1
            }
            _ => t.pos as usize..(t.pos + t.len) as usize,
        }
    }
}

/// One JSON value, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as written.
    Number(Num<'a>),
    /// A string.
    String(Str<'a>),
    /// An object.
    Object(Obj<'a>),
    /// An array.
    Array(Arr<'a>),
}

impl<'a> Value<'a> {
    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// A short name of its kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() => "integer",
            Value::Number(_) => "number with fraction",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// The value's JSON text as written in the record.
    pub fn raw(&self) -> &'a str {
        match self {
            Value::Null => "null",
            Value::Bool(true) => "true",
            Value::Bool(false) => "false",
            Value::Number(n) => n.text,
            Value::String(s) => s.quoted,
            Value::Object(o) => o.view.text_range(o.view.span(o.at)),
            Value::Array(a) => a.view.text_range(a.view.span(a.at)),
        }
    }

    /// The value as an owned `serde_json` value (tests and error paths only).
    pub fn to_serde(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => serde_json::Value::from(i),
                None => match n.text.parse::<u64>() {
                    Ok(u) if !n.fraction => serde_json::Value::from(u),
                    // Rust's parser rounds correctly (serde_json's default one may not).
                    _ => serde_json::Number::from_f64(n.as_f64())
                        .map_or(serde_json::Value::Null, serde_json::Value::Number),
                },
            },
            Value::String(s) => serde_json::Value::String(s.get().into_owned()),
            Value::Object(o) => serde_json::Value::Object(
                o.iter()
                    .map(|(k, v)| (k.get().into_owned(), v.to_serde()))
                    .collect(),
            ),
            Value::Array(a) => serde_json::Value::Array(a.iter().map(|v| v.to_serde()).collect()),
        }
    }
}

impl<'a> JsonView<'a> {
    fn text_range(&self, r: std::ops::Range<usize>) -> &'a str {
        self.text(r.start, r.end - r.start)
    }
}

/// A number as written in the record.
#[derive(Debug, Clone, Copy)]
pub struct Num<'a> {
    text: &'a str,
    fraction: bool,
}

impl<'a> Num<'a> {
    /// The number's text.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// Whether it is written as an integer that fits an i64.
    pub fn is_i64(&self) -> bool {
        self.as_i64().is_some()
    }

    /// Its value as an i64, when written as an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        if self.fraction {
            return None;
        }
        self.text.parse().ok()
    }

    /// Its value as the nearest f64 (integers beyond 2^53 round, like any JSON reader).
    pub fn as_f64(&self) -> f64 {
        self.text.parse().unwrap_or(f64::NAN)
    }

    /// Whether it has a fraction or an exponent.
    pub fn has_fraction(&self) -> bool {
        self.fraction
    }
}

/// A string as written in the record (escapes resolved on demand).
#[derive(Debug, Clone, Copy)]
pub struct Str<'a> {
    /// The text with its quotes.
    quoted: &'a str,
    escaped: bool,
}

impl<'a> Str<'a> {
    /// The string's value.
    pub fn get(&self) -> Cow<'a, str> {
        if self.escaped {
            Cow::Owned(unescape(self.raw()))
        } else {
            Cow::Borrowed(self.raw())
        }
    }

    /// The text between the quotes, escapes as written.
    pub fn raw(&self) -> &'a str {
        &self.quoted[1..self.quoted.len() - 1]
    }

    /// The text with its quotes (valid JSON).
    pub fn quoted(&self) -> &'a str {
        self.quoted
    }

    /// Whether the string equals `s` (without allocating when there are no escapes).
    pub fn eq_str(&self, s: &str) -> bool {
        if self.escaped {
            unescape(self.raw()) == s
        } else {
            // Inline, not `memcmp`: this compares every key of a patched object with
            // the names the patch edits.
            floe_json_scan::bytes_eq(self.raw().as_bytes(), s.as_bytes())
        }
    }
}

/// An object, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Obj<'a> {
    view: JsonView<'a>,
    at: usize,
}

impl<'a> Obj<'a> {
    /// Its fields in order.
    pub fn iter(&self) -> ObjIter<'a> {
        ObjIter {
            view: self.view,
            i: self.at + 1,
            end: self.view.tape[self.at].len as usize,
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.iter().find(|(k, _)| k.eq_str(key)).map(|(_, v)| v)
    }

    /// Whether it has no fields.
    pub fn is_empty(&self) -> bool {
        self.at + 1 == self.view.tape[self.at].len as usize
    }

    /// The object's JSON text.
    pub fn raw(&self) -> &'a str {
        self.view.text_range(self.view.span(self.at))
    }
}

/// Fields of an object.
pub struct ObjIter<'a> {
    view: JsonView<'a>,
    i: usize,
    end: usize,
}

impl<'a> Iterator for ObjIter<'a> {
    type Item = (Str<'a>, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.i >= self.end {
            return None;
        }
        let Value::String(key) = self.view.value_at(self.i) else {
            return None;
        };
        let value = self.view.value_at(self.i + 1);
        self.i = self.view.skip(self.i + 1);
        Some((key, value))
    }
}

/// An array, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Arr<'a> {
    view: JsonView<'a>,
    at: usize,
}

impl<'a> Arr<'a> {
    /// Its items in order.
    pub fn iter(&self) -> ArrIter<'a> {
        ArrIter {
            view: self.view,
            i: self.at + 1,
            end: self.view.tape[self.at].len as usize,
        }
    }

    /// Whether it has no items.
    pub fn is_empty(&self) -> bool {
        self.at + 1 == self.view.tape[self.at].len as usize
    }

    /// Number of items (walks the array).
    pub fn len(&self) -> usize {
        self.iter().count()
    }
}

/// Items of an array.
pub struct ArrIter<'a> {
    view: JsonView<'a>,
    i: usize,
    end: usize,
}

impl<'a> Iterator for ArrIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.i >= self.end {
            return None;
        }
        let v = self.view.value_at(self.i);
        self.i = self.view.skip(self.i);
        Some(v)
    }
}

/// Resolves the escapes of a string's raw text (validated by the tokenizer).
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let hi = u32::from_str_radix(&hex, 16).unwrap_or(0xFFFD);
                let code = if (0xD800..0xDC00).contains(&hi) {
                    // A high surrogate is followed by `\uXXXX` with the low one (checked).
                    let _ = chars.next();
                    let _ = chars.next();
                    let lo: String = chars.by_ref().take(4).collect();
                    let lo = u32::from_str_radix(&lo, 16).unwrap_or(0xDC00);
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Tokenizes one JSON object into `tape`.
fn tokenize(text: &str, tape: &mut Vec<Tok>, stack: &mut Vec<usize>) -> Result<(), JsonError> {
    tape.clear();
    stack.clear();
    let bytes = text.as_bytes();
    let mut i = skip_ws(bytes, 0);
    match bytes.get(i) {
        Some(b'{') => {}
        None => return Err(syntax("empty input", i)),
        Some(_) => {
            return Err(match value_kind_name(bytes, i) {
                Some(kind) => {
                    // Still report bad JSON as such: `[1,` is not "an array".
                    let mut scratch = Vec::new();
                    let mut stack2 = Vec::new();
                    match tokenize_any(bytes, i, &mut scratch, &mut stack2) {
                        Ok(_) => JsonError::NotAnObject(kind),
                        Err(e) => e,
                    }
                }
                None => syntax("expected a value", i),
            });
        }
    }
    i = tokenize_any(bytes, i, tape, stack)?;
    let end = skip_ws(bytes, i);
    if end != bytes.len() {
        return Err(syntax("trailing characters", end));
    }
    Ok(())
}

/// `bytes` as text, if UTF-8 and small enough for the tape's 32-bit offsets.
fn utf8(bytes: &[u8]) -> Result<&str, JsonError> {
    if bytes.len() > u32::MAX as usize {
        return Err(JsonError::TooLarge);
    }
    std::str::from_utf8(bytes).map_err(|e| syntax("invalid UTF-8", e.valid_up_to()))
}

fn value_kind_name(bytes: &[u8], i: usize) -> Option<&'static str> {
    Some(match bytes[i] {
        b'[' => "array",
        b'"' => "string",
        b't' | b'f' => "boolean",
        b'n' => "null",
        b'-' | b'0'..=b'9' => {
            let rest = &bytes[i..];
            let end = rest
                .iter()
                .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                .unwrap_or(rest.len());
            if rest[..end].iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
                "number with fraction"
            } else {
                "integer"
            }
        }
        _ => return None,
    })
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(i) {
        i += 1;
    }
    i
}

/// What the tokenizer expects next inside the innermost container.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (array item or object field value).
    Value,
    /// A key or `}` (right after `{`).
    FirstKey,
    /// A key (after a comma).
    Key,
    /// A value or `]` (right after `[`).
    FirstItem,
    /// `,` or the closing bracket.
    CommaOrEnd,
}

/// Tokenizes one value starting at `i`; returns the index after it.
fn tokenize_any(
    bytes: &[u8],
    mut i: usize,
    tape: &mut Vec<Tok>,
    stack: &mut Vec<usize>,
) -> Result<usize, JsonError> {
    let mut expect = Expect::Value;
    loop {
        i = skip_ws(bytes, i);
        let Some(&b) = bytes.get(i) else {
            return Err(syntax("unexpected end of input", i));
        };
        match expect {
            Expect::CommaOrEnd => {
                let open = *stack.last().expect("inside a container");
                let in_object = tape[open].kind == Kind::Object;
                match (b, in_object) {
                    (b',', true) => {
                        expect = Expect::Key;
                        i += 1;
                        continue;
                    }
                    (b',', false) => {
                        expect = Expect::Value;
                        i += 1;
                        continue;
                    }
                    (b'}', true) | (b']', false) => {
                        close(bytes, tape, stack, i, in_object)?;
                        i += 1;
                        if stack.is_empty() {
                            return Ok(i);
                        }
                        expect = Expect::CommaOrEnd;
                        continue;
                    }
                    _ => return Err(syntax("expected ',' or a closing bracket", i)),
                }
            }
            Expect::FirstKey | Expect::Key => {
                if b == b'}' && expect == Expect::FirstKey {
                    close(bytes, tape, stack, i, true)?;
                    i += 1;
                    if stack.is_empty() {
                        return Ok(i);
                    }
                    expect = Expect::CommaOrEnd;
                    continue;
                }
                if b != b'"' {
                    return Err(syntax("expected a string key", i));
                }
                let (end, escaped) = scan_string(bytes, i)?;
                tape.push(Tok::spanning(Kind::Key, escaped, i, end));
                i = skip_ws(bytes, end);
                if bytes.get(i) != Some(&b':') {
                    return Err(syntax("expected ':' after a key", i));
                }
                i += 1;
                expect = Expect::Value;
                continue;
            }
            Expect::FirstItem if b == b']' => {
                close(bytes, tape, stack, i, false)?;
                i += 1;
                if stack.is_empty() {
                    return Ok(i);
                }
                expect = Expect::CommaOrEnd;
                continue;
            }
            Expect::Value | Expect::FirstItem => {}
        }
        // A value.
        match b {
            b'{' | b'[' => {
                if stack.len() >= MAX_DEPTH {
                    return Err(JsonError::TooDeep);
                }
                stack.push(tape.len());
                let object = b == b'{';
                tape.push(Tok {
                    kind: if object { Kind::Object } else { Kind::Array },
                    flag: false,
                    pos: i as u32,
                    len: 0,
                });
                i += 1;
                expect = if object {
                    Expect::FirstKey
                } else {
                    Expect::FirstItem
                };
                continue;
            }
            b'"' => {
                let (end, escaped) = scan_string(bytes, i)?;
                tape.push(Tok::spanning(Kind::String, escaped, i, end));
                i = end;
            }
            b't' | b'f' | b'n' => {
                let (word, kind): (&[u8], Kind) = match b {
                    b't' => (b"true", Kind::True),
                    b'f' => (b"false", Kind::False),
                    _ => (b"null", Kind::Null),
                };
                if !bytes[i..].starts_with(word) {
                    return Err(syntax("invalid literal", i));
                }
                tape.push(Tok::spanning(kind, false, i, i + word.len()));
                i += word.len();
            }
            b'-' | b'0'..=b'9' => {
                let (end, fraction) = scan_number(bytes, i)?;
                tape.push(Tok::spanning(Kind::Number, fraction, i, end));
                i = end;
            }
            _ => return Err(syntax("expected a value", i)),
        }
        if stack.is_empty() {
            return Ok(i);
        }
        expect = Expect::CommaOrEnd;
    }
}

/// Closes the innermost container at byte `i`, checking its keys are unique.
fn close(
    bytes: &[u8],
    tape: &mut Vec<Tok>,
    stack: &mut Vec<usize>,
    i: usize,
    object: bool,
) -> Result<(), JsonError> {
    let open = stack.pop().expect("inside a container");
    let end = tape.len();
    tape[open].len = end as u32;
    tape.push(Tok {
        kind: Kind::End,
        flag: false,
        pos: i as u32,
        len: 1,
    });
    if object {
        check_unique_keys(bytes, tape, open)?;
    }
    Ok(())
}

/// Duplicate keys: a linear scan for small objects, a hash set for wide ones.
fn check_unique_keys(bytes: &[u8], tape: &[Tok], open: usize) -> Result<(), JsonError> {
    const LINEAR: usize = 16;
    let end = tape[open].len as usize;
    let raw = |t: &Tok| &bytes[t.pos as usize + 1..(t.pos + t.len) as usize - 1];
    let mut small: [Option<&Tok>; LINEAR] = [None; LINEAR];
    let mut count = 0;
    let mut wide: Option<std::collections::HashSet<Cow<'_, [u8]>>> = None;
    let mut any_escaped = false;
    let mut i = open + 1;
    while i < end {
        let key = &tape[i];
        any_escaped |= key.flag;
        if let Some(set) = &mut wide {
            if !set.insert(key_bytes(raw(key), key.flag)) {
                return Err(duplicate(raw(key)));
            }
        } else if count < LINEAR {
            let this = raw(key);
            for other in small[..count].iter().flatten() {
                let same = if any_escaped {
                    key_bytes(this, key.flag) == key_bytes(raw(other), other.flag)
                } else {
                    raw(other) == this
                };
                if same {
                    return Err(duplicate(this));
                }
            }
            small[count] = Some(key);
            count += 1;
        } else {
            let mut set: std::collections::HashSet<Cow<'_, [u8]>> = small
                .iter()
                .flatten()
                .map(|t| key_bytes(raw(t), t.flag))
                .collect();
            if !set.insert(key_bytes(raw(key), key.flag)) {
                return Err(duplicate(raw(key)));
            }
            wide = Some(set);
        }
        i += 1;
        i = match tape[i].kind {
            Kind::Object | Kind::Array => tape[i].len as usize + 1,
            _ => i + 1,
        };
    }
    Ok(())
}

fn key_bytes(raw: &[u8], escaped: bool) -> Cow<'_, [u8]> {
    if escaped {
        Cow::Owned(unescape(std::str::from_utf8(raw).unwrap_or_default()).into_bytes())
    } else {
        Cow::Borrowed(raw)
    }
}

fn duplicate(raw: &[u8]) -> JsonError {
    let text = std::str::from_utf8(raw).unwrap_or_default();
    JsonError::DuplicateKey(unescape(text))
}

/// Scans a string starting at its opening quote; returns the index after the closing
/// quote and whether it has escapes.
fn scan_string(bytes: &[u8], start: usize) -> Result<(usize, bool), JsonError> {
    let mut i = start + 1;
    let mut escaped = false;
    loop {
        i = skip_plain(bytes, i);
        let Some(&b) = bytes.get(i) else {
            return Err(syntax("unterminated string", start));
        };
        match b {
            b'"' => return Ok((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                match bytes.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                    Some(b'u') => {
                        let code = hex4(bytes, i + 2).ok_or_else(|| syntax("bad \\u escape", i))?;
                        i += 6;
                        if (0xD800..0xDC00).contains(&code) {
                            let low = (bytes.get(i) == Some(&b'\\')
                                && bytes.get(i + 1) == Some(&b'u'))
                            .then(|| hex4(bytes, i + 2))
                            .flatten()
                            .filter(|c| (0xDC00..0xE000).contains(c));
                            if low.is_none() {
                                return Err(syntax("lone surrogate in \\u escape", i));
                            }
                            i += 6;
                        } else if (0xDC00..0xE000).contains(&code) {
                            return Err(syntax("lone surrogate in \\u escape", i));
                        }
                    }
                    _ => return Err(syntax("invalid escape", i)),
                }
            }
            0x00..=0x1F => return Err(syntax("control character in string", i)),
            _ => i += 1,
        }
    }
}

/// The index of the first byte at or after `i` that a string scan must look at (a
/// quote, a backslash or a control character), or where fewer than eight bytes are
/// left. Eight bytes at a time: most of a record's text is plain string content.
pub(super) fn skip_plain(bytes: &[u8], mut i: usize) -> usize {
    use floe_json_scan::has_byte;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // Bytes below 0x20: subtracting 0x20 sets their high bit, and `!w` keeps only
        // bytes that had none (like `has_byte`, exact for the lowest flagged byte).
        let control = w.wrapping_sub(0x2020_2020_2020_2020) & !w & 0x8080_8080_8080_8080;
        let special = has_byte(w, b'"') | has_byte(w, b'\\') | control;
        if special != 0 {
            return i + (special.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = bytes.get(at..at + 4)?;
    let mut v = 0;
    for &d in digits {
        v = v * 16 + (d as char).to_digit(16)?;
    }
    Some(v)
}

/// Scans a number; returns the index after it and whether it has a fraction or exponent.
fn scan_number(bytes: &[u8], start: usize) -> Result<(usize, bool), JsonError> {
    let mut i = start;
    let digit = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    if bytes.get(i) == Some(&b'-') {
        i += 1;
    }
    match bytes.get(i) {
        Some(b'0') => {
            i += 1;
            if digit(i) {
                return Err(syntax("leading zero in number", start));
            }
        }
        Some(b'1'..=b'9') => {
            while digit(i) {
                i += 1;
            }
        }
        _ => return Err(syntax("invalid number", start)),
    }
    let mut fraction = false;
    if bytes.get(i) == Some(&b'.') {
        fraction = true;
        i += 1;
        if !digit(i) {
            return Err(syntax("invalid number", start));
        }
        while digit(i) {
            i += 1;
        }
    }
    if let Some(b'e' | b'E') = bytes.get(i) {
        fraction = true;
        i += 1;
        if let Some(b'+' | b'-') = bytes.get(i) {
            i += 1;
        }
        if !digit(i) {
            return Err(syntax("invalid number", start));
        }
        while digit(i) {
            i += 1;
        }
    }
    Ok((i, fraction))
}

mod patch;
mod writer;

pub(crate) use patch::INLINE_OPS;
pub use writer::JsonWriter;

#[cfg(test)]
mod tests;
