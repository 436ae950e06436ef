//! Leaf helpers the stages' config structs share, below every stage and below
//! [`crate::config`] (which gathers the stages' structs): serde parsers of durations and
//! sizes, and the values that are never printed ([`Secret`], [`Redacted`],
//! [`redact_url`], from [`floe_iceberg::redact`], whose catalog settings need them too).

pub use floe_iceberg::redact::{Redact, Redacted, Secret, redact_url};

/// Serde helper: durations written as `"60s"`, `"1m"`, `"500ms"`.
pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {s:?}: {e} (write e.g. \"60s\" or \"1m\")"
            ))
        })
    }
}

/// Serde helper: sizes written as `"64MiB"` or a number of bytes.
pub(crate) mod size {
    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(n),
            Raw::Text(s) => s
                .parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| {
                    serde::de::Error::custom(format!(
                        "invalid size {s:?}: {e} (write e.g. \"64MiB\")"
                    ))
                }),
        }
    }

    /// [`deserialize`] for an optional size.
    pub(crate) fn deserialize_option<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<u64>, D::Error> {
        deserialize(d).map(Some)
    }
}
