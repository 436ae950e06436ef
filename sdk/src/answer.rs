//! What a plugin answers for one record.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::Error;
use crate::json::FieldRef;
use crate::wire;

/// What one input record produced. The cheap answers cost the agent nothing:
/// [`Answer::Unchanged`] passes the record on as the agent already holds it, and a
/// [`Patch`] is applied by the agent to its own copy, without serializing or parsing
/// the record again.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The record goes on as it is (a filter that keeps it), optionally routed to the
    /// named output stream (each stream is written to its own table).
    Unchanged {
        /// Output stream; `None` keeps the input's stream.
        route: Option<String>,
    },
    /// The record produces nothing (a filter that drops it).
    Dropped,
    /// The record goes on with some fields set or removed.
    Patch(Patch),
    /// The record is replaced by these new objects (none, one, or many: flat-map).
    Emit(Vec<Emit>),
}

impl Answer {
    /// The record goes on unchanged.
    pub const UNCHANGED: Answer = Answer::Unchanged { route: None };

    /// The record goes on unchanged to the output stream `stream`.
    pub fn route(stream: impl Into<String>) -> Answer {
        Answer::Unchanged {
            route: Some(stream.into()),
        }
    }
}

impl From<Patch> for Answer {
    fn from(p: Patch) -> Answer {
        Answer::Patch(p)
    }
}

impl From<Emit> for Answer {
    fn from(e: Emit) -> Answer {
        Answer::Emit(vec![e])
    }
}

impl From<Vec<Emit>> for Answer {
    fn from(e: Vec<Emit>) -> Answer {
        Answer::Emit(e)
    }
}

