//! `passthrough`: emits every record unchanged. Useful as a baseline for the cost of the chain.

use floe_sdk::{Config, Emit, Record, Transform};

/// The plugin.
pub struct Passthrough;

impl Transform for Passthrough {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(Passthrough)
    }

    fn process(&mut self, record: Record) -> Result<Vec<Emit>, String> {
        Ok(vec![Emit::new(record.value)])
    }
}

floe_sdk::export_transform!(Passthrough);

#[cfg(test)]
mod tests {
    use floe_sdk::json;
    use floe_sdk::testing::{Harness, object};

    use super::*;

    #[test]
    fn emits_the_record_unchanged() {
        let mut h = Harness::<Passthrough>::new(json!({})).unwrap();
        let out = h.run(json!({"a": 1, "b": {"c": [true]}})).unwrap();
        assert_eq!(
            out,
            vec![Emit::new(object(json!({"a": 1, "b": {"c": [true]}})))]
        );
        assert!(
            h.run_bytes(b"not json")
                .unwrap_err()
                .contains("not valid JSON")
        );
    }
}
