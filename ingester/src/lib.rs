//! shoal-ingester: reads Kubernetes and Istio objects, normalizes them into shoal's model
//! and publishes them to the state bus.
//!
//! Flow: [`manifest`] parses documents into k8s-openapi objects and typed Istio config,
//! [`normalize`] and [`istio`] turn them into the model, [`state`] computes the desired
//! bus state (joining EndpointSlices with Pods and Nodes), and [`publish`] writes only what
//! changed. [`FileSource`] drives all of it from a directory; a Kubernetes source will feed
//! the same functions.
//!
//! This crate never depends on gRPC or Envoy types.
#![forbid(unsafe_code)]

pub mod app;
pub mod error;
pub mod file;
pub mod istio;
pub mod manifest;
pub mod normalize;
pub mod publish;
pub mod state;

pub use app::{run, IngesterArgs, LogFormat, SourceSpec};
pub use error::{IngestError, InvalidObject};
pub use file::{FileSource, FileSourceConfig, DEFAULT_POLL_INTERVAL};
pub use publish::{PublishReport, Publisher};
