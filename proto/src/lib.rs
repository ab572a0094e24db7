//! shoal-proto: the xDS types shoal serves (re-exported from `envoy-types`), type URLs,
//! `Any` packing with content-hash versions, and Istio's resource-name conventions.
#![forbid(unsafe_code)]

pub mod istio_ca;
pub mod istio_workload;

pub use envoy_types::pb;
pub use envoy_types::pb::google::protobuf::Any;

use prost::Message;
use sha2::{Digest, Sha256};

/// Type URL of Envoy's `Cluster`.
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of Envoy's `ClusterLoadAssignment`.
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of Envoy's `Listener`.
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of Envoy's `RouteConfiguration`.
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// Type URL of Envoy's SDS `Secret`.
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Type URL of Istio's ambient `Address` (a workload or a service), served to ztunnel.
pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
/// Type URL of Istio's ambient L4 `Authorization`, served to ztunnel.
pub const AUTHORIZATION_TYPE: &str = "type.googleapis.com/istio.security.Authorization";

/// The xDS resource types shoal serves, in the order a push sends them (CDS before EDS,
/// LDS before RDS), as Envoy's ADS sequencing requires to avoid traffic loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XdsType {
    /// CDS.
    Cluster,
    /// EDS.
    Endpoint,
    /// LDS.
    Listener,
    /// RDS.
    Route,
    /// SDS (gateway credentials), last as in istiod: Envoy asks for secrets while it
    /// warms the listeners that name them.
    Secret,
    /// Ambient workloads and services (ztunnel only).
    Address,
    /// Ambient L4 authorization policies (ztunnel only).
    Authorization,
}

impl XdsType {
    /// All types in push order.
    pub const ALL: [XdsType; 7] = [
        XdsType::Cluster,
        XdsType::Endpoint,
        XdsType::Listener,
        XdsType::Route,
        XdsType::Secret,
        XdsType::Address,
        XdsType::Authorization,
    ];

    /// The type's position in [`XdsType::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The type URL.
    pub fn type_url(self) -> &'static str {
        match self {
            XdsType::Cluster => CLUSTER_TYPE,
            XdsType::Endpoint => ENDPOINT_TYPE,
            XdsType::Listener => LISTENER_TYPE,
            XdsType::Route => ROUTE_TYPE,
            XdsType::Secret => SECRET_TYPE,
            XdsType::Address => ADDRESS_TYPE,
            XdsType::Authorization => AUTHORIZATION_TYPE,
        }
    }

    /// Parses a type URL.
    pub fn from_type_url(url: &str) -> Option<XdsType> {
        XdsType::ALL.into_iter().find(|t| t.type_url() == url)
    }

    /// Short name (`cds`, `eds`, `lds`, `rds`, `sds`; `wds` and `wads` for ztunnel's, as
    /// istiod names them) for logs and metrics.
    pub fn short(self) -> &'static str {
        match self {
            XdsType::Cluster => "cds",
            XdsType::Endpoint => "eds",
            XdsType::Listener => "lds",
            XdsType::Route => "rds",
            XdsType::Secret => "sds",
            XdsType::Address => "wds",
            XdsType::Authorization => "wads",
        }
    }

    /// Whether a request names no resources means "all" (wildcard): true for CDS and LDS.
    pub fn is_wildcard_type(self) -> bool {
        matches!(self, XdsType::Cluster | XdsType::Listener)
    }
}

/// Packs a message into an `Any` with its fully qualified type URL.
pub fn pack<M: Message>(type_url: &str, msg: &M) -> Any {
    Any {
        type_url: type_url.to_string(),
        value: msg.encode_to_vec(),
    }
}

