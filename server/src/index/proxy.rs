//! Proxy identity, parsed from the Envoy node the way Istio's bootstrap writes it.

use shoal_common::model::Locality;
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
use std::collections::{BTreeMap, BTreeSet};

/// An Istio release, major and minor (what istiod's version gates compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IstioVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl IstioVersion {
    /// The newest release: what istiod assumes of a version it cannot parse (a dev build).
    pub const NEWEST: IstioVersion = IstioVersion {
        major: u32::MAX,
        minor: u32::MAX,
    };

    /// Parses `ISTIO_VERSION` (`1.24.2`, `1.25-dev`, `1.26.0-beta.1`) as istiod's
    /// `ParseIstioVersion`: `<major>.<minor>` at the start, else the newest release.
    pub fn parse(s: &str) -> IstioVersion {
        let s = s.trim_start_matches('v');
        let mut parts = s.splitn(3, ['.', '-']);
        let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
        match (num(parts.next()), num(parts.next())) {
            (Some(major), Some(minor)) if major > 0 => IstioVersion { major, minor },
            _ => IstioVersion::NEWEST,
        }
    }

    /// Whether this release is `major.minor` or newer.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        self >= IstioVersion { major, minor }
    }
}

/// Whether a proxy is a sidecar, a gateway (`router`), a proxyless gRPC application or an
/// ambient ztunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyKind {
    /// A workload sidecar.
    Sidecar,
    /// A gateway (ingress/egress).
    Router,
    /// gRPC's own xDS client (node metadata `GENERATOR: grpc`, as istio-agent's gRPC
    /// bootstrap sets it; the node id still says `sidecar`): served as istiod's `grpc`
    /// generator serves it (see [`crate::generate::grpc`]).
    Proxyless,
    /// Ambient mode's per-node proxy (node id `ztunnel~…`): served the mesh-wide workload
    /// and authorization types of [`crate::generate::ambient`], nothing else.
    Ztunnel,
}

impl ProxyKind {
    /// Its name in metric labels (`sidecar`, `router`, `proxyless`, `ztunnel`).
    pub fn label(self) -> &'static str {
        match self {
            ProxyKind::Sidecar => "sidecar",
            ProxyKind::Router => "router",
            ProxyKind::Proxyless => "proxyless",
            ProxyKind::Ztunnel => "ztunnel",
        }
    }

    /// Whether a request of `ty` that names no resources means "all of them". Envoy's CDS
    /// and LDS are wildcard; gRPC names every listener and cluster it wants (a target's
    /// `host:port`, the clusters its routes use), so for proxyless nodes no type is.
    pub fn wildcard(self, ty: shoal_proto::XdsType) -> bool {
        // ztunnel's types are wildcard too, but with `XDS_ON_DEMAND` it unsubscribes `*`
        // and names addresses: its streams' wildcard-ness is per subscription (see
        // `xds::delta`), so no ztunnel type is wildcard for the view.
        !matches!(self, ProxyKind::Proxyless | ProxyKind::Ztunnel) && ty.is_wildcard_type()
    }
}

/// Node metadata `GENERATOR` of a proxyless gRPC application.
pub const GENERATOR_GRPC: &str = "grpc";

/// How a sidecar's traffic reaches Envoy (node metadata `INTERCEPTION_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Interception {
    /// iptables `REDIRECT` to 15001/15006 (Istio's default, also when the field is absent).
    Redirect,
    /// iptables `TPROXY`: as `REDIRECT`, with transparent listeners.
    Tproxy,
    /// No capture: the application calls Envoy's listeners directly.
    None,
}

impl Interception {
    /// Whether traffic is captured (iptables), so the sidecar gets `virtualOutbound` and
    /// `virtualInbound`.
    pub fn captured(self) -> bool {
        self != Interception::None
    }
}

