//! VirtualService HTTP rules → Envoy routes, with istiod's translation: matches (URI,
//! headers incl. presence and `withoutHeaders`, query parameters, method, authority, scheme,
//! port, gateways, source labels/namespace), destinations and weights, redirects, rewrites,
//! direct responses, timeouts, retries, header manipulation, fault injection, mirroring and
//! CORS.

use super::{ordered_map, pb_duration};
use crate::index::config::Config;
use crate::index::gateway_api::REDIRECT_PREFIX_MARKER;
use crate::index::hosts::resolve_host;
use shoal_common::model::{
    CorsPolicy, Destination, HeaderMatch, HeaderOperations, HttpFaultInjection, HttpMatchRequest,
    HttpRetry, HttpRoute, HttpRouteDestination, Percent, StringMatch, VirtualService,
};
use shoal_proto::pb::envoy::config::core::v3::{
    data_source, header_value_option::HeaderAppendAction, DataSource, HeaderValue,
    HeaderValueOption, Metadata, RuntimeFractionalPercent,
};
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier,
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    retry_policy::{
        retry_host_predicate, retry_priority, RetryBackOff, RetryHostPredicate, RetryPriority,
    },
    route::Action,
    route_action::{self, ClusterSpecifier, HostRewriteSpecifier, RequestMirrorPolicy},
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteMatch, WeightedCluster,
};
use shoal_proto::pb::envoy::extensions::filters::common::fault::v3::{
    fault_delay::FaultDelaySecifier, FaultDelay,
};
use shoal_proto::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCors;
use shoal_proto::pb::envoy::extensions::filters::http::fault::v3::{
    fault_abort::ErrorType, FaultAbort, HttpFault,
};
use shoal_proto::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use shoal_proto::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use shoal_proto::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatchAndSubstitute, RegexMatcher, StringMatcher,
};
use shoal_proto::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use shoal_proto::pb::google::protobuf::{value, BoolValue, Struct, UInt32Value, Value};
use shoal_proto::{outbound_cluster_name, Any};
use std::collections::BTreeMap;

/// Istio's default retry conditions (no status codes: a 503 is not retried by default).
const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
/// Istio's default number of retries when a route sets none.
const DEFAULT_RETRIES: u32 = 2;
/// The HTTP filter names whose per-route config routes carry.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
/// The CORS filter.
pub const CORS_FILTER: &str = "envoy.filters.http.cors";

/// Service ports by hostname, for the destinations a set of VirtualServices names.
pub type DestinationPorts = BTreeMap<String, Vec<u16>>;

/// The calling workload, for `sourceLabels` / `sourceNamespace` matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    /// The proxy's namespace.
    pub namespace: String,
    /// The proxy's labels.
    pub labels: BTreeMap<String, String>,
}

/// How a route's destinations resolve: the namespace of the VirtualService (short hosts),
/// the port traffic arrived on (a destination's default port), the services' ports, and the
/// calling workload when some match depends on it.
pub struct RouteEnv<'a> {
    /// The VirtualService's namespace.
    pub ns: &'a str,
    /// The listener port.
    pub listener_port: u32,
    /// Ports of destination services.
    pub destinations: &'a DestinationPorts,
    /// The calling workload (set when a VirtualService in the key matches on the source).
    pub source: Option<&'a Source>,
    /// Consistent hashes of destinations (DestinationRule `consistentHash`).
    pub hashes: &'a crate::index::push_context::DestinationHashes,
}

/// Whether any VirtualService has a match on the calling workload: only then do route
/// tables depend on it (and go into the generator key).
pub fn uses_source(vss: &[std::sync::Arc<Config<VirtualService>>]) -> bool {
    vss.iter().any(|vs| {
        vs.spec.http.iter().any(|r| {
            r.matches
                .iter()
                .any(|m| !m.source_labels.is_empty() || m.source_namespace.is_some())
        })
    })
}

/// Every host a set of VirtualServices sends traffic to (routes and mirrors).
pub fn destination_hosts(vs: &Config<VirtualService>) -> impl Iterator<Item = String> + '_ {
    vs.spec.http.iter().flat_map(move |rule| {
        rule.route
            .iter()
            .map(|d| &d.destination)
            .chain(rule.mirror.iter())
            .chain(rule.mirrors.iter().map(|m| &m.destination))
            .map(move |d| resolve_host(&d.host, &vs.meta.namespace))
    })
}

