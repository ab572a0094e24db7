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
    /// Translated from a Gateway API route (never read from input, never on the bus):
    /// istiod's "gateway semantics": path prefixes match whole segments, a rewrite to `/`
    /// removes the prefix, a missing backend answers 500.
    #[serde(skip)]
    pub gateway_semantics: bool,
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
    /// Header manipulation (request and response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    /// Fault injection (delays, aborts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    /// Mirror traffic to this destination too (fire and forget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    /// Percentage of traffic `mirror` receives (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer form of `mirrorPercentage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_percent: Option<u32>,
    /// Several mirrors, each with its own percentage.
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// CORS policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    /// Answer directly instead of forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Routes of another VirtualService inserted here (the root's match ANDed in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
}

/// A percentage in [0, 100] (Istio's `Percent`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Percent {
    /// The percentage.
    pub value: f64,
}

impl Eq for Percent {}

impl std::hash::Hash for Percent {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.to_bits().hash(state);
    }
}

/// Header operations on requests and responses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Headers {
    /// Applied to the request before forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    /// Applied to the response before returning it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Set, add and remove header operations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HeaderOperations {
    /// Overwrite these headers.
    pub set: BTreeMap<String, String>,
    /// Append these headers.
    pub add: BTreeMap<String, String>,
    /// Remove these headers.
    pub remove: Vec<String>,
}

/// Fault injection.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpFaultInjection {
    /// Delay requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
    /// Abort requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
}

/// A fixed delay for a percentage of requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultDelay {
    /// The delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed_delay: Option<Duration>,
    /// Share of requests delayed (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
    /// Deprecated integer form of `percentage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
}

/// An abort with an HTTP (or gRPC) status for a percentage of requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultAbort {
    /// HTTP status to return.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u32>,
    /// gRPC status name or number to return.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// Share of requests aborted (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

impl FaultAbort {
    /// The gRPC status code of `grpcStatus` (a name like `UNAVAILABLE`, or a number), as
    /// Istio accepts it; `None` when absent or not a gRPC status.
    pub fn grpc_code(&self) -> Option<u32> {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        let name = self.grpc_status.as_deref()?;
        NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| i as u32)
            .or_else(|| name.parse().ok().filter(|c| *c < 17))
    }
}

/// One mirror destination with its share of traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpMirrorPolicy {
    /// Where mirrored requests go.
    pub destination: Destination,
    /// Share of requests mirrored (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// Cross-origin resource sharing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct CorsPolicy {
    /// Origins allowed.
    pub allow_origins: Vec<StringMatch>,
    /// Methods allowed (`Access-Control-Allow-Methods`).
    pub allow_methods: Vec<String>,
    /// Request headers allowed.
    pub allow_headers: Vec<String>,
    /// Response headers the browser may read.
    pub expose_headers: Vec<String>,
    /// How long a preflight may be cached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Whether credentials are allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
}

/// A direct response.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpDirectResponse {
    /// Status code.
    pub status: u32,
    /// Body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// A direct response body: text or base64 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpBody {
    /// Text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Base64-encoded body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

/// The VirtualService a route delegates to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Delegate {
    /// Its name.
    pub name: String,
    /// Its namespace (default: the root's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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
    /// Header matches (lowercase names); `{}` matches presence.
    pub headers: BTreeMap<String, HeaderMatch>,
    /// Headers that must not match (`{}`: must be absent).
    pub without_headers: BTreeMap<String, HeaderMatch>,
    /// Query parameter matches (exact or regex; `{}` matches presence).
    pub query_params: BTreeMap<String, HeaderMatch>,
    /// URI scheme match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    /// Labels the calling workload must carry.
    pub source_labels: BTreeMap<String, String>,
    /// The calling workload's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
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

/// A header (or query parameter) match: a [`StringMatch`], or `{}` for "present".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StringMatchRepr", into = "StringMatchRepr")]
pub enum HeaderMatch {
    /// The header is present, with any value.
    Present,
    /// The value matches.
    Value(StringMatch),
}

impl TryFrom<StringMatchRepr> for HeaderMatch {
    type Error = String;

    fn try_from(r: StringMatchRepr) -> Result<Self, Self::Error> {
        if r.exact.is_none() && r.prefix.is_none() && r.regex.is_none() {
            return Ok(HeaderMatch::Present);
        }
        StringMatch::try_from(r).map(HeaderMatch::Value)
    }
}

impl From<HeaderMatch> for StringMatchRepr {
    fn from(m: HeaderMatch) -> Self {
        match m {
            HeaderMatch::Present => StringMatchRepr::default(),
            HeaderMatch::Value(v) => v.into(),
        }
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
    /// `FROM_PROTOCOL_DEFAULT` (80/443) or `FROM_REQUEST_PORT` instead of `port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub derive_port: Option<String>,
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
    /// Rewrites the path with a regex (RE2) and a substitution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// A regex rewrite of the path.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RegexRewrite {
    /// RE2 pattern.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Substitution (`\1` for groups).
    pub rewrite: String,
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
    /// Prefer other localities on retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
    /// Skip hosts already tried (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Base interval of the exponential back-off between retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_status_names_and_numbers() {
        let abort = |s: &str| FaultAbort {
            grpc_status: Some(s.into()),
            ..Default::default()
        };
        assert_eq!(abort("UNAVAILABLE").grpc_code(), Some(14));
        assert_eq!(abort("7").grpc_code(), Some(7));
        assert_eq!(abort("NOPE").grpc_code(), None);
    }

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