/// A connected proxy, as identified by its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    /// The full node id.
    pub id: String,
    /// Sidecar or router.
    pub kind: ProxyKind,
    /// The proxy's IP address.
    pub ip: String,
    /// `<pod>.<namespace>`.
    pub pod: String,
    /// The proxy's namespace (metadata `NAMESPACE`, else from the node id).
    pub namespace: String,
    /// The workload's labels (metadata `LABELS`).
    pub labels: BTreeMap<String, String>,
    /// The cluster the proxy runs in (metadata `CLUSTER_ID`).
    pub cluster_id: String,
    /// How traffic reaches the proxy (metadata `INTERCEPTION_MODE`; gateways: `NONE`).
    pub interception: Interception,
    /// The pod's container ports by name (metadata `POD_PORTS`), for named `targetPort`s.
    pub pod_ports: BTreeMap<String, u16>,
    /// Where the proxy runs, for locality load balancing (see [`proxy_locality`]).
    pub locality: Locality,
    /// The Istio release of an istio-proxy (node metadata `ISTIO_VERSION`); `None` for
    /// an upstream Envoy, which sends no such metadata. istio-proxy gets Istio's
    /// telemetry filters ([`crate::generate::telemetry`]), which an upstream Envoy cannot
    /// load, and version-gated config as istiod gates it.
    pub istio_version: Option<IstioVersion>,
    /// The proxy's bootstrap loads Envoy's internal listener extension
    /// (`envoy.bootstrap.internal_listener`), which internal listeners need: istio-proxy's
    /// always does; an upstream Envoy says so with node metadata
    /// [`INTERNAL_LISTENER_METADATA`]` = "true"`. Only such a proxy is sent HBONE to
    /// ambient pods ([`crate::generate::hbone`]); Envoy rejects the listener otherwise.
    pub internal_listener: bool,
    /// The workload's service account (metadata `SERVICE_ACCOUNT`), checked against the
    /// caller's identity on the secure port ([`crate::security::auth::authorize`]).
    pub service_account: Option<String>,
    /// What the stream's authentication proved (istiod's `Proxy.VerifiedIdentity`): set by
    /// the stream once the caller is authorized for this node, never from the node itself;
    /// `None` on the plaintext port. Gateway credentials go by it alone
    /// ([`crate::generate::sds`]).
    pub verified: Option<VerifiedIdentity>,
    /// The network the proxy is on (metadata `NETWORK`, istio-agent's
    /// `ISTIO_META_NETWORK`); empty when unset (see [`crate::index::network`]).
    pub network: String,
    /// The networks whose endpoints the proxy asks to see besides its own (metadata
    /// `REQUESTED_NETWORK_VIEW`, comma-separated); empty: all.
    pub requested_network_view: Vec<String>,
    /// The Kubernetes node it runs on (metadata `NODE_NAME`; ztunnel sends it): an
    /// on-demand ztunnel gets its node's workloads unasked, as from istiod.
    pub node_name: String,
}

/// What a stream's credential proved about its proxy: the service accounts and the
/// cluster gateway credentials are authorized for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifiedIdentity {
    /// The service accounts of the caller's identities in the proxy's namespace (the
    /// namespace authorization already tied to the caller).
    pub service_accounts: BTreeSet<String>,
    /// The cluster the credential proves the caller is in.
    pub cluster: ProvenCluster,
}

/// The cluster a caller's credential proves it runs in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProvenCluster {
    /// A service-account token that only this cluster's issuer keys verify.
    Token(String),
    /// A client certificate: a SPIFFE identity names no cluster (see
    /// [`crate::generate::sds`] for what that allows).
    Certificate,
    /// A token that the keys of several clusters verify (clusters sharing a signing key, and
    /// no `clusterid` header): it proves no cluster.
    Ambiguous,
}

impl std::fmt::Display for ProvenCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProvenCluster::Token(c) => write!(f, "{c} (token)"),
            ProvenCluster::Certificate => f.write_str("none proven (certificate)"),
            ProvenCluster::Ambiguous => f.write_str("none proven (token of several clusters)"),
        }
    }
}