/// Converts a VirtualService's HTTP rules; `applies` filters match blocks by their
/// `gateways` field. A rule whose every match block is filtered out yields no route.
pub fn vs_routes(
    vs: &Config<VirtualService>,
    env: &RouteEnv<'_>,
    applies: impl Fn(&HttpMatchRequest) -> bool,
) -> Vec<Route> {
    let mut out = Vec::new();
    for rule in &vs.spec.http {
        let mut r = RouteParts::new(rule, env, vs.spec.gateway_semantics);
        r.metadata = Some(istio_config_metadata(&vs.meta.namespace, &vs.meta.name));
        r.operation_fallback = format!("{}:{}", vs.meta.name, env.listener_port);
        let name = rule.name.clone().unwrap_or_default();
        if rule.matches.is_empty() {
            out.push(r.route(&name, catch_all_match()));
            continue;
        }
        for m in &rule.matches {
            if !applies(m)
                || m.port.is_some_and(|p| p != env.listener_port)
                || !source_applies(m, env.source)
            {
                continue;
            }
            let name = m
                .name
                .as_ref()
                .map(|n| {
                    if name.is_empty() {
                        n.clone()
                    } else {
                        format!("{name}.{n}")
                    }
                })
                .unwrap_or_else(|| name.clone());
            out.push(r.route(&name, route_match(m, vs.spec.gateway_semantics)));
        }
    }
    out
}

/// A match on the calling workload: it applies only to proxies it describes. Without a
/// known source (gateways built without one), such a match never applies.
fn source_applies(m: &HttpMatchRequest, source: Option<&Source>) -> bool {
    if m.source_labels.is_empty() && m.source_namespace.is_none() {
        return true;
    }
    let Some(src) = source else { return false };
    m.source_labels
        .iter()
        .all(|(k, v)| src.labels.get(k) == Some(v))
        && m.source_namespace
            .as_ref()
            .is_none_or(|ns| *ns == src.namespace)
}

/// Everything of a rule that does not depend on the match block.
struct RouteParts {
    action: Action,
    request_headers_to_add: Vec<HeaderValueOption>,
    request_headers_to_remove: Vec<String>,
    response_headers_to_add: Vec<HeaderValueOption>,
    response_headers_to_remove: Vec<String>,
    per_filter: Vec<(String, Any)>,
    /// `istio: {config: <the VirtualService's path>}`, as istiod marks every route it
    /// builds from a VirtualService (istioctl and access logs read it).
    metadata: Option<Metadata>,
    /// `<VirtualService>:<listener port>`: the tracing operation of a route to several
    /// clusters (see [`route_operation`]).
    operation_fallback: String,
}

/// istiod's `GetRouteOperation`, the route's `decorator` (the span name of traces through
/// it): `<host>:<port><path>` for a route to one cluster, else `<VirtualService>:<listener
/// port><path>`; the path is the match's (`<prefix>*` for a prefix), `/*` without one.
fn route_operation(r: &Route, fallback: &str) -> String {
    let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(re)) => re.regex.clone(),
        _ => "/*".into(),
    };
    let single = match &r.action {
        Some(Action::Route(a)) => match &a.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => shoal_proto::parse_outbound_cluster_name(c)
                .map(|(port, _, host)| format!("{host}:{port}")),
            _ => None,
        },
        _ => None,
    };
    format!("{}{path}", single.as_deref().unwrap_or(fallback))
}

/// istiod's route metadata naming the VirtualService a route comes from. One map entry
/// (prost encodes maps in hash order; one entry keeps the bytes deterministic).
fn istio_config_metadata(namespace: &str, name: &str) -> Metadata {
    let config = Value {
        kind: Some(value::Kind::StringValue(format!(
            "/apis/networking.istio.io/v1/namespaces/{namespace}/virtual-service/{name}"
        ))),
    };
    Metadata {
        filter_metadata: std::iter::once((
            "istio".to_string(),
            Struct {
                fields: std::iter::once(("config".to_string(), config)).collect(),
            },
        ))
        .collect(),
        typed_filter_metadata: Default::default(),
    }
}

