//! istio-proxy's telemetry, as istiod sends it without a Telemetry resource: Istio's
//! standard metrics (`istio_requests_total`, `istio_tcp_*`, which Kiali, Istio's dashboards
//! and their alerts read) come from istio-proxy's own filters, fed by the peer metadata the
//! metadata exchange filters trade.
//!
//! Only a proxy whose node metadata carries `ISTIO_VERSION` (istio-proxy) gets them:
//! upstream Envoy has none of `istio.stats`, `istio.metadata_exchange` or `istio.alpn` and
//! would reject every listener naming one. The generators build the same listeners and
//! clusters for both; for istio-proxy each such key is wrapped in a [`TelemetryKey`] and the
//! built resource decorated here, as istiod's listener and cluster builders add them:
//!
//! - HTTP connection managers: `istio.metadata_exchange` first (peer metadata from and to
//!   `x-envoy-peer-metadata` headers and workload discovery), `envoy.filters.http.grpc_stats`
//!   and (not inbound) `istio.alpn` before fault injection, `istio.stats` before the router;
//!   the tracing block (sampling 1% as MeshConfig's default, Istio's custom tags) and the
//!   UUID request-id extension used for trace sampling.
//! - TCP chains: `istio.stats` before the `tcp_proxy`; inbound chains also the TCP
//!   `istio.metadata_exchange` first (peer metadata over the `istio-peer-exchange` ALPN).
//!   Inbound HTTP chains get it too, before the connection manager.
//! - Clusters: `alt_stat_name` `<name>;`, the delimiter Istio's stat tag extraction reads.
//!
//! istio-proxy's configs are Istio protos shoal has no types for: `istio.stats`' and
//! `istio.alpn`'s are encoded by hand (their field numbers from istio/proxy and istio/api),
//! the metadata exchange ones are `TypedStruct`s as istiod writes them. Structs are encoded
//! field by field in name order, so the bytes are the same on every replica.

use super::{Key, Resource};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;
use shoal_proto::pb::envoy::config::core::v3::TrafficDirection;
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use shoal_proto::pb::envoy::extensions::filters::http::grpc_stats::v3::{
    filter_config::PerMethodStatSpecifier, FilterConfig as GrpcStatsConfig,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::Tracing, http_filter, HttpConnectionManager, HttpFilter,
    RequestIdExtension,
};
use shoal_proto::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use shoal_proto::pb::envoy::r#type::metadata::v3::{
    metadata_key::{path_segment::Segment, PathSegment},
    metadata_kind, MetadataKey, MetadataKind,
};
use shoal_proto::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag};
use shoal_proto::pb::envoy::r#type::v3::Percent;
use shoal_proto::pb::google::protobuf::BoolValue;
use shoal_proto::{Any, XdsType};

const HCM: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
/// istio-proxy's stats filter (HTTP and network alike).
pub const STATS_FILTER: &str = "istio.stats";
/// istio-proxy's metadata exchange filter (HTTP and network alike).
pub const MX_FILTER: &str = "istio.metadata_exchange";
/// istio-proxy's upstream ALPN override filter.
pub const ALPN_FILTER: &str = "istio.alpn";
const GRPC_STATS_FILTER: &str = "envoy.filters.http.grpc_stats";
const STATS_TYPE: &str = "type.googleapis.com/stats.PluginConfig";
const ALPN_TYPE: &str =
    "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";
const PEER_METADATA_TYPE: &str = "type.googleapis.com/io.istio.http.peer_metadata.Config";
const TCP_MX_TYPE: &str = "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange";
const TYPED_STRUCT: &str = "type.googleapis.com/xds.type.v3.TypedStruct";
/// `Cluster.alt_stat_name`'s field number.
const ALT_STAT_NAME_FIELD: u32 = 28;
/// MeshConfig `defaultConfig.tracing.sampling`'s default, in percent.
const DEFAULT_TRACE_SAMPLING: f64 = 1.0;

/// Whether a proxy gets istio-proxy's telemetry.
pub fn applies(proxy: &Proxy) -> bool {
    proxy.istio_version.is_some() && proxy.kind != ProxyKind::Proxyless
}