/// A node that does not identify a proxy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyError {
    /// The first request carried no node.
    #[error("the first request of a stream must carry a node")]
    MissingNode,
    /// The node id is not `<type>~<ip>~<pod>.<ns>~<ns>.svc.<domain>`.
    #[error(
        "node id {0:?} is not <sidecar|router|ztunnel>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>"
    )]
    BadId(String),
    /// Node metadata `INTERCEPTION_MODE` is not one Istio defines.
    #[error("node metadata INTERCEPTION_MODE {0:?} is not REDIRECT, TPROXY or NONE")]
    BadInterception(String),
}

impl Proxy {
    /// Parses a node: id `<sidecar|router>~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`, metadata
    /// `NAMESPACE`, `LABELS`, `CLUSTER_ID`.
    pub fn from_node(node: Option<&Node>) -> Result<Proxy, ProxyError> {
        let node = node.ok_or(ProxyError::MissingNode)?;
        let bad = || ProxyError::BadId(node.id.clone());
        let parts: Vec<&str> = node.id.split('~').collect();
        let [kind, ip, pod, domain] = parts.as_slice() else {
            return Err(bad());
        };
        let meta = node.metadata.as_ref();
        let kind = match *kind {
            // istio-agent's gRPC bootstrap names proxyless nodes `sidecar~…` and tells them
            // apart by the generator they ask for, as istiod does.
            "sidecar"
                if meta.and_then(|m| string_field(m, "GENERATOR")).as_deref()
                    == Some(GENERATOR_GRPC) =>
            {
                ProxyKind::Proxyless
            }
            "sidecar" => ProxyKind::Sidecar,
            "router" => ProxyKind::Router,
            "ztunnel" => ProxyKind::Ztunnel,
            _ => return Err(bad()),
        };
        if ip.is_empty() || pod.is_empty() {
            return Err(bad());
        }
        let namespace = meta
            .and_then(|m| string_field(m, "NAMESPACE"))
            .or_else(|| pod.rsplit_once('.').map(|(_, ns)| ns.to_string()))
            .or_else(|| domain.split('.').next().map(str::to_string))
            .filter(|ns| !ns.is_empty())
            .ok_or_else(bad)?;
        let labels = meta
            .and_then(|m| m.fields.get("LABELS"))
            .and_then(|v| match &v.kind {
                Some(Kind::StructValue(s)) => Some(string_map(s)),
                _ => None,
            })
            .unwrap_or_default();
        let cluster_id = meta
            .and_then(|m| string_field(m, "CLUSTER_ID"))
            .unwrap_or_else(|| shoal_common::defaults::CLUSTER_ID.to_string());
        let interception = match meta.and_then(|m| string_field(m, "INTERCEPTION_MODE")) {
            // Gateways bind their listeners; gRPC applications dial on their own.
            _ if kind != ProxyKind::Sidecar => Interception::None,
            None => Interception::Redirect,
            Some(mode) => match mode.as_str() {
                "REDIRECT" | "" => Interception::Redirect,
                "TPROXY" => Interception::Tproxy,
                "NONE" => Interception::None,
                _ => return Err(ProxyError::BadInterception(mode)),
            },
        };
        let pod_ports = meta
            .and_then(|m| string_field(m, "POD_PORTS"))
            .map(|json| pod_ports(&json))
            .unwrap_or_default();
        let locality = proxy_locality(&labels, node);
        let service_account = meta
            .and_then(|m| string_field(m, "SERVICE_ACCOUNT"))
            .filter(|sa| !sa.is_empty());
        // Proxyless gRPC runs no Envoy: no istio-proxy filters, whatever the bootstrap says.
        let istio_version = meta
            .and_then(|m| string_field(m, "ISTIO_VERSION"))
            .filter(|v| !v.is_empty() && kind != ProxyKind::Proxyless)
            .map(|v| IstioVersion::parse(&v));
        // Only Envoys load internal listeners: proxyless gRPC and ztunnel have none,
        // whatever their metadata says.
        let internal_listener = matches!(kind, ProxyKind::Sidecar | ProxyKind::Router)
            && (istio_version.is_some()
                || meta
                    .and_then(|m| m.fields.get(INTERNAL_LISTENER_METADATA))
                    .is_some_and(metadata_true));
        let network = meta
            .and_then(|m| string_field(m, "NETWORK"))
            .unwrap_or_default();
        let mut requested_network_view: Vec<String> = meta
            .and_then(|m| string_field(m, "REQUESTED_NETWORK_VIEW"))
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        requested_network_view.sort();
        requested_network_view.dedup();
        let node_name = meta
            .and_then(|m| string_field(m, "NODE_NAME"))
            .unwrap_or_default();
        Ok(Proxy {
            network,
            requested_network_view,
            node_name,
            id: node.id.clone(),
            kind,
            ip: ip.to_string(),
            pod: pod.to_string(),
            namespace,
            labels,
            cluster_id,
            interception,
            pod_ports,
            locality,
            service_account,
            verified: None,
            istio_version,
            internal_listener,
        })
    }
}