impl RouteParts {
    fn new(rule: &HttpRoute, env: &RouteEnv<'_>, gateway_semantics: bool) -> RouteParts {
        let (req, resp) = rule
            .headers
            .as_ref()
            .map(|h| (h.request.as_ref(), h.response.as_ref()))
            .unwrap_or_default();
        let mut per_filter = Vec::new();
        if let Some(f) = rule.fault.as_ref().and_then(fault) {
            per_filter.push((
                FAULT_FILTER.to_string(),
                shoal_proto::pack(
                    "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
                    &f,
                ),
            ));
        }
        if let Some(c) = &rule.cors_policy {
            per_filter.push((
                CORS_FILTER.to_string(),
                shoal_proto::pack(
                    "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
                    &cors(c),
                ),
            ));
        }
        RouteParts {
            action: action(rule, env, gateway_semantics),
            request_headers_to_add: header_options(req),
            request_headers_to_remove: req.map(|o| o.remove.clone()).unwrap_or_default(),
            response_headers_to_add: header_options(resp),
            response_headers_to_remove: resp.map(|o| o.remove.clone()).unwrap_or_default(),
            per_filter,
            metadata: None,
            operation_fallback: String::new(),
        }
    }

    fn route(&self, name: &str, m: RouteMatch) -> Route {
        let mut r = Route {
            name: name.to_string(),
            r#match: Some(m),
            action: Some(self.action.clone()),
            request_headers_to_add: self.request_headers_to_add.clone(),
            request_headers_to_remove: self.request_headers_to_remove.clone(),
            response_headers_to_add: self.response_headers_to_add.clone(),
            response_headers_to_remove: self.response_headers_to_remove.clone(),
            typed_per_filter_config: ordered_map(self.per_filter.clone()),
            metadata: self.metadata.clone(),
            ..Default::default()
        };
        if !self.operation_fallback.is_empty() {
            r.decorator = Some(Decorator {
                operation: route_operation(&r, &self.operation_fallback),
                ..Default::default()
            });
        }
        r
    }
}

/// `set` overwrites, `add` appends, as istiod translates them.
fn header_options(ops: Option<&HeaderOperations>) -> Vec<HeaderValueOption> {
    let Some(ops) = ops else { return Vec::new() };
    let opt = |k: &String, v: &String, action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue {
            key: k.clone(),
            value: v.clone(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    };
    ops.set
        .iter()
        .map(|(k, v)| opt(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .chain(
            ops.add
                .iter()
                .map(|(k, v)| opt(k, v, HeaderAppendAction::AppendIfExistsOrAdd)),
        )
        .collect()
}

/// The match-everything route match.
pub fn catch_all_match() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".into())),
        ..Default::default()
    }
}

/// Under gateway semantics (a Gateway API route) a prefix matches whole path segments, as
/// istiod builds it: `/a` matches `/a` and `/a/b`, not `/ab`.
fn route_match(m: &HttpMatchRequest, gateway_semantics: bool) -> RouteMatch {
    let path_specifier = Some(match &m.uri {
        None => PathSpecifier::Prefix("/".into()),
        Some(StringMatch::Prefix(p)) if gateway_semantics && p != "/" => {
            PathSpecifier::PathSeparatedPrefix(p.trim_end_matches('/').to_string())
        }
        Some(StringMatch::Exact(p)) => PathSpecifier::Path(p.clone()),
        Some(StringMatch::Prefix(p)) => PathSpecifier::Prefix(p.clone()),
        Some(StringMatch::Regex(r)) => PathSpecifier::SafeRegex(regex(r)),
    });
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .map(|(name, hm)| header_matcher(name, hm, false))
        .collect();
    headers.extend(
        m.without_headers
            .iter()
            .map(|(name, hm)| header_matcher(name, hm, true)),
    );
    for (name, sm) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            headers.push(header_matcher(name, &HeaderMatch::Value(sm.clone()), false));
        }
    }
    let query_parameters = m
        .query_params
        .iter()
        .map(|(name, qm)| QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(match qm {
                HeaderMatch::Present => QueryParameterMatchSpecifier::PresentMatch(true),
                HeaderMatch::Value(sm) => {
                    QueryParameterMatchSpecifier::StringMatch(string_matcher(sm))
                }
            }),
        })
        .collect();
    RouteMatch {
        path_specifier,
        headers,
        query_parameters,
        case_sensitive: m.ignore_uri_case.then_some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// `s` as a regular expression matching itself literally.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn regex(r: &str) -> RegexMatcher {
    RegexMatcher {
        regex: r.to_string(),
        ..Default::default()
    }
}

fn string_matcher(sm: &StringMatch) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(match sm {
            StringMatch::Exact(s) => MatchPattern::Exact(s.clone()),
            StringMatch::Prefix(s) => MatchPattern::Prefix(s.clone()),
            StringMatch::Regex(r) => MatchPattern::SafeRegex(regex(r)),
        }),
        ..Default::default()
    }
}

