//! Glue between [`crate::Transform`] and the component exports. Not part of the API.

use std::cell::Cell;

use crate::answer::write_answer;
use crate::wire::{AnswerWriter, InputReader};
use crate::{Record, Transform};

#[cfg(target_arch = "wasm32")]
pub use wit_bindgen;

/// Bindings generated from `wit/transform.wit`, only on WebAssembly targets.
#[cfg(target_arch = "wasm32")]
#[allow(missing_docs, reason = "generated code")]
pub mod bindings {
    wit_bindgen::generate!({
        world: "transform",
        path: "wit/transform.wit",
        pub_export_macro: true,
        export_macro_name: "__export_floe_guest",
        default_bindings_module: "::floe_sdk::__export::bindings",
        runtime_path: "::floe_sdk::__export::wit_bindgen::rt",
    });
}

std::thread_local! {
    /// Index in the batch of the record being processed, for panic reports.
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Reports panics to the host, which aborts the call and reports the message as the
/// fault (the trap itself would only say `unreachable`).
#[cfg(target_arch = "wasm32")]
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = match info.payload().downcast_ref::<&str>() {
            Some(s) => (*s).to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "non-string panic".to_string()),
        };
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let index = CURRENT.with(Cell::get);
        bindings::floe_plugin::transform::host::panicked(&format!("{message}{location}"), index);
    }));
}

/// Runs one batch (an input buffer) through a plugin and returns the output buffer.
pub fn process_batch<T: Transform>(plugin: &mut T, batch: &[u8]) -> Vec<u8> {
    let Ok(mut input) = InputReader::new(batch) else {
        // The host checks the answer count: an empty answer is reported as a broken batch.
        return Vec::new();
    };
    let mut out = AnswerWriter::new(input.len(), 16 + input.len() * 8);
    let mut index = 0u32;
    while let Some(next) = input.next_record() {
        let Ok(r) = next else {
            return Vec::new();
        };
        let record = Record::new(
            r.value,
            r.topic,
            r.partition,
            r.offset,
            r.timestamp_ms,
            r.key,
        )
        .with_index(r.fields);
        CURRENT.with(|c| c.set(Some(index)));
        let answer = plugin.process(&record);
        write_answer(&mut out, answer);
        index += 1;
    }
    CURRENT.with(|c| c.set(None));
    out.finish()
}

/// The answers before `init` succeeded: an error for each record.
pub fn before_init(batch: &[u8]) -> Vec<u8> {
    let n = InputReader::new(batch).map_or(0, |r| r.len());
    let mut out = AnswerWriter::new(n, 0);
    for _ in 0..n {
        out.error("plugin used before init");
    }
    out.finish()
}

/// Support for the attribute macros.
pub mod macros {
    use crate::{Answer, Error, IntoAnswer, IntoEmits, IntoKeep};

    /// A filter's answer.
    pub fn filter(keep: impl IntoKeep) -> Result<Answer, Error> {
        Ok(if keep.into_keep()? {
            Answer::UNCHANGED
        } else {
            Answer::Dropped
        })
    }

    /// A map's answer.
    pub fn map(answer: impl IntoAnswer) -> Result<Answer, Error> {
        answer.into_answer()
    }

    /// A flat-map's answer.
    pub fn flat_map(emits: impl IntoEmits) -> Result<Answer, Error> {
        Ok(Answer::Emit(emits.into_emits()?))
    }
}
