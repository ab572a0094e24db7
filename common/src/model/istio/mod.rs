//! Istio config, typed with the field names of `networking.istio.io/v1` and
//! `security.istio.io/v1`.
//!
//! Only the fields shoal implements are modelled; unknown fields are ignored on input.

pub(crate) use super::{Duration, ObjectMeta};
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use std::collections::BTreeMap;

mod destination_rule;
mod gateway;
mod security;
mod service_entry;
mod sidecar;
mod virtual_service;

pub use destination_rule::*;
pub use gateway::*;
pub use security::*;
pub use service_entry::*;
pub use sidecar::*;
pub use virtual_service::*;

/// The kinds of Istio config shoal understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigKind {
    /// `Gateway`.
    Gateway,
    /// `VirtualService`.
    VirtualService,
    /// `DestinationRule`.
    DestinationRule,
    /// `Sidecar`.
    Sidecar,
    /// `ServiceEntry`.
    ServiceEntry,
    /// `WorkloadEntry`.
    WorkloadEntry,
    /// `PeerAuthentication` (`security.istio.io`).
    PeerAuthentication,
    /// `AuthorizationPolicy` (`security.istio.io`).
    AuthorizationPolicy,
    /// `RequestAuthentication` (`security.istio.io`).
    RequestAuthentication,
    /// A Gateway TLS credential: a Kubernetes Secret a Gateway names in `credentialName`,
    /// sealed ([`crate::credential`]). Not an Istio kind: never read from Istio manifests.
    Credential,
    // New kinds go last: the encoded form of a variant may be its index.
    /// `GatewayClass` (`gateway.networking.k8s.io`, cluster-scoped).
    GatewayClass,
    /// `Gateway` of the Kubernetes Gateway API (`gateway.networking.k8s.io`).
    KubeGateway,
    /// `HTTPRoute` (`gateway.networking.k8s.io`).
    HTTPRoute,
    /// `GRPCRoute` (`gateway.networking.k8s.io`).
    GRPCRoute,
    /// `TCPRoute` (`gateway.networking.k8s.io`, experimental channel).
    TCPRoute,
    /// `TLSRoute` (`gateway.networking.k8s.io`, experimental channel).
    TLSRoute,
    /// `ReferenceGrant` (`gateway.networking.k8s.io`).
    ReferenceGrant,
    /// A Kubernetes Namespace's labels, for the Gateway API's `allowedRoutes` namespace
    /// selectors. Not an Istio kind: published from Namespaces, never read from manifests
    /// of Istio kinds (cluster-scoped).
    Namespace,
}

/// The API group of Istio's networking kinds.
pub const NETWORKING_GROUP: &str = "networking.istio.io";
/// The API group of Istio's security kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

impl ConfigKind {
    /// The kinds read from Kubernetes objects, in a stable order (not
    /// [`ConfigKind::Credential`]).
    pub const ALL: [ConfigKind; 16] = [
        ConfigKind::Gateway,
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::Sidecar,
        ConfigKind::ServiceEntry,
        ConfigKind::WorkloadEntry,
        ConfigKind::PeerAuthentication,
        ConfigKind::AuthorizationPolicy,
        ConfigKind::RequestAuthentication,
        ConfigKind::GatewayClass,
        ConfigKind::KubeGateway,
        ConfigKind::HTTPRoute,
        ConfigKind::GRPCRoute,
        ConfigKind::TCPRoute,
        ConfigKind::TLSRoute,
        ConfigKind::ReferenceGrant,
    ];

    /// The Kubernetes API group of the kind.
    pub fn group(self) -> &'static str {
        match self {
            ConfigKind::PeerAuthentication
            | ConfigKind::AuthorizationPolicy
            | ConfigKind::RequestAuthentication => SECURITY_GROUP,
            // A Kubernetes Secret or Namespace: the core group.
            ConfigKind::Credential | ConfigKind::Namespace => "",
            ConfigKind::GatewayClass
            | ConfigKind::KubeGateway
            | ConfigKind::HTTPRoute
            | ConfigKind::GRPCRoute
            | ConfigKind::TCPRoute
            | ConfigKind::TLSRoute
            | ConfigKind::ReferenceGrant => super::GATEWAY_API_GROUP,
            _ => NETWORKING_GROUP,
        }
    }

    /// The versions of the kind shoal reads, preferred first; they share one schema for
    /// the fields shoal models.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            // The experimental channel's kinds: v1alpha2 is what Istio reads.
            ConfigKind::TCPRoute | ConfigKind::TLSRoute => return &["v1alpha2"],
            ConfigKind::GRPCRoute | ConfigKind::ReferenceGrant => return &["v1", "v1beta1"],
            ConfigKind::GatewayClass | ConfigKind::KubeGateway | ConfigKind::HTTPRoute => {
                return &["v1", "v1beta1"]
            }
            _ => {}
        }
        match self.group() {
            SECURITY_GROUP => &["v1", "v1beta1"],
            "" => &["v1"],
            _ => &["v1", "v1beta1", "v1alpha3"],
        }
    }

    /// Parses a Kubernetes group and kind (`None` for kinds of other groups).
    pub fn parse_in(group: &str, kind: &str) -> Option<ConfigKind> {
        ConfigKind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.kube_kind() == kind)
    }

    /// The Kubernetes `kind` string (`Gateway` for both Gateway kinds; see [`Self::group`]).
    pub fn kube_kind(self) -> &'static str {
        match self {
            ConfigKind::KubeGateway => "Gateway",
            k => k.as_str(),
        }
    }

    /// Whether objects of the kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, ConfigKind::GatewayClass | ConfigKind::Namespace)
    }

    /// The kind's token: in keys, logs and metrics; unique among kinds (the Kubernetes
    /// kind, but `KubeGateway` for the Gateway API's Gateway).
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::Gateway => "Gateway",
            ConfigKind::VirtualService => "VirtualService",
            ConfigKind::DestinationRule => "DestinationRule",
            ConfigKind::Sidecar => "Sidecar",
            ConfigKind::ServiceEntry => "ServiceEntry",
            ConfigKind::WorkloadEntry => "WorkloadEntry",
            ConfigKind::PeerAuthentication => "PeerAuthentication",
            ConfigKind::AuthorizationPolicy => "AuthorizationPolicy",
            ConfigKind::RequestAuthentication => "RequestAuthentication",
            ConfigKind::GatewayClass => "GatewayClass",
            ConfigKind::KubeGateway => "KubeGateway",
            ConfigKind::HTTPRoute => "HTTPRoute",
            ConfigKind::GRPCRoute => "GRPCRoute",
            ConfigKind::TCPRoute => "TCPRoute",
            ConfigKind::TLSRoute => "TLSRoute",
            ConfigKind::ReferenceGrant => "ReferenceGrant",
            ConfigKind::Credential => "Credential",
            ConfigKind::Namespace => "Namespace",
        }
    }

    /// Parses a kind token ([`Self::as_str`]) of one of [`ConfigKind::ALL`].
    pub fn parse(kind: &str) -> Option<ConfigKind> {
        ConfigKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// Parses the kind token of a `shoal-config` key: an Istio kind, `Credential` or
    /// `Namespace`.
    pub fn parse_key_token(kind: &str) -> Option<ConfigKind> {
        ConfigKind::parse(kind).or([ConfigKind::Credential, ConfigKind::Namespace]
            .into_iter()
            .find(|k| k.as_str() == kind))
    }
}