/// A listener or cluster key of an istio-proxy, and what its decoration reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TelemetryKey {
    /// The key of the undecorated resource.
    pub inner: Box<Key>,
    /// A gateway: its HTTP managers are of istiod's gateway class.
    pub gateway: bool,
    /// Tracing's `istio.namespace` tag.
    pub namespace: String,
    /// Tracing's `istio.mesh_id` tag (the trust domain, istiod's default mesh id).
    pub mesh_id: String,
    /// Tracing's `istio.canonical_service` and `istio.canonical_revision` tags: only on
    /// resources of the proxy's own (its inbound side, a gateway's listeners), since a
    /// sidecar's outbound listeners are shared by sidecars of different workloads.
    pub canonical: Option<(String, String)>,
}

/// Wraps the keys of `ty` for istio-proxy (listeners and clusters; other types unchanged).
pub fn wrap(ty: XdsType, keys: Vec<Key>, proxy: &Proxy, ctx: &PushContext) -> Vec<Key> {
    if !applies(proxy) || !matches!(ty, XdsType::Listener | XdsType::Cluster) {
        return keys;
    }
    let gateway = proxy.kind == ProxyKind::Router;
    keys.into_iter()
        .map(|k| {
            // HBONE's internal plumbing carries no telemetry of its own in istiod (the
            // service cluster and listener in front of it do).
            if matches!(
                &k,
                Key::Listener(super::lds::ListenerKey::ConnectOriginate)
                    | Key::Cluster(super::cds::ClusterKey::ConnectOriginate)
            ) {
                return k;
            }
            let own = gateway
                || matches!(
                    &k,
                    Key::Listener(super::lds::ListenerKey::VirtualInbound(_))
                );
            let canonical = (own && ty == XdsType::Listener).then(|| canonical_service(proxy));
            Key::IstioProxy(TelemetryKey {
                inner: Box::new(k),
                gateway,
                namespace: proxy.namespace.clone(),
                mesh_id: ctx.mesh.trust_domain.clone(),
                canonical,
            })
        })
        .collect()
}

/// The proxy's canonical service and revision, from its labels as istiod reads them.
fn canonical_service(proxy: &Proxy) -> (String, String) {
    let label = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| proxy.labels.get(*k).filter(|v| !v.is_empty()))
            .cloned()
    };
    let workload = proxy.pod.split('.').next().unwrap_or_default().to_string();
    let service = label(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or(workload);
    let revision = label(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .unwrap_or_else(|| "latest".into());
    (service, revision)
}

/// Builds the inner resource and decorates it.
pub fn build(key: &TelemetryKey) -> Resource {
    let inner = super::build(&key.inner);
    if inner.any.type_url == XdsType::Listener.type_url() {
        let Ok(mut l) = Listener::decode(&*inner.any.value) else {
            return inner;
        };
        decorate_listener(&mut l, key);
        Resource::new(XdsType::Listener, inner.name, &l)
    } else if inner.any.type_url == XdsType::Cluster.type_url() {
        // Appended to the encoding rather than decoded and encoded again: a cluster's
        // hand-ordered metadata maps (`cds::with_service_metadata`) keep their bytes.
        let mut value = inner.any.value.to_vec();
        delimited(
            ALT_STAT_NAME_FIELD,
            format!("{};", inner.name).as_bytes(),
            &mut value,
        );
        let any = Any {
            type_url: inner.any.type_url.clone(),
            value,
        };
        let version = shoal_proto::content_version(&any.value);
        Resource::from_parts(inner.name, version, any)
    } else {
        inner
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Inbound,
    Outbound,
    Gateway,
}

fn decorate_listener(l: &mut Listener, key: &TelemetryKey) {
    let class = if key.gateway {
        Class::Gateway
    } else if l.traffic_direction == TrafficDirection::Inbound as i32 {
        Class::Inbound
    } else {
        Class::Outbound
    };
    for chain in l
        .filter_chains
        .iter_mut()
        .chain(l.default_filter_chain.as_mut())
    {
        decorate_chain(chain, class, key);
    }
}

fn decorate_chain(chain: &mut FilterChain, class: Class, key: &TelemetryKey) {
    if let Some(i) = chain.filters.iter().position(|f| f.name == HCM) {
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[i].config_type else {
            return;
        };
        let Ok(mut hcm) = HttpConnectionManager::decode(&*any.value) else {
            return;
        };
        decorate_hcm(&mut hcm, class, key);
        chain.filters[i] = super::lds::hcm_filter(&hcm);
        if class == Class::Inbound {
            chain.filters.insert(0, tcp_metadata_exchange());
        }
    } else if let Some(i) = chain.filters.iter().position(|f| f.name == TCP_PROXY) {
        chain
            .filters
            .insert(i, network_filter(STATS_FILTER, stats_config(class)));
        if class == Class::Inbound {
            chain.filters.insert(0, tcp_metadata_exchange());
        }
    }
}

fn decorate_hcm(hcm: &mut HttpConnectionManager, class: Class, key: &TelemetryKey) {
    let filters = &mut hcm.http_filters;
    filters.insert(0, http_metadata_exchange(class == Class::Inbound));
    // grpc_stats (and istio.alpn) go before fault injection, CORS and the router, after
    // authentication and authorization.
    let at = filters
        .iter()
        .position(|f| {
            matches!(
                f.name.as_str(),
                "envoy.filters.http.fault"
                    | "envoy.filters.http.cors"
                    | "envoy.filters.http.router"
            )
        })
        .unwrap_or(filters.len());
    let mut middle = vec![grpc_stats()];
    if class != Class::Inbound {
        middle.push(alpn());
    }
    filters.splice(at..at, middle);
    let router = filters
        .iter()
        .position(|f| f.name == "envoy.filters.http.router")
        .unwrap_or(filters.len());
    filters.insert(router, http_filter(STATS_FILTER, stats_config(class)));
    hcm.tracing = Some(tracing(key));
    hcm.request_id_extension = Some(RequestIdExtension {
        typed_config: Some(shoal_proto::pack(
            "type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
            &UuidRequestIdConfig {
                use_request_id_for_trace_sampling: Some(BoolValue { value: true }),
                ..Default::default()
            },
        )),
    });
}

fn http_filter(name: &str, any: Any) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    }
}

