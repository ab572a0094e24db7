//! The KV key scheme: one key per normalized object, tokens separated by `.`.
//!
//! Object names may contain characters that are not allowed in a key token (`.` above all),
//! so every token is escaped with one reversible scheme:
//! `[a-zA-Z0-9-]` stand for themselves, `.` becomes `_`, and every other byte (including
//! `_` and `=`) becomes `=HH` with two uppercase hex digits. Escaped tokens use only
//! `[-_=a-zA-Z0-9]`, never `.`, so keys split back into tokens unambiguously.

use crate::model::{ConfigKind, ConfigObject, ConfigSpec};

/// A key that could not be parsed back into its parts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The key does not have the number of tokens its bucket uses.
    #[error("key {key:?} has {found} tokens, expected {expected}")]
    TokenCount {
        /// The key.
        key: String,
        /// Tokens found.
        found: usize,
        /// Tokens expected.
        expected: usize,
    },
    /// A token contains a malformed escape or a character outside the scheme.
    #[error("key token {token:?} is not validly escaped")]
    BadEscape {
        /// The token.
        token: String,
    },
    /// The kind token of a config key is not a known kind.
    #[error("unknown config kind {kind:?} in key")]
    UnknownKind {
        /// The kind token.
        kind: String,
    },
}

/// Escapes one key token.
pub fn escape(token: &str) -> String {
    let mut out = String::with_capacity(token.len());
    for b in token.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => out.push(b as char),
            b'.' => out.push('_'),
            _ => push_escaped(&mut out, b),
        }
    }
    out
}

/// Writes `b` as `=XX`, the escape of a byte outside the key alphabet.
fn push_escaped(out: &mut String, b: u8) {
    use std::fmt::Write as _;
    let _ = write!(out, "={b:02X}"); // writing to a String cannot fail
}

/// Reverses [`escape`].
pub fn unescape(token: &str) -> Result<String, KeyError> {
    let bad = || KeyError::BadEscape {
        token: token.to_string(),
    };
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => out.push(b'.'),
            b'=' => {
                let hex = token.get(i + 1..i + 3).ok_or_else(bad)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 2;
            }
            b @ (b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-') => out.push(b),
            _ => return Err(bad()),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| bad())
}

fn join(tokens: &[&str]) -> String {
    tokens
        .iter()
        .map(|t| escape(t))
        .collect::<Vec<_>>()
        .join(".")
}

fn split<const N: usize>(key: &str) -> Result<[String; N], KeyError> {
    Ok(split_raw::<N>(key)?.map(|(value, _)| value))
}

/// [`split`], each token also as written.
fn split_raw<const N: usize>(key: &str) -> Result<[(String, &str); N], KeyError> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.len() != N {
        return Err(KeyError::TokenCount {
            key: key.to_string(),
            found: parts.len(),
            expected: N,
        });
    }
    let mut out: [(String, &str); N] = std::array::from_fn(|_| (String::new(), ""));
    for (slot, part) in out.iter_mut().zip(parts) {
        *slot = (unescape(part)?, part);
    }
    Ok(out)
}

/// Key of an Istio config object in `shoal-config`: `<kind>.<namespace>.<name>`. Gateway
/// credentials have keys of their own ([`credential_key`]).
/// A cluster-scoped kind (GatewayClass) has the namespace token [`CLUSTER_SCOPED`].
pub fn config_key(kind: ConfigKind, namespace: &str, name: &str) -> String {
    let namespace = match namespace {
        "" => CLUSTER_SCOPED.to_string(),
        // Not a Kubernetes namespace, but a file may say it: written escaped, so that it
        // is not read back as cluster-scoped.
        CLUSTER_SCOPED => {
            let mut token = String::new();
            push_escaped(&mut token, b'-');
            token
        }
        namespace => escape(namespace),
    };
    [escape(kind.as_str()), namespace, escape(name)].join(".")
}

/// The namespace token of cluster-scoped objects: a NATS key token cannot be empty, and no
/// Kubernetes namespace is named `-` (a DNS label starts with a letter or digit); one so
/// named elsewhere is written `=2D`.
pub const CLUSTER_SCOPED: &str = "-";

/// Key of a gateway credential in `shoal-config`: `Credential.<cluster>.<namespace>.<name>`.
/// Istio config is cluster-independent, but a Secret is one cluster's: the same
/// `namespace/name` in two clusters are two credentials, served to gateways of their own
/// cluster only.
pub fn credential_key(cluster: &str, namespace: &str, name: &str) -> String {
    join(&[ConfigKind::Credential.as_str(), cluster, namespace, name])
}

