//! Applying a patch (set / remove fields) to a parsed object, copying everything else
//! as written.

use super::{JsonError, JsonObject, JsonView, JsonWriter, MAX_DEPTH, Obj, PatchOp, Tok, Value};

/// `view` with `ops` applied in order.
pub(super) fn apply(view: JsonView<'_>, ops: &[PatchOp]) -> Result<JsonObject, JsonError> {
    let mut current: Option<JsonObject> = None;
    for op in ops {
        let (path, new) = match op {
            PatchOp::Set { path, value } => (path, Some(value.as_slice())),
            PatchOp::Remove { path } => (path, None),
        };
        if path.is_empty() || path.len() > MAX_DEPTH {
            return Err(JsonError::PatchPath(format!(
                "a path of {} names",
                path.len()
            )));
        }
        let parsed_value = match new {
            Some(text) => Some(ParsedValue::parse(text)?),
            None => None,
        };
        let base = current.as_ref().map_or(view, JsonObject::view);
        let mut w = JsonWriter::with_capacity(base.bytes.len() + 16);
        write_with(
            &mut w,
            base.root(),
            path,
            parsed_value.as_ref().map(ParsedValue::value),
        )?;
        current = Some(w.finish());
    }
    Ok(current.unwrap_or_else(|| view.to_object()))
}

/// One JSON value (any kind) parsed on its own.
struct ParsedValue {
    bytes: Vec<u8>,
    tape: Vec<Tok>,
}

impl ParsedValue {
    fn parse(text: &[u8]) -> Result<ParsedValue, JsonError> {
        if let Err(e) = std::str::from_utf8(text) {
            return Err(super::syntax("invalid UTF-8", e.valid_up_to()));
        }
        let mut tape = Vec::new();
        let start = super::skip_ws(text, 0);
        let end = super::tokenize_any(text, start, &mut tape, &mut Vec::new())?;
        if super::skip_ws(text, end) != text.len() {
            return Err(super::syntax("trailing characters", end));
        }
        // Token positions are relative to the text as given (leading spaces included).
        Ok(ParsedValue {
            bytes: text.to_vec(),
            tape,
        })
    }

    fn value(&self) -> Value<'_> {
        JsonView {
            bytes: &self.bytes,
            tape: &self.tape,
        }
        .value_at(0)
    }
}

fn write_with(
    w: &mut JsonWriter,
    obj: Obj<'_>,
    path: &[String],
    new: Option<Value<'_>>,
) -> Result<(), JsonError> {
    let name = &path[0];
    let mut found = false;
    w.begin_object();
    for (key, value) in obj.iter() {
        if found || !key.eq_str(name) {
            w.key_quoted(key.quoted(), key.escaped);
            w.value(value);
            continue;
        }
        found = true;
        match (path.len(), new, value) {
            (1, Some(v), _) => {
                w.key_quoted(key.quoted(), key.escaped);
                w.value(v);
            }
            (1, None, _) => {}
            (_, _, Value::Object(inner)) => {
                w.key_quoted(key.quoted(), key.escaped);
                write_with(w, inner, &path[1..], new)?;
            }
            (_, Some(_), _) => return Err(JsonError::PatchPath(path_text(path))),
            // Removing below a non-object: nothing to remove.
            (_, None, other) => {
                w.key_quoted(key.quoted(), key.escaped);
                w.value(other);
            }
        }
    }
    if !found && let Some(v) = new {
        w.key(name);
        for part in &path[1..] {
            w.begin_object();
            w.key(part);
        }
        w.value(v);
        for _ in &path[1..] {
            w.end_object();
        }
    }
    w.end_object();
    Ok(())
}

fn path_text(path: &[String]) -> String {
    path.join(".")
}
