//! The ingester's error type. Every variant names what it concerns (file and document, or
//! bucket and key), so a log line alone tells an operator what to fix.

use crate::object::{DocRef, ObjectId};
use shoal_common::bus::{Bucket, BusError};
use shoal_common::envelope::EnvelopeError;
use std::path::PathBuf;

/// Errors of the ingester.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The source directory is missing, not a directory, or cannot be listed.
    #[error("manifest directory {}: {source}", path.display())]
    SourceDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest file could not be read (or is not UTF-8).
    #[error("reading {}: {source}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest file is larger than `--max-manifest-bytes`; it is not read, and the
    /// objects it had stay.
    #[error(
        "{}: {size} bytes, over the {limit}-byte limit on manifest files \
         (--max-manifest-bytes); not read, its previous objects kept",
        path.display()
    )]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A manifest nests deeper than any object does (checked in one pass before parsing,
    /// whose time grows with the square of the depth); the whole file is set aside.
    #[error(
        "{} document {document} line {line}: nested deeper than {limit} levels; \
         not parsed",
        path.display()
    )]
    TooDeep {
        /// The file.
        path: PathBuf,
        /// Index (from 0) of the document.
        document: usize,
        /// Line (from 1) where the limit was passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// A YAML file is not valid YAML; the whole file is set aside.
    #[error("{} document {document}: not valid YAML: {source}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// Index (from 0) of the document that failed.
        document: usize,
        /// The cause (with the line and column in the file).
        #[source]
        source: Box<shoal_common::yaml::Error>,
    },
    /// A JSON file is not valid JSON; the whole file is set aside.
    #[error("{} document {document}: not valid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Index (from 0) of the document that failed.
        document: usize,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A document is not a Kubernetes object (not a mapping, no `kind`, no `metadata.name`).
    #[error("{} document {document}: {reason}", path.display())]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// The document.
        document: DocRef,
        /// What is wrong.
        reason: String,
    },
    /// A known kind in an `apiVersion` shoal does not read.
    #[error(
        "{} document {document}: {kind} in apiVersion {api_version} is not supported \
         (supported: {supported})",
        path.display()
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The document.
        document: DocRef,
        /// The document's `apiVersion`.
        api_version: String,
        /// The document's `kind`.
        kind: String,
        /// The apiVersions shoal reads for this kind.
        supported: String,
    },
    /// A document of a known kind does not decode into that kind's type.
    #[error("{} document {document}: {id}: {source}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The document.
        document: DocRef,
        /// Kind, namespace and name of the object.
        id: ObjectId,
        /// The cause (from decoding the document's generic value: the expected type and
        /// the value found, or the missing or unsupported field).
        #[source]
        source: serde_json::Error,
    },
    /// An object decodes but fails validation.
    #[error("{} document {document}: {id}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The document.
        document: DocRef,
        /// Kind, namespace and name of the object.
        id: ObjectId,
        /// What is wrong (boxed to keep every `Result` of this crate small).
        #[source]
        source: Box<InvalidObject>,
    },
    /// A value could not be encoded for the bus.
    #[error("encoding {bucket}/{key}: {source}")]
    Encode {
        /// The bucket.
        bucket: Bucket,
        /// The key.
        key: String,
        /// The cause.
        #[source]
        source: EnvelopeError,
    },
    /// An encoded value exceeds the bus's size limit; the key keeps its previous value.
    #[error("{bucket}/{key}: value of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// The bucket.
        bucket: Bucket,
        /// The key.
        key: String,
        /// Size of the encoded envelope.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A bus operation failed (the bus error names bucket and key).
    #[error("{action}: {source}")]
    Bus {
        /// What the ingester was doing.
        action: &'static str,
        /// The cause.
        #[source]
        source: BusError,
    },
    /// A `--source` value that is not a supported source.
    #[error("unsupported source {spec:?}: supported sources are `kube` and `file:DIR`")]
    UnsupportedSource {
        /// The rejected value.
        spec: String,
    },
    /// A background task of the ingester panicked or was cancelled.
    #[error("{action}: background task failed: {source}")]
    Task {
        /// What the task was doing.
        action: &'static str,
        /// The cause.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// Why an object is rejected: a validation failure, without file context (the caller adds
/// it), so the same normalization functions serve the file and the Kubernetes sources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidObject {
    /// What is wrong, naming the offending field.
    pub reason: String,
}

impl InvalidObject {
    /// An error with the given reason.
    pub fn new(reason: impl Into<String>) -> Self {
        InvalidObject {
            reason: reason.into(),
        }
    }
}
