//! shoal-ingester: reads Kubernetes and Istio objects, admits them into shoal's model and
//! publishes them to the state bus. This crate never depends on gRPC or Envoy types.
//!
//! # Where to start
//!
//! Folders by role, from the bottom up; each uses only what is above it in this list, so
//! there is no import cycle between them:
//!
//! - Neutral: [`object`] (which object, and where it was read), [`error`], [`task`]
//!   (task guards), [`selector`] (discovery selectors).
//! - [`admit`]: validation and conversion of one object into the model: Istio config
//!   ([`admit::istio`]) and Kubernetes objects ([`admit::normalize`]).
//! - [`desired`]: the desired bus state (keys, values, each kind's entry, sealed gateway
//!   credentials).
//! - [`coordination`]: the fleet: leader election ([`coordination::lease`]), cluster
//!   ownership, readiness and the fleet's sync marker, bus healing.
//! - [`publish`]: writes the desired state, only what changed, only while leading.
//! - [`source`]: where objects come from: [`source::file`] (manifests) and
//!   [`source::kubernetes`] (watches, multicluster Secrets, CRDs, status).
//! - On top: [`app`] (the binary's wiring, [`run`]) and [`admin`] (`/ready`, `/metrics`,
//!   `/debug/clusters`).
//!
//! Flow: a source reads objects and admits them, computes each cluster's desired state in
//! the namespaces the discovery selectors select, and hands it to a [`Publisher`], which
//! writes what differs from the bus while [`Leadership`] says this replica leads its
//! fleet. To follow one object: a manifest is parsed in [`source::file::manifest`], a
//! watched object reduced in [`source::kubernetes::reduce`]; both end in [`desired`]'s
//! entries. Metrics live beside their subsystem ([`publish::metrics`],
//! [`coordination::metrics`], [`source::kubernetes::metrics`]), all registered into the
//! one registry `/metrics` serves.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admit;
pub mod app;
pub mod coordination;
pub mod desired;
pub mod error;
pub mod object;
pub mod publish;
pub mod selector;
pub mod source;
pub mod task;
#[cfg(test)]
pub(crate) mod testing;

pub use app::{run, IngesterArgs, LogFormat, SourceSpec};
pub use coordination::lease::{Leadership, Term};
pub use error::{IngestError, InvalidObject};
pub use publish::{PublishReport, Publisher};
pub use source::file::{FileSource, FileSourceConfig, DEFAULT_POLL_INTERVAL};
