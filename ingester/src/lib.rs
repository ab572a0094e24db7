//! shoal-ingester: reads Kubernetes and Istio objects, normalizes them into shoal's model
//! and publishes them to the state bus.
//!
//! Flow: a source gets objects — [`FileSource`] from a directory of manifests
//! ([`manifest`]), [`kubernetes::KubeSource`] from Kubernetes clusters (watches, multicluster
//! secrets, CRDs). [`normalize`] and [`istio`] turn them into the model, [`state`] computes
//! the desired bus state (joining EndpointSlices with Pods and Nodes) in the namespaces
//! the discovery [`selector`]s select, and [`publish`] writes only what changed. Replicas of
//! a fleet elect a leader through a [`lease`] on the bus; only the leader writes.
//! [`admin`] serves readiness and [`metrics`].
//!
//! This crate never depends on gRPC or Envoy types.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod bus_guard;
#[cfg(test)]
mod compat_doc;
pub mod credentials;
pub mod destination_rule;
pub mod error;
pub mod file;
pub mod istio;
pub mod kubernetes;
pub mod lease;
pub mod manifest;
pub mod mesh_config;
pub mod metrics;
pub mod normalize;
pub mod ownership;
pub mod publish;
pub mod readiness;
pub mod security;
pub mod selector;
pub mod state;
pub mod status;
#[cfg(test)]
pub(crate) mod testing;
pub mod virtual_service;

pub use app::{run, IngesterArgs, LogFormat, SourceSpec};
pub use error::{IngestError, InvalidObject};
pub use file::{FileSource, FileSourceConfig, DEFAULT_POLL_INTERVAL};
pub use lease::{Leadership, Term};
pub use publish::{PublishReport, Publisher};
