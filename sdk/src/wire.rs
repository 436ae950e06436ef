//! The batch buffers of the plugin contract (`wit/transform.wit` describes the
//! layout): one buffer of records into a plugin, one buffer of answers out.
//!
//! Plugin authors never use this module: the SDK reads the input and writes the
//! answers for them. The agent uses it to write inputs and read answers, and the test
//! harness uses both sides, so the plugin under test goes through the same bytes as in
//! WebAssembly. Readers never panic on malformed buffers: they return a [`WireError`].

use std::fmt;

/// `u32` length meaning "absent" (no key, no route).
pub const NONE: u32 = u32::MAX;
/// Timestamp meaning "absent".
pub const NO_TIMESTAMP: i64 = i64::MIN;

/// Answer tags.
pub mod tag {
    /// The input goes on unchanged.
    pub const UNCHANGED: u8 = 0;
    /// The input produces nothing.
    pub const DROPPED: u8 = 1;
    /// The input goes on with a patch applied.
    pub const PATCH: u8 = 2;
    /// The input is replaced by zero or more new objects.
    pub const EMIT: u8 = 3;
    /// A record error.
    pub const ERROR: u8 = 4;
}

/// Patch operation kinds.
pub mod op {
    /// Sets a value at a path.
    pub const SET: u8 = 0;
    /// Removes the value at a path.
    pub const REMOVE: u8 = 1;
    /// Renames the field at a path, keeping its place in its object.
    pub const RENAME: u8 = 2;
}

/// A malformed buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

fn err<T>(what: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(what.into()))
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("buffers stay below 4 GiB")
}

/// Appends `u32 len` and the bytes.
fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(buf, len32(bytes.len()));
    buf.extend_from_slice(bytes);
}

/// Appends an optional route.
fn put_route(buf: &mut Vec<u8>, route: Option<&str>) {
    match route {
        Some(r) => put_bytes(buf, r.as_bytes()),
        None => put_u32(buf, NONE),
    }
}

/// Appends a path of keys.
pub fn put_path<'k>(buf: &mut Vec<u8>, keys: impl Iterator<Item = &'k str> + Clone) {
    put_u32(buf, len32(keys.clone().count()));
    for key in keys {
        put_bytes(buf, key.as_bytes());
    }
}

/// A reading position in a buffer.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// Reads `buf` from the start.
    pub fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// Whether everything was read.
    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let out = &self.buf[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            _ => err(format!(
                "buffer ends early: {n} bytes wanted at {} of {}",
                self.pos,
                self.buf.len()
            )),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let b = self.bytes(N)?;
        let mut out = [0; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian `i32`.
    pub fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    /// A little-endian `i64`.
    pub fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// `u32 len` and that many bytes.
    pub fn sized(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }

    /// An optional `u32 len` + bytes (`NONE` is absent).
    pub fn optional(&mut self) -> Result<Option<&'a [u8]>, WireError> {
        match self.u32()? {
            NONE => Ok(None),
            n => self.bytes(n as usize).map(Some),
        }
    }

    /// A count that cannot exceed what the rest of the buffer could hold, given that
    /// each item takes at least `min_size` bytes.
    pub fn count(&mut self, min_size: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        let left = self.buf.len() - self.pos;
        if n.saturating_mul(min_size.max(1)) > left {
            return err(format!("count {n} cannot fit in the {left} bytes left"));
        }
        Ok(n)
    }
}

/// Writes an input buffer: the topic table first, then each record.
#[derive(Debug)]
pub struct InputWriter<'b> {
    buf: &'b mut Vec<u8>,
    /// Whether records carry the field index (contract 0.2.2 and later).
    indexed: bool,
}

/// Bytes of a record's fixed header in the input buffer.
pub const RECORD_HEADER: usize = 32;

/// Bytes of one entry of a record's field index.
pub const FIELD_ENTRY: usize = 16;

/// Bit of an index entry's key start that says the key holds a backslash escape.
pub const ESCAPED_KEY: u32 = 1 << 31;

