//! Who a proxy is, on the secure xDS port, and whether it may have the config it asks for.
//!
//! As istiod does it (`pilot/pkg/xds/auth.go`, `security/pkg/server/ca/authenticate`):
//!
//! - **Authentication**, when a stream opens: a client certificate (verified against the
//!   client CA by the TLS handshake) whose URI SAN is a SPIFFE identity
//!   `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`, or else a Kubernetes service-account token
//!   (`authorization: Bearer <jwt>`, what istio-agent sends). Tokens are verified
//!   **offline**: against the issuer keys the ingester read from each cluster's API server
//!   and published in `shoal-meta` ([`ClusterIssuer`]), with the audience istio-agent asks
//!   for (`istio-ca` by default), the expiry and `nbf` checked (60 s leeway), and a token
//!   without `kid` checked against a few keys of its algorithm only
//!   ([`MAX_KEYS_WITHOUT_KID`]). The `clusterid` header, when
//!   present, restricts the check to that cluster's keys, as istiod's `clusterid` does. No
//!   server needs Kubernetes access and the API servers see no request per connection.
//!   Unlike istiod's TokenReview, a token stays valid until it expires even if its pod is
//!   deleted (projected tokens are short-lived; see docs/security.md).
//! - **Authorization**, on the stream's first request: the node's namespace (the one its
//!   config is generated for) must be the identity's, and when the node names a service
//!   account (metadata `SERVICE_ACCOUNT`), so must the identity (istiod's
//!   `checkConnectionIdentity`).
//!
//! Refusals end the stream with `Unauthenticated` (no usable credential) or
//! `PermissionDenied` (a valid identity asking for another's config), the reason in the
//! status message and in `shoal_xds_auth_refused_total{reason}`. The plaintext port, when
//! enabled, authenticates nothing (istiod's 15010): it is for trusted networks only.

use crate::index::proxy::{ProvenCluster, Proxy, VerifiedIdentity};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rustls_pki_types::CertificateDer;
use shoal_common::model::ClusterIssuer;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

/// The audience istio-agent requests for the token it sends to istiod (`istio-ca`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// A workload identity: `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    /// The trust domain.
    pub trust_domain: String,
    /// The namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
}

impl Identity {
    /// Parses a SPIFFE URI of Istio's form; `None` for anything else.
    pub fn parse(uri: &str) -> Option<Identity> {
        let rest = uri.strip_prefix("spiffe://")?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
                Some(Identity {
                    trust_domain: td.to_string(),
                    namespace: ns.to_string(),
                    service_account: sa.to_string(),
                })
            }
            _ => None,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its identities (a certificate may carry several).
    pub identities: Vec<Identity>,
    /// `certificate` or `token`.
    pub source: CredentialSource,
    /// The cluster its credential proves: a token's is the one cluster whose issuer keys
    /// verify it; a certificate names none.
    pub cluster: ProvenCluster,
    /// The node the caller's pod runs on, from a bound token's `kubernetes.io.node.name`
    /// claim (Kubernetes 1.30+); what a ztunnel may impersonate is bound to it
    /// ([`crate::security::ca`]). None for certificates.
    pub node: Option<String>,
}

impl Caller {
    /// The caller's identities, for logs.
    pub fn describe(&self) -> String {
        let ids: Vec<String> = self.identities.iter().map(Identity::to_string).collect();
        ids.join(", ")
    }
}

/// What a caller authenticated with: the `source` label of `shoal_xds_auth_accepted_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialSource {
    /// A client certificate with a SPIFFE identity.
    Certificate,
    /// A service-account token.
    Token,
}

