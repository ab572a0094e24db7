//! A cluster's service-account token issuer, as the ingester reads it from the cluster's
//! API server (`/.well-known/openid-configuration` and `/openid/v1/jwks`) and publishes it
//! in `shoal-meta` under [`crate::keys::issuer_key`].
//!
//! xDS servers verify the Kubernetes service-account tokens proxies present against these
//! keys, offline: no server needs Kubernetes access, and the API servers see no request
//! per proxy connection.

use serde::{Deserialize, Serialize};

/// The token issuer of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIssuer {
    /// The cluster ID.
    pub cluster: String,
    /// The `issuer` of the cluster's OpenID configuration: the `iss` of its tokens.
    pub issuer: String,
    /// The cluster's JSON Web Key Set, as served (`{"keys": [...]}`).
    pub jwks: String,
}
