//! Applying a patch (set / remove / rename fields) to a parsed object, copying everything else
//! as written.

use std::cell::RefCell;

use smallvec::SmallVec;

use super::{JsonError, JsonObject, JsonView, JsonWriter, MAX_DEPTH, Obj, PatchRef, Tok, Value};

/// `view` with `ops` applied in order.
///
/// Ops whose paths are disjoint (none equal to or a prefix of another) do not see each
/// other, so they are applied in one pass over the object; others one after the other.
pub(super) fn apply(view: JsonView<'_>, ops: &[PatchRef<'_>]) -> Result<JsonObject, JsonError> {
    thread_local! {
        /// Tokens of the values a patch sets, reused from patch to patch (this runs for
        /// every patched record).
        static VALUE_TOKENS: RefCell<Vec<Tok>> = const { RefCell::new(Vec::new()) };
    }
    for op in ops {
        let path = op.path();
        if path.is_empty() || path.len() > MAX_DEPTH {
            return Err(JsonError::PatchPath(format!(
                "a path of {} names",
                path.len()
            )));
        }
    }
    let mut tokens = VALUE_TOKENS.with_borrow_mut(std::mem::take);
    tokens.clear();
    let applied = apply_with(view, ops, &mut tokens);
    if tokens.capacity() <= KEEP_VALUE_TOKENS {
        VALUE_TOKENS.set(tokens);
    }
    applied
}

/// Value tokens kept between patches at most (a patch setting a huge value does not
/// leave its tokens behind).
const KEEP_VALUE_TOKENS: usize = 4096;

/// [`apply`], the values set tokenized into `tokens`.
fn apply_with(
    view: JsonView<'_>,
    ops: &[PatchRef<'_>],
    tokens: &mut Vec<Tok>,
) -> Result<JsonObject, JsonError> {
    // Room for the object as it is and what the ops add to it: written without growing.
    let mut extra_bytes = 16;
    let mut starts: SmallVec<[Option<(&str, usize)>; INLINE_OPS]> = SmallVec::new();
    for op in ops {
        starts.push(match op {
            PatchRef::Set { value, .. } => {
                extra_bytes += value.len();
                Some(parse_value(value, tokens)?)
            }
            PatchRef::Rename { to, .. } => {
                extra_bytes += to.len() + 2;
                None
            }
            PatchRef::Remove { .. } => None,
        });
    }
    let values = &*tokens;
    // Pushed in place: a collected SmallVec is built aside and then copied whole.
    let mut edits: SmallVec<[Edit<'_, '_>; INLINE_OPS]> = SmallVec::new();
    for (op, start) in ops.iter().zip(&starts) {
        let action = match (op, start) {
            (PatchRef::Rename { to, .. }, _) => Action::Rename(to),
            (_, Some((text, at))) => Action::Set(JsonView { text, tape: values }.value_at(*at)),
            (_, None) => Action::Remove,
        };
        edits.push((op.path(), action));
    }
    let room = |base: JsonView<'_>| {
        JsonWriter::with_room(
            base.text.len() + extra_bytes,
            base.tape.len() + values.len() + 4,
        )
    };
    if edits.len() <= ONE_PASS_MAX && disjoint(ops) {
        let mut w = room(view);
        write_edits(&mut w, view.root(), &edits)?;
        return Ok(w.finish());
    }
    let mut current: Option<JsonObject> = None;
    for edit in &edits {
        let base = current.as_ref().map_or(view, JsonObject::view);
        let mut w = room(base);
        write_edits(&mut w, base.root(), std::slice::from_ref(edit))?;
        if let Some(before) = current.replace(w.finish()) {
            before.recycle();
        }
    }
    Ok(current.unwrap_or_else(|| view.to_object()))
}

/// Ops of a patch kept on the stack (a patch of a few fields allocates nothing for them).
pub(crate) const INLINE_OPS: usize = 8;

/// The most edits applied in one pass (what edits are done is one bit each).
const ONE_PASS_MAX: usize = 64;

/// Tokenizes one JSON value (any kind) given on its own, appending its tokens to
/// `tokens`: its text and the index of its first token there. Token positions are
/// relative to the text as given (leading spaces included).
fn parse_value<'t>(bytes: &'t [u8], tokens: &mut Vec<Tok>) -> Result<(&'t str, usize), JsonError> {
    let text = super::utf8(bytes)?;
    let at = tokens.len();
    let start = super::skip_ws(bytes, 0);
    let end = super::tokenize_any(bytes, start, tokens, &mut Vec::new())?;
    if super::skip_ws(bytes, end) != bytes.len() {
        return Err(super::syntax("trailing characters", end));
    }
    Ok((text, at))
}

/// Whether no path that an op of `ops` touches equals or is a prefix of one that
/// another op touches (a rename touches its field and the field of its new name).
/// Runs per patched record: compares in place, allocates nothing.
pub(super) fn disjoint(ops: &[PatchRef<'_>]) -> bool {
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
    head: &'a [&'a str],
    last: Option<&'a str>,
}

impl<'a> Touched<'a> {
    fn len(self) -> usize {
        self.head.len() + usize::from(self.last.is_some())
    }

    fn name(self, i: usize) -> &'a str {
        self.head
            .get(i)
            .copied()
            .unwrap_or_else(|| self.last.unwrap_or(""))
    }

    /// One is the other or a prefix of it.
    fn overlaps(self, other: Touched<'_>) -> bool {
        (0..self.len().min(other.len())).all(|i| self.name(i) == other.name(i))
    }
}