/// Node label holding the region of a locality.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Node label holding the zone of a locality.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Istio's label for the subzone of a locality.
pub const LABEL_SUBZONE: &str = "topology.istio.io/subzone";

/// The proxy's locality as istiod's `setTopologyLabels` finds it: the workload's topology
/// labels (`LABELS`) when any is set, else its `topology.istio.io/locality` (or legacy
/// `istio-locality`) label, `.`-separated as Kubernetes labels must be, else the node's
/// `locality`, which istio-agent fills from that label or the platform.
fn proxy_locality(labels: &BTreeMap<String, String>, node: &Node) -> Locality {
    let get = |k: &str| labels.get(k).cloned();
    let (region, zone, subzone) = (get(LABEL_REGION), get(LABEL_ZONE), get(LABEL_SUBZONE));
    if region.is_some() || zone.is_some() || subzone.is_some() {
        return Locality {
            region: region.unwrap_or_default(),
            zone: zone.unwrap_or_default(),
            subzone: subzone.unwrap_or_default(),
        };
    }
    let label = labels
        .get("topology.istio.io/locality")
        .or_else(|| labels.get("istio-locality"));
    if let Some(label) = label {
        let label = if label.contains('/') {
            label.clone()
        } else {
            label.replace('.', "/")
        };
        return parse_locality(&label);
    }
    let l = node.locality.as_ref();
    Locality {
        region: l.map(|l| l.region.clone()).unwrap_or_default(),
        zone: l.map(|l| l.zone.clone()).unwrap_or_default(),
        subzone: l.map(|l| l.sub_zone.clone()).unwrap_or_default(),
    }
}

/// `region/zone/subzone` (each part optional) as a locality.
pub fn parse_locality(s: &str) -> Locality {
    // As istiod's `SplitLocalityLabel`: parts after the third are ignored.
    let mut parts = s.split('/').map(str::to_string);
    Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        subzone: parts.next().unwrap_or_default(),
    }
}

/// Parses istio-agent's `POD_PORTS` (the pod's container ports as JSON:
/// `[{"name":"http","containerPort":8080,"protocol":"TCP"}]`). Unnamed and malformed
/// entries are ignored: they can only matter to a named `targetPort`, which then stays
/// unresolved and is logged where it is used.
fn pod_ports(json: &str) -> BTreeMap<String, u16> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ContainerPort {
        #[serde(default)]
        name: String,
        container_port: u16,
    }
    match serde_json::from_str::<Vec<ContainerPort>>(json) {
        Ok(ports) => ports
            .into_iter()
            .filter(|p| !p.name.is_empty())
            .map(|p| (p.name, p.container_port))
            .collect(),
        Err(error) => {
            tracing::debug!(%error, "ignoring unparsable POD_PORTS node metadata");
            BTreeMap::new()
        }
    }
}