/// Where one top-level member of a record's value lies in the value's text: what the
/// field index (contract 0.2.2) lists for each member, so that a plugin reads a field
/// without scanning the text before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpan {
    /// Byte range of the key, quotes included.
    pub key: (u32, u32),
    /// Whether the key holds a backslash escape.
    pub escaped: bool,
    /// Byte range of the value.
    pub value: (u32, u32),
}

impl<'b> InputWriter<'b> {
    /// Starts a batch of `records` records whose topics are `topics` (clears `buf`),
    /// in the layout of contract 0.2.1 and earlier: no field index.
    pub fn new(buf: &'b mut Vec<u8>, records: usize, topics: &[&str]) -> InputWriter<'b> {
        buf.clear();
        put_u32(buf, len32(records));
        put_u32(buf, len32(topics.len()));
        for t in topics {
            put_bytes(buf, t.as_bytes());
        }
        InputWriter {
            buf,
            indexed: false,
        }
    }

    /// Starts a batch like [`InputWriter::new`], in the layout of this contract: each
    /// record followed by its field index.
    pub fn indexed(buf: &'b mut Vec<u8>, records: usize, topics: &[&str]) -> InputWriter<'b> {
        let mut writer = InputWriter::new(buf, records, topics);
        writer.indexed = true;
        writer
    }

    /// Appends one record; `topic` is an index into the topic table. `fields` are the
    /// value's top-level members in order, read only by an indexed writer (`None` sends
    /// no index, and the plugin scans the text).
    #[allow(clippy::too_many_arguments)]
    pub fn push<I: IntoIterator<Item = FieldSpan>>(
        &mut self,
        value: &[u8],
        key: Option<&[u8]>,
        topic: u32,
        partition: i32,
        offset: i64,
        timestamp_ms: Option<i64>,
        fields: Option<I>,
    ) {
        let buf = &mut *self.buf;
        // Room for a record of a dozen fields: written without growing as a rule.
        let index = if self.indexed {
            4 + 12 * FIELD_ENTRY
        } else {
            0
        };
        buf.reserve(RECORD_HEADER + value.len() + key.map_or(0, <[u8]>::len) + index);
        let mut header = [0u8; RECORD_HEADER];
        header[0..4].copy_from_slice(&len32(value.len()).to_le_bytes());
        header[4..8].copy_from_slice(&key.map_or(NONE, |k| len32(k.len())).to_le_bytes());
        header[8..12].copy_from_slice(&topic.to_le_bytes());
        header[12..16].copy_from_slice(&partition.to_le_bytes());
        header[16..24].copy_from_slice(&offset.to_le_bytes());
        header[24..32].copy_from_slice(&timestamp_ms.unwrap_or(NO_TIMESTAMP).to_le_bytes());
        buf.extend_from_slice(&header);
        buf.extend_from_slice(value);
        if let Some(k) = key {
            buf.extend_from_slice(k);
        }
        if !self.indexed {
            return;
        }
        let Some(fields) = fields else {
            put_u32(buf, NONE);
            return;
        };
        // The count goes first and is known last: written over a placeholder.
        let count_at = buf.len();
        put_u32(buf, 0);
        let mut count = 0u32;
        for f in fields {
            let start = f.key.0 | if f.escaped { ESCAPED_KEY } else { 0 };
            let mut entry = [0u8; FIELD_ENTRY];
            entry[0..4].copy_from_slice(&start.to_le_bytes());
            entry[4..8].copy_from_slice(&f.key.1.to_le_bytes());
            entry[8..12].copy_from_slice(&f.value.0.to_le_bytes());
            entry[12..16].copy_from_slice(&f.value.1.to_le_bytes());
            buf.extend_from_slice(&entry);
            count += 1;
        }
        buf[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    }
}

/// One record read from an input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputRecord<'a> {
    /// The value's JSON text.
    pub value: &'a [u8],
    /// The key bytes.
    pub key: Option<&'a [u8]>,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The timestamp in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// The value's field index (entries of [`FIELD_ENTRY`] bytes), if the host sent one.
    pub fields: Option<&'a [u8]>,
}

/// Reads an input buffer (the layout of this contract: with field indexes).
#[derive(Debug, Clone)]
pub struct InputReader<'a> {
    cursor: Cursor<'a>,
    topics: Vec<&'a str>,
    left: usize,
}

impl<'a> InputReader<'a> {
    /// Reads the header and topic table.
    pub fn new(buf: &'a [u8]) -> Result<InputReader<'a>, WireError> {
        let mut cursor = Cursor::new(buf);
        let records = cursor.u32()? as usize;
        let n = cursor.count(4)?;
        let mut topics = Vec::with_capacity(n);
        for _ in 0..n {
            let t = cursor.sized()?;
            topics
                .push(std::str::from_utf8(t).map_err(|_| WireError("topic is not UTF-8".into()))?);
        }
        Ok(InputReader {
            cursor,
            topics,
            left: records,
        })
    }

    /// Records not read yet.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether every record was read.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next record.
    pub fn next_record(&mut self) -> Option<Result<InputRecord<'a>, WireError>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(self.read())
    }

