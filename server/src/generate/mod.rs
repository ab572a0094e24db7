//! Generators: pure functions from a snapshot and a proxy to Envoy resources.
//!
//! Output is deterministic: inputs are ordered maps and sorted vectors, and no generated
//! message contains a protobuf map with more than one entry (prost encodes maps in hash
//! order). The same snapshot therefore yields the same bytes, and the same versions, on
//! every replica.

pub mod ambient;
pub mod authn;
pub mod authz;
pub mod cache;
pub mod cds;
pub mod eds;
pub mod gateway;
pub mod grpc;
pub mod hbone;
pub mod http_route;
pub mod inbound;
pub mod intern;
pub mod lds;
pub mod locality;
pub mod metrics;
pub mod mtls;
pub mod outbound;
pub mod rds;
pub mod sds;
pub mod telemetry;
pub mod traffic_policy;
pub mod vhosts;

#[cfg(test)]
mod tests;

use crate::index::endpoints::EndpointIndex;
use crate::index::proxy::Proxy;
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use bytes::{Bytes, BytesMut};
use prost::Message as _;
use shoal_proto::pb::envoy::config::core::v3::{
    address, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier, Address,
    AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress,
};
use shoal_proto::pb::envoy::service::discovery::v3::Resource as PbResource;
use shoal_proto::pb::google::protobuf::{value, Duration as PbDuration, Struct, Value};
use shoal_proto::{content_version, Any, XdsType};
use std::sync::{Arc, OnceLock};

/// One generated resource, encoded.
#[derive(Debug, Clone)]
pub struct Resource {
    /// The resource name.
    pub name: String,
    /// Content hash of `any.value`.
    pub version: String,
    /// The encoded resource.
    pub any: Any,
    /// Other names of the resource (delta `Resource.aliases`): the `<network>/<ip>` names
    /// an on-demand ztunnel may have asked for it by (see `ambient`); empty elsewhere.
    /// Not part of the version: the same resource sent with or without them is the same.
    pub aliases: Vec<String>,
    /// Its entry in a delta response, encoded once (see [`Resource::delta_entry`]).
    delta_entry: OnceLock<Bytes>,
    /// Its entry in a State-of-the-World response, encoded once.
    sotw_entry: OnceLock<Bytes>,
    /// sha256 of name and version, computed once (see [`Resource::digest`]).
    digest: OnceLock<[u8; 32]>,
}

impl PartialEq for Resource {
    fn eq(&self, other: &Resource) -> bool {
        // The entries are encodings of these four.
        self.name == other.name
            && self.version == other.version
            && self.any == other.any
            && self.aliases == other.aliases
    }
}

impl Eq for Resource {}

impl Resource {
    /// Encodes a message as a resource of `ty`.
    pub fn new<M: prost::Message>(ty: XdsType, name: String, msg: &M) -> Resource {
        let any = shoal_proto::pack(ty.type_url(), msg);
        let version = content_version(&any.value);
        Resource::from_parts(name, version, any)
    }

    /// A resource of `ty` from its encoded message.
    pub fn from_encoded(ty: XdsType, name: String, value: Vec<u8>) -> Resource {
        let version = content_version(&value);
        let any = Any {
            type_url: ty.type_url().to_string(),
            value,
        };
        Resource::from_parts(name, version, any)
    }

    /// A resource from its name, version and encoding.
    pub fn from_parts(name: String, version: String, any: Any) -> Resource {
        Resource {
            name,
            version,
            any,
            aliases: Vec::new(),
            delta_entry: OnceLock::new(),
            sotw_entry: OnceLock::new(),
            digest: OnceLock::new(),
        }
    }

    /// The resource with other names it answers to (see [`Resource::aliases`]).
    pub fn with_aliases(mut self, aliases: Vec<String>) -> Resource {
        self.aliases = aliases;
        self
    }

    /// sha256 of the name and the version: what a set version sums (see
    /// `view::Output::version`), computed once per resource.
    pub fn digest(&self) -> &[u8; 32] {
        self.digest.get_or_init(|| {
            use sha2::Digest as _;
            let mut h = sha2::Sha256::new();
            h.update(self.name.as_bytes());
            h.update([0]);
            h.update(self.version.as_bytes());
            h.finalize().into()
        })
    }

    /// The resource as one entry of `DeltaDiscoveryResponse.resources` (field 2, with its
    /// tag and length), encoded on first use: every stream sending it writes these bytes.
    pub fn delta_entry(&self) -> &Bytes {
        self.delta_entry.get_or_init(|| {
            // prost writes a message's fields in tag order: `version` (1), `resource` (2),
            // then `name` (3) and `aliases` (4). The same bytes, with `resource` written
            // from `self.any` rather than from a copy of it.
            let before = PbResource {
                version: self.version.clone(),
                ..Default::default()
            };
            let after = PbResource {
                name: self.name.clone(),
                aliases: self.aliases.clone(),
                ..Default::default()
            };
            let any_len = self.any.encoded_len();
            let len = before.encoded_len() + field_len(any_len) + after.encoded_len();
            let mut buf = BytesMut::with_capacity(field_len(len));
            encode_field_head(RESOURCES_FIELD, len, &mut buf);
            before.encode_raw(&mut buf);
            encode_field_head(RESOURCE_FIELD, any_len, &mut buf);
            self.any.encode_raw(&mut buf);
            after.encode_raw(&mut buf);
            buf.freeze()
        })
    }