std::thread_local! {
    /// The op buffer of the last patch answered, for the next [`Patch`].
    static SPARE_OPS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest op buffer kept for the next patch (a patch setting a big value does
/// not leave it behind).
const SPARE_OPS_MAX: usize = 4096;

/// Field changes to a record, applied by the agent in order:
///
/// - [`set`](Patch::set) writes a value at a path: a replaced value keeps its position,
///   a new key goes at the end of its object, missing or `null` parent objects are
///   created, and a parent holding anything else makes the record an error;
/// - [`remove`](Patch::remove) deletes the value at a path if it is there.
///
/// ```
/// use floe_sdk::{Patch, json};
///
/// let patch = Patch::new()
///     .set("user.id", "a1b2")        // any serde value
///     .set_json("copy", b"[1,2]")     // JSON text as it is
///     .remove("email")
///     .route("eu");                   // optional: output stream
/// assert_eq!(patch.len(), 3);
/// # let _ = json!(null);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Patch {
    ops: Vec<u8>,
    count: u32,
    route: Option<String>,
    error: Option<String>,
}

impl Patch {
    /// An empty patch (the record unchanged).
    pub fn new() -> Patch {
        Patch::default()
    }

    /// The op buffer, with room for a few ops from the first one on (growing from
    /// empty would reallocate several times per patch; an unused patch allocates
    /// nothing).
    /// It is the buffer of the patch answered before when there is one: a plugin
    /// builds a patch per record, and an allocation inside WebAssembly is costly.
    fn ops(&mut self) -> &mut Vec<u8> {
        if self.ops.capacity() == 0 {
            self.ops = SPARE_OPS.take();
            if self.ops.capacity() == 0 {
                self.ops.reserve(64);
            }
        }
        &mut self.ops
    }

    /// Keeps the op buffer for the next patch (a small one only).
    fn recycle(self) {
        let mut ops = self.ops;
        if ops.capacity() > 0 && ops.capacity() <= SPARE_OPS_MAX {
            ops.clear();
            SPARE_OPS.set(ops);
        }
    }

    /// Sets the value at `path` to `value` serialized as JSON. A value serde cannot
    /// write (a map with non-string keys) makes the record an error.
    pub fn set(mut self, path: impl FieldRef, value: impl Serialize) -> Patch {
        self.ops().push(wire::op::SET);
        wire::put_path(&mut self.ops, path.keys());
        let at = self.ops.len();
        self.ops.extend_from_slice(&[0; 4]);
        match serde_json::to_writer(&mut self.ops, &value) {
            Ok(()) => {
                let len = (self.ops.len() - at - 4) as u32;
                self.ops[at..at + 4].copy_from_slice(&len.to_le_bytes());
                self.count += 1;
            }
            Err(e) => {
                self.ops.truncate(at);
                self.error
                    .get_or_insert_with(|| format!("cannot serialize a patch value: {e}"));
            }
        }
        self
    }

    /// Sets the value at `path` to `json`, the text of one JSON value, as it is (for
    /// example a value read from the record with [`Json::bytes`](crate::json::Json::bytes)).
    pub fn set_json(mut self, path: impl FieldRef, json: &[u8]) -> Patch {
        wire::put_set(self.ops(), path.keys(), json);
        self.count += 1;
        self
    }

    /// Removes the value at `path`, if it is there.
    pub fn remove(mut self, path: impl FieldRef) -> Patch {
        wire::put_remove(self.ops(), path.keys());
        self.count += 1;
        self
    }

    /// Renames the field at `path` to `to` within the same object, keeping its place
    /// among the other fields (a field already named `to` there is replaced). Nothing
    /// happens when `path` is absent.
    pub fn rename(mut self, path: impl FieldRef, to: &str) -> Patch {
        wire::put_rename(self.ops(), path.keys(), to);
        self.count += 1;
        self
    }

    /// Routes the patched record to the output stream `stream`.
    pub fn route(mut self, stream: impl Into<String>) -> Patch {
        self.route = Some(stream.into());
        self
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether there are no operations.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn write(&self, out: &mut wire::AnswerWriter) {
        match &self.error {
            Some(e) => out.error(e),
            None if self.count == 0 => out.unchanged(self.route.as_deref()),
            None => out.patch(self.route.as_deref(), self.count, &self.ops),
        }
    }
}

/// One new object a plugin emits, optionally routed to a named output stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Emit {
    json: Vec<u8>,
    route: Option<String>,
    error: Option<String>,
}

impl Emit {
    /// An output whose value is `value` serialized as JSON (a `serde_json` map, the
    /// [`json!`](crate::json!) macro, or a struct of your own deriving `Serialize`).
    /// The agent checks that it is a JSON object.
    pub fn new(value: impl Serialize) -> Emit {
        match serde_json::to_vec(&value) {
            Ok(json) => Emit::json(json),
            Err(e) => Emit {
                json: Vec::new(),
                route: None,
                error: Some(format!("cannot serialize an output: {e}")),
            },
        }
    }

    /// An output given as the text of a JSON object (for example from
    /// [`ObjectWriter`](crate::json::ObjectWriter)).
    pub fn json(json: impl Into<Vec<u8>>) -> Emit {
        Emit {
            json: json.into(),
            route: None,
            error: None,
        }
    }

    /// Routes this output to the output stream `stream`.
    pub fn route(mut self, stream: impl Into<String>) -> Emit {
        self.route = Some(stream.into());
        self
    }

    /// The JSON text.
    pub fn bytes(&self) -> &[u8] {
        &self.json
    }

    /// The output stream, if routed.
    pub fn stream(&self) -> Option<&str> {
        self.route.as_deref()
    }
}

impl From<Map<String, Value>> for Emit {
    fn from(map: Map<String, Value>) -> Emit {
        Emit::new(map)
    }
}

impl From<Value> for Emit {
    fn from(value: Value) -> Emit {
        Emit::new(value)
    }
}

/// Writes one answer.
pub(crate) fn write_answer(out: &mut wire::AnswerWriter, answer: Result<Answer, Error>) {
    match answer {
        Ok(Answer::Unchanged { route }) => out.unchanged(route.as_deref()),
        Ok(Answer::Dropped) => out.dropped(),
        Ok(Answer::Patch(p)) => {
            p.write(out);
            p.recycle();
        }
        Ok(Answer::Emit(emits)) => match emits.iter().find_map(|e| e.error.as_deref()) {
            Some(e) => out.error(e),
            None => out.emit(
                emits
                    .iter()
                    .map(|e| (e.route.as_deref(), e.json.as_slice())),
            ),
        },
        Err(e) => out.error(e.message()),
    }
}

/// What a `#[map]` function may return: an [`Answer`], a [`Patch`], an [`Emit`], a
/// `serde_json` value or map (the new record), `Option` of those (`None` drops the
/// record), and `Result` of those.
pub trait IntoAnswer {
    /// The answer.
    fn into_answer(self) -> Result<Answer, Error>;
}

impl IntoAnswer for Answer {
    fn into_answer(self) -> Result<Answer, Error> {
        Ok(self)
    }
}

impl IntoAnswer for Patch {
    fn into_answer(self) -> Result<Answer, Error> {
        Ok(Answer::Patch(self))
    }
}

impl IntoAnswer for Emit {
    fn into_answer(self) -> Result<Answer, Error> {
        Ok(Answer::from(self))
    }
}

impl IntoAnswer for Map<String, Value> {
    fn into_answer(self) -> Result<Answer, Error> {
        Ok(Answer::from(Emit::new(self)))
    }
}

impl IntoAnswer for Value {
    fn into_answer(self) -> Result<Answer, Error> {
        Ok(Answer::from(Emit::new(self)))
    }
}

impl<T: IntoAnswer> IntoAnswer for Option<T> {
    fn into_answer(self) -> Result<Answer, Error> {
        match self {
            Some(t) => t.into_answer(),
            None => Ok(Answer::Dropped),
        }
    }
}

impl<T: IntoAnswer, E: Into<Error>> IntoAnswer for Result<T, E> {
    fn into_answer(self) -> Result<Answer, Error> {
        self.map_err(Into::into)?.into_answer()
    }
}

/// What a `#[filter]` function may return: `bool` (keep or drop) or `Result<bool, E>`.
pub trait IntoKeep {
    /// Whether the record is kept.
    fn into_keep(self) -> Result<bool, Error>;
}

impl IntoKeep for bool {
    fn into_keep(self) -> Result<bool, Error> {
        Ok(self)
    }
}

impl<E: Into<Error>> IntoKeep for Result<bool, E> {
    fn into_keep(self) -> Result<bool, Error> {
        self.map_err(Into::into)
    }
}

/// What a `#[flat_map]` function may return: a `Vec` or `Option` of outputs (anything
/// that converts into [`Emit`]), or a `Result` of those.
pub trait IntoEmits {
    /// The outputs.
    fn into_emits(self) -> Result<Vec<Emit>, Error>;
}

impl<T: Into<Emit>> IntoEmits for Vec<T> {
    fn into_emits(self) -> Result<Vec<Emit>, Error> {
        Ok(self.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Emit>> IntoEmits for Option<T> {
    fn into_emits(self) -> Result<Vec<Emit>, Error> {
        Ok(self.into_iter().map(Into::into).collect())
    }
}

impl<T: IntoEmits, E: Into<Error>> IntoEmits for Result<T, E> {
    fn into_emits(self) -> Result<Vec<Emit>, Error> {
        self.map_err(Into::into)?.into_emits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ops of each patch answered, as (op, path, value or new name) text.
    fn ops_of(buf: &[u8]) -> Vec<Vec<String>> {
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        let mut reader = wire::AnswerReader::new(buf).unwrap();
        let mut patches = Vec::new();
        while let Some(answer) = reader.next_answer() {
            let wire::Answer::Patch { ops, .. } = answer.unwrap() else {
                panic!("a patch")
            };
            patches.push(
                ops.map(|op| match op {
                    wire::Op::Set { path, value } => {
                        format!(
                            "set {} {}",
                            text(&path.collect::<Vec<_>>().join(&b'.')),
                            text(value)
                        )
                    }
                    wire::Op::Remove { path } => {
                        format!("remove {}", text(&path.collect::<Vec<_>>().join(&b'.')))
                    }
                    wire::Op::Rename { path, to } => format!(
                        "rename {} {}",
                        text(&path.collect::<Vec<_>>().join(&b'.')),
                        text(to)
                    ),
                })
                .collect(),
            );
        }
        patches
    }

    #[test]
    fn a_patch_is_written_in_the_buffer_of_the_patch_answered_before() {
        let first = Patch::new().set("a.b", 1).remove("gone");
        let buffer = first.ops.as_ptr();
        let mut out = wire::AnswerWriter::new(3, 0);
        write_answer(&mut out, Ok(Answer::Patch(first)));
        let second = Patch::new().rename("c", "d");
        assert_eq!(second.ops.as_ptr(), buffer, "the buffer is reused");
        write_answer(&mut out, Ok(Answer::Patch(second)));
        // A patch too big to keep the buffer of leaves none behind.
        let big = Patch::new().set_json("x", &vec![b'1'; SPARE_OPS_MAX]);
        write_answer(&mut out, Ok(Answer::Patch(big)));
        assert_eq!(Patch::new().remove("y").ops.capacity(), 64);
        assert_eq!(
            ops_of(&out.finish()),
            [
                vec!["set a.b 1".to_string(), "remove gone".to_string()],
                vec!["rename c d".to_string()],
                vec![format!("set x {}", "1".repeat(SPARE_OPS_MAX))],
            ]
        );
    }
}