impl std::fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Istio config object: metadata plus a typed spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConfigObject {
    /// Name, namespace, labels, annotations.
    pub meta: ObjectMeta,
    /// The typed spec; its variant is the kind.
    pub spec: ConfigSpec,
}

impl ConfigObject {
    /// The kind of this object.
    pub fn kind(&self) -> ConfigKind {
        match &self.spec {
            ConfigSpec::Gateway(_) => ConfigKind::Gateway,
            ConfigSpec::VirtualService(_) => ConfigKind::VirtualService,
            ConfigSpec::DestinationRule(_) => ConfigKind::DestinationRule,
            ConfigSpec::Sidecar(_) => ConfigKind::Sidecar,
            ConfigSpec::ServiceEntry(_) => ConfigKind::ServiceEntry,
            ConfigSpec::WorkloadEntry(_) => ConfigKind::WorkloadEntry,
            ConfigSpec::PeerAuthentication(_) => ConfigKind::PeerAuthentication,
            ConfigSpec::AuthorizationPolicy(_) => ConfigKind::AuthorizationPolicy,
            ConfigSpec::RequestAuthentication(_) => ConfigKind::RequestAuthentication,
            ConfigSpec::GatewayClass(_) => ConfigKind::GatewayClass,
            ConfigSpec::KubeGateway(_) => ConfigKind::KubeGateway,
            ConfigSpec::HTTPRoute(_) => ConfigKind::HTTPRoute,
            ConfigSpec::GRPCRoute(_) => ConfigKind::GRPCRoute,
            ConfigSpec::TCPRoute(_) => ConfigKind::TCPRoute,
            ConfigSpec::TLSRoute(_) => ConfigKind::TLSRoute,
            ConfigSpec::ReferenceGrant(_) => ConfigKind::ReferenceGrant,
            ConfigSpec::Credential(_) => ConfigKind::Credential,
            ConfigSpec::Namespace(_) => ConfigKind::Namespace,
        }
    }
}

/// The spec of an Istio config object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConfigSpec {
    /// A Gateway spec.
    Gateway(Gateway),
    /// A VirtualService spec.
    VirtualService(VirtualService),
    /// A DestinationRule spec.
    DestinationRule(DestinationRule),
    /// A Sidecar spec.
    Sidecar(Sidecar),
    /// A ServiceEntry spec.
    ServiceEntry(ServiceEntry),
    /// A WorkloadEntry spec.
    WorkloadEntry(WorkloadEntry),
    /// A PeerAuthentication spec.
    PeerAuthentication(PeerAuthentication),
    /// An AuthorizationPolicy spec.
    AuthorizationPolicy(AuthorizationPolicy),
    /// A RequestAuthentication spec.
    RequestAuthentication(RequestAuthentication),
    /// A sealed gateway TLS credential.
    Credential(crate::credential::SealedCredential),
    // New kinds go last: the encoded form of a variant may be its index.
    /// A Gateway API GatewayClass spec.
    GatewayClass(super::GatewayClass),
    /// A Gateway API Gateway spec.
    KubeGateway(super::KubeGateway),
    /// An HTTPRoute spec.
    HTTPRoute(super::HTTPRoute),
    /// A GRPCRoute spec.
    GRPCRoute(super::GRPCRoute),
    /// A TCPRoute spec.
    TCPRoute(super::L4Route),
    /// A TLSRoute spec.
    TLSRoute(super::L4Route),
    /// A ReferenceGrant spec.
    ReferenceGrant(super::ReferenceGrant),
    /// A Namespace: its labels are the object's metadata labels.
    Namespace(super::NamespaceLabels),
}