    /// The resource as one entry of `DiscoveryResponse.resources` (field 2), encoded on
    /// first use.
    pub fn sotw_entry(&self) -> &Bytes {
        self.sotw_entry.get_or_init(|| {
            let any_len = self.any.encoded_len();
            let mut buf = BytesMut::with_capacity(field_len(any_len));
            encode_field_head(RESOURCES_FIELD, any_len, &mut buf);
            self.any.encode_raw(&mut buf);
            buf.freeze()
        })
    }
}

/// `resources` of `DiscoveryResponse` and `DeltaDiscoveryResponse`.
const RESOURCES_FIELD: u32 = 2;
/// `resource` of a delta `Resource`.
const RESOURCE_FIELD: u32 = 2;

/// The encoded length of a length-delimited field (tag below 16) of `len` bytes.
fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// A length-delimited field's tag and length.
fn encode_field_head(field: u32, len: usize, buf: &mut BytesMut) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    encode_key(field, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Everything the generators read for one push.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Config and services.
    pub ctx: Arc<PushContext>,
    /// Endpoint shards.
    pub endpoints: Arc<EndpointIndex>,
    /// Monotonic snapshot number (local to this replica).
    pub number: u64,
}

/// The inputs of one resource: the generator's key. Building a resource reads only its key,
/// so the key's `Hash`/`Eq` cover everything the resource depends on, and resources can be
/// cached by key and shared between proxies with the same view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// A cluster.
    Cluster(cds::ClusterKey),
    /// A load assignment.
    Endpoints(eds::EndpointsKey),
    /// A listener.
    Listener(lds::ListenerKey),
    /// A route table.
    Route(rds::RouteKey),
    /// A gateway credential.
    Secret(sds::SecretKey),
    /// A proxyless gRPC node's listener, route table or cluster.
    Grpc(grpc::GrpcKey),
    /// An istio-proxy's listener or cluster: the same resource with Istio's telemetry.
    IstioProxy(telemetry::TelemetryKey),
    /// A ztunnel's address or authorization policy.
    Ambient(ambient::AmbientKey),
}

/// Which of a proxy's resources of a type. A captured sidecar's inbound clusters and its
/// `virtualInbound` listener are its own side; everything else is its outbound side, which
/// every sidecar of its outbound part shares (see `push::view`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Both sides.
    All,
    /// All but the inbound clusters and listener.
    Outbound,
    /// Only the inbound clusters and listener.
    Inbound,
}

impl Side {
    /// Whether a resource of this name is on a sidecar's inbound side (its own: an inbound
    /// cluster, `InboundPassthroughCluster`, `virtualInbound`). Outputs keep each such
    /// resource in a run of its own, so the runs around it are the part's and shared.
    pub fn is_inbound_name(name: &str) -> bool {
        name.starts_with("inbound|")
            || name == cds::INBOUND_PASSTHROUGH_CLUSTER
            || name == inbound::VIRTUAL_INBOUND
    }
}

