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
        let duration = humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {s:?}: {e} (write e.g. \"60s\" or \"1m\")"
            ))
        })?;
        match duration <= MAX {
            true => Ok(duration),
            false => Err(serde::de::Error::custom(format!(
                "duration {s:?} is too long (at most {})",
                humantime::format_duration(MAX)
            ))),
        }
    }

    /// The longest duration a setting takes: longer ones are typos, and time arithmetic
    /// on them would overflow.
    pub(crate) const MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
}

/// Serde helper: sizes written as `"64MiB"` or a number of bytes.
pub(crate) mod size {
    use serde::Deserializer;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(SizeVisitor)
    }

    /// A number of bytes or a string such as `"64MiB"`.
    struct SizeVisitor;

    impl serde::de::Visitor<'_> for SizeVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a size such as \"64MiB\" or a number of bytes")
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::custom(format!("invalid size {n}: below 0")))
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            s.parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| E::custom(format!("invalid size {s:?}: {e} (write e.g. \"64MiB\")")))
        }
    }

    /// [`deserialize`] for an optional size.
    pub(crate) fn deserialize_option<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<u64>, D::Error> {
        deserialize(d).map(Some)
    }
}
