//! Applying a patch (set / remove / rename fields) to a parsed object, copying everything else
//! as written.

use super::{JsonError, JsonObject, JsonView, JsonWriter, MAX_DEPTH, Obj, PatchOp, Tok, Value};

/// `view` with `ops` applied in order.
///
/// Ops whose paths are disjoint (none equal to or a prefix of another) do not see each
/// other, so they are applied in one pass over the object; others one after the other.
pub(super) fn apply(view: JsonView<'_>, ops: &[PatchOp]) -> Result<JsonObject, JsonError> {
    for op in ops {
        let path = op.path();
        if path.is_empty() || path.len() > MAX_DEPTH {
            return Err(JsonError::PatchPath(format!(
                "a path of {} names",
                path.len()
            )));
        }
    }
    let values = ops
        .iter()
        .map(|op| match op {
            PatchOp::Set { value, .. } => ParsedValue::parse(value).map(Some),
            PatchOp::Remove { .. } | PatchOp::Rename { .. } => Ok(None),
        })
        .collect::<Result<Vec<Option<ParsedValue>>, JsonError>>()?;
    let edits: Vec<Edit<'_, '_>> = ops
        .iter()
        .zip(&values)
        .map(|(op, v)| {
            let action = match (op, v) {
                (PatchOp::Rename { to, .. }, _) => Action::Rename(to),
                (_, Some(v)) => Action::Set(v.value()),
                (_, None) => Action::Remove,
            };
            (op.path().as_slice(), action)
        })
        .collect();
    if ops.len() > 1 && disjoint(ops) {
        let mut w = JsonWriter::with_capacity(view.bytes.len() + 16);
        write_edits(&mut w, view.root(), &edits)?;
        return Ok(w.finish());
    }
    let mut current: Option<JsonObject> = None;
    for edit in &edits {
        let base = current.as_ref().map_or(view, JsonObject::view);
        let mut w = JsonWriter::with_capacity(base.bytes.len() + 16);
        write_edits(&mut w, base.root(), std::slice::from_ref(edit))?;
        current = Some(w.finish());
    }
    Ok(current.unwrap_or_else(|| view.to_object()))
}

/// One JSON value (any kind) parsed on its own, borrowing its text.
struct ParsedValue<'t> {
    bytes: &'t [u8],
    tape: Vec<Tok>,
}

impl<'t> ParsedValue<'t> {
    fn parse(text: &'t [u8]) -> Result<ParsedValue<'t>, JsonError> {
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
        Ok(ParsedValue { bytes: text, tape })
    }

    fn value(&self) -> Value<'_> {
        JsonView {
            bytes: self.bytes,
            tape: &self.tape,
        }
        .value_at(0)
    }
}

/// Whether no path that an op of `ops` touches equals or is a prefix of one that
/// another op touches (a rename touches its field and the field of its new name).
/// Runs per patched record: compares in place, allocates nothing.
pub(super) fn disjoint(ops: &[PatchOp]) -> bool {
    ops.iter().enumerate().all(|(i, a)| {
        ops[i + 1..].iter().all(|b| {
            touched(a)
                .into_iter()
                .flatten()
                .all(|x| touched(b).into_iter().flatten().all(|y| !x.overlaps(y)))
        })
    })
}

/// A path an op touches: names, and for a rename's new field its parent's names and
/// the new name.
#[derive(Clone, Copy)]
struct Touched<'a> {
    head: &'a [String],
    last: Option<&'a str>,
}

impl<'a> Touched<'a> {
    fn len(self) -> usize {
        self.head.len() + usize::from(self.last.is_some())
    }

    fn name(self, i: usize) -> &'a str {
        self.head
            .get(i)
            .map_or_else(|| self.last.unwrap_or(""), String::as_str)
    }

    /// One is the other or a prefix of it.
    fn overlaps(self, other: Touched<'_>) -> bool {
        (0..self.len().min(other.len())).all(|i| self.name(i) == other.name(i))
    }
}