    fn read(&mut self) -> Result<InputRecord<'a>, WireError> {
        let c = &mut self.cursor;
        // The fixed header in one bounds check rather than one per field: this runs for
        // every record, inside the guest.
        let header: &[u8; RECORD_HEADER] = c.bytes(RECORD_HEADER)?.try_into().expect("sized");
        let u32_at = |at: usize| u32::from_le_bytes(*header[at..].first_chunk().expect("in"));
        let i64_at = |at: usize| i64::from_le_bytes(*header[at..].first_chunk().expect("in"));
        let value_len = u32_at(0) as usize;
        let key_len = u32_at(4);
        let topic = u32_at(8) as usize;
        let partition = u32_at(12) as i32;
        let offset = i64_at(16);
        let timestamp = i64_at(24);
        let value = c.bytes(value_len)?;
        let key = match key_len {
            NONE => None,
            n => Some(c.bytes(n as usize)?),
        };
        let fields = match c.u32()? {
            NONE => None,
            n => Some(c.bytes((n as usize).saturating_mul(FIELD_ENTRY))?),
        };
        let topic = *self
            .topics
            .get(topic)
            .ok_or_else(|| WireError(format!("topic index {topic} out of range")))?;
        Ok(InputRecord {
            value,
            key,
            topic,
            partition,
            offset,
            timestamp_ms: (timestamp != NO_TIMESTAMP).then_some(timestamp),
            fields,
        })
    }
}

/// Writes an output buffer, one answer per input record, in order.
#[derive(Debug)]
pub struct AnswerWriter {
    buf: Vec<u8>,
}

impl AnswerWriter {
    /// Starts the answers to `records` records.
    pub fn new(records: usize, capacity: usize) -> AnswerWriter {
        let mut buf = Vec::with_capacity(capacity.max(4));
        put_u32(&mut buf, len32(records));
        AnswerWriter { buf }
    }

    /// The input goes on unchanged.
    pub fn unchanged(&mut self, route: Option<&str>) {
        self.buf.push(tag::UNCHANGED);
        put_route(&mut self.buf, route);
    }

    /// The input produces nothing.
    pub fn dropped(&mut self) {
        self.buf.push(tag::DROPPED);
    }

    /// A patch: `ops` holds `count` encoded operations (see [`put_set`], [`put_remove`]).
    pub fn patch(&mut self, route: Option<&str>, count: u32, ops: &[u8]) {
        self.buf.push(tag::PATCH);
        put_route(&mut self.buf, route);
        put_u32(&mut self.buf, count);
        self.buf.extend_from_slice(ops);
    }

    /// New objects replacing the input, each with its route.
    pub fn emit<'e>(
        &mut self,
        outputs: impl ExactSizeIterator<Item = (Option<&'e str>, &'e [u8])>,
    ) {
        self.buf.push(tag::EMIT);
        put_u32(&mut self.buf, len32(outputs.len()));
        for (route, json) in outputs {
            put_route(&mut self.buf, route);
            put_bytes(&mut self.buf, json);
        }
    }

    /// A record error.
    pub fn error(&mut self, message: &str) {
        self.buf.push(tag::ERROR);
        put_bytes(&mut self.buf, message.as_bytes());
    }

    /// The buffer.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Appends a `set` operation.
