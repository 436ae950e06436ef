//! Building a [`JsonObject`] (text and tape together) without parsing.

use std::cell::RefCell;
use std::ops::Range;

use smallvec::SmallVec;

use super::{Arr, JsonObject, JsonView, Kind, Obj, Tok, Value};

thread_local! {
    /// Buffers of objects handed back with [`JsonObject::recycle`], taken by the next
    /// writer on the same thread. A plugin chain writes a new object for every patched
    /// record and drops the one before: reusing the buffers saves an allocation and a
    /// free of the text and of the tape for each.
    static SPARE: RefCell<Spare> = const {
        RefCell::new(Spare {
            buffers: Vec::new(),
            bytes: 0,
        })
    };
}

/// Spare buffers of one thread and the bytes they hold.
struct Spare {
    buffers: Vec<(Vec<u8>, Vec<Tok>)>,
    bytes: usize,
}

/// The most spare buffers a thread keeps: a whole batch of records (the records of a
/// batch come back from the pipeline only after the batch's last part has run, so a
/// thread keeping a few parts' worth allocated afresh for most of each batch).
const SPARE_MAX: usize = 8192;

/// The most bytes of spare buffers a thread keeps: what a thread holds between batches
/// stays small whatever the records' size.
pub(super) const SPARE_TOTAL_BYTES_MAX: usize = 2 << 20;

/// Bytes held by a text and a tape.
fn held(text: &Vec<u8>, tape: &Vec<Tok>) -> usize {
    text.capacity() + tape.capacity() * std::mem::size_of::<Tok>()
}

/// `buf` emptied, with room for `n` items: a recycled buffer too small for them is
/// replaced by a new one a power of two in size (growing it would copy it, and an
/// exact fit would be too small again for the next, slightly longer record).
fn room<T>(mut buf: Vec<T>, n: usize) -> Vec<T> {
    buf.clear();
    if buf.capacity() < n {
        buf = Vec::with_capacity(n.next_power_of_two());
    }
    buf
}

/// Bytes of spare buffers this thread holds.
#[cfg(test)]
pub(super) fn spare_bytes() -> usize {
    SPARE.with_borrow(|spare| spare.bytes)
}

impl JsonObject {
    /// Drops the object, keeping its buffers for the next [`JsonWriter`] on this thread
    /// (up to a bound: past 8,192 buffers or 2 MiB, they are freed).
    pub fn recycle(self) {
        let (text, tape) = (self.text.into_bytes(), self.tape);
        let bytes = held(&text, &tape);
        SPARE.with_borrow_mut(|spare| {
            if spare.buffers.len() < SPARE_MAX && spare.bytes + bytes <= SPARE_TOTAL_BYTES_MAX {
                spare.bytes += bytes;
                spare.buffers.push((text, tape));
            }
        });
    }
}

/// Writes one JSON object, producing its text and tape at once. Used by decoders of
/// other formats (Avro, Protobuf) and by patches. The caller writes a well-formed
/// object (keys unique, every `begin` closed); misuse panics in debug builds only.
#[derive(Debug, Default)]
pub struct JsonWriter {
    /// Built from `&str` pieces and ASCII only: a `String` from the start, so the
    /// finished object needs no UTF-8 check (it cost every patched record one).
    bytes: String,
    tape: Vec<Tok>,
    /// Open containers: tape index and whether a member was written (on the stack for
    /// the usual few levels).
    stack: SmallVec<[(usize, bool); 8]>,
    /// A key was written; its value comes next without a comma.
    after_key: bool,
}

impl JsonWriter {
    /// An empty writer.
    pub fn new() -> JsonWriter {
        JsonWriter::default()
    }

    /// An empty writer with room for `bytes` bytes of text (in buffers of a recycled
    /// object when this thread has one).
    pub fn with_capacity(bytes: usize) -> JsonWriter {
        Self::with_room(bytes, bytes / 8)
    }

