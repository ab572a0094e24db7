//! Generators: pure functions from a snapshot and a proxy to Envoy resources.
//!
//! Output is deterministic: inputs are ordered maps and sorted vectors, and no generated
//! message contains a protobuf map with more than one entry (prost encodes maps in hash
//! order). The same snapshot therefore yields the same bytes, and the same versions, on
//! every replica.

pub mod cds;
pub mod eds;
pub mod lds;
pub mod rds;

#[cfg(test)]
mod tests;

use crate::endpoints::EndpointIndex;
use crate::proxy::Proxy;
use crate::push_context::PushContext;
use crate::scope::ProxyScope;
use shoal_proto::pb::envoy::config::core::v3::{
    address, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier, Address,
    AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress,
};
use shoal_proto::pb::google::protobuf::Duration as PbDuration;
use shoal_proto::{content_version, Any, XdsType};
use std::sync::Arc;

/// One generated resource, encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The resource name.
    pub name: String,
    /// Content hash of `any.value`.
    pub version: String,
    /// The encoded resource.
    pub any: Any,
}

impl Resource {
    /// Encodes a message as a resource of `ty`.
    pub fn new<M: prost::Message>(ty: XdsType, name: String, msg: &M) -> Resource {
        let any = shoal_proto::pack(ty.type_url(), msg);
        let version = content_version(&any.value);
        Resource { name, version, any }
    }
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

/// Generates the resources of `ty` for a proxy. `names` are the requested resource names
/// (ignored for wildcard types; EDS and RDS return exactly the requested names that exist).
pub fn generate(
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    snap: &Snapshot,
    names: &[String],
) -> Vec<Resource> {
    let mut out = match ty {
        XdsType::Cluster => cds::generate(scope, &snap.ctx),
        XdsType::Endpoint => eds::generate(names, scope, &snap.ctx, &snap.endpoints),
        XdsType::Listener => lds::generate(proxy, scope, &snap.ctx),
        XdsType::Route => rds::generate(proxy, scope, &snap.ctx, names),
    };
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
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

/// A protobuf Duration from a std Duration.
pub(crate) fn pb_duration(d: std::time::Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