fn network_filter(name: &str, any: Any) -> Filter {
    Filter {
        name: name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(any)),
    }
}

/// `stats.PluginConfig`: inbound and gateway managers do not fall back to the `host`
/// header for the destination service (field 6, `disable_host_header_fallback`).
fn stats_config(class: Class) -> Any {
    let mut value = Vec::new();
    if class != Class::Outbound {
        encode_key(6, WireType::Varint, &mut value);
        encode_varint(1, &mut value);
    }
    Any {
        type_url: STATS_TYPE.into(),
        value,
    }
}

fn grpc_stats() -> HttpFilter {
    http_filter(
        GRPC_STATS_FILTER,
        shoal_proto::pack(
            "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
            &GrpcStatsConfig {
                emit_filter_state: true,
                per_method_stat_specifier: Some(PerMethodStatSpecifier::StatsForAllMethods(
                    BoolValue { value: false },
                )),
                ..Default::default()
            },
        ),
    )
}

/// `istio.alpn`: upstream mTLS offers `istio-http/1.0`, `istio-http/1.1` or `istio-h2` by
/// the request's protocol, so the server's inbound chains tell HTTP from TCP by ALPN.
/// `FilterConfig.alpn_override` (1) of `AlpnOverride { upstream_protocol (1), alpn_override
/// (2) }`, protocols HTTP10 = 0, HTTP11 = 1, HTTP2 = 2.
fn alpn() -> HttpFilter {
    let overrides: [(u64, [&str; 3]); 3] = [
        (0, ["istio-http/1.0", "istio", "http/1.0"]),
        (1, ["istio-http/1.1", "istio", "http/1.1"]),
        (2, ["istio-h2", "istio", "h2"]),
    ];
    let mut value = Vec::new();
    for (protocol, alpns) in overrides {
        let mut entry = Vec::new();
        if protocol != 0 {
            encode_key(1, WireType::Varint, &mut entry);
            encode_varint(protocol, &mut entry);
        }
        for a in alpns {
            delimited(2, a.as_bytes(), &mut entry);
        }
        delimited(1, &entry, &mut value);
    }
    http_filter(
        ALPN_FILTER,
        Any {
            type_url: ALPN_TYPE.into(),
            value,
        },
    )
}

/// istiod's HTTP metadata exchange: peer metadata from `x-envoy-peer-metadata` headers or
/// workload discovery, and its own sent on, downstream (inbound) or upstream (outbound,
/// gateways).
fn http_metadata_exchange(inbound: bool) -> HttpFilter {
    let side = if inbound { "downstream" } else { "upstream" };
    let empty = || J::Obj(Vec::new());
    let config = vec![
        (
            format!("{side}_discovery"),
            J::List(vec![
                J::Obj(vec![("istio_headers".into(), empty())]),
                J::Obj(vec![("workload_discovery".into(), empty())]),
            ]),
        ),
        (
            format!("{side}_propagation"),
            J::List(vec![J::Obj(vec![("istio_headers".into(), empty())])]),
        ),
    ];
    http_filter(MX_FILTER, typed_struct(PEER_METADATA_TYPE, config))
}