/// The identity of an object in `shoal-config`: what its key says.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigId {
    /// The kind.
    pub kind: ConfigKind,
    /// The cluster of a gateway credential; `None` for Istio config (cluster-independent).
    pub cluster: Option<String>,
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ConfigId {
    /// The identity of an object: a credential's cluster is the one it is sealed for.
    pub fn of(obj: &ConfigObject) -> ConfigId {
        ConfigId {
            kind: obj.kind(),
            cluster: match &obj.spec {
                ConfigSpec::Credential(sealed) => Some(sealed.cluster.clone()),
                _ => None,
            },
            namespace: obj.meta.namespace.clone(),
            name: obj.meta.name.clone(),
        }
    }

    /// The object's key ([`config_key`] or [`credential_key`]).
    pub fn key(&self) -> String {
        match &self.cluster {
            Some(cluster) => credential_key(cluster, &self.namespace, &self.name),
            None => config_key(self.kind, &self.namespace, &self.name),
        }
    }
}

/// Parses a `shoal-config` key. A credential key without its cluster (written before
/// credentials were keyed by cluster) is an error: the ingester that publishes the new key
/// deletes it.
pub fn parse_config_key(key: &str) -> Result<ConfigId, KeyError> {
    let token = key.split('.').next().unwrap_or_default();
    let kind = unescape(token)?;
    let kind = ConfigKind::parse_key_token(&kind).ok_or(KeyError::UnknownKind { kind })?;
    if kind == ConfigKind::Credential {
        let [_, cluster, namespace, name] = split::<4>(key)?;
        return Ok(ConfigId {
            kind,
            cluster: Some(cluster),
            namespace,
            name,
        });
    }
    let [_, (mut namespace, written), (name, _)] = split_raw::<3>(key)?;
    // The token as written: `=2D` is a namespace named `-`.
    if written == CLUSTER_SCOPED {
        namespace.clear();
    }
    Ok(ConfigId {
        kind,
        cluster: None,
        namespace,
        name,
    })
}

/// Key of a service in `shoal-services`: `<cluster>.<namespace>.<name>`.
pub fn service_key(cluster: &str, namespace: &str, name: &str) -> String {
    join(&[cluster, namespace, name])
}

/// Parses a `shoal-services` key.
pub fn parse_service_key(key: &str) -> Result<ServiceId, KeyError> {
    let [cluster, namespace, name] = split::<3>(key)?;
    Ok(ServiceId {
        cluster,
        namespace,
        name,
    })
}

/// The identity of a service in `shoal-services`: what its key says.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    /// The cluster it was read from.
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ServiceId {
    /// The service's key ([`service_key`]).
    pub fn key(&self) -> String {
        service_key(&self.cluster, &self.namespace, &self.name)
    }
}

/// Key of an endpoint set in `shoal-endpoints`: `<cluster>.<namespace>.<service>.<slice>`.
pub fn endpoints_key(cluster: &str, namespace: &str, service: &str, slice: &str) -> String {
    join(&[cluster, namespace, service, slice])
}

/// Parses a `shoal-endpoints` key.
pub fn parse_endpoints_key(key: &str) -> Result<SliceId, KeyError> {
    let [cluster, namespace, service, slice] = split::<4>(key)?;
    Ok(SliceId {
        cluster,
        namespace,
        service,
        slice,
    })
}

/// The identity of an endpoint set in `shoal-endpoints` (one EndpointSlice): what its key
/// says.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceId {
    /// The cluster it was read from.
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// The service the slice belongs to.
    pub service: String,
    /// The slice's name.
    pub slice: String,
}

impl SliceId {
    /// The slice's key ([`endpoints_key`]).
    pub fn key(&self) -> String {
        endpoints_key(&self.cluster, &self.namespace, &self.service, &self.slice)
    }
}

/// A value of a data bucket, which knows the identity its key must have: a reader checks
/// that the two agree before applying it (a value copied under another key is refused).
pub trait BusIdentity {
    /// The identity type ([`ConfigId`], [`ServiceId`], [`SliceId`]).
    type Id: PartialEq + std::fmt::Display;
    /// What the value says it is.
    fn bus_id(&self) -> Self::Id;
}

impl BusIdentity for ConfigObject {
    type Id = ConfigId;
    fn bus_id(&self) -> ConfigId {
        ConfigId::of(self)
    }
}

impl BusIdentity for crate::model::Service {
    type Id = ServiceId;
    fn bus_id(&self) -> ServiceId {
        ServiceId {
            cluster: self.cluster.clone(),
            namespace: self.meta.namespace.clone(),
            name: self.meta.name.clone(),
        }
    }
}