fn touched<'a>(op: &PatchRef<'a>) -> [Option<Touched<'a>>; 2] {
    let path = op.path();
    let renamed = match *op {
        PatchRef::Rename { to, .. } => Some(Touched {
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
type Edit<'p, 'v> = (&'p [&'p str], Action<'p, 'v>);

/// Writes `obj` with disjoint `edits` applied, in one pass. At most [`ONE_PASS_MAX`]
/// edits (each is one bit of `done`).
fn write_edits(w: &mut JsonWriter, obj: Obj<'_>, edits: &[Edit<'_, '_>]) -> Result<(), JsonError> {
    debug_assert!(edits.len() <= ONE_PASS_MAX);
    let mut done = 0u64;
    let is_done = |done: u64, i: usize| done & (1 << i) != 0;
    // A field named like a rename's new name goes when the renamed field is here (the
    // rename takes its place): looked up only when such a name is met, which is rare.
    let taken = |key: &super::Str<'_>| {
        edits.iter().any(|(path, action)| match action {
            Action::Rename(to) => path.len() == 1 && key.eq_str(to) && obj.get(path[0]).is_some(),
            _ => false,
        })
    };
    w.begin_object();
    let view = obj.view;
    let end = view.tape[obj.at].len as usize;
    // Untouched members in a row are copied at once (their text and tokens): tape
    // indices of the run's first member and after its last.
    let mut run: Option<(usize, usize)> = None;
    let mut next = obj.at + 1;
    while next < end {
        let at = next;
        let Some(key) = view.key_at(at) else {
            break;
        };
        // The value is only looked at for the fields an edit names.
        let value = || view.value_at(at + 1);
        next = view.skip(at + 1);
        let matches = |done: u64, i: usize| !is_done(done, i) && key.eq_str(edits[i].0[0]);
        let Some(first) = (0..edits.len()).find(|&i| matches(done, i)) else {
            if taken(&key) {
                if let Some((from, to)) = run.take() {
                    w.members(view, from, to);
                }
            } else {
                run = Some((run.map_or(at, |(from, _)| from), next));
            }
            continue;
        };
        if let Some((from, to)) = run.take() {
            w.members(view, from, to);
        }
        // Disjoint: either one edit of this very field, or edits below it.
        if edits[first].0.len() == 1 {
            done |= 1 << first;
            match edits[first].1 {
                Action::Set(v) => {
                    w.key_quoted(key.quoted(), key.escaped);
                    w.value(v);
                }
                Action::Remove => {}
                Action::Rename(to) => {
                    w.key(to);
                    w.value(value());
                }
            }
            continue;
        }
        let mine: Vec<usize> = (first..edits.len()).filter(|&i| matches(done, i)).collect();
        for &i in &mine {
            done |= 1 << i;
        }
        match value() {
            Value::Object(inner) => {
                let below: Vec<Edit<'_, '_>> = mine
                    .iter()
                    .map(|&i| (&edits[i].0[1..], edits[i].1))
                    .collect();
                w.key_quoted(key.quoted(), key.escaped);
                write_edits(w, inner, &below)?;
            }
            other => {
                let sets: Vec<(&[&str], Value<'_>)> = mine
                    .iter()
                    .filter_map(|&i| match edits[i].1 {
                        Action::Set(v) => Some((&edits[i].0[1..], v)),
                        _ => None,
                    })
                    .collect();
                w.key_quoted(key.quoted(), key.escaped);
                if sets.is_empty() {
                    // Removing or renaming below a non-object: nothing to do.
                    w.value(other);
                } else if other.is_null() {
                    // A `null` parent becomes an object holding what is set below it.
                    w.begin_object();
                    write_new(w, &sets);
                    w.end_object();
                } else {
                    let i = mine
                        .iter()
                        .find(|&&i| matches!(edits[i].1, Action::Set(_)))
                        .expect("a set among them");
                    return Err(JsonError::PatchPath(path_text(edits[*i].0)));
                }
            }
        }
    }
    if let Some((from, to)) = run {
        w.members(view, from, to);
    }
    // Sets of fields that are not there (removing what is not there does nothing).
    // Empty in the usual case: no allocation.
    let missing: Vec<(&[&str], Value<'_>)> = edits
        .iter()
        .enumerate()
        .filter(|(i, _)| !is_done(done, *i))
        .filter_map(|(_, (path, action))| match action {
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
fn write_new(w: &mut JsonWriter, sets: &[(&[&str], Value<'_>)]) {
    let mut written = vec![false; sets.len()];
    for i in 0..sets.len() {
        if written[i] {
            continue;
        }
        let name = sets[i].0[0];
        w.key(name);
        if sets[i].0.len() == 1 {
            written[i] = true;
            w.value(sets[i].1);
            continue;
        }
        let mut below: Vec<(&[&str], Value<'_>)> = Vec::new();
        for j in i..sets.len() {
            if !written[j] && sets[j].0[0] == name {
                written[j] = true;
                below.push((&sets[j].0[1..], sets[j].1));
            }
        }
        w.begin_object();
        write_new(w, &below);
        w.end_object();
    }
}

fn path_text(path: &[&str]) -> String {
    path.join(".")
}