impl CredentialSource {
    /// Every source.
    pub const ALL: [CredentialSource; 2] = [CredentialSource::Certificate, CredentialSource::Token];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialSource::Certificate => "certificate",
            CredentialSource::Token => "token",
        }
    }
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a stream presented: set by the TLS listener (the peer's certificates) and read
/// from the request's headers.
#[derive(Debug, Default, Clone)]
pub struct Credentials {
    /// The verified client certificate chain, leaf first (empty: none presented).
    pub certificates: Vec<CertificateDer<'static>>,
    /// The bearer token of the `authorization` header.
    pub token: Option<String>,
    /// The `clusterid` header: the cluster whose keys verify the token.
    pub cluster_id: Option<String>,
}

/// The client certificates of a TLS connection, put into each request's extensions by the
/// listener; its presence marks a stream of the secure port.
#[derive(Debug, Clone, Default)]
pub struct TlsPeer(pub Arc<Vec<CertificateDer<'static>>>);

impl Credentials {
    /// The credentials of a request of a TLS connection; `None` on the plaintext port.
    pub fn of<B>(request: &tonic::codegen::http::Request<B>) -> Option<Credentials> {
        let peer = request.extensions().get::<TlsPeer>()?;
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let token = header("authorization").and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        });
        Some(Credentials {
            certificates: peer.0.as_ref().clone(),
            token,
            cluster_id: header("clusterid").map(str::to_string),
        })
    }
}

/// Why a stream was refused. [`AuthError::reason`] is its metric label.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Neither a client certificate nor a token.
    #[error(
        "no credentials: present a client certificate with a SPIFFE identity or a Kubernetes \
         service-account token (authorization: Bearer <token>)"
    )]
    NoCredentials,
    /// A certificate without a SPIFFE URI SAN, and no token.
    #[error(
        "the client certificate has no SPIFFE identity (URI SAN \
         spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>)"
    )]
    NoSpiffeIdentity,
    /// The token is not a JWT.
    #[error("the token is not a JWT: {0}")]
    MalformedToken(String),
    /// No published issuer's keys could have signed the token.
    #[error("no cluster's issuer keys verify the token{}; known clusters: {known}", cluster.as_ref().map(|c| format!(" (clusterid {c:?})")).unwrap_or_default())]
    UnknownIssuer {
        /// The `clusterid` the client named.
        cluster: Option<String>,
        /// The clusters whose keys are loaded.
        known: String,
    },
    /// A known issuer's token failed verification (signature, expiry, audience).
    #[error("token of cluster {cluster:?} rejected: {reason}")]
    InvalidToken {
        /// The cluster whose issuer matched.
        cluster: String,
        /// What failed.
        reason: String,
    },
    /// A valid token without the Kubernetes service-account claims.
    #[error("the token names no service account (claims kubernetes.io.namespace and kubernetes.io.serviceaccount.name, or sub system:serviceaccount:<ns>:<sa>)")]
    NoServiceAccount,
    /// The caller asked for another identity's config.
    #[error("node {node:?} wants namespace {namespace:?}{} but the caller is {identities}", service_account.as_ref().map(|sa| format!(" and service account {sa:?}")).unwrap_or_default())]
    Forbidden {
        /// The node id.
        node: String,
        /// The node's namespace.
        namespace: String,
        /// The node's service account, if it names one.
        service_account: Option<String>,
        /// The caller's identities.
        identities: String,
    },
}

/// Every [`AuthError::reason`].
pub const REFUSAL_REASONS: [&str; 7] = [
    "no_credentials",
    "no_spiffe_identity",
    "malformed_token",
    "unknown_issuer",
    "invalid_token",
    "no_service_account",
    "forbidden",
];

impl AuthError {
    /// The `reason` label of `shoal_xds_auth_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::NoCredentials => "no_credentials",
            AuthError::NoSpiffeIdentity => "no_spiffe_identity",
            AuthError::MalformedToken(_) => "malformed_token",
            AuthError::UnknownIssuer { .. } => "unknown_issuer",
            AuthError::InvalidToken { .. } => "invalid_token",
            AuthError::NoServiceAccount => "no_service_account",
            AuthError::Forbidden { .. } => "forbidden",
        }
    }

    /// The gRPC status a refused stream ends with.
    pub fn status(&self) -> tonic::Status {
        match self {
            AuthError::Forbidden { .. } => {
                tonic::Status::permission_denied(format!("authorization failed: {self}"))
            }
            _ => tonic::Status::unauthenticated(format!("authentication failed: {self}")),
        }
    }
}

