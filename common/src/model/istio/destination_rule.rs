//! `DestinationRule`: subsets and traffic policies.

use super::*;

/// `DestinationRule` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct DestinationRule {
    /// The service the rule applies to.
    pub host: String,
    /// Policy for all subsets unless overridden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets.
    pub subsets: Vec<Subset>,
    /// Namespaces this rule is exported to; empty = all.
    pub export_to: Vec<String>,
}

/// A named subset of a service's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Subset {
    /// Subset name (used in cluster names).
    pub name: String,
    /// Labels the endpoints must carry.
    pub labels: BTreeMap<String, String>,
    /// Policy overriding the rule's policy for this subset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Traffic policy of a destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TrafficPolicy {
    /// Load-balancer settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
}

/// Load-balancer settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancerSettings {
    /// A simple algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
}

/// Simple load-balancing algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    /// Envoy's default (least request in Istio).
    Unspecified,
    /// Least request.
    LeastRequest,
    /// Least connections (Envoy: least request).
    LeastConn,
    /// Random.
    Random,
    /// Pass through to the original destination.
    Passthrough,
    /// Round robin.
    RoundRobin,
}