/// istiod's TCP metadata exchange (`TCPListenerMx`).
fn tcp_metadata_exchange() -> Filter {
    network_filter(
        MX_FILTER,
        typed_struct(
            TCP_MX_TYPE,
            vec![
                ("enable_discovery".into(), J::Bool(true)),
                ("protocol".into(), J::Str("istio-peer-exchange".into())),
            ],
        ),
    )
}

/// istiod's tracing block without a Telemetry resource or tracing provider (the
/// bootstrap's tracer): every client-forced request, 1% at random, Istio's tags.
fn tracing(key: &TelemetryKey) -> Tracing {
    let rbac_tag = |tag: &str, path: &str| CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Request(metadata_kind::Request {})),
            }),
            metadata_key: Some(MetadataKey {
                key: "envoy.filters.http.rbac".into(),
                path: vec![PathSegment {
                    segment: Some(Segment::Key(path.into())),
                }],
            }),
            ..Default::default()
        })),
    };
    let literal = |tag: &str, value: &str| CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal {
            value: value.into(),
        })),
    };
    let mut custom_tags = vec![
        rbac_tag(
            "istio.authorization.dry_run.allow_policy.name",
            "istio_dry_run_allow_shadow_effective_policy_id",
        ),
        rbac_tag(
            "istio.authorization.dry_run.allow_policy.result",
            "istio_dry_run_allow_shadow_engine_result",
        ),
        rbac_tag(
            "istio.authorization.dry_run.deny_policy.name",
            "istio_dry_run_deny_shadow_effective_policy_id",
        ),
        rbac_tag(
            "istio.authorization.dry_run.deny_policy.result",
            "istio_dry_run_deny_shadow_engine_result",
        ),
    ];
    if let Some((service, revision)) = &key.canonical {
        custom_tags.push(literal("istio.canonical_revision", revision));
        custom_tags.push(literal("istio.canonical_service", service));
    }
    custom_tags.push(literal("istio.mesh_id", &key.mesh_id));
    custom_tags.push(literal("istio.namespace", &key.namespace));
    Tracing {
        client_sampling: Some(Percent { value: 100.0 }),
        random_sampling: Some(Percent {
            value: DEFAULT_TRACE_SAMPLING,
        }),
        overall_sampling: Some(Percent { value: 100.0 }),
        custom_tags,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Deterministic google.protobuf.Struct encoding

/// A JSON value, with object fields in the order given (write them sorted).
pub(crate) enum J {
    Str(String),
    Bool(bool),
    List(Vec<J>),
    Obj(Vec<(String, J)>),
}

pub(crate) fn delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// `Struct { map<string, Value> fields = 1 }`: one map entry (`key = 1`, `value = 2`) per
/// field, in the order given.
pub(crate) fn encode_struct(fields: &[(String, J)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        let mut entry = Vec::new();
        delimited(1, k.as_bytes(), &mut entry);
        delimited(2, &encode_value(v), &mut entry);
        delimited(1, &entry, &mut out);
    }
    out
}

/// `Value`: `string_value = 3`, `bool_value = 4`, `struct_value = 5`, `list_value = 6`
/// (`ListValue { repeated Value values = 1 }`).
fn encode_value(v: &J) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        J::Str(s) => delimited(3, s.as_bytes(), &mut out),
        J::Bool(b) => {
            encode_key(4, WireType::Varint, &mut out);
            encode_varint(u64::from(*b), &mut out);
        }
        J::Obj(fields) => delimited(5, &encode_struct(fields), &mut out),
        J::List(items) => {
            let mut list = Vec::new();
            for item in items {
                delimited(1, &encode_value(item), &mut list);
            }
            delimited(6, &list, &mut out);
        }
    }
    out
}

/// `xds.type.v3.TypedStruct { type_url = 1, value = 2 }`.
fn typed_struct(type_url: &str, fields: Vec<(String, J)>) -> Any {
    let mut value = Vec::new();
    delimited(1, type_url.as_bytes(), &mut value);
    delimited(2, &encode_struct(&fields), &mut value);
    Any {
        type_url: TYPED_STRUCT.into(),
        value,
    }
}
