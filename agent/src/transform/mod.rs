//! Transform stage: the config-declared chain of user plugins.
//!
//! The WebAssembly host arrives with its own issue; until then the chain is empty and
//! every decoded record passes through unchanged. The pipeline already calls the chain
//! at the place where plugins will run, so wiring stays the same.

use serde_json::{Map, Value};

/// An ordered chain of transforms (empty for now).
#[derive(Debug, Default)]
pub struct TransformChain {
    _private: (),
}

impl TransformChain {
    /// The empty chain.
    pub fn empty() -> Self {
        TransformChain::default()
    }

    /// Runs the chain on one record. With no plugins the record is returned unchanged.
    pub fn apply(&self, record: Map<String, Value>) -> Map<String, Value> {
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_chain_is_identity() {
        let mut m = Map::new();
        m.insert("a".into(), Value::from(1));
        assert_eq!(TransformChain::empty().apply(m.clone()), m);
    }
}