/// The version of a resource: a hash of its encoded bytes, so every replica that generates
/// the same bytes reports the same version.
pub fn content_version(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Istio's cluster name: `outbound|<port>|<subset>|<hostname>`.
pub fn outbound_cluster_name(port: u32, subset: &str, hostname: &str) -> String {
    format!("outbound|{port}|{subset}|{hostname}")
}

/// istiod's SNI-DNAT cluster name (its `BuildDNSSrvSubsetKey`), which is also the SNI of
/// Istio mutual TLS to `outbound|<port>|<subset>|<hostname>`:
/// `outbound_.<port>_.<subset>_.<hostname>`. An `AUTO_PASSTHROUGH` gateway routes by it.
pub fn sni_dnat_cluster_name(port: u32, subset: &str, hostname: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{hostname}")
}

/// Parses an Istio outbound cluster name, `outbound|<port>|<subset>|<hostname>` or the
/// SNI-DNAT form `outbound_.<port>_.<subset>_.<hostname>`, into (port, subset, hostname).
pub fn parse_outbound_cluster_name(name: &str) -> Option<(u32, &str, &str)> {
    if let Some(rest) = name.strip_prefix("outbound_.") {
        let (port, rest) = rest.split_once("_.")?;
        let (subset, host) = rest.split_once("_.")?;
        return Some((port.parse().ok()?, subset, host));
    }
    let mut parts = name.splitn(4, '|');
    if parts.next()? != "outbound" {
        return None;
    }
    let port = parts.next()?.parse().ok()?;
    let subset = parts.next()?;
    let host = parts.next()?;
    Some((port, subset, host))
}

/// Istio's listener name for an address and port: `0.0.0.0_8080`.
pub fn listener_name(bind: &str, port: u32) -> String {
    format!("{bind}_{port}")
}

/// The SDS resource name of a gateway credential: `kubernetes://<secret>` (Istio's).
pub fn credential_resource_name(secret: &str) -> String {
    format!("kubernetes://{secret}")
}

/// Istio's route name of a gateway HTTPS server (TLS terminated):
/// `https.<port>.<port name>.<gateway>.<gateway namespace>`.
pub fn gateway_https_route_name(
    port: u32,
    port_name: &str,
    gateway: &str,
    namespace: &str,
) -> String {
    format!("https.{port}.{port_name}.{gateway}.{namespace}")
}

/// Istio's gateway route name for a port: `http.8080`.
pub fn gateway_route_name(port: u32) -> String {
    format!("http.{port}")
}

/// Istio's sidecar outbound route name for a port: `"9080"`.
pub fn sidecar_route_name(port: u32) -> String {
    port.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_sits_at_its_index() {
        for (i, ty) in XdsType::ALL.into_iter().enumerate() {
            assert_eq!(ty.index(), i, "{ty:?}");
        }
    }

    #[test]
    fn cluster_names_round_trip() {
        let n = outbound_cluster_name(9080, "v1", "reviews.default.svc.cluster.local");
        assert_eq!(n, "outbound|9080|v1|reviews.default.svc.cluster.local");
        assert_eq!(
            parse_outbound_cluster_name(&n),
            Some((9080, "v1", "reviews.default.svc.cluster.local"))
        );
        assert_eq!(parse_outbound_cluster_name("inbound|1||x"), None);
        // istiod's names for the same cluster under AUTO_PASSTHROUGH (its SNI).
        let n = sni_dnat_cluster_name(9080, "", "reviews.default.svc.cluster.local");
        assert_eq!(n, "outbound_.9080_._.reviews.default.svc.cluster.local");
        assert_eq!(
            parse_outbound_cluster_name(&n),
            Some((9080, "", "reviews.default.svc.cluster.local"))
        );
        assert_eq!(
            parse_outbound_cluster_name("outbound_.8080_.v1_.a.b.svc.cluster.local"),
            Some((8080, "v1", "a.b.svc.cluster.local"))
        );
        assert_eq!(parse_outbound_cluster_name("outbound_.x_._.a"), None);
    }

    #[test]
    fn versions_depend_only_on_bytes() {
        assert_eq!(content_version(b"abc"), content_version(b"abc"));
        assert_ne!(content_version(b"abc"), content_version(b"abd"));
        assert_eq!(content_version(b"").len(), 16);
    }
}