/// A header matcher; `invert` for `withoutHeaders` (a `{}` there means "absent").
fn header_matcher(name: &str, hm: &HeaderMatch, invert: bool) -> HeaderMatcher {
    let spec = match hm {
        HeaderMatch::Present => HeaderMatchSpecifier::PresentMatch(true),
        HeaderMatch::Value(sm) => HeaderMatchSpecifier::StringMatch(string_matcher(sm)),
    };
    HeaderMatcher {
        name: name.to_ascii_lowercase(),
        header_match_specifier: Some(spec),
        invert_match: invert,
        ..Default::default()
    }
}

fn action(rule: &HttpRoute, env: &RouteEnv<'_>, gateway_semantics: bool) -> Action {
    if let Some(r) = &rule.redirect {
        let mut port = r.port.unwrap_or_default();
        if r.derive_port.as_deref() == Some("FROM_REQUEST_PORT") {
            // Envoy cannot derive the port; routes are built per listener port, so that port
            // is the request's (istiod does the same).
            port = env.listener_port;
        }
        let scheme = r.scheme.as_deref().unwrap_or("http");
        if (port == 80 && scheme == "http") || (port == 443 && scheme == "https") {
            port = 0;
        }
        return Action::Redirect(RedirectAction {
            host_redirect: r.authority.clone().unwrap_or_default(),
            port_redirect: port,
            path_rewrite_specifier: r.uri.as_ref().map(|uri| {
                match uri.strip_prefix(REDIRECT_PREFIX_MARKER) {
                    Some(prefix) if gateway_semantics => {
                        PathRewriteSpecifier::PrefixRewrite(prefix.to_string())
                    }
                    _ => PathRewriteSpecifier::PathRedirect(uri.clone()),
                }
            }),
            scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
            response_code: redirect_code(r.redirect_code.unwrap_or(301)) as i32,
            ..Default::default()
        });
    }
    if let Some(d) = &rule.direct_response {
        let body = d.body.as_ref().and_then(|b| {
            let specifier = match (&b.string, &b.bytes) {
                (Some(s), _) => data_source::Specifier::InlineString(s.clone()),
                (None, Some(b64)) => data_source::Specifier::InlineBytes(base64_decode(b64)?),
                (None, None) => return None,
            };
            Some(DataSource {
                specifier: Some(specifier),
                ..Default::default()
            })
        });
        return Action::DirectResponse(DirectResponseAction {
            status: d.status,
            body,
            ..Default::default()
        });
    }
    let timeout = pb_duration(rule.timeout.map(|t| t.get()).unwrap_or_default());
    let mut ra = RouteAction {
        cluster_specifier: Some(cluster_specifier(&rule.route, env)),
        timeout: Some(timeout),
        // istiod's `setTimeout`: a gRPC client's `grpc-timeout` is honoured up to the route's
        // timeout (0s: without a cap), instead of being ignored.
        #[allow(deprecated)]
        max_grpc_timeout: Some(timeout),
        retry_policy: match &rule.retries {
            None => Some(default_retry_policy()),
            Some(r) if r.attempts == 0 => None,
            Some(r) => Some(retry_policy(r)),
        },
        ..Default::default()
    };
    if gateway_semantics {
        // The Gateway API answers 500 for a backend that does not exist (or may not be
        // referred to), as istiod configures it.
        ra.cluster_not_found_response_code =
            route_action::ClusterNotFoundResponseCode::InternalServerError as i32;
    }
    if let Some(rw) = &rule.rewrite {
        // Gateway API `ReplacePrefixMatch: /` removes the matched prefix (istiod's regex;
        // translated routes have one match each).
        let matched_prefix = match rule.matches.first().and_then(|m| m.uri.as_ref()) {
            Some(StringMatch::Prefix(p)) if gateway_semantics => Some(p.trim_end_matches('/')),
            _ => None,
        };
        match (&rw.uri, matched_prefix) {
            (Some(uri), Some(prefix)) if uri == "/" => {
                ra.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(regex(&format!("^{}(/?)(.*)", regex_escape(prefix)))),
                    substitution: "/\\2".into(),
                });
            }
            (Some(uri), _) => ra.prefix_rewrite = uri.clone(),
            (None, _) => {}
        }
        if let Some(rr) = &rw.uri_regex_rewrite {
            ra.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(regex(&rr.pattern)),
                substitution: rr.rewrite.clone(),
            });
        }
        if let Some(auth) = &rw.authority {
            ra.host_rewrite_specifier =
                Some(HostRewriteSpecifier::HostRewriteLiteral(auth.clone()));
        }
    }
    let mirror_percent = match (rule.mirror_percentage, rule.mirror_percent) {
        (Some(p), _) => (p.value > 0.0).then(|| million(p)),
        (None, Some(p)) => (p > 0).then(|| hundred(p)),
        (None, None) => Some(hundred(100)),
    };
    if let (Some(m), Some(pct)) = (&rule.mirror, mirror_percent) {
        ra.request_mirror_policies
            .push(mirror_policy(destination_cluster(m, env), pct));
    }
    for m in &rule.mirrors {
        let pct = match m.percentage {
            Some(p) if p.value > 0.0 => million(p),
            Some(_) => continue,
            None => hundred(100),
        };
        ra.request_mirror_policies
            .push(mirror_policy(destination_cluster(&m.destination, env), pct));
    }
    consistent_hash(rule, env, &mut ra);
    Action::Route(ra)
}