/// The node metadata key by which an upstream Envoy says its bootstrap loads the internal
/// listener extension (see [`Proxy::internal_listener`]). istio-proxy needs none: its
/// bootstrap always loads it, and `ISTIO_VERSION` says it is istio-proxy.
pub const INTERNAL_LISTENER_METADATA: &str = "SHOAL_INTERNAL_LISTENER";

/// A boolean metadata value as istio-agent writes them (Istio's `StringBool`: the string
/// `"true"`), or a JSON `true` a hand-written bootstrap may hold. Anything else is false:
/// the extension is opt-in.
fn metadata_true(v: &Value) -> bool {
    match &v.kind {
        Some(Kind::StringValue(s)) => s.trim().eq_ignore_ascii_case("true"),
        Some(Kind::BoolValue(b)) => *b,
        _ => false,
    }
}

fn string_field(s: &Struct, key: &str) -> Option<String> {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

fn string_map(s: &Struct) -> BTreeMap<String, String> {
    s.fields
        .iter()
        .filter_map(|(k, v): (&String, &Value)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn node(id: &str, ns: &str, labels: &[(&str, &str)]) -> Node {
        let sv = |s: &str| Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        let labels = Struct {
            fields: labels.iter().map(|(k, v)| (k.to_string(), sv(v))).collect(),
        };
        let mut fields = std::collections::HashMap::new();
        fields.insert("NAMESPACE".to_string(), sv(ns));
        fields.insert(
            "LABELS".to_string(),
            Value {
                kind: Some(Kind::StructValue(labels)),
            },
        );
        Node {
            id: id.to_string(),
            metadata: Some(Struct { fields }),
            ..Default::default()
        }
    }

    /// `ISTIO_VERSION` marks istio-proxy, parsed as istiod parses it; upstream Envoy and
    /// proxyless gRPC have none.
    #[test]
    fn istio_version_from_metadata() {
        let with = |id: &str, v: Option<&str>| {
            let mut n = node(id, "default", &[]);
            if let Some(v) = v {
                n.metadata.as_mut().unwrap().fields.insert(
                    "ISTIO_VERSION".into(),
                    Value {
                        kind: Some(Kind::StringValue(v.into())),
                    },
                );
            }
            Proxy::from_node(Some(&n)).unwrap().istio_version
        };
        let sidecar = "sidecar~10.0.0.1~a-1.default~default.svc.cluster.local";
        assert_eq!(
            with(sidecar, Some("1.24.2")),
            Some(IstioVersion {
                major: 1,
                minor: 24
            })
        );
        assert_eq!(
            with(sidecar, Some("1.25-dev")),
            Some(IstioVersion {
                major: 1,
                minor: 25
            })
        );
        assert_eq!(with(sidecar, Some("master")), Some(IstioVersion::NEWEST));
        assert_eq!(with(sidecar, None), None);
        assert_eq!(with(sidecar, Some("")), None);
        assert!(IstioVersion::parse("1.23.4") < IstioVersion::parse("1.24.0"));
        assert!(IstioVersion::parse("1.24.0").at_least(1, 24));
        assert!(!IstioVersion::parse("1.23.9").at_least(1, 24));
    }

    /// istio-proxy loads internal listeners; an upstream Envoy only when its metadata says
    /// `SHOAL_INTERNAL_LISTENER: "true"` (a string, as istio-agent writes booleans, or a
    /// JSON boolean); proxyless gRPC never.
    #[test]
    fn internal_listener_from_metadata() {
        let with = |id: &str, fields: &[(&str, Kind)]| {
            let mut n = node(id, "default", &[]);
            for (k, v) in fields {
                n.metadata.as_mut().unwrap().fields.insert(
                    k.to_string(),
                    Value {
                        kind: Some(v.clone()),
                    },
                );
            }
            Proxy::from_node(Some(&n)).unwrap().internal_listener
        };
        let s = |v: &str| Kind::StringValue(v.into());
        let sidecar = "sidecar~10.0.0.1~a-1.default~default.svc.cluster.local";
        let router = "router~10.0.0.1~gw-1.default~default.svc.cluster.local";
        let grpc = sidecar;
        let grpc_meta = |k: &'static str, v: Kind| [("GENERATOR", s("grpc")), (k, v)];
        assert!(!with(sidecar, &[]));
        assert!(with(sidecar, &[("ISTIO_VERSION", s("1.26.0"))]));
        assert!(with(sidecar, &[(INTERNAL_LISTENER_METADATA, s("true"))]));
        assert!(with(router, &[(INTERNAL_LISTENER_METADATA, s("TRUE"))]));
        assert!(with(
            sidecar,
            &[(INTERNAL_LISTENER_METADATA, Kind::BoolValue(true))]
        ));
        assert!(!with(sidecar, &[(INTERNAL_LISTENER_METADATA, s("false"))]));
        assert!(!with(
            sidecar,
            &[(INTERNAL_LISTENER_METADATA, s("yes please"))]
        ));
        assert!(!with(
            sidecar,
            &[(INTERNAL_LISTENER_METADATA, Kind::NumberValue(1.0))]
        ));
        assert!(!with(
            grpc,
            &grpc_meta(INTERNAL_LISTENER_METADATA, s("true"))
        ));
        assert!(!with(grpc, &grpc_meta("ISTIO_VERSION", s("1.26.0"))));
    }

    #[test]
    fn parses_istio_node_ids() {
        let n = node(
            "router~10.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local",
            "istio-system",
            &[("istio", "ingressgateway")],
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.kind, ProxyKind::Router);
        assert_eq!(p.namespace, "istio-system");
        assert_eq!(p.labels["istio"], "ingressgateway");
        assert_eq!(p.cluster_id, "Kubernetes");
    }

    #[test]
    fn interception_mode_and_pod_ports() {
        let sv = |s: &str| Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        let mut n = node(
            "sidecar~10.1.0.5~a.demo~demo.svc.cluster.local",
            "demo",
            &[],
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.interception, Interception::Redirect);
        assert_eq!(p.ip, "10.1.0.5");
        let fields = &mut n.metadata.as_mut().unwrap().fields;
        fields.insert("INTERCEPTION_MODE".into(), sv("NONE"));
        fields.insert(
            "POD_PORTS".into(),
            sv(r#"[{"name":"http","containerPort":8080,"protocol":"TCP"},{"containerPort":9}]"#),
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.interception, Interception::None);
        assert_eq!(p.pod_ports, BTreeMap::from([("http".to_string(), 8080)]));
        let fields = &mut n.metadata.as_mut().unwrap().fields;
        fields.insert("INTERCEPTION_MODE".into(), sv("MAGIC"));
        assert_eq!(
            Proxy::from_node(Some(&n)),
            Err(ProxyError::BadInterception("MAGIC".into()))
        );
        // Gateways are never captured.
        let g = node(
            "router~10.1.0.6~gw.demo~demo.svc.cluster.local",
            "demo",
            &[],
        );
        assert_eq!(
            Proxy::from_node(Some(&g)).unwrap().interception,
            Interception::None
        );
    }

    #[test]
    fn a_ztunnel_node_is_parsed() {
        let n = node(
            "ztunnel~10.1.0.3~ztunnel-x1.istio-system~istio-system.svc.cluster.local",
            "istio-system",
            &[],
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.kind, ProxyKind::Ztunnel);
        assert_eq!(p.kind.label(), "ztunnel");
        assert_eq!(
            (p.namespace.as_str(), p.ip.as_str()),
            ("istio-system", "10.1.0.3")
        );
        assert_eq!(p.interception, Interception::None);
        // Wildcard per subscription (on demand), never per type.
        assert!(!p.kind.wildcard(shoal_proto::XdsType::Address));
    }

    #[test]
    fn generator_grpc_is_a_proxyless_node() {
        let sv = |s: &str| Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        let mut n = node(
            "sidecar~10.1.0.5~echo-1.default~default.svc.cluster.local",
            "default",
            &[("app", "echo")],
        );
        let fields = &mut n.metadata.as_mut().unwrap().fields;
        fields.insert("GENERATOR".into(), sv("grpc"));
        fields.insert("INTERCEPTION_MODE".into(), sv("REDIRECT"));
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.kind, ProxyKind::Proxyless);
        assert_eq!(p.interception, Interception::None, "nothing is captured");
        assert_eq!(p.labels["app"], "echo");
        assert!(!p.kind.wildcard(shoal_proto::XdsType::Listener));
        assert!(ProxyKind::Sidecar.wildcard(shoal_proto::XdsType::Listener));
        // Any other generator is Envoy's.
        let fields = &mut n.metadata.as_mut().unwrap().fields;
        fields.insert("GENERATOR".into(), sv("envoy"));
        assert_eq!(Proxy::from_node(Some(&n)).unwrap().kind, ProxyKind::Sidecar);
    }

    #[test]
    fn locality_from_labels_then_node() {
        use shoal_proto::pb::envoy::config::core::v3::Locality as PbLocality;
        let loc = |r: &str, z: &str, s: &str| Locality {
            region: r.into(),
            zone: z.into(),
            subzone: s.into(),
        };
        let id = "sidecar~10.1.0.5~a.demo~demo.svc.cluster.local";
        let mut n = node(id, "demo", &[]);
        assert_eq!(
            Proxy::from_node(Some(&n)).unwrap().locality,
            Locality::default()
        );
        n.locality = Some(PbLocality {
            region: "us-east".into(),
            zone: "a".into(),
            sub_zone: "rack1".into(),
        });
        assert_eq!(
            Proxy::from_node(Some(&n)).unwrap().locality,
            loc("us-east", "a", "rack1")
        );
        // The locality label wins over the node's, `.` standing for `/`.
        let mut l = node(id, "demo", &[("istio-locality", "eu.b")]);
        l.locality = n.locality.clone();
        assert_eq!(
            Proxy::from_node(Some(&l)).unwrap().locality,
            loc("eu", "b", "")
        );
        // Topology labels win over both.
        let mut t = node(
            id,
            "demo",
            &[
                ("topology.istio.io/locality", "eu/b"),
                (LABEL_REGION, "ap"),
                (LABEL_ZONE, "c"),
            ],
        );
        t.locality = n.locality.clone();
        assert_eq!(
            Proxy::from_node(Some(&t)).unwrap().locality,
            loc("ap", "c", "")
        );
    }

    #[test]
    fn namespace_falls_back_to_id() {
        let n = Node {
            id: "sidecar~1.2.3.4~a.demo~demo.svc.cluster.local".into(),
            ..Default::default()
        };
        assert_eq!(Proxy::from_node(Some(&n)).unwrap().namespace, "demo");
    }

    #[test]
    fn namespace_is_the_last_token_of_a_dotted_pod_name() {
        let n = Node {
            id: "sidecar~1.2.3.4~web.v2-abc.demo~demo.svc.cluster.local".into(),
            ..Default::default()
        };
        assert_eq!(Proxy::from_node(Some(&n)).unwrap().namespace, "demo");
    }

    #[test]
    fn rejects_bad_ids() {
        for id in ["", "x~1~a.b~b.svc", "sidecar~~a.b~b.svc", "sidecar~1.2.3.4"] {
            let n = Node {
                id: id.into(),
                ..Default::default()
            };
            assert!(Proxy::from_node(Some(&n)).is_err(), "{id}");
        }
        assert_eq!(Proxy::from_node(None), Err(ProxyError::MissingNode));
    }
}