impl BusIdentity for crate::model::EndpointSet {
    type Id = SliceId;
    fn bus_id(&self) -> SliceId {
        SliceId {
            cluster: self.cluster.clone(),
            namespace: self.namespace.clone(),
            service: self.service.clone(),
            slice: self.slice.clone(),
        }
    }
}

impl std::fmt::Display for ConfigId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)?;
        match &self.cluster {
            Some(cluster) => write!(f, " of cluster {cluster}"),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "service {}/{} in {}",
            self.namespace, self.name, self.cluster
        )
    }
}

impl std::fmt::Display for SliceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "slice {}/{} of {} in {}",
            self.namespace, self.slice, self.service, self.cluster
        )
    }
}

/// Key of a cluster's sync status in `shoal-meta`.
pub fn cluster_status_key(cluster: &str) -> String {
    format!("cluster.{}", escape(cluster))
}

/// Key of a fleet's ingester lease in `shoal-meta`.
pub fn lease_key(fleet: &str) -> String {
    format!("lease.{}", escape(fleet))
}

/// Key of a cluster's owner record in `shoal-meta`: which fleet publishes that cluster.
pub fn owner_key(cluster: &str) -> String {
    format!("owner.{}", escape(cluster))
}

/// Key of a fleet's sync marker in `shoal-meta`: the fleet published all of its clusters
/// once (see [`crate::synced`]).
pub fn synced_key(fleet: &str) -> String {
    format!("synced.{}", escape(fleet))
}

/// The fleet of a `shoal-meta` sync marker key; `None` for any other key.
pub fn parse_synced_key(key: &str) -> Option<String> {
    let token = key.strip_prefix("synced.")?;
    if token.contains('.') {
        return None;
    }
    unescape(token).ok()
}

/// The cluster of a `shoal-meta` owner key; `None` for any other key.
pub fn parse_owner_key(key: &str) -> Option<String> {
    parse_meta_key("owner.", key)
}

/// Key of a cluster's service-account token issuer (its keys) in `shoal-meta`.
pub fn issuer_key(cluster: &str) -> String {
    format!("issuer.{}", escape(cluster))
}

/// The cluster of a `shoal-meta` issuer key; `None` for any other key.
pub fn parse_issuer_key(key: &str) -> Option<String> {
    parse_meta_key("issuer.", key)
}

/// The one token after `prefix` of a `shoal-meta` key, unescaped.
fn parse_meta_key(prefix: &str, key: &str) -> Option<String> {
    let token = key.strip_prefix(prefix)?;
    if token.contains('.') {
        return None;
    }
    unescape(token).ok()
}