    /// An empty writer with room for `bytes` bytes of text and `tokens` tokens.
    pub(super) fn with_room(bytes: usize, tokens: usize) -> JsonWriter {
        let (text, tape) = SPARE
            .with_borrow_mut(|spare| {
                let (text, tape) = spare.buffers.pop()?;
                spare.bytes -= held(&text, &tape);
                Some((text, tape))
            })
            .unwrap_or_default();
        JsonWriter {
            // Emptied: the check of its (no) text costs nothing.
            bytes: String::from_utf8(room(text, bytes)).expect("an empty buffer"),
            tape: room(tape, tokens),
            ..JsonWriter::default()
        }
    }

    fn separate(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some((_, written)) = self.stack.last_mut() {
            if *written {
                self.bytes.push(',');
            }
            *written = true;
        }
    }

    fn push(&mut self, kind: Kind, flag: bool, start: usize) {
        self.tape.push(Tok {
            kind,
            flag,
            pos: start as u32,
            len: (self.bytes.len() - start) as u32,
        });
    }

    fn open(&mut self, kind: Kind, bracket: char) {
        self.separate();
        self.stack.push((self.tape.len(), false));
        self.tape.push(Tok {
            kind,
            flag: false,
            pos: self.bytes.len() as u32,
            len: 0,
        });
        self.bytes.push(bracket);
    }

    fn close(&mut self, bracket: char) {
        let (open, _) = self.stack.pop().expect("a container is open");
        debug_assert!(!self.after_key, "a key without a value");
        let end = self.tape.len();
        self.tape[open].len = end as u32;
        self.tape.push(Tok {
            kind: Kind::End,
            flag: false,
            pos: self.bytes.len() as u32,
            len: 1,
        });
        self.bytes.push(bracket);
    }

    /// `{`.
    pub fn begin_object(&mut self) {
        self.open(Kind::Object, '{');
    }

    /// `}`.
    pub fn end_object(&mut self) {
        self.close('}');
    }

    /// `[`.
    pub fn begin_array(&mut self) {
        self.open(Kind::Array, '[');
    }

    /// `]`.
    pub fn end_array(&mut self) {
        self.close(']');
    }

    /// An object key (its value must follow).
    pub fn key(&mut self, key: &str) {
        self.separate();
        let start = self.bytes.len();
        let escaped = write_string(&mut self.bytes, key);
        self.push(Kind::Key, escaped, start);
        self.bytes.push(':');
        self.after_key = true;
    }

    /// An object key given as quoted JSON text (copied as is).
    pub(super) fn key_quoted(&mut self, quoted: &str, escaped: bool) {
        self.separate();
        let start = self.bytes.len();
        self.bytes.push_str(quoted);
        self.push(Kind::Key, escaped, start);
        self.bytes.push(':');
        self.after_key = true;
    }

    /// `null`.
    pub fn null(&mut self) {
        self.literal(Kind::Null, "null");
    }

    /// `true` or `false`.
    pub fn bool(&mut self, b: bool) {
        if b {
            self.literal(Kind::True, "true");
        } else {
            self.literal(Kind::False, "false");
        }
    }

    fn literal(&mut self, kind: Kind, text: &str) {
        self.separate();
        let start = self.bytes.len();
        self.bytes.push_str(text);
        self.push(kind, false, start);
    }

    /// An integer.
    pub fn i64(&mut self, v: i64) {
        self.separate();
        let start = self.bytes.len();
        self.bytes.push_str(itoa::Buffer::new().format(v));
        self.push(Kind::Number, false, start);
    }

    /// A float, always written with a fraction or exponent (`1.0`, not `1`), so that it
    /// reads back as a floating-point value. NaN and the infinities, which JSON has no
    /// numbers for, are written as the strings `"NaN"`, `"inf"`, `"-inf"`.
    pub fn f64(&mut self, v: f64) {
        if !v.is_finite() {
            let text = if v.is_nan() {
                "NaN"
            } else if v > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            return self.string(text);
        }
        self.separate();
        let start = self.bytes.len();
        self.bytes.push_str(ryu::Buffer::new().format_finite(v));
        self.push(Kind::Number, true, start);
    }

