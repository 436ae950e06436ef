//! Run a plugin natively in unit tests, through the same bytes-in, bytes-out path the
//! agent uses in WebAssembly.

use serde_json::{Map, Value};

use crate::{Emit, Metadata, Transform, init_from_json, process_bytes};

/// A plugin instance under test.
pub struct Harness<T: Transform> {
    plugin: T,
    offset: i64,
}

impl<T: Transform> Harness<T> {
    /// Builds the plugin from a `with` table given as JSON.
    pub fn new(config: Value) -> Result<Self, String> {
        Ok(Harness {
            plugin: init_from_json::<T>(&config.to_string())?,
            offset: 0,
        })
    }

    /// Runs one record (a JSON object) with default metadata.
    pub fn run(&mut self, value: Value) -> Result<Vec<Emit>, String> {
        let metadata = Metadata {
            topic: "test".into(),
            partition: 0,
            offset: self.offset,
            timestamp_ms: None,
            key: None,
        };
        self.run_with(value, metadata)
    }

    /// Runs one record that must give exactly one output on the input's stream, and
    /// returns that output (panics otherwise: a test helper).
    pub fn run_one(&mut self, value: Value) -> Value {
        let mut out = self
            .run(value)
            .unwrap_or_else(|e| panic!("the plugin returned an error: {e}"));
        assert_eq!(out.len(), 1, "expected exactly one output, got {out:?}");
        let emit = out.remove(0);
        assert_eq!(emit.route, None, "expected the input's stream");
        Value::Object(emit.value)
    }

    /// The error `init` gives for `config` (panics if `init` accepts it).
    pub fn init_error(config: Value) -> String {
        match Self::new(config) {
            Ok(_) => panic!("init should fail"),
            Err(e) => e,
        }
    }

    /// Runs one record with the given metadata.
    pub fn run_with(&mut self, value: Value, metadata: Metadata) -> Result<Vec<Emit>, String> {
        self.offset += 1;
        let bytes = serde_json::to_vec(&value).map_err(|e| e.to_string())?;
        let outputs = process_bytes(&mut self.plugin, &bytes, metadata)?;
        outputs
            .into_iter()
            .map(
                |(bytes, route)| match serde_json::from_slice::<Value>(&bytes) {
                    Ok(Value::Object(value)) => Ok(Emit { value, route }),
                    _ => Err("plugin emitted something that is not a JSON object".to_string()),
                },
            )
            .collect()
    }

    /// Runs raw bytes (e.g. to check how the plugin treats invalid input).
    pub fn run_bytes(&mut self, bytes: &[u8]) -> Result<Vec<crate::WireOutput>, String> {
        process_bytes(&mut self.plugin, bytes, Metadata::default())
    }

    /// The plugin itself, to inspect its state.
    pub fn plugin(&mut self) -> &mut T {
        &mut self.plugin
    }
}

/// Shorthand: the JSON object of `value` (panics if it is not an object).
pub fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(m) => m,
        other => panic!("not a JSON object: {other}"),
    }
}