/// DestinationRule `consistentHash` on the route (istiod's `processDestination` /
/// `processWeightedDestination`): a hash policy per hashed destination; with a single
/// hashed destination the default retry policy does not avoid previously tried hosts
/// (unless `retryIgnorePreviousHosts: true`), so a retry stays on the hashed host.
fn consistent_hash(rule: &HttpRoute, env: &RouteEnv<'_>, ra: &mut RouteAction) {
    let hash_of = |d: &HttpRouteDestination| {
        let host = resolve_host(&d.destination.host, env.ns);
        let subset = d.destination.subset.clone().unwrap_or_default();
        let port = d.destination.port.as_ref().map(|p| p.number);
        env.hashes.get(&(host, subset, port))
    };
    let dests: Vec<&HttpRouteDestination> = match rule.route.as_slice() {
        [only] => vec![only],
        many => many.iter().filter(|d| d.weight.unwrap_or(0) > 0).collect(),
    };
    for h in dests.into_iter().filter_map(hash_of) {
        ra.hash_policy.push(super::traffic_policy::hash_policy(h));
    }
    if let [only] = rule.route.as_slice() {
        let keep = rule
            .retries
            .as_ref()
            .and_then(|r| r.retry_ignore_previous_hosts)
            == Some(true);
        if hash_of(only).is_some() && !keep {
            if let Some(p) = ra.retry_policy.as_mut() {
                p.retry_host_predicate.clear();
            }
        }
    }
}

