//! `VirtualService`: HTTP, TCP and TLS routing rules.

use super::*;

/// `VirtualService` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct VirtualService {
    /// Destination hosts the rules apply to.
    pub hosts: Vec<String>,
    /// Gateways (`ns/name` or `name`, `mesh` for sidecars) the rules apply to; empty = `mesh`.
    pub gateways: Vec<String>,
    /// Ordered HTTP routing rules.
    pub http: Vec<HttpRoute>,
    /// Ordered rules for opaque TCP traffic.
    pub tcp: Vec<TcpRoute>,
    /// Ordered rules for unterminated TLS traffic (by SNI).
    pub tls: Vec<TlsRoute>,
    /// Namespaces this VirtualService is exported to; empty = all.
    pub export_to: Vec<String>,
}

/// One TCP routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TcpRoute {
    /// Match conditions, ORed; empty matches every connection.
    #[serde(rename = "match")]
    pub matches: Vec<L4MatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// One TLS routing rule (unterminated TLS, routed by SNI).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsRoute {
    /// Match conditions, ORed; each must name `sniHosts`.
    #[serde(rename = "match")]
    pub matches: Vec<TlsMatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// Connection-level match conditions of a TCP rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct L4MatchAttributes {
    /// Destination IPs or CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels the source workload must carry.
    pub source_labels: BTreeMap<String, String>,
    /// Gateways (`mesh` for sidecars) the match applies to; empty = the rule's gateways.
    pub gateways: Vec<String>,
    /// The source workload's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// Match conditions of a TLS rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsMatchAttributes {
    /// SNI values to match (`*` wildcards allowed).
    pub sni_hosts: Vec<String>,
    /// Destination IPs or CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels the source workload must carry.
    pub source_labels: BTreeMap<String, String>,
    /// Gateways (`mesh` for sidecars) the match applies to; empty = the rule's gateways.
    pub gateways: Vec<String>,
    /// The source workload's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// A weighted destination of a TCP or TLS rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteDestination {
    /// Where to send traffic.
    pub destination: Destination,
    /// Relative weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// One HTTP routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRoute {
    /// Name of the route, for debugging.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Match conditions, ORed; empty matches everything.
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    pub route: Vec<HttpRouteDestination>,
    /// A redirect instead of forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// Rewrite of URI / authority before forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Request timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Retry policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
}

/// Match conditions of an HTTP rule; fields are ANDed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpMatchRequest {
    /// Name of the match, for debugging.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// URI match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    /// Header matches (lowercase names).
    pub headers: BTreeMap<String, StringMatch>,
    /// HTTP method match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// Authority match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Restrict to this listener port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Restrict to these gateways.
    pub gateways: Vec<String>,
    /// Case-insensitive URI matching.
    pub ignore_uri_case: bool,
}

/// A string match: exactly one of exact, prefix or regex (RE2 syntax).
///
/// On the wire it is Istio's object form (`{exact: "x"}`), read through [`StringMatchRepr`]
/// so every format (YAML, JSON, msgpack) accepts it and "exactly one" is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StringMatchRepr", into = "StringMatchRepr")]
pub enum StringMatch {
    /// Exact string.
    Exact(String),
    /// Prefix.
    Prefix(String),
    /// RE2 regular expression, matched against the whole value.
    Regex(String),
}

/// The object form of [`StringMatch`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StringMatchRepr {
    /// Exact string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// Prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// RE2 regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

impl TryFrom<StringMatchRepr> for StringMatch {
    type Error = String;

    fn try_from(r: StringMatchRepr) -> Result<Self, Self::Error> {
        match (r.exact, r.prefix, r.regex) {
            (Some(s), None, None) => Ok(StringMatch::Exact(s)),
            (None, Some(s), None) => Ok(StringMatch::Prefix(s)),
            (None, None, Some(s)) => Ok(StringMatch::Regex(s)),
            _ => Err("a string match needs exactly one of exact, prefix or regex".to_string()),
        }
    }
}

impl From<StringMatch> for StringMatchRepr {
    fn from(m: StringMatch) -> Self {
        let mut r = StringMatchRepr::default();
        match m {
            StringMatch::Exact(s) => r.exact = Some(s),
            StringMatch::Prefix(s) => r.prefix = Some(s),
            StringMatch::Regex(s) => r.regex = Some(s),
        }
        r
    }
}

/// A weighted destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteDestination {
    /// Where to send traffic.
    pub destination: Destination,
    /// Relative weight; when weights are given they must sum to 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// A destination service (and optional subset and port).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Destination {
    /// Service hostname (short names resolve in the VirtualService's namespace).
    pub host: String,
    /// DestinationRule subset name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// Port on the destination host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// Selects a port by number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PortSelector {
    /// Port number.
    pub number: u32,
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRedirect {
    /// Replacement path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replacement authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Replacement port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Replacement scheme.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Status code (default 301).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

/// An HTTP rewrite.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRewrite {
    /// Replaces the matched path prefix (or the whole path for exact/regex matches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replaces the Host/Authority header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
}

/// Retry policy.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRetry {
    /// Number of retries.
    pub attempts: u32,
    /// Timeout per attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Envoy `retry_on` conditions, comma-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_match_object_form() {
        let m: StringMatch = serde_json::from_str(r#"{"prefix": "/api"}"#).unwrap();
        assert_eq!(m, StringMatch::Prefix("/api".into()));
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"prefix":"/api"}"#);
        assert!(serde_json::from_str::<StringMatch>(r#"{"prefix": "/a", "exact": "/b"}"#).is_err());
        assert!(serde_json::from_str::<StringMatch>(r#"{}"#).is_err());
        let bytes = rmp_serde::to_vec_named(&m).unwrap();
        assert_eq!(rmp_serde::from_slice::<StringMatch>(&bytes).unwrap(), m);
    }
}
