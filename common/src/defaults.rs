//! shoal's defaults in one place: Istio's own, so a mesh moving from istiod keeps its names.

/// The cluster ID of the local cluster and of proxies that send no `CLUSTER_ID` (Istio's
/// default).
pub const CLUSTER_ID: &str = "Kubernetes";

/// The DNS suffix of Kubernetes services (`<name>.<namespace>.svc.<suffix>`).
pub const DOMAIN_SUFFIX: &str = "cluster.local";

/// Istio's system namespace: the root namespace of mesh-wide config (its selector-less
/// Sidecar, DestinationRules) and where multicluster Secrets live, unless configured.
pub const ROOT_NAMESPACE: &str = "istio-system";

/// The namespace the control plane runs in (Istio's `istio-system`); its
/// `topology.istio.io/network` label names its cluster's network.
pub const SYSTEM_NAMESPACE: &str = "istio-system";

/// The mesh's trust domain when MeshConfig sets none (Istio's `trustDomain` default): the
/// trust domain of identities read from service-account tokens.
pub const TRUST_DOMAIN: &str = "cluster.local";
