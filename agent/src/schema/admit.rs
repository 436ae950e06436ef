//! The schema stage's decision for one row of one table: admit it (possibly rewritten by
//! `coerce`, with its upsert key), reject it to the dead letters, or fail the pipeline.

use std::sync::Arc;

use iceberg::spec::StructType;

use super::{OnIncompatible, Rejection, SchemaTracker};
use crate::record::json::{JsonObject, Obj};
use crate::record::key::{KeyHash, KeySpec};

/// One table's schema stage: its tracker, the pipeline's policy, and the upsert key.
#[derive(Debug, Clone)]
pub struct TableSchema {
    /// What the table's columns are and what they may become.
    pub tracker: SchemaTracker,
    policy: OnIncompatible,
    key: Option<KeySpec>,
}

/// What becomes of a row.
#[derive(Debug)]
pub enum Admission {
    /// Buffer it.
    Admit(Admitted),
    /// Send the original message to the dead letters.
    Reject {
        /// `schema` (a value does not fit, or a limit) or `key` (no usable upsert key).
        stage: &'static str,
        /// Why.
        reason: String,
    },
    /// Stop the pipeline (`on_incompatible = "fail"`).
    Fail(Rejection),
}

/// An admitted row.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The value rewritten by `coerce`, if it was.
    pub rewritten: Option<JsonObject>,
    /// Upsert mode: the row's key, computed from the final value.
    pub key: Option<KeyHash>,
}

impl TableSchema {
    /// A stage for one table.
    pub fn new(tracker: SchemaTracker, policy: OnIncompatible, key: Option<KeySpec>) -> Self {
        TableSchema {
            tracker,
            policy,
            key,
        }
    }

    /// The upsert key, if the table is upserted.
    pub fn key(&self) -> Option<&KeySpec> {
        self.key.as_ref()
    }

    /// Decides about one row. `value` is `None` for a tombstone; `message_key` is the
    /// text stored in `_kafka_key`; `declare` merges a writer schema's columns (Avro
    /// without plugins: columns exist even while their values are null); `hints` are
    /// declared types of fields that may have gone through plugins.
    pub fn admit(
        &mut self,
        value: Option<Obj<'_>>,
        message_key: Option<&str>,
        declare: Option<&Arc<StructType>>,
        hints: Option<&StructType>,
    ) -> Admission {
        let Some(obj) = value else {
            return self.with_key(None, message_key, None);
        };
        if let Some(d) = declare {
            self.tracker.declare(d);
        }
        // The key is checked before the tracker learns from the record: a key that
        // cannot be one (missing, null, `1.5`, `true`) must not teach a new table the
        // type of its key column, or the table could never be created.
        let key = match &self.key {
            None => None,
            Some(spec) => match spec.of_record(Some(obj), message_key) {
                Ok(k) => Some(k),
                Err(e) => {
                    return Admission::Reject {
                        stage: "key",
                        reason: e.to_string(),
                    };
                }
            },
        };
        match self.tracker.observe_json(obj, hints) {
            Ok(()) => Admission::Admit(Admitted {
                rewritten: None,
                key,
            }),
            Err(rejection) => self.refused(obj, message_key, hints, rejection),
        }
    }

    fn refused(
        &mut self,
        obj: Obj<'_>,
        message_key: Option<&str>,
        hints: Option<&StructType>,
        rejection: Rejection,
    ) -> Admission {
        // Limits protect the agent from hostile records: always a dead letter.
        let Rejection::Conflict(_) = &rejection else {
            return reject("schema", &rejection);
        };
        match self.policy {
            OnIncompatible::Fail => Admission::Fail(rejection),
            OnIncompatible::DeadLetter => reject("schema", &rejection),
            OnIncompatible::Coerce => {
                let Some(rewritten) = self.tracker.coerce(obj) else {
                    return reject("schema", &rejection);
                };
                // What still conflicts after coercion is the reason given.
                match self.tracker.observe_json(rewritten.view().root(), hints) {
                    Ok(()) => {
                        let key = self.with_key(Some(rewritten.view().root()), message_key, None);
                        match key {
                            Admission::Admit(a) => Admission::Admit(Admitted {
                                rewritten: Some(rewritten),
                                key: a.key,
                            }),
                            other => other,
                        }
                    }
                    Err(still) => reject("schema", &still),
                }
            }
        }
    }

    fn with_key(
        &self,
        value: Option<Obj<'_>>,
        message_key: Option<&str>,
        rewritten: Option<JsonObject>,
    ) -> Admission {
        let key = match &self.key {
            None => None,
            Some(spec) => match spec.of_record(value, message_key) {
                Ok(k) => Some(k),
                Err(e) => {
                    return Admission::Reject {
                        stage: "key",
                        reason: e.to_string(),
                    };
                }
            },
        };
        Admission::Admit(Admitted { rewritten, key })
    }
}

fn reject(stage: &'static str, rejection: &Rejection) -> Admission {
    Admission::Reject {
        stage,
        reason: rejection.to_string(),
    }
}
