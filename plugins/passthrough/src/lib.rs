//! `passthrough`: emits every record unchanged. A baseline for the cost of the chain:
//! the record crosses into the plugin and back, and the answer ("unchanged") lets the
//! agent keep the record it already parsed.

use floe_sdk::{Record, filter};

/// Keeps every record.
#[filter(Passthrough)]
fn passthrough(_record: &Record) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use floe_sdk::json;
    use floe_sdk::testing::{Answered, Harness, Output, object};

    use super::*;

    #[test]
    fn emits_the_record_unchanged() {
        let mut h = Harness::<Passthrough>::new(json!({})).unwrap();
        let out = h.run(json!({"a": 1, "b": {"c": [true]}})).unwrap();
        assert_eq!(
            out,
            vec![Output::new(object(json!({"a": 1, "b": {"c": [true]}})))]
        );
        assert_eq!(
            h.answer(json!({"x": 1})).unwrap(),
            Answered::Unchanged(None)
        );
        assert!(
            h.run_json(b"not json")
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
        let e = Harness::<Passthrough>::init_error(json!({"x": 1}));
        assert!(e.contains("unknown field `x`"), "{e}");
    }
}
