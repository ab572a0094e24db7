//! SDS: gateway credentials (`tls.credentialName`) as Envoy `Secret`s, on the gateway's ADS
//! stream, as istiod's `SecretGen` serves them (`pilot/pkg/xds/sds.go`).
//!
//! Names are Istio's: `kubernetes://<secret>` is the server certificate and key of the
//! Secret `<secret>`; `kubernetes://<secret>-cacert` is a client CA bundle: the Secret
//! `<secret>-cacert` if it exists, else the `ca.crt` of `<secret>`.
//!
//! Authorization (istiod's rule, without its RBAC escape hatch): only gateways get
//! credentials, only from their own namespace (the proxy's namespace, which on the secure
//! port is its authenticated identity's), and only on an authenticated stream (enforced by
//! the stream, [`crate::xds`]). A name that is refused or names nothing yields no
//! resource; [`authorize`] says why, for the logs and `shoal_sds_denied_total`.

use super::Resource;
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use shoal_common::credential::TlsCredential;
use shoal_proto::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};
use shoal_proto::XdsType;
use std::sync::Arc;

/// The prefix of the SDS names shoal serves.
pub const KUBERNETES_PREFIX: &str = "kubernetes://";
/// The suffix of a client CA resource (Istio's `SdsCaSuffix`).
pub const CA_SUFFIX: &str = "-cacert";

/// Everything one Secret resource is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretKey {
    /// The requested name (`kubernetes://...`), which is the resource's name.
    pub name: String,
    /// The credential it comes from.
    pub credential: Arc<TlsCredential>,
    /// Whether it is the CA bundle (a validation context) rather than certificate and key.
    pub ca: bool,
}

/// Why a requested secret is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The stream did not authenticate (plaintext port).
    Unauthenticated,
    /// A sidecar asked: only gateways get credentials.
    NotGateway,
    /// The name is not `kubernetes://<name>`.
    UnknownName,
    /// `kubernetes://<namespace>/<name>` for another namespace than the proxy's.
    OtherNamespace,
    /// No such credential in the proxy's namespace (or it has no certificate or no CA).
    NotFound,
}

/// Every [`Denial::reason`].
pub const DENIAL_REASONS: [&str; 5] = [
    "unauthenticated",
    "not_gateway",
    "unknown_name",
    "other_namespace",
    "not_found",
];

impl Denial {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Denial::Unauthenticated => "unauthenticated",
            Denial::NotGateway => "not_gateway",
            Denial::UnknownName => "unknown_name",
            Denial::OtherNamespace => "other_namespace",
            Denial::NotFound => "not_found",
        }
    }
}

/// Whether a proxy may ask for a name at all, whatever the snapshot holds: the Secret
/// name in the proxy's namespace it stands for, or why not.
pub fn check<'a>(name: &'a str, proxy: &Proxy) -> Result<&'a str, Denial> {
    if proxy.kind != ProxyKind::Router {
        return Err(Denial::NotGateway);
    }
    let rest = name
        .strip_prefix(KUBERNETES_PREFIX)
        .ok_or(Denial::UnknownName)?;
    let secret = match rest.split_once('/') {
        Some((ns, secret)) if ns == proxy.namespace => secret,
        Some(_) => return Err(Denial::OtherNamespace),
        None => rest,
    };
    if secret.is_empty() || secret.contains('/') {
        return Err(Denial::UnknownName);
    }
    Ok(secret)
}

/// Resolves one requested name for a proxy: the key of its resource, or why there is none.
pub fn authorize(name: &str, proxy: &Proxy, ctx: &PushContext) -> Result<SecretKey, Denial> {
    let secret = check(name, proxy)?;
    let lookup = |s: &str| {
        ctx.credentials
            .get(&(proxy.namespace.clone(), s.to_string()))
            .cloned()
    };
    if let Some(base) = secret.strip_suffix(CA_SUFFIX) {
        // The `-cacert` Secret if there is one, else the CA of the base Secret.
        let credential = lookup(secret)
            .filter(|c| c.ca_cert.is_some())
            .or_else(|| lookup(base).filter(|c| c.ca_cert.is_some()))
            .ok_or(Denial::NotFound)?;
        return Ok(SecretKey {
            name: name.to_string(),
            credential,
            ca: true,
        });
    }
    let credential = lookup(secret)
        .filter(|c| c.cert_chain.is_some() && c.private_key.is_some())
        .ok_or(Denial::NotFound)?;
    Ok(SecretKey {
        name: name.to_string(),
        credential,
        ca: false,
    })
}

/// The secrets of the requested names that the proxy may have.
pub fn keys(names: &[String], proxy: &Proxy, ctx: &PushContext) -> Vec<SecretKey> {
    names
        .iter()
        .filter_map(|n| authorize(n, proxy, ctx).ok())
        .collect()
}

/// Builds one Secret from its key alone.
pub fn build(key: &SecretKey) -> Resource {
    let inline = |pem: &Option<String>| {
        pem.as_ref().map(|p| DataSource {
            specifier: Some(Specifier::InlineBytes(p.as_bytes().to_vec())),
            ..Default::default()
        })
    };
    let ty = if key.ca {
        secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&key.credential.ca_cert),
            ..Default::default()
        })
    } else {
        secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&key.credential.cert_chain),
            private_key: inline(&key.credential.private_key),
            ..Default::default()
        })
    };
    let s = Secret {
        name: key.name.clone(),
        r#type: Some(ty),
    };
    Resource::new(XdsType::Secret, key.name.clone(), &s)
}