    /// A string.
    pub fn string(&mut self, s: &str) {
        self.separate();
        let start = self.bytes.len();
        let escaped = write_string(&mut self.bytes, s);
        self.push(Kind::String, escaped, start);
    }

    /// A copy of a value of another parsed object (text and tape, no parsing).
    pub fn value(&mut self, v: Value<'_>) {
        match v {
            Value::Null => self.null(),
            Value::Bool(b) => self.bool(b),
            Value::Number(n) => {
                self.separate();
                let start = self.bytes.len();
                self.bytes.push_str(n.text());
                self.push(Kind::Number, n.has_fraction(), start);
            }
            Value::String(s) => {
                self.separate();
                let start = self.bytes.len();
                self.bytes.push_str(s.quoted());
                self.push(Kind::String, s.escaped, start);
            }
            Value::Object(Obj { view, at }) | Value::Array(Arr { view, at }) => {
                self.separate();
                let end = view.tape[at].len as usize;
                self.copy(view, view.span(at), at..end + 1);
            }
        }
    }

    /// Copies the members `view.tape[from..to]` of an object (whole members: keys and
    /// values) into the object being written, as they are written there (with what lies
    /// between them): one copy for a run of fields a patch leaves alone.
    pub(super) fn members(&mut self, view: JsonView<'_>, from: usize, to: usize) {
        debug_assert!(!self.after_key && from < to);
        self.separate();
        // The last token of a member is a scalar or a closing bracket: its text ends
        // at `pos + len`.
        let last = view.tape[to - 1];
        let span = view.tape[from].pos as usize..(last.pos + last.len) as usize;
        self.copy(view, span, from..to);
    }

    /// Appends the text `span` of `view` and its tokens `tokens`, moved to where they
    /// land here.
    fn copy(&mut self, view: JsonView<'_>, span: Range<usize>, tokens: Range<usize>) {
        let byte_shift = self.bytes.len() as i64 - span.start as i64;
        let tape_shift = self.tape.len() as i64 - tokens.start as i64;
        self.bytes.push_str(&view.text[span]);
        // One reservation for the run (an exact-size iterator), not a check per token.
        self.tape.extend(view.tape[tokens].iter().map(|t| {
            let mut t = *t;
            t.pos = (t.pos as i64 + byte_shift) as u32;
            if matches!(t.kind, Kind::Object | Kind::Array) {
                t.len = (t.len as i64 + tape_shift) as u32;
            }
            t
        }));
    }

    /// The finished object. Panics if the writer does not hold exactly one closed object.
    pub fn finish(self) -> JsonObject {
        assert!(
            self.stack.is_empty() && self.tape.first().map(|t| t.kind) == Some(Kind::Object),
            "JsonWriter::finish: not one complete object"
        );
        JsonObject {
            text: self.bytes,
            tape: self.tape,
        }
    }

    /// The text written so far (for writers of non-object values, e.g. keys).
    pub fn into_text(self) -> Vec<u8> {
        self.bytes.into_bytes()
    }
}

/// Writes `s` as a JSON string; returns whether an escape was written.
pub(super) fn write_string(out: &mut String, s: &str) -> bool {
    let bytes = s.as_bytes();
    // Text with nothing to escape (the usual name) is copied whole, found plain eight
    // bytes at a time rather than by a match per byte: names are written for every
    // patched record.
    let plain = super::skip_plain(bytes, 0);
    if bytes[plain..]
        .iter()
        .all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
    {
        out.reserve(bytes.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return false;
    }
    out.push('"');
    let mut escaped = false;
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `i` is at an ASCII byte: a character boundary.
        out.push_str(&s[from..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[(b >> 4) as usize]));
            out.push(char::from(HEX[(b & 15) as usize]));
        } else {
            out.push_str(esc);
        }
        escaped = true;
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
    escaped
}