/// The keys of the resources of `ty` for a proxy. `names` are the requested resource names
/// (ignored for wildcard types; EDS and RDS return exactly the requested names that exist).
pub fn keys(
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Key> {
    side_keys(Side::All, ty, proxy, scope, snap, names)
}

/// The keys of one side of the resources of `ty` for a proxy (see [`keys`]).
pub fn side_keys(
    side: Side,
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Key> {
    if proxy.kind == crate::index::proxy::ProxyKind::Ztunnel {
        // ztunnel reads its two types only, the same for every ztunnel.
        return ambient::keys(ty, &snap.ctx, &snap.endpoints, names)
            .into_iter()
            .map(Key::Ambient)
            .collect();
    }
    let keys = plain_side_keys(side, ty, proxy, scope, snap, names);
    telemetry::wrap(ty, keys, proxy, &snap.ctx)
}

/// [`side_keys`] as an upstream Envoy gets them.
fn plain_side_keys(
    side: Side,
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Key> {
    if proxy.kind == crate::index::proxy::ProxyKind::Proxyless {
        // No sides: proxyless views are never composed (see `push::view`).
        if let Some(keys) = grpc::keys(ty, proxy, scope, &snap.ctx, &snap.endpoints, names) {
            return keys.into_iter().map(Key::Grpc).collect();
        }
    }
    match (side, ty) {
        (Side::Inbound, XdsType::Cluster) => cds::inbound_keys(proxy, scope)
            .into_iter()
            .map(Key::Cluster)
            .collect(),
        (Side::Outbound, XdsType::Cluster) => {
            cds::outbound_keys(proxy, scope, &snap.ctx, &snap.endpoints)
                .into_iter()
                .map(Key::Cluster)
                .collect()
        }
        (Side::Inbound, XdsType::Listener) => lds::inbound_keys(proxy, scope, &snap.ctx)
            .into_iter()
            .map(Key::Listener)
            .collect(),
        (Side::Outbound, XdsType::Listener) => lds::outbound_keys(proxy, scope, &snap.ctx)
            .into_iter()
            .map(Key::Listener)
            .collect(),
        (Side::Inbound, _) => Vec::new(),
        _ => all_keys(ty, proxy, scope, snap, names),
    }
}

fn all_keys(
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Key> {
    match ty {
        XdsType::Cluster => cds::keys(proxy, scope, &snap.ctx, &snap.endpoints)
            .into_iter()
            .map(Key::Cluster)
            .collect(),
        XdsType::Endpoint => eds::keys(names, proxy, scope, &snap.ctx, &snap.endpoints)
            .into_iter()
            .map(Key::Endpoints)
            .collect(),
        XdsType::Listener => lds::keys(proxy, scope, &snap.ctx)
            .into_iter()
            .map(Key::Listener)
            .collect(),
        XdsType::Route => rds::keys(proxy, scope, &snap.ctx, names)
            .into_iter()
            .map(Key::Route)
            .collect(),
        XdsType::Secret => sds::keys(names, proxy, snap)
            .into_iter()
            .map(Key::Secret)
            .collect(),
        // ztunnel's types only (see `side_keys`).
        XdsType::Address | XdsType::Authorization => Vec::new(),
    }
}

/// Builds a resource from its key.
pub fn build(key: &Key) -> Resource {
    match key {
        Key::Cluster(k) => cds::build(k),
        Key::Endpoints(k) => eds::build(k),
        Key::Listener(k) => lds::build(k),
        Key::Route(k) => rds::build(k),
        Key::Secret(k) => sds::build(k),
        Key::Grpc(k) => grpc::build(k),
        Key::IstioProxy(k) => telemetry::build(k),
        Key::Ambient(k) => ambient::build(k),
    }
}

/// Generates the resources of `ty` for a proxy, without a cache.
pub fn generate(
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Resource> {
    finish(
        keys(ty, proxy, scope, snap, names)
            .iter()
            .map(build)
            .collect(),
    )
}

/// Orders resources (owned or shared) by name and drops duplicates: responses are
/// deterministic.
pub(crate) fn finish<R: std::borrow::Borrow<Resource>>(mut out: Vec<R>) -> Vec<R> {
    out.sort_by(|a, b| a.borrow().name.cmp(&b.borrow().name));
    out.dedup_by(|a, b| a.borrow().name == b.borrow().name);
    out
}

/// A config source pointing back at the ADS stream.
pub(crate) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// ADS with `initial_fetch_timeout: 0s`, istiod's config source for RDS: a listener waits
/// for its routes however long the control plane takes, instead of serving 404s after
/// Envoy's default 15 s.
pub(crate) fn ads_config_source_waiting() -> ConfigSource {
    ConfigSource {
        initial_fetch_timeout: Some(pb_duration(std::time::Duration::ZERO)),
        ..ads_config_source()
    }
}

/// A protobuf map whose iteration order is its key order, so that prost encodes it the
/// same way every time (prost encodes `HashMap` fields in iteration order, which depends on
/// the map's random hasher). Tries fresh hashers until the order comes out sorted: one try
/// for one entry, about n! tries for n entries — per-route filter configs have two at most.
pub(crate) fn ordered_map<V: Clone>(
    mut entries: Vec<(String, V)>,
) -> std::collections::HashMap<String, V> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.dedup_by(|a, b| a.0 == b.0);
    let sorted = |m: &std::collections::HashMap<String, V>| {
        m.keys().zip(entries.iter()).all(|(k, (e, _))| k == e)
    };
    let mut map = std::collections::HashMap::new();
    for _ in 0..10_000 {
        map = entries.iter().cloned().collect();
        if sorted(&map) {
            return map;
        }
    }
    tracing::error!(
        entries = entries.len(),
        "could not order a protobuf map; its resource may differ between replicas"
    );
    map
}

/// A TCP socket address.
pub(crate) fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// A protobuf Struct of one string field (endpoint metadata, transport socket matches):
/// one entry, so that its encoding does not depend on map order.
pub(crate) fn string_struct(key: &str, value: &str) -> Struct {
    Struct {
        fields: std::iter::once((
            key.to_string(),
            Value {
                kind: Some(value::Kind::StringValue(value.to_string())),
            },
        ))
        .collect(),
    }
}

/// A protobuf Duration from a std Duration.
pub(crate) fn pb_duration(d: std::time::Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
