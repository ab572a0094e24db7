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
}

/// The API group of Istio's networking kinds.
pub const NETWORKING_GROUP: &str = "networking.istio.io";
/// The API group of Istio's security kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

impl ConfigKind {
    /// The Istio kinds, in a stable order (not [`ConfigKind::Credential`]).
    pub const ALL: [ConfigKind; 9] = [
        ConfigKind::Gateway,
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::Sidecar,
        ConfigKind::ServiceEntry,
        ConfigKind::WorkloadEntry,
        ConfigKind::PeerAuthentication,
        ConfigKind::AuthorizationPolicy,
        ConfigKind::RequestAuthentication,
    ];

    /// The Kubernetes API group of the kind.
    pub fn group(self) -> &'static str {
        match self {
            ConfigKind::PeerAuthentication
            | ConfigKind::AuthorizationPolicy
            | ConfigKind::RequestAuthentication => SECURITY_GROUP,
            // A Kubernetes Secret: the core group.
            ConfigKind::Credential => "",
            _ => NETWORKING_GROUP,
        }
    }

    /// The versions of the kind shoal reads, preferred first; they share one schema for
    /// the fields shoal models.
    pub fn versions(self) -> &'static [&'static str] {
        match self.group() {
            SECURITY_GROUP => &["v1", "v1beta1"],
            "" => &["v1"],
            _ => &["v1", "v1beta1", "v1alpha3"],
        }
    }

    /// Parses a Kubernetes group and kind (`None` for kinds of other groups).
    pub fn parse_in(group: &str, kind: &str) -> Option<ConfigKind> {
        ConfigKind::parse(kind).filter(|k| k.group() == group)
    }

    /// The Kubernetes `kind` string.
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
            ConfigKind::Credential => "Credential",
        }
    }

    /// Parses a Kubernetes `kind` string of an Istio kind (one of [`ConfigKind::ALL`]).
    pub fn parse(kind: &str) -> Option<ConfigKind> {
        ConfigKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// Parses the kind token of a `shoal-config` key: an Istio kind or `Credential`.
    pub fn parse_key_token(kind: &str) -> Option<ConfigKind> {
        ConfigKind::parse(kind)
            .or((kind == ConfigKind::Credential.as_str()).then_some(ConfigKind::Credential))
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
            ConfigSpec::Credential(_) => ConfigKind::Credential,
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
}
