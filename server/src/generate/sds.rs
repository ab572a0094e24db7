//! SDS: gateway credentials (`tls.credentialName`) as Envoy `Secret`s, on the gateway's ADS
//! stream, as istiod's `SecretGen` serves them (`pilot/pkg/xds/sds.go`).
//!
//! Names are Istio's: `kubernetes://<secret>` is the server certificate and key of the
//! Secret `<secret>`; `kubernetes://<secret>-cacert` is a client CA bundle: the Secret
//! `<secret>-cacert` if it exists, else the `ca.crt` of `<secret>`.
//!
//! Authorization. istiod serves a credential to a proxy whose verified identity may read
//! the Secret, in the proxy's own cluster: a SubjectAccessReview asks that cluster's API
//! server whether the service account may `get` it (`pilot/pkg/xds/sds.go`). shoal's
//! servers have no Kubernetes rights, so "may read it" becomes "runs the gateway that
//! serves it", which is what the Role istio's gateway charts grant is for. A requested
//! name `kubernetes://<secret>` is served only when all of these hold (each refusal has its
//! [`Denial`]):
//!
//! 1. the stream authenticated (the TLS port: the proxy's [`VerifiedIdentity`], which the
//!    stream sets from its credential — never from the node id or metadata);
//! 2. the proxy is a gateway (`router`), and the Secret is in its namespace (on the TLS port
//!    an authenticated identity's namespace);
//! 3. the Secret is one of the caller's **cluster**: a token proves the cluster whose
//!    issuer keys verified it. A client certificate names no cluster (SPIFFE identities
//!    have none, and the CA signs for tokens of every cluster whose issuer is published), so
//!    it proves one only when the servers accept tokens of at most one cluster: then every
//!    certificate the CA issued came from that cluster (or from a PKI that knows no
//!    clusters). With token issuers of several clusters published, certificate-
//!    authenticated gateways get no credentials: they must authenticate with their
//!    service-account token (istio-agent's default);
//! 4. one of the caller's service accounts is that of a **workload serving the Secret** in
//!    that cluster: a pod (an endpoint, with its labels and service account) in the
//!    Secret's namespace and cluster that the `selector` of a Gateway of that namespace
//!    naming the Secret in a server's `tls.credentialName` selects (a `-cacert` name is
//!    served by the Gateways naming its base Secret). Only Gateways of the Secret's
//!    namespace count: the ingester publishes only Secrets those name, and a Gateway in
//!    another namespace must not let its author pick who reads this namespace's Secrets. A
//!    Gateway without a selector names no workload, so it authorizes nobody (it applies to
//!    every gateway proxy, but shoal cannot tell gateway pods from others).
//!
//! A name refused or naming nothing yields no resource. All of this reads the proxy's
//! verified identity, the PushContext and the endpoint index's workloads: the view key
//! carries the verified identity (`crate::push::view::ViewKey`), and a view's SDS output is
//! rebuilt when the PushContext or the workloads change.

use super::{Resource, Snapshot};
use crate::index::hosts::labels_match;
use crate::index::proxy::{ProvenCluster, Proxy, ProxyKind, VerifiedIdentity};
use crate::index::push_context::PushContext;
use shoal_common::credential::TlsCredential;
use shoal_proto::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The prefix of the SDS names shoal serves.
pub const KUBERNETES_PREFIX: &str = "kubernetes://";
/// The suffix of a client CA resource (Istio's `SdsCaSuffix`).
pub const CA_SUFFIX: &str = "-cacert";

/// Everything one Secret resource is built from. The caller's identity is not part of it:
/// it decides whether the key exists ([`authorize`]), not what the resource holds.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Denial {
    /// The stream did not authenticate (plaintext port).
    Unauthenticated,
    /// A sidecar asked: only gateways get credentials.
    NotGateway,
    /// The name is not `kubernetes://<name>`.
    UnknownName,
    /// `kubernetes://<namespace>/<name>` for another namespace than the proxy's.
    OtherNamespace,
    /// The caller's cluster is not proven: a client certificate while tokens of several
    /// clusters are accepted, or a token the keys of several clusters verify.
    UnprovenCluster,
    /// The Secret exists in the proxy's namespace, but of another cluster than the
    /// caller's.
    OtherCluster,
    /// No such credential in the proxy's namespace (or it has no certificate or no CA).
    NotFound,
    /// None of the caller's service accounts runs a workload of a Gateway that serves the
    /// Secret (in its namespace and cluster).
    NotGatewayIdentity,
}

/// Every [`Denial::reason`].
pub const DENIAL_REASONS: [&str; 8] = [
    "unauthenticated",
    "not_gateway",
    "unknown_name",
    "other_namespace",
    "unproven_cluster",
    "other_cluster",
    "not_found",
    "not_gateway_identity",
];

impl Denial {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Denial::Unauthenticated => "unauthenticated",
            Denial::NotGateway => "not_gateway",
            Denial::UnknownName => "unknown_name",
            Denial::OtherNamespace => "other_namespace",
            Denial::UnprovenCluster => "unproven_cluster",
            Denial::OtherCluster => "other_cluster",
            Denial::NotFound => "not_found",
            Denial::NotGatewayIdentity => "not_gateway_identity",
        }
    }
}