/// The fleet of a `shoal-meta` lease key; `None` for any other key.
pub fn parse_lease_key(key: &str) -> Option<String> {
    parse_meta_key("lease.", key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_round_trips_and_stays_in_alphabet() {
        for s in ["reviews", "a.b.c", "x_y=z", "ünï code", "a..b", "", "-_.="] {
            let e = escape(s);
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)),
                "{e}"
            );
            assert_eq!(unescape(&e).unwrap(), s);
        }
    }

    #[test]
    fn keys_parse_back() {
        let k = config_key(ConfigKind::VirtualService, "default", "reviews.v1");
        assert_eq!(k, "VirtualService.default.reviews_v1");
        assert_eq!(
            parse_config_key(&k).unwrap(),
            ConfigId {
                kind: ConfigKind::VirtualService,
                cluster: None,
                namespace: "default".into(),
                name: "reviews.v1".into()
            }
        );
        let k = credential_key("east.1", "istio-system", "web-cert");
        assert_eq!(k, "Credential.east_1.istio-system.web-cert");
        let id = parse_config_key(&k).unwrap();
        assert_eq!(
            (id.kind, id.cluster.as_deref(), id.namespace.as_str()),
            (ConfigKind::Credential, Some("east.1"), "istio-system")
        );
        assert_eq!(id.key(), k);
        // A credential key without its cluster (the layout before clusters) is refused.
        assert!(matches!(
            parse_config_key("Credential.istio-system.web-cert"),
            Err(KeyError::TokenCount { expected: 4, .. })
        ));
        let k = endpoints_key("c1", "ns", "svc", "svc-abc.1");
        let id = parse_endpoints_key(&k).unwrap();
        assert_eq!(
            (
                id.cluster.as_str(),
                id.namespace.as_str(),
                id.service.as_str()
            ),
            ("c1", "ns", "svc")
        );
        assert_eq!((id.slice.as_str(), id.key()), ("svc-abc.1", k));
    }

    #[test]
    fn a_namespace_named_dash_is_not_cluster_scoped() {
        // Found by `prop_built_keys_parse_back`.
        let id = ConfigId {
            kind: ConfigKind::Gateway,
            cluster: None,
            namespace: "-".into(),
            name: String::new(),
        };
        assert_eq!(id.key(), "Gateway.=2D.");
        assert_eq!(parse_config_key(&id.key()).expect("parses"), id);
        let cluster_scoped = config_key(ConfigKind::Gateway, "", "x");
        assert_eq!(cluster_scoped, "Gateway.-.x");
        assert_eq!(
            parse_config_key(&cluster_scoped).expect("parses").namespace,
            ""
        );
    }

    #[test]
    fn lease_keys_parse_back() {
        let k = lease_key("east.1");
        assert_eq!(k, "lease.east_1");
        assert_eq!(parse_lease_key(&k).as_deref(), Some("east.1"));
        assert_eq!(parse_lease_key("cluster.east"), None);
        assert_eq!(parse_lease_key("lease.a.b"), None);
        assert_eq!(parse_lease_key("lease.a=Z1"), None);
        let k = owner_key("east.1");
        assert_eq!(k, "owner.east_1");
        assert_eq!(parse_owner_key(&k).as_deref(), Some("east.1"));
        assert_eq!(parse_owner_key("lease.east"), None);
        assert_eq!(parse_owner_key("owner.a.b"), None);
    }

    #[test]
    fn bad_keys_are_errors() {
        assert!(matches!(
            parse_service_key("a.b"),
            Err(KeyError::TokenCount { .. })
        ));
        assert!(matches!(unescape("a=Z1"), Err(KeyError::BadEscape { .. })));
        assert!(matches!(unescape("a=1"), Err(KeyError::BadEscape { .. })));
        assert!(matches!(
            parse_config_key("Foo.a.b"),
            Err(KeyError::UnknownKind { .. })
        ));
    }

    use proptest::prelude::*;

    /// Strings shaped like keys: the escape alphabet, dots and a few strays.
    fn keyish() -> impl Strategy<Value = String> {
        prop_oneof![
            "[-_=.a-zA-Z0-9]{0,30}",
            "[-_=.A-F0-9]{0,30}",
            ".{0,30}",
            "(lease|owner|issuer|cluster)\\.[-_=.a-zA-Z0-9]{0,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(512), ..ProptestConfig::default() })]

        #[test]
        fn prop_arbitrary_keys_parse_or_fail_cleanly(key in keyish()) {
            let _ = unescape(&key);
            let _ = parse_config_key(&key);
            let _ = parse_service_key(&key);
            let _ = parse_endpoints_key(&key);
            let _ = parse_lease_key(&key);
            let _ = parse_owner_key(&key);
            let _ = parse_issuer_key(&key);
        }

        #[test]
        fn prop_escape_round_trips_in_alphabet(token in any::<String>()) {
            let e = escape(&token);
            prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)));
            prop_assert_eq!(unescape(&e).expect("an escaped token unescapes"), token);
        }

        #[test]
        fn prop_built_keys_parse_back(
            kind in prop::sample::select(ConfigKind::ALL.to_vec()),
            a in any::<String>(),
            b in any::<String>(),
            c in any::<String>(),
            d in any::<String>(),
        ) {
            let id = ConfigId { kind, cluster: None, namespace: a.clone(), name: b.clone() };
            prop_assert_eq!(parse_config_key(&id.key()).expect("parses"), id);
            let id = ConfigId {
                kind: ConfigKind::Credential,
                cluster: Some(c.clone()),
                namespace: a.clone(),
                name: b.clone(),
            };
            prop_assert_eq!(parse_config_key(&id.key()).expect("parses"), id);
            let service = ServiceId {
                cluster: a.clone(),
                namespace: b.clone(),
                name: c.clone(),
            };
            prop_assert_eq!(parse_service_key(&service.key()).expect("parses"), service);
            let slice = SliceId {
                cluster: a.clone(),
                namespace: b.clone(),
                service: c.clone(),
                slice: d.clone(),
            };
            prop_assert_eq!(parse_endpoints_key(&slice.key()).expect("parses"), slice);
            prop_assert_eq!(parse_lease_key(&lease_key(&a)), Some(a.clone()));
            prop_assert_eq!(parse_owner_key(&owner_key(&a)), Some(a.clone()));
            prop_assert_eq!(parse_issuer_key(&issuer_key(&a)), Some(a.clone()));
        }
    }
}
