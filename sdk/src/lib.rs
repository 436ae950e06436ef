//! Floe SDK: the crate plugin authors depend on to write WebAssembly transforms.
//!
//! The plugin API (a `Transform` trait, an export macro and a native test harness)
//! arrives with the WebAssembly transform chain. Today this crate only fixes the
//! record representation the agent hands to transforms: one JSON object per record.

/// The record a transform receives: the decoded message value as a JSON object.
pub type Record = serde_json::Map<String, serde_json::Value>;