fn mirror_policy(cluster: String, pct: FractionalPercent) -> RequestMirrorPolicy {
    RequestMirrorPolicy {
        cluster,
        runtime_fraction: Some(RuntimeFractionalPercent {
            default_value: Some(pct),
            ..Default::default()
        }),
        trace_sampled: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// Istio's `Percent` as a fraction of a million (4 decimal places kept).
fn million(p: Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value * 10_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

fn hundred(p: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: p,
        denominator: DenominatorType::Hundred as i32,
    }
}

/// Envoy's fault filter config, as istiod translates it (a delay without a percentage
/// delays nothing; an abort without one aborts nothing).
fn fault(f: &HttpFaultInjection) -> Option<HttpFault> {
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = d.fixed_delay?;
        Some(FaultDelay {
            percentage: Some(match d.percentage {
                Some(p) => million(p),
                None => hundred(d.percent.unwrap_or(0)),
            }),
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(pb_duration(fixed.get()))),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        let error_type = match (&a.http_status, &a.grpc_status) {
            (Some(s), _) => ErrorType::HttpStatus(*s),
            (None, Some(_)) => ErrorType::GrpcStatus(a.grpc_code()?),
            (None, None) => return None,
        };
        Some(FaultAbort {
            percentage: a.percentage.map(million),
            error_type: Some(error_type),
            ..Default::default()
        })
    });
    (delay.is_some() || abort.is_some()).then_some(HttpFault {
        delay,
        abort,
        ..Default::default()
    })
}

fn cors(c: &CorsPolicy) -> EnvoyCors {
    EnvoyCors {
        allow_origin_string_match: c.allow_origins.iter().map(string_matcher).collect(),
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c
            .max_age
            .map(|d| d.get().as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(hundred(100)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Istio's default retry policy: 2 retries on connection errors, refused streams and
/// `unavailable`/`cancelled` gRPC statuses, preferring hosts not tried yet.
pub fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.into(),
        num_retries: Some(UInt32Value {
            value: DEFAULT_RETRIES,
        }),
        retry_host_predicate: vec![previous_hosts()],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

/// Istio's default retry policy of inbound routes: a request reset before it reached the
/// application was never processed, so it is retried (twice).
pub fn default_inbound_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: "reset-before-request".into(),
        num_retries: Some(UInt32Value {
            value: DEFAULT_RETRIES,
        }),
        ..Default::default()
    }
}

fn previous_hosts() -> RetryHostPredicate {
    RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(retry_host_predicate::ConfigType::TypedConfig(
            shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
                &PreviousHostsPredicate {},
            ),
        )),
    }
}

/// A VirtualService retry policy: Istio's default with the given fields overridden. Numbers
/// in `retryOn` are status codes (Envoy's `retry_on` accepts only condition names).
fn retry_policy(r: &HttpRetry) -> RetryPolicy {
    let mut p = default_retry_policy();
    p.num_retries = Some(UInt32Value { value: r.attempts });
    if let Some(on) = r.retry_on.as_deref().filter(|s| !s.trim().is_empty()) {
        let (codes, conditions): (Vec<&str>, Vec<&str>) = on
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .partition(|s| s.parse::<u16>().is_ok_and(|c| (100..600).contains(&c)));
        p.retriable_status_codes = codes.iter().filter_map(|c| c.parse().ok()).collect();
        p.retry_on = conditions.join(",");
        if !p.retriable_status_codes.is_empty() && !conditions.contains(&"retriable-status-codes") {
            if !p.retry_on.is_empty() {
                p.retry_on.push(',');
            }
            p.retry_on.push_str("retriable-status-codes");
        }
    }
    if let Some(t) = r.per_try_timeout {
        p.per_try_timeout = Some(pb_duration(t.get()));
    }
    if r.retry_ignore_previous_hosts == Some(false) {
        p.retry_host_predicate.clear();
    }
    if r.retry_remote_localities == Some(true) {
        p.retry_priority = Some(RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_priority::ConfigType::TypedConfig(shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                &PreviousPrioritiesConfig { update_frequency: 2 },
            ))),
        });
    }
    if let Some(b) = r.backoff {
        p.retry_back_off = Some(RetryBackOff {
            base_interval: Some(pb_duration(b.get())),
            ..Default::default()
        });
    }
    p
}

fn redirect_code(code: u32) -> RedirectResponseCode {
    match code {
        302 => RedirectResponseCode::Found,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => RedirectResponseCode::MovedPermanently,
    }
}

/// The cluster of one destination: `outbound|<port>|<subset>|<fqdn>`. Without an explicit
/// port: the service's only port, else the port traffic arrived on.
fn destination_cluster(d: &Destination, env: &RouteEnv<'_>) -> String {
    let host = resolve_host(&d.host, env.ns);
    let port =
        d.port
            .as_ref()
            .map(|p| p.number)
            .unwrap_or_else(|| match env.destinations.get(&host) {
                Some(ports) if ports.len() == 1 => ports[0].into(),
                _ => env.listener_port,
            });
    outbound_cluster_name(port, d.subset.as_deref().unwrap_or_default(), &host)
}

/// One destination takes everything; several split by their weights (any positive total,
/// as in Istio; validation rejects several destinations without weights). Destinations of
/// weight 0 get nothing.
fn cluster_specifier(dests: &[HttpRouteDestination], env: &RouteEnv<'_>) -> ClusterSpecifier {
    let weighted: Vec<(String, u32)> = match dests {
        [only] => vec![(destination_cluster(&only.destination, env), 1)],
        many => many
            .iter()
            .filter(|d| d.weight.unwrap_or(0) > 0)
            .map(|d| {
                (
                    destination_cluster(&d.destination, env),
                    d.weight.unwrap_or(0),
                )
            })
            .collect(),
    };
    match weighted.as_slice() {
        [] => ClusterSpecifier::Cluster(super::cds::BLACKHOLE_CLUSTER.into()),
        [(single, _)] => ClusterSpecifier::Cluster(single.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|(name, w)| ClusterWeight {
                    name: name.clone(),
                    weight: Some(UInt32Value { value: *w }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_bodies() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        assert!(base64_decode("a*b").is_none());
    }
}
