//! The normalized mesh model: what the ingester publishes and the server consumes.
//!
//! Kubernetes objects are reduced to the fields shoal uses; Istio config keeps the
//! `networking.istio.io/v1` field names (camelCase on the wire) so manifests map one to one.

pub mod duration;
pub mod gateway_api;
pub mod issuer;
pub mod istio;
pub mod service;

pub use duration::{Duration, DurationError};
pub use gateway_api::*;
pub use issuer::ClusterIssuer;
pub use istio::*;
pub use service::*;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The identity and metadata of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct ObjectMeta {
    /// Object name.
    pub name: String,
    /// Object namespace.
    pub namespace: String,
    /// Labels of the object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations shoal interprets (e.g. `networking.istio.io/exportTo`); others are dropped.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `creationTimestamp`, in seconds since the Unix epoch, when known: Istio orders
    /// config (which VirtualService or DestinationRule wins) by creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<i64>,
}

impl ObjectMeta {
    /// istiod's config precedence: older first, then by name, then by namespace; objects
    /// without a creation time sort after those with one.
    pub fn precedence(&self) -> (bool, i64, &str, &str) {
        (
            self.created.is_none(),
            self.created.unwrap_or(0),
            &self.name,
            &self.namespace,
        )
    }
}

/// The default cluster-local domain suffix for Kubernetes services.
pub const DEFAULT_DOMAIN_SUFFIX: &str = crate::defaults::DOMAIN_SUFFIX;

/// The fully qualified hostname of a Kubernetes service.
pub fn service_fqdn(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}.svc.{DEFAULT_DOMAIN_SUFFIX}")
}