/// One verification key of an issuer.
struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The usable keys of one cluster's issuer.
struct IssuerKeys {
    issuer: String,
    keys: Vec<Key>,
}

/// An issuer whose keys cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// The value is not a [`ClusterIssuer`] envelope.
    #[error("undecodable issuer record: {0}")]
    Decode(String),
    /// The key set is not a JWKS.
    #[error("cluster {cluster}: the key set is not a JWKS: {error}")]
    Jwks {
        /// The cluster.
        cluster: String,
        /// What failed.
        error: String,
    },
    /// No key of the set can verify tokens.
    #[error("cluster {cluster}: no usable signing key in its key set ({skipped})")]
    NoKeys {
        /// The cluster.
        cluster: String,
        /// Why keys were skipped.
        skipped: String,
    },
}

impl IssuerKeys {
    fn parse(record: &ClusterIssuer) -> Result<IssuerKeys, IssuerError> {
        let set: JwkSet = serde_json::from_str(&record.jwks).map_err(|e| IssuerError::Jwks {
            cluster: record.cluster.clone(),
            error: e.to_string(),
        })?;
        let mut keys = Vec::new();
        let mut skipped = Vec::new();
        for jwk in &set.keys {
            let algorithm = match jwk.common.key_algorithm {
                Some(a) => format!("{a:?}").parse::<Algorithm>().ok(),
                None => match &jwk.algorithm {
                    AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
                    AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                        EllipticCurve::P256 => Some(Algorithm::ES256),
                        EllipticCurve::P384 => Some(Algorithm::ES384),
                        _ => None,
                    },
                    AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
                    AlgorithmParameters::OctetKey(_) => None,
                },
            };
            // Symmetric keys never verify service-account tokens.
            let asymmetric = !matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_));
            match (algorithm, asymmetric, DecodingKey::from_jwk(jwk)) {
                (Some(algorithm), true, Ok(key)) => keys.push(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                }),
                (_, _, Err(e)) => skipped.push(e.to_string()),
                _ => skipped.push("unsupported algorithm".into()),
            }
        }
        if keys.is_empty() {
            return Err(IssuerError::NoKeys {
                cluster: record.cluster.clone(),
                skipped: skipped.join("; "),
            });
        }
        Ok(IssuerKeys {
            issuer: record.issuer.clone(),
            keys,
        })
    }
}

/// The issuer keys of every cluster, as published on the bus.
#[derive(Clone, Default)]
pub struct Issuers(Arc<RwLock<BTreeMap<String, Arc<IssuerKeys>>>>);

impl Issuers {
    /// Sets a cluster's issuer from its record.
    pub fn set(&self, record: &ClusterIssuer) -> Result<(), IssuerError> {
        let keys = Arc::new(IssuerKeys::parse(record)?);
        self.write().insert(record.cluster.clone(), keys);
        Ok(())
    }

    /// Forgets a cluster's issuer.
    pub fn remove(&self, cluster: &str) {
        self.write().remove(cluster);
    }