pub fn put_set<'k>(ops: &mut Vec<u8>, keys: impl Iterator<Item = &'k str> + Clone, value: &[u8]) {
    ops.push(op::SET);
    put_path(ops, keys);
    put_bytes(ops, value);
}

/// Appends a `remove` operation.
pub fn put_remove<'k>(ops: &mut Vec<u8>, keys: impl Iterator<Item = &'k str> + Clone) {
    ops.push(op::REMOVE);
    put_path(ops, keys);
}

/// Appends a `rename` operation: the field at `keys` gets the name `to`.
pub fn put_rename<'k>(ops: &mut Vec<u8>, keys: impl Iterator<Item = &'k str> + Clone, to: &str) {
    ops.push(op::RENAME);
    put_path(ops, keys);
    put_bytes(ops, to.as_bytes());
}

/// One answer read from an output buffer. Text fields are raw bytes: the reader checks
/// the structure, the caller decides what to do with bytes that are not UTF-8.
#[derive(Debug, Clone)]
pub enum Answer<'a> {
    /// The input goes on unchanged.
    Unchanged {
        /// Output stream.
        route: Option<&'a [u8]>,
    },
    /// The input produces nothing.
    Dropped,
    /// The input goes on with a patch.
    Patch {
        /// Output stream.
        route: Option<&'a [u8]>,
        /// The operations.
        ops: Ops<'a>,
    },
    /// New objects.
    Emit {
        /// The outputs.
        outputs: Emits<'a>,
    },
    /// A record error.
    Error {
        /// The message.
        message: &'a [u8],
    },
}

/// One patch operation.
#[derive(Debug, Clone)]
pub enum Op<'a> {
    /// Sets the value at a path.
    Set {
        /// The keys.
        path: Path<'a>,
        /// One JSON value's text.
        value: &'a [u8],
    },
    /// Removes the value at a path.
    Remove {
        /// The keys.
        path: Path<'a>,
    },
    /// Renames the field at a path within its object, keeping its place; a field
    /// already named `to` there is replaced. Nothing happens when the path is absent.
    Rename {
        /// The keys.
        path: Path<'a>,
        /// The new name (raw bytes).
        to: &'a [u8],
    },
}

/// The keys of a path (already checked to be well formed).
#[derive(Debug, Clone)]
pub struct Path<'a> {
    cursor: Cursor<'a>,
    left: usize,
}

impl<'a> Iterator for Path<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.cursor.sized().ok()
    }
}

impl Path<'_> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether the path has no keys (a malformed patch).
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

fn read_path<'a>(c: &mut Cursor<'a>) -> Result<Path<'a>, WireError> {
    let n = c.count(4)?;
    let start = c.clone();
    for _ in 0..n {
        c.sized()?;
    }
    Ok(Path {
        cursor: start,
        left: n,
    })
}

fn read_op<'a>(c: &mut Cursor<'a>) -> Result<Op<'a>, WireError> {
    match c.u8()? {
        op::SET => {
            let path = read_path(c)?;
            let value = c.sized()?;
            Ok(Op::Set { path, value })
        }
        op::REMOVE => Ok(Op::Remove {
            path: read_path(c)?,
        }),
        op::RENAME => {
            let path = read_path(c)?;
            let to = c.sized()?;
            Ok(Op::Rename { path, to })
        }
        other => err(format!("unknown patch operation {other}")),
    }
}

/// The operations of a patch (already checked to be well formed).
#[derive(Debug, Clone)]
pub struct Ops<'a> {
    cursor: Cursor<'a>,
    left: usize,
}

impl<'a> Iterator for Ops<'a> {
    type Item = Op<'a>;

    fn next(&mut self) -> Option<Op<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        read_op(&mut self.cursor).ok()
    }
}

impl Ops<'_> {
    /// Number of operations.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

/// The outputs of an `emit` answer (already checked to be well formed).
#[derive(Debug, Clone)]
pub struct Emits<'a> {
    cursor: Cursor<'a>,
    left: usize,
}

impl<'a> Iterator for Emits<'a> {
    /// Route and JSON text.
    type Item = (Option<&'a [u8]>, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let route = self.cursor.optional().ok()?;
        let json = self.cursor.sized().ok()?;
        Some((route, json))
    }
}

