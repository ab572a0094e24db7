//! Admission: what an object must be to enter shoal's model, and its conversion into it.
//! Pure functions of one object, with no file, watch or bus context (callers add theirs to
//! the errors), so the file and the Kubernetes sources admit alike.
//!
//! - [`istio`]: Istio config into typed [`shoal_common::model::ConfigObject`]s, refusing
//!   unmodelled fields, validated kind by kind as Istio's webhook would
//!   ([`istio::virtual_service`], [`istio::destination_rule`], [`istio::security`]).
//! - [`normalize`]: Kubernetes Services, EndpointSlices, Pods and Nodes into the model.

#[cfg(test)]
mod compat_doc;
pub mod istio;
pub mod normalize;
#[cfg(test)]
mod samples;