    /// Clusters with loaded keys.
    pub fn clusters(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<IssuerKeys>>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<IssuerKeys>>> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces every issuer (after a full replay of the bucket).
    fn replace(&self, all: BTreeMap<String, Arc<IssuerKeys>>) {
        *self.write() = all;
    }
}

/// The claims shoal reads from a Kubernetes service-account token.
#[derive(Debug, serde::Deserialize)]
struct Claims {
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
    sub: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct KubernetesClaims {
    namespace: Option<String>,
    serviceaccount: Option<NameClaim>,
    node: Option<NameClaim>,
}

#[derive(Debug, serde::Deserialize)]
struct NameClaim {
    name: Option<String>,
}

impl Claims {
    /// (namespace, service account).
    fn service_account(&self) -> Option<(String, String)> {
        let from_kubernetes = self.kubernetes.as_ref().and_then(|k| {
            let sa = k.serviceaccount.as_ref()?.name.clone()?;
            Some((k.namespace.clone()?, sa))
        });
        from_kubernetes.or_else(|| {
            let rest = self.sub.as_ref()?.strip_prefix("system:serviceaccount:")?;
            let (ns, sa) = rest.split_once(':')?;
            Some((ns.to_string(), sa.to_string()))
        })
    }
}

/// Authenticates streams of the secure port.
#[derive(Clone)]
pub struct Authenticator {
    issuers: Issuers,
    audiences: Arc<[String]>,
    trust_domain: Arc<str>,
}

impl Authenticator {
    /// Verifies tokens against `issuers` for one of `audiences`; identities of tokens get
    /// `trust_domain`.
    pub fn new(issuers: Issuers, audiences: Vec<String>, trust_domain: &str) -> Self {
        Authenticator {
            issuers,
            audiences: audiences.into(),
            trust_domain: trust_domain.into(),
        }
    }

    /// Who presented `creds`: the client certificate's SPIFFE identities, else the token's.
    pub fn authenticate(&self, creds: &Credentials) -> Result<Caller, AuthError> {
        if let Some(leaf) = creds.certificates.first() {
            let identities = spiffe_identities(leaf);
            if !identities.is_empty() {
                return Ok(Caller {
                    identities,
                    source: CredentialSource::Certificate,
                    cluster: ProvenCluster::Certificate,
                    node: None,
                });
            }
            if creds.token.is_none() {
                return Err(AuthError::NoSpiffeIdentity);
            }
        }
        match &creds.token {
            Some(token) => self.verify_token(token, creds.cluster_id.as_deref()),
            None => Err(AuthError::NoCredentials),
        }
    }

    /// Verifies a token against the issuer keys of `cluster` (the `clusterid` header), else
    /// of every cluster. Every cluster is tried even after one verifies the token, so that a
    /// token several clusters' keys verify (clusters sharing a signing key) proves no
    /// cluster ([`ProvenCluster::Ambiguous`]).
    fn verify_token(&self, token: &str, cluster: Option<&str>) -> Result<Caller, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| AuthError::MalformedToken(e.to_string()))?;
        let issuers = self.issuers.read();
        let mut failure: Option<AuthError> = None;
        let mut verified: Vec<(&str, Claims)> = Vec::new();
        for (id, issuer, key) in candidate_keys(&issuers, &header, cluster) {
            if verified.last().is_some_and(|(done, _)| *done == id) {
                continue; // this cluster verified it; on to the others
            }
            let mut validation = Validation::new(key.algorithm);
            validation.set_audience(&self.audiences);
            validation.set_issuer(&[issuer.issuer.as_str()]);
            validation.set_required_spec_claims(&["exp", "iss", "aud"]);
            // `nbf`, when present, with the leeway `exp` has (60 s).
            validation.validate_nbf = true;
            match jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => verified.push((id, data.claims)),
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind;
                    // Another cluster may share the key id or the issuer name: only a
                    // verified signature with a wrong claim is this cluster's verdict.
                    let verdict = !matches!(
                        e.kind(),
                        ErrorKind::InvalidIssuer | ErrorKind::InvalidSignature
                    );
                    if verdict && failure.is_none() {
                        failure = Some(AuthError::InvalidToken {
                            cluster: id.to_string(),
                            reason: e.to_string(),
                        });
                    }
                }
            }
        }
        let Some((first, claims)) = verified.first() else {
            return Err(failure.unwrap_or_else(|| AuthError::UnknownIssuer {
                cluster: cluster.map(str::to_string),
                known: format!("{:?}", issuers.keys().collect::<Vec<_>>()),
            }));
        };
        let (namespace, service_account) = claims
            .service_account()
            .ok_or(AuthError::NoServiceAccount)?;
        let cluster = match verified.as_slice() {
            [_] => ProvenCluster::Token(first.to_string()),
            _ => ProvenCluster::Ambiguous,
        };
        Ok(Caller {
            identities: vec![Identity {
                trust_domain: self.trust_domain.to_string(),
                namespace,
                service_account,
            }],
            source: CredentialSource::Token,
            cluster,
            node: claims
                .kubernetes
                .as_ref()
                .and_then(|k| k.node.as_ref())
                .and_then(|n| n.name.clone())
                .filter(|n| !n.is_empty()),
        })
    }
}