impl Emits<'_> {
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

/// Reads an output buffer.
#[derive(Debug, Clone)]
pub struct AnswerReader<'a> {
    cursor: Cursor<'a>,
    left: usize,
    /// Answers announced in the header.
    pub count: usize,
}

impl<'a> AnswerReader<'a> {
    /// Reads the header.
    pub fn new(buf: &'a [u8]) -> Result<AnswerReader<'a>, WireError> {
        let mut cursor = Cursor::new(buf);
        let count = cursor.count(1)?;
        Ok(AnswerReader {
            cursor,
            left: count,
            count,
        })
    }

    /// The next answer, checked to be well formed; `None` after the last one.
    pub fn next_answer(&mut self) -> Option<Result<Answer<'a>, WireError>> {
        self.next_answer_with(|_| {})
    }

    /// [`AnswerReader::next_answer`], handing each operation of a patch to `each_op`
    /// as it is checked: a reader that needs every operation once reads them once
    /// (iterating the answer's `ops` reads them again). When the answer turns out
    /// malformed, the operations handed over so far belong to no answer.
    pub fn next_answer_with(
        &mut self,
        each_op: impl FnMut(Op<'a>),
    ) -> Option<Result<Answer<'a>, WireError>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let answer = self.read(each_op);
        if answer.is_err() {
            self.left = 0;
        }
        Some(answer)
    }

    /// Whether the buffer holds nothing after the last answer.
    pub fn at_end(&self) -> bool {
        self.cursor.at_end()
    }