fn touched(op: &PatchOp) -> [Option<Touched<'_>>; 2] {
    let path = op.path();
    let renamed = match op {
        PatchOp::Rename { to, .. } => Some(Touched {
            head: &path[..path.len().saturating_sub(1)],
            last: Some(to),
        }),
        _ => None,
    };
    [
        Some(Touched {
            head: path,
            last: None,
        }),
        renamed,
    ]
}

/// What an edit does at its path.
#[derive(Clone, Copy)]
enum Action<'p, 'v> {
    Set(Value<'v>),
    Remove,
    Rename(&'p str),
}

/// A path and what to do there.
type Edit<'p, 'v> = (&'p [String], Action<'p, 'v>);

/// Writes `obj` with disjoint `edits` applied, in one pass.
fn write_edits(w: &mut JsonWriter, obj: Obj<'_>, edits: &[Edit<'_, '_>]) -> Result<(), JsonError> {
    let mut done = vec![false; edits.len()];
    // Names that a rename here takes over: a field already called so goes.
    let taken: Vec<&str> = edits
        .iter()
        .filter_map(|(path, action)| match action {
            Action::Rename(to) if path.len() == 1 && obj.get(&path[0]).is_some() => Some(*to),
            _ => None,
        })
        .collect();
    w.begin_object();
    for (key, value) in obj.iter() {
        let matches = |i: usize| !done[i] && key.eq_str(&edits[i].0[0]);
        let Some(first) = (0..edits.len()).find(|&i| matches(i)) else {
            if !taken.iter().any(|t| key.eq_str(t)) {
                w.key_quoted(key.quoted(), key.escaped);
                w.value(value);
            }
            continue;
        };
        // Disjoint: either one edit of this very field, or edits below it.
        if edits[first].0.len() == 1 {
            done[first] = true;
            match edits[first].1 {
                Action::Set(v) => {
                    w.key_quoted(key.quoted(), key.escaped);
                    w.value(v);
                }
                Action::Remove => {}
                Action::Rename(to) => {
                    w.key(to);
                    w.value(value);
                }
            }
            continue;
        }
        let mine: Vec<usize> = (first..edits.len()).filter(|&i| matches(i)).collect();
        for &i in &mine {
            done[i] = true;
        }
        match value {
            Value::Object(inner) => {
                let below: Vec<Edit<'_, '_>> = mine
                    .iter()
                    .map(|&i| (&edits[i].0[1..], edits[i].1))
                    .collect();
                w.key_quoted(key.quoted(), key.escaped);
                write_edits(w, inner, &below)?;
            }
            other => {
                if let Some(&i) = mine.iter().find(|&&i| matches!(edits[i].1, Action::Set(_))) {
                    return Err(JsonError::PatchPath(path_text(edits[i].0)));
                }
                // Removing or renaming below a non-object: nothing to do.
                w.key_quoted(key.quoted(), key.escaped);
                w.value(other);
            }
        }
    }
    // Sets of fields that are not there (removing what is not there does nothing).
    let missing: Vec<(&[String], Value<'_>)> = edits
        .iter()
        .zip(&done)
        .filter(|(_, done)| !**done)
        .filter_map(|((path, action), _)| match action {
            Action::Set(v) => Some((*path, *v)),
            _ => None,
        })
        .collect();
    write_new(w, &missing);
    w.end_object();
    Ok(())
}

/// Writes members for disjoint sets of absent paths, creating the objects between;
/// names in the order they first appear.
fn write_new(w: &mut JsonWriter, sets: &[(&[String], Value<'_>)]) {
    let mut written = vec![false; sets.len()];
    for i in 0..sets.len() {
        if written[i] {
            continue;
        }
        let name = &sets[i].0[0];
        w.key(name);
        if sets[i].0.len() == 1 {
            written[i] = true;
            w.value(sets[i].1);
            continue;
        }
        let mut below: Vec<(&[String], Value<'_>)> = Vec::new();
        for j in i..sets.len() {
            if !written[j] && &sets[j].0[0] == name {
                written[j] = true;
                below.push((&sets[j].0[1..], sets[j].1));
            }
        }
        w.begin_object();
        write_new(w, &below);
        w.end_object();
    }
}

fn path_text(path: &[String]) -> String {
    path.join(".")
}