/// Most keys a token is checked against without a key id to match: a token without `kid`
/// (or a key published without one) is a guess, and each guess is a signature check. The
/// Kubernetes API server sets `kid` on every service-account token it signs, so guesses
/// are for legacy tokens; an unauthenticated caller gets at most this many checks per
/// stream, however many keys the issuers publish.
pub const MAX_KEYS_WITHOUT_KID: usize = 4;

/// The keys a token is checked against, in order (clusters by name, keys as published):
/// only keys of the token's algorithm (a key's `alg`, else its type's: RS256 for RSA,
/// ES256/ES384 by curve, EdDSA), of the `clusterid` cluster when given; every key whose
/// `kid` is the token's, and at most [`MAX_KEYS_WITHOUT_KID`] where either has no `kid`.
fn candidate_keys<'a>(
    issuers: &'a BTreeMap<String, Arc<IssuerKeys>>,
    header: &jsonwebtoken::Header,
    cluster: Option<&str>,
) -> Vec<(&'a str, &'a IssuerKeys, &'a Key)> {
    let mut out = Vec::new();
    let mut guesses = 0;
    for (id, issuer) in issuers {
        if cluster.is_some_and(|c| c != id) {
            continue;
        }
        for key in issuer.keys.iter().filter(|k| k.algorithm == header.alg) {
            match (&header.kid, &key.kid) {
                (Some(token), Some(key)) if token != key => continue,
                (Some(_), Some(_)) => {}
                _ if guesses == MAX_KEYS_WITHOUT_KID => continue,
                _ => guesses += 1,
            }
            out.push((id.as_str(), issuer.as_ref(), key));
        }
    }
    out
}

/// The SPIFFE identities among a certificate's URI SANs (none if it does not parse).
pub fn spiffe_identities(cert: &CertificateDer<'_>) -> Vec<Identity> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(uri) => Identity::parse(uri),
            _ => None,
        })
        .collect()
}

/// Whether `caller` may receive `proxy`'s config: one of its identities is in the proxy's
/// namespace and, if the proxy names its service account, has that service account.
pub fn authorize(proxy: &Proxy, caller: &Caller) -> Result<Identity, AuthError> {
    caller
        .identities
        .iter()
        .find(|id| {
            id.namespace == proxy.namespace
                && proxy
                    .service_account
                    .as_ref()
                    .is_none_or(|sa| *sa == id.service_account)
        })
        .cloned()
        .ok_or_else(|| AuthError::Forbidden {
            node: proxy.id.clone(),
            namespace: proxy.namespace.clone(),
            service_account: proxy.service_account.clone(),
            identities: caller
                .identities
                .iter()
                .map(Identity::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// What an authorized caller proves for `proxy` ([`authorize`] accepted it): the service
/// accounts of its identities in the proxy's namespace, and its cluster. Only this, never
/// the node's metadata, decides who gets gateway credentials ([`crate::generate::sds`]).
pub fn verified_identity(proxy: &Proxy, caller: &Caller) -> VerifiedIdentity {
    VerifiedIdentity {
        service_accounts: caller
            .identities
            .iter()
            .filter(|id| id.namespace == proxy.namespace)
            .map(|id| id.service_account.clone())
            .collect(),
        cluster: caller.cluster.clone(),
    }
}

mod issuer_records;
pub use issuer_records::{follow_issuers, IssuerRefusal};

#[cfg(test)]
mod tests;
