//! Floe SDK
