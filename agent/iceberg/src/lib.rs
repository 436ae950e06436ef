//! Floe's Iceberg write path.

pub mod redact;
