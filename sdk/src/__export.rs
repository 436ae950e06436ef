//! Glue between [`crate::Transform`] and the component exports. Not part of the API.

#[cfg(target_arch = "wasm32")]
pub use wit_bindgen;

/// Bindings generated from `wit/transform.wit`, only on WebAssembly targets.
#[cfg(target_arch = "wasm32")]
#[allow(missing_docs, reason = "generated code")]
pub mod bindings {
    wit_bindgen::generate!({
        world: "transform",
        path: "../wit/transform.wit",
        pub_export_macro: true,
        export_macro_name: "__export_floe_guest",
        default_bindings_module: "::floe_sdk::__export::bindings",
        runtime_path: "::floe_sdk::__export::wit_bindgen::rt",
    });
}

#[cfg(target_arch = "wasm32")]
use bindings::floe_plugin::transform::types::{Input, Outcome, Output};

/// Reports panics through the host's log so the agent can show the message
/// (the trap itself only says `unreachable`).
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
        crate::log::panic_message(&format!("{message}{location}"));
    }));
}

/// Runs one batch through a plugin.
#[cfg(target_arch = "wasm32")]
pub fn process_batch<T: crate::Transform>(plugin: &mut T, batch: Vec<Input>) -> Vec<Outcome> {
    batch
        .into_iter()
        .map(|input| {
            let m = input.metadata;
            let metadata = crate::Metadata {
                topic: m.topic,
                partition: m.partition,
                offset: m.offset,
                timestamp_ms: m.timestamp_ms,
                key: m.key,
            };
            match crate::process_bytes(plugin, &input.value, metadata) {
                Ok(outputs) => Outcome::Emit(
                    outputs
                        .into_iter()
                        .map(|(value, route)| Output { value, route })
                        .collect(),
                ),
                Err(e) => Outcome::Error(e),
            }
        })
        .collect()
}
