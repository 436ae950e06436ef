//! Why a pipeline stops, and the class of each cause.

use crate::dead_letter::DeadLetterError;
use crate::decode::DecodeError;
use crate::error::{Classify, ErrorClass};
use crate::schema::Rejection;
use crate::sink::SinkError;
use crate::source::SourceError;
use crate::transform::TransformError;

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Kafka side.
    #[error("pipeline {pipeline}: {source}")]
    Source {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<SourceError>,
    },
    /// Iceberg side.
    #[error("pipeline {pipeline}: {source}")]
    Sink {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<SinkError>,
    },
    /// Dead-letter file.
    #[error("pipeline {pipeline}: {source}")]
    DeadLetter {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<DeadLetterError>,
    },
    /// A plugin could not start, faulted too often, or failed a record under `on_error = "fail"`.
    #[error("pipeline {pipeline}: {source}")]
    Transform {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<TransformError>,
    },
    /// Decoding cannot go on (schema registry unreachable, schema file unreadable).
    #[error("pipeline {pipeline}: {source}")]
    Decode {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<DecodeError>,
    },
    /// A record could not be decoded and that stops the pipeline (a JSON-schema
    /// violation under `on_incompatible = "fail"`, a registry that cannot be asked).
    #[error("pipeline {pipeline}: cannot decode {topic}/{partition}@{offset}: {source}")]
    DecodeFailed {
        /// Pipeline name.
        pipeline: String,
        /// Topic of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// Cause.
        source: Box<DecodeError>,
    },
    /// A value does not fit its column and the policy is `on_incompatible = "fail"`.
    #[error(
        "pipeline {pipeline}: incompatible value in {topic}/{partition}@{offset}: {conflict} (on_incompatible = \"fail\")"
    )]
    Incompatible {
        /// Pipeline name.
        pipeline: String,
        /// Topic of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// Field, column type and value type.
        conflict: Box<Rejection>,
    },
    /// A record failed in a plugin whose policy is `fail`.
    #[error(
        "pipeline {pipeline}: plugin {plugin} failed on {topic}/{partition}@{offset}: {message} (on_error = \"fail\")"
    )]
    RecordFailed {
        /// Pipeline name.
        pipeline: String,
        /// Plugin name.
        plugin: String,
        /// Topic of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// What the plugin said.
        message: String,
    },
    /// A pipeline thread or task ended unexpectedly (a bug: please report).
    #[error("pipeline {pipeline}: internal error: {message}")]
    Internal {
        /// Pipeline name.
        pipeline: String,
        /// What happened.
        message: String,
    },
}

impl PipelineError {
    /// Wraps sink errors of `pipeline` (for `map_err`).
    pub(super) fn sink(pipeline: &str) -> impl Fn(SinkError) -> PipelineError + Copy + '_ {
        move |e| PipelineError::Sink {
            pipeline: pipeline.to_string(),
            source: Box::new(e),
        }
    }

    pub(super) fn internal(pipeline: &str, message: impl Into<String>) -> PipelineError {
        PipelineError::Internal {
            pipeline: pipeline.to_string(),
            message: message.into(),
        }
    }
}

impl Classify for PipelineError {
    fn class(&self) -> ErrorClass {
        match self {
            PipelineError::Source { source, .. } => match **source {
                SourceError::Unreachable { .. } => ErrorClass::Transient,
                _ => ErrorClass::Fatal,
            },
            PipelineError::Sink { source, .. } => source.class(),
            PipelineError::Decode { source, .. } | PipelineError::DecodeFailed { source, .. } => {
                source.class()
            }
            PipelineError::DeadLetter { .. }
            | PipelineError::Transform { .. }
            | PipelineError::Incompatible { .. }
            | PipelineError::RecordFailed { .. }
            | PipelineError::Internal { .. } => ErrorClass::Fatal,
        }
    }
}