/// The Secret name in the proxy's namespace that a requested name stands for, or why it
/// cannot be asked for at all (whatever the snapshot holds).
fn secret_name<'a>(name: &'a str, proxy: &Proxy) -> Result<&'a str, Denial> {
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

/// Which cluster's Secrets a verified caller may have: `Some(cluster)`, or `None` for
/// "whichever one cluster has it" (a certificate while no cluster's tokens are accepted).
fn caller_cluster<'a>(
    verified: &'a VerifiedIdentity,
    ctx: &'a PushContext,
) -> Result<Option<&'a str>, Denial> {
    match &verified.cluster {
        ProvenCluster::Token(cluster) => Ok(Some(cluster)),
        ProvenCluster::Ambiguous => Err(Denial::UnprovenCluster),
        ProvenCluster::Certificate => {
            let mut issuers = ctx.token_issuers.iter();
            match (issuers.next(), issuers.next()) {
                (None, _) => Ok(None),
                (Some(only), None) => Ok(Some(only)),
                (Some(_), Some(_)) => Err(Denial::UnprovenCluster),
            }
        }
    }
}

/// Whether a Gateway of `namespace` names `secret` as a server's credential (or, for a
/// `-cacert` name, its base Secret).
fn names_secret(spec: &shoal_common::model::Gateway, secret: &str) -> bool {
    spec.servers.iter().any(|server| {
        server
            .tls
            .as_ref()
            .and_then(|t| t.credential_name.as_deref())
            .is_some_and(|c| c == secret || secret.strip_suffix(CA_SUFFIX) == Some(c))
    })
}

/// Whether one of `accounts` runs a workload serving `secret` in `namespace` of `cluster`
/// (rule 4 of the module doc).
fn serves(
    accounts: &std::collections::BTreeSet<String>,
    secret: &str,
    namespace: &str,
    cluster: &str,
    snap: &Snapshot,
) -> bool {
    let Some(workloads) = snap.endpoints.workloads(cluster, namespace) else {
        return false;
    };
    let selectors: Vec<&BTreeMap<String, String>> = snap
        .ctx
        .gateways
        .iter()
        .filter(|g| g.meta.namespace == namespace && !g.spec.selector.is_empty())
        .filter(|g| names_secret(&g.spec, secret))
        .map(|g| &g.spec.selector)
        .collect();
    workloads.keys().any(|(labels, account)| {
        accounts.contains(account) && selectors.iter().any(|s| labels_match(s, labels))
    })
}

/// Resolves one requested name for a proxy: the key of its resource, or why there is none
/// (the rules of the module doc, in order).
pub fn authorize(name: &str, proxy: &Proxy, snap: &Snapshot) -> Result<SecretKey, Denial> {
    let verified = proxy.verified.as_ref().ok_or(Denial::Unauthenticated)?;
    let secret = secret_name(name, proxy)?;
    let ctx = &snap.ctx;
    let cluster = caller_cluster(verified, ctx)?;
    // The credential of `s` in the caller's cluster: (its cluster, it).
    let lookup = |s: &str| -> Result<Option<(&str, &Arc<TlsCredential>)>, Denial> {
        let Some(by_cluster) = ctx
            .credentials
            .get(&(proxy.namespace.clone(), s.to_string()))
        else {
            return Ok(None);
        };
        match cluster {
            Some(c) => Ok(by_cluster.get_key_value(c).map(|(c, v)| (c.as_str(), v))),
            None if by_cluster.len() > 1 => Err(Denial::UnprovenCluster),
            None => Ok(by_cluster.iter().next().map(|(c, v)| (c.as_str(), v))),
        }
    };
    let (ca, found) = match secret.strip_suffix(CA_SUFFIX) {
        // The `-cacert` Secret if there is one, else the CA of the base Secret.
        Some(base) => {
            let own = lookup(secret)?.filter(|(_, c)| c.ca_cert.is_some());
            let found = match own {
                Some(found) => Some(found),
                None => lookup(base)?.filter(|(_, c)| c.ca_cert.is_some()),
            };
            (true, found)
        }
        None => {
            let found =
                lookup(secret)?.filter(|(_, c)| c.cert_chain.is_some() && c.private_key.is_some());
            (false, found)
        }
    };
    let Some((secret_cluster, credential)) = found else {
        // Not in the caller's cluster: say so when another cluster has it (for a CA, the
        // `-cacert` Secret or its base).
        let names = [Some(secret), secret.strip_suffix(CA_SUFFIX)];
        let elsewhere = cluster.is_some_and(|own| {
            names.into_iter().flatten().any(|s| {
                ctx.credentials
                    .get(&(proxy.namespace.clone(), s.to_string()))
                    .is_some_and(|by_cluster| by_cluster.keys().any(|c| c != own))
            })
        });
        return Err(if elsewhere {
            Denial::OtherCluster
        } else {
            Denial::NotFound
        });
    };
    if !serves(
        &verified.service_accounts,
        secret,
        &proxy.namespace,
        secret_cluster,
        snap,
    ) {
        return Err(Denial::NotGatewayIdentity);
    }
    Ok(SecretKey {
        name: name.to_string(),
        credential: credential.clone(),
        ca,
    })
}

/// The secrets of the requested names that the proxy may have.
pub fn keys(names: &[String], proxy: &Proxy, snap: &Snapshot) -> Vec<SecretKey> {
    names
        .iter()
        .filter_map(|n| authorize(n, proxy, snap).ok())
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