    fn read(&mut self, mut each_op: impl FnMut(Op<'a>)) -> Result<Answer<'a>, WireError> {
        let c = &mut self.cursor;
        match c.u8()? {
            tag::UNCHANGED => Ok(Answer::Unchanged {
                route: c.optional()?,
            }),
            tag::DROPPED => Ok(Answer::Dropped),
            tag::PATCH => {
                let route = c.optional()?;
                let n = c.count(5)?;
                let start = c.clone();
                for _ in 0..n {
                    each_op(read_op(c)?);
                }
                Ok(Answer::Patch {
                    route,
                    ops: Ops {
                        cursor: start,
                        left: n,
                    },
                })
            }
            tag::EMIT => {
                let n = c.count(8)?;
                let start = c.clone();
                for _ in 0..n {
                    c.optional()?;
                    c.sized()?;
                }
                Ok(Answer::Emit {
                    outputs: Emits {
                        cursor: start,
                        left: n,
                    },
                })
            }
            tag::ERROR => Ok(Answer::Error {
                message: c.sized()?,
            }),
            other => err(format!("unknown answer tag {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_round_trip() {
        let mut buf = Vec::new();
        let fields = [FieldSpan {
            key: (1, 4),
            escaped: true,
            value: (5, 6),
        }];
        let mut w = InputWriter::indexed(&mut buf, 2, &["a", "bb"]);
        w.push(br#"{"x":1}"#, Some(b"k"), 1, 3, 42, Some(7), Some(fields));
        w.push(b"{}", None, 0, -1, 0, None, None::<[FieldSpan; 0]>);
        let mut r = InputReader::new(&buf).unwrap();
        assert_eq!(r.len(), 2);
        let first = r.next_record().unwrap().unwrap();
        let mut entry = Vec::new();
        for v in [1 | ESCAPED_KEY, 4, 5, 6] {
            entry.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(
            first,
            InputRecord {
                value: br#"{"x":1}"#,
                key: Some(b"k"),
                topic: "bb",
                partition: 3,
                offset: 42,
                timestamp_ms: Some(7),
                fields: Some(&entry),
            }
        );
        let second = r.next_record().unwrap().unwrap();
        assert_eq!(
            (second.topic, second.key, second.timestamp_ms, second.fields),
            ("a", None, None, None)
        );
        assert!(r.next_record().is_none());
        assert!(r.cursor.at_end());

        // The layout of contract 0.2.1 and earlier: no index, whatever is given.
        let mut old = Vec::new();
        let mut w = InputWriter::new(&mut old, 1, &["a"]);
        w.push(b"{}", None, 0, 0, 0, None, Some(fields));
        assert_eq!(old.len(), 4 + 4 + 4 + 1 + RECORD_HEADER + 2);
    }

    #[test]
    fn answers_round_trip() {
        let mut ops = Vec::new();
        put_set(&mut ops, ["a", "b"].into_iter(), b"1");
        put_remove(&mut ops, ["c"].into_iter());
        let mut w = AnswerWriter::new(5, 0);
        w.unchanged(Some("eu"));
        w.dropped();
        w.patch(None, 2, &ops);
        w.emit([(None, &b"{}"[..]), (Some("x"), &b"{\"a\":1}"[..])].into_iter());
        w.error("bad");
        let buf = w.finish();
        let mut r = AnswerReader::new(&buf).unwrap();
        assert_eq!(r.count, 5);
        assert!(matches!(
            r.next_answer(),
            Some(Ok(Answer::Unchanged { route: Some(b"eu") }))
        ));
        assert!(matches!(r.next_answer(), Some(Ok(Answer::Dropped))));
        let Some(Ok(Answer::Patch { route: None, ops })) = r.next_answer() else {
            panic!("patch")
        };
        let ops: Vec<Op<'_>> = ops.collect();
        assert!(
            matches!(&ops[0], Op::Set { path, value: b"1" } if path.clone().collect::<Vec<_>>() == [b"a", b"b"])
        );
        assert!(matches!(&ops[1], Op::Remove { path } if path.len() == 1));
        let Some(Ok(Answer::Emit { outputs })) = r.next_answer() else {
            panic!("emit")
        };
        let outputs: Vec<_> = outputs.collect();
        assert_eq!(outputs[1], (Some(&b"x"[..]), &b"{\"a\":1}"[..]));
        assert!(matches!(
            r.next_answer(),
            Some(Ok(Answer::Error { message: b"bad" }))
        ));
        assert!(r.next_answer().is_none());
        assert!(r.at_end());

        // Read again, the operations handed over as they are checked: the same ones
        // the answer's `ops` give, and only for the patch.
        let mut r = AnswerReader::new(&buf).unwrap();
        let mut handed = Vec::new();
        let mut iterated = Vec::new();
        while let Some(answer) = r.next_answer_with(|op| handed.push(format!("{op:?}"))) {
            if let Answer::Patch { ops, .. } = answer.unwrap() {
                iterated.extend(ops.map(|op| format!("{op:?}")));
            }
        }
        assert_eq!(handed.len(), 2);
        assert_eq!(handed, iterated);
    }

    #[test]
    fn malformed_buffers_are_errors_not_panics() {
        assert!(AnswerReader::new(&[1, 0]).is_err());
        assert!(
            AnswerReader::new(&[255, 255, 255, 255]).is_err(),
            "a count beyond the buffer"
        );
        let mut r = AnswerReader::new(&[1, 0, 0, 0, 9]).unwrap();
        assert!(r.next_answer().unwrap().is_err(), "unknown tag");
        let mut r = AnswerReader::new(&[1, 0, 0, 0, tag::ERROR, 10, 0, 0, 0, b'x']).unwrap();
        assert!(
            r.next_answer().unwrap().is_err(),
            "a message longer than the buffer"
        );
        let mut r = AnswerReader::new(&[1, 0, 0, 0, tag::PATCH, 255, 255, 255, 255, 1, 0, 0, 0, 7])
            .unwrap();
        assert!(r.next_answer().unwrap().is_err(), "unknown op");
        assert!(InputReader::new(&[0, 0, 0, 0, 1, 0, 0, 0]).is_err());
        // Every truncation of a valid buffer is an error, never a panic.
        let mut ops = Vec::new();
        put_set(&mut ops, ["a"].into_iter(), b"1");
        let mut w = AnswerWriter::new(2, 0);
        w.patch(Some("r"), 1, &ops);
        w.emit([(None, &b"{}"[..])].into_iter());
        let buf = w.finish();
        for cut in 0..buf.len() {
            if let Ok(mut r) = AnswerReader::new(&buf[..cut]) {
                let mut failed = false;
                while let Some(a) = r.next_answer() {
                    failed |= a.is_err();
                }
                assert!(failed, "cut at {cut}");
            }
        }
    }
}
