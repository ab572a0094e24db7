//! Pure functions from Kubernetes objects (k8s-openapi types) to shoal's model.
//!
//! They take no file or watch context, so the file source and the Kubernetes source feed
//! the same functions; callers add context to the errors.

use crate::error::InvalidObject;
use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::{Endpoint as KubeEndpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as KubeMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use shoal_common::model::{
    service_fqdn, Endpoint, EndpointPort, EndpointSet, Locality, ObjectMeta, Protocol, Service,
    ServicePort, TargetPort, NO_SERVICE,
};
use std::collections::BTreeMap;
use tracing::debug;

/// The namespace of a namespaced object whose manifest names none (as `kubectl apply`).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Istio's annotation restricting which namespaces see a Service.
pub const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";

/// Istio's annotation making an AuthorizationPolicy a dry run (Envoy's shadow rules).
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// The label of an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Node label holding the region of its locality.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// Node label holding the zone of its locality.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Node label holding Istio's subzone of its locality.
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// Annotations shoal reads; the rest are dropped so unrelated annotation churn (e.g.
/// `kubectl.kubernetes.io/last-applied-configuration`) never changes a published value.
const INTERPRETED_ANNOTATIONS: &[&str] = &[
    EXPORT_TO_ANNOTATION,
    DRY_RUN_ANNOTATION,
    shoal_common::model::AMBIENT_REDIRECTION_ANNOTATION,
];

/// Whether shoal reads this annotation (others never reach the bus).
pub fn is_interpreted_annotation(key: &str) -> bool {
    INTERPRETED_ANNOTATIONS.contains(&key)
}

/// The model metadata of a Kubernetes object: name, namespace (defaulted), labels and the
/// annotations shoal interprets.
pub fn object_meta(meta: &KubeMeta) -> ObjectMeta {
    let annotations = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| is_interpreted_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        name: meta.name.clone().unwrap_or_default(),
        namespace: namespace_of(meta).to_string(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations,
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
    }
}

fn namespace_of(meta: &KubeMeta) -> &str {
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns,
        _ => DEFAULT_NAMESPACE,
    }
}

fn port_number(value: i32, field: &str) -> Result<u16, InvalidObject> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(InvalidObject::new(format!(
            "{field} is {value}, not a port number (1-65535)"
        ))),
    }
}

/// Checks what [`service`] relies on: a name and valid port numbers.
pub fn check_service(svc: &KubeService) -> Result<(), InvalidObject> {
    if svc.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(InvalidObject::new("metadata.name is empty"));
    }
    let ports = svc.spec.iter().flat_map(|s| s.ports.iter().flatten());
    for (i, p) in ports.enumerate() {
        port_number(p.port, &format!("spec.ports[{i}].port"))?;
    }
    Ok(())
}

/// Ports istiod never sniffs (its `wellKnownPorts`: SMTP, DNS, MySQL, MongoDB): a port
/// on one of them that names no protocol is TCP. Sniffing would break these protocols,
/// where the server speaks first or the client sends nothing HTTP-like (kube-dns' TCP 53
/// gets a plain TCP proxy, as from istiod).
const WELL_KNOWN_TCP_PORTS: [u16; 4] = [25, 53, 3306, 27017];

/// The protocol of a service port: `appProtocol` when set, else Istio's port-name convention,
/// else TCP on a well-known port (istiod's `ConvertProtocol`).
fn port_protocol(name: &str, port: u16, app_protocol: Option<&str>) -> Protocol {
    let protocol = match app_protocol {
        // The standard Kubernetes appProtocols Istio maps to mesh protocols.
        Some("kubernetes.io/h2c") => Protocol::Http2,
        Some("kubernetes.io/ws") => Protocol::Http,
        Some("kubernetes.io/wss") => Protocol::Https,
        Some(p) if !p.is_empty() => Protocol::from_port_name(p),
        _ => Protocol::from_port_name(name),
    };
    if protocol == Protocol::Unsupported && WELL_KNOWN_TCP_PORTS.contains(&port) {
        return Protocol::Tcp;
    }
    protocol
}

/// Normalizes a Service seen in `cluster`. `Ok(None)` for services shoal does not model
/// (`ExternalName`).
pub fn service(svc: &KubeService, cluster: &str) -> Result<Option<Service>, InvalidObject> {
    check_service(svc)?;
    let meta = object_meta(&svc.metadata);
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        debug!(namespace = %meta.namespace, name = %meta.name, "skipping ExternalName service");
        return Ok(None);
    }
    let mut cluster_ips: Vec<String> = match spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips,
        _ => spec.cluster_ip.into_iter().collect(),
    };
    // "None" marks a headless service: it has no virtual IP.
    cluster_ips.retain(|ip| !ip.is_empty() && ip != "None");
    let mut ports = Vec::new();
    for p in spec.ports.unwrap_or_default() {
        // The mesh proxies TCP only; UDP and SCTP ports pass outside it.
        if matches!(p.protocol.as_deref(), Some("UDP") | Some("SCTP")) {
            continue;
        }
        let name = p.name.unwrap_or_default();
        let port = port_number(p.port, "port")?;
        let target_port = match p.target_port {
            Some(IntOrString::Int(n)) => Some(TargetPort::Number(port_number(n, "targetPort")?)),
            Some(IntOrString::String(s)) => match s.parse::<i32>() {
                Ok(n) => Some(TargetPort::Number(port_number(n, "targetPort")?)),
                Err(_) if !s.is_empty() => Some(TargetPort::Name(s)),
                Err(_) => None,
            },
            None => None,
        }
        // The default, spelled out: keep the stored value small.
        .filter(|t| *t != TargetPort::Number(port));
        ports.push(ServicePort {
            protocol: port_protocol(&name, port, p.app_protocol.as_deref()),
            name,
            port,
            target_port,
        });
    }
    let export_to = meta
        .annotations
        .get(EXPORT_TO_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    // The load balancer's addresses first (what istiod's `ClusterExternalAddresses`
    // takes for a LoadBalancer Service), then the external IPs.
    let external_addresses = svc
        .status
        .iter()
        .filter_map(|s| s.load_balancer.as_ref())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
        .chain(spec.external_ips.iter().flatten().cloned())
        .filter(|a| !a.is_empty())
        .collect();
    Ok(Some(Service {
        external_addresses,
        hostname: service_fqdn(&meta.name, &meta.namespace),
        cluster: cluster.to_string(),
        cluster_ips,
        ports,
        selector: spec.selector.unwrap_or_default(),
        export_to,
        meta,
    }))
}

/// The name of the Service an EndpointSlice belongs to.
pub fn slice_service_name(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// Checks what [`endpoint_slice`] relies on: a name, the service-name label, valid ports.
pub fn check_endpoint_slice(slice: &EndpointSlice) -> Result<(), InvalidObject> {
    if slice
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        return Err(InvalidObject::new("metadata.name is empty"));
    }
    if slice_service_name(slice).is_none() {
        return Err(InvalidObject::new(format!(
            "label {SERVICE_NAME_LABEL} is missing: the slice belongs to no service"
        )));
    }
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Some(port) = p.port {
            port_number(port, &format!("ports[{i}].port"))?;
        }
    }
    Ok(())
}

/// Looks up a pod by (namespace, name).
pub type PodLookup<'a> = &'a dyn Fn(&str, &str) -> Option<&'a Pod>;

/// The pods and nodes EndpointSlices are joined with, indexed for lookup.
#[derive(Default)]
pub struct Workloads<'a> {
    /// Pods by (namespace, name).
    pods: BTreeMap<(&'a str, &'a str), &'a Pod>,
    /// Pods by (namespace, IP), for endpoints without a usable `targetRef`.
    pods_by_ip: BTreeMap<(&'a str, &'a str), &'a Pod>,
    /// Nodes by name.
    nodes: BTreeMap<&'a str, &'a Node>,
    /// Pods outside `pods`, looked up by name (see [`Workloads::with_pod_lookup`]).
    more_pods: Option<PodLookup<'a>>,
}

impl std::fmt::Debug for Workloads<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workloads")
            .field("pods", &self.pods.len())
            .field("pods_by_ip", &self.pods_by_ip.len())
            .field("nodes", &self.nodes.len())
            .field("more_pods", &self.more_pods.is_some())
            .finish()
    }
}

impl<'a> Workloads<'a> {
    /// Indexes the given pods and nodes.
    pub fn new(
        pods: impl IntoIterator<Item = &'a Pod>,
        nodes: impl IntoIterator<Item = &'a Node>,
    ) -> Self {
        let mut w = Workloads::default();
        for pod in pods {
            let Some(name) = pod.metadata.name.as_deref() else {
                continue;
            };
            let ns = namespace_of(&pod.metadata);
            w.pods.insert((ns, name), pod);
            let spec = pod.spec.as_ref();
            let status = pod.status.as_ref();
            // A host-network pod has its node's IP, and a finished pod's IP may already
            // belong to a new pod: neither identifies a pod by IP.
            let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
            let finished = matches!(
                status.and_then(|s| s.phase.as_deref()),
                Some("Succeeded") | Some("Failed")
            );
            if host_network || finished {
                continue;
            }
            let ips = status.into_iter().flat_map(|s| {
                s.pod_ip
                    .iter()
                    .chain(s.pod_ips.iter().flatten().map(|p| &p.ip))
            });
            for ip in ips {
                w.pods_by_ip.insert((ns, ip.as_str()), pod);
            }
        }
        for node in nodes {
            if let Some(name) = node.metadata.name.as_deref() {
                w.nodes.insert(name, node);
            }
        }
        w
    }

    /// Looks up a `targetRef`'s pod with `lookup` when it is not among the indexed pods.
    /// A round that recomputes some namespaces indexes only their pods (an endpoint's pod
    /// by IP is always in the slice's namespace), and still finds a pod a `targetRef`
    /// names in another namespace.
    pub fn with_pod_lookup(mut self, lookup: PodLookup<'a>) -> Self {
        self.more_pods = Some(lookup);
        self
    }

    /// The pod behind one address of an endpoint: its `targetRef` when that names a known
    /// pod, else the pod with that IP in the slice's namespace.
    fn pod(&self, namespace: &str, ep: &KubeEndpoint, address: &str) -> Option<&'a Pod> {
        let by_ref = ep.target_ref.as_ref().and_then(|r| {
            if r.kind.as_deref() != Some("Pod") {
                return None;
            }
            let ns = r.namespace.as_deref().unwrap_or(namespace);
            let name = r.name.as_deref()?;
            let indexed = self.pods.get(&(ns, name)).copied();
            indexed.or_else(|| self.more_pods.and_then(|lookup| lookup(ns, name)))
        });
        by_ref.or_else(|| self.pods_by_ip.get(&(namespace, address)).copied())
    }
}

/// The locality of a node, from its topology labels.
pub fn node_locality(node: &Node) -> Locality {
    let label = |key: &str| {
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Locality {
        region: label(REGION_LABEL),
        zone: label(ZONE_LABEL),
        subzone: label(SUBZONE_LABEL),
    }
}

/// A pod's service account.
fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| {
            s.service_account_name
                .as_ref()
                .or(s.service_account.as_ref())
        })
        .cloned()
        .unwrap_or_default()
}

/// Whether istio-cni redirected the pod's traffic to ztunnel.
fn redirected(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(shoal_common::model::AMBIENT_REDIRECTION_ANNOTATION))
        .is_some_and(|v| v == "enabled")
}

/// A pod that no EndpointSlice names, as an endpoint set of its own (service
/// [`NO_SERVICE`], slice: the pod's name), so that ambient serves it as a workload as
/// istiod's ambient index serves every pod with an IP. `None` for what istiod does not
/// serve either: a pod without an IP yet (pending), a host-network pod (its IP is its
/// node's), a finished pod (its IP may already be another pod's).
pub fn lone_pod(pod: &Pod, cluster: &str, workloads: &Workloads<'_>) -> Option<EndpointSet> {
    let name = pod.metadata.name.as_deref()?;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref()?;
    if spec.and_then(|s| s.host_network).unwrap_or(false)
        || matches!(status.phase.as_deref(), Some("Succeeded") | Some("Failed"))
    {
        return None;
    }
    let mut ips: Vec<&str> = status
        .pod_ip
        .iter()
        .chain(status.pod_ips.iter().flatten().map(|p| &p.ip))
        .map(String::as_str)
        .filter(|ip| !ip.is_empty())
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return None;
    }
    // Kubernetes' pod readiness: the Ready condition is True.
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
    let locality = workloads
        .nodes
        .get(node.as_str())
        .map(|n| node_locality(n))
        .unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let endpoints = ips
        .into_iter()
        .map(|ip| Endpoint {
            address: ip.to_string(),
            ready,
            labels: labels.clone(),
            service_account: service_account(pod),
            locality: locality.clone(),
            pod: name.to_string(),
            node: node.clone(),
            ambient: redirected(pod),
        })
        .collect();
    Some(EndpointSet {
        cluster: cluster.to_string(),
        namespace: namespace_of(&pod.metadata).to_string(),
        service: NO_SERVICE.to_string(),
        slice: name.to_string(),
        ports: Vec::new(),
        endpoints,
        network: String::new(),
    })
}

/// Normalizes an EndpointSlice seen in `cluster`, joining each address with its pod
/// (labels, service account, name) and node (locality). `Ok(None)` for slices shoal does
/// not model (address type `FQDN`).
pub fn endpoint_slice(
    slice: &EndpointSlice,
    cluster: &str,
    workloads: &Workloads<'_>,
) -> Result<Option<EndpointSet>, InvalidObject> {
    check_endpoint_slice(slice)?;
    let namespace = namespace_of(&slice.metadata);
    let name = slice.metadata.name.clone().unwrap_or_default();
    let service = slice_service_name(slice).unwrap_or_default().to_string();
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        debug!(
            %namespace,
            %name,
            address_type = %slice.address_type,
            "skipping EndpointSlice that is not IPv4 or IPv6",
        );
        return Ok(None);
    }
    let mut ports: Vec<EndpointPort> = Vec::new();
    for p in slice.ports.iter().flatten() {
        // A port without a number means "all ports", which the model cannot express.
        let Some(port) = p.port else { continue };
        ports.push(EndpointPort {
            name: p.name.clone().unwrap_or_default(),
            port: port_number(port, "port")?,
        });
    }
    // Keyed by address: sorted output, and a repeated address yields one endpoint.
    let mut endpoints: BTreeMap<&str, Endpoint> = BTreeMap::new();
    for ep in &slice.endpoints {
        // Kubernetes: an absent `ready` condition means ready.
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        for address in &ep.addresses {
            if endpoints.contains_key(address.as_str()) {
                continue;
            }
            let pod = workloads.pod(namespace, ep, address);
            let node_name = pod
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.as_deref())
                .or(ep.node_name.as_deref());
            let locality = match node_name.and_then(|n| workloads.nodes.get(n)) {
                Some(node) => node_locality(node),
                None => Locality {
                    zone: ep.zone.clone().unwrap_or_default(),
                    ..Locality::default()
                },
            };
            let service_account = pod.map(service_account).unwrap_or_default();
            endpoints.insert(
                address,
                Endpoint {
                    address: address.clone(),
                    ready,
                    labels: pod
                        .and_then(|p| p.metadata.labels.clone())
                        .unwrap_or_default(),
                    service_account,
                    locality,
                    pod: pod
                        .and_then(|p| p.metadata.name.clone())
                        .unwrap_or_default(),
                    node: node_name.unwrap_or_default().to_string(),
                    ambient: pod.is_some_and(redirected),
                },
            );
        }
    }
    Ok(Some(EndpointSet {
        cluster: cluster.to_string(),
        namespace: namespace.to_string(),
        service,
        slice: name,
        ports,
        endpoints: endpoints.into_values().collect(),
        // The cluster's network is set where the cluster's system namespace is known.
        network: String::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
        shoal_common::yaml::from_str(s).expect("test manifest parses")
    }

    fn svc(ports: &str) -> KubeService {
        yaml(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: reviews\n  namespace: bookinfo\n  \
             annotations:\n    networking.istio.io/exportTo: \" .,istio-system ,\"\n    \
             kubectl.kubernetes.io/last-applied-configuration: '{{}}'\n\
             spec:\n  clusterIP: 10.0.0.7\n  selector:\n    app: reviews\n  ports:\n{ports}"
        ))
    }

    /// kube-dns (`dns` UDP 53, `dns-tcp` TCP 53, `metrics` 9153): the TCP DNS port names
    /// no protocol but is well known, so TCP (a plain TCP proxy, as istiod); `metrics` stays
    /// sniffed; the UDP port is not proxied.
    #[test]
    fn well_known_ports_are_tcp_unless_named() {
        let s = svc("  - {name: dns, port: 53, protocol: UDP}\n  \
                     - {name: dns-tcp, port: 53, protocol: TCP}\n  \
                     - {name: metrics, port: 9153, protocol: TCP}\n  \
                     - {name: http-smtp, port: 25}\n  - {port: 3306}\n  \
                     - {name: mongo, port: 27017}\n  - {name: ws, port: 82, appProtocol: kubernetes.io/ws}\n");
        let s = service(&s, "c1").unwrap().unwrap();
        let got: Vec<(&str, u16, Protocol)> = s
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.port, p.protocol))
            .collect();
        assert_eq!(
            got,
            vec![
                ("dns-tcp", 53, Protocol::Tcp),
                ("metrics", 9153, Protocol::Unsupported),
                ("http-smtp", 25, Protocol::Http),
                ("", 3306, Protocol::Tcp),
                ("mongo", 27017, Protocol::Tcp),
                ("ws", 82, Protocol::Http),
            ]
        );
    }

    #[test]
    fn service_normalizes_ports_protocols_and_annotations() {
        let s = svc("  - {name: http-web, port: 9080}\n  - {name: grpc, port: 9090}\n  \
                     - {name: dns, port: 53, protocol: UDP}\n  - {name: foo, port: 81, appProtocol: http2}\n  \
                     - {name: x, port: 82, appProtocol: kubernetes.io/h2c}\n  - {port: 83}\n  \
                     - {name: tcp-db, port: 5432, protocol: TCP}\n  - {name: s, port: 84, protocol: SCTP}\n");
        let s = service(&s, "c1").unwrap().unwrap();
        assert_eq!(s.cluster, "c1");
        assert_eq!(s.hostname, "reviews.bookinfo.svc.cluster.local");
        assert_eq!(s.cluster_ips, vec!["10.0.0.7"]);
        assert_eq!(s.selector.get("app").map(String::as_str), Some("reviews"));
        assert_eq!(s.export_to, vec![".", "istio-system"]);
        assert_eq!(
            s.meta.annotations.keys().collect::<Vec<_>>(),
            vec![EXPORT_TO_ANNOTATION]
        );
        let got: Vec<(&str, u16, Protocol)> = s
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.port, p.protocol))
            .collect();
        assert_eq!(
            got,
            vec![
                ("http-web", 9080, Protocol::Http),
                ("grpc", 9090, Protocol::Grpc),
                ("foo", 81, Protocol::Http2),
                ("x", 82, Protocol::Http2),
                ("", 83, Protocol::Unsupported),
                ("tcp-db", 5432, Protocol::Tcp),
            ]
        );
    }

    #[test]
    fn headless_dual_stack_and_external_name() {
        let mut s = svc("  - {name: http, port: 80}\n");
        let spec = s.spec.as_mut().unwrap();
        spec.cluster_ip = Some("None".into());
        spec.cluster_ips = Some(vec!["None".into()]);
        assert!(service(&s, "c").unwrap().unwrap().cluster_ips.is_empty());
        let spec = s.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["10.0.0.1".into(), "fd00::1".into()]);
        assert_eq!(
            service(&s, "c").unwrap().unwrap().cluster_ips,
            vec!["10.0.0.1", "fd00::1"]
        );
        s.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert_eq!(service(&s, "c").unwrap(), None);
    }

    #[test]
    fn service_port_out_of_range_is_invalid() {
        let s = svc("  - {name: http, port: 70000}\n");
        let err = check_service(&s).unwrap_err();
        assert!(err.reason.contains("spec.ports[0].port"), "{err}");
        assert!(service(&s, "c").is_err());
    }

    const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: reviews-abc
  namespace: bookinfo
  labels: {kubernetes.io/service-name: reviews}
addressType: IPv4
ports:
  - {name: http, port: 9080}
  - {name: all}
endpoints:
  - addresses: [10.1.0.9]
    conditions: {ready: false}
    targetRef: {kind: Pod, name: reviews-v2, namespace: bookinfo}
  - addresses: [10.1.0.3]
    nodeName: node-b
    zone: zone-from-slice
  - addresses: [10.1.0.5]
    zone: zone-from-slice
"#;

    const POD_V2: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: reviews-v2, namespace: bookinfo, labels: {app: reviews, version: v2}}
spec: {serviceAccountName: reviews-sa, nodeName: node-a, containers: []}
status: {podIP: 10.1.0.9}
"#;

    const POD_V1: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: reviews-v1
  namespace: bookinfo
  labels: {app: reviews, version: v1}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: reviews-sa, containers: []}
status: {podIPs: [{ip: 10.1.0.3}]}
"#;

    const NODE_A: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z1, topology.istio.io/subzone: s1}
"#;

    const NODE_B: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/region: r2, topology.kubernetes.io/zone: z2}}
"#;

    #[test]
    fn endpoint_slice_joins_pods_and_nodes() {
        let slice: EndpointSlice = yaml(SLICE);
        let pods: Vec<Pod> = vec![yaml(POD_V2), yaml(POD_V1)];
        let nodes: Vec<Node> = vec![yaml(NODE_A), yaml(NODE_B)];
        let w = Workloads::new(&pods, &nodes);
        let set = endpoint_slice(&slice, "c1", &w).unwrap().unwrap();
        assert_eq!(
            (set.cluster.as_str(), set.namespace.as_str()),
            ("c1", "bookinfo")
        );
        assert_eq!(
            (set.service.as_str(), set.slice.as_str()),
            ("reviews", "reviews-abc")
        );
        assert_eq!(
            set.ports,
            vec![EndpointPort {
                name: "http".into(),
                port: 9080
            }]
        );
        let addrs: Vec<&str> = set.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, vec!["10.1.0.3", "10.1.0.5", "10.1.0.9"], "sorted");

        // Joined by IP (no targetRef); the pod has no node, the endpoint's nodeName does.
        let e3 = &set.endpoints[0];
        assert!(e3.ready, "absent ready condition means ready");
        assert_eq!(e3.pod, "reviews-v1");
        assert_eq!(e3.labels.get("version").map(String::as_str), Some("v1"));
        assert_eq!(e3.service_account, "reviews-sa");
        assert_eq!(e3.locality.region, "r2");
        assert_eq!(e3.locality.zone, "z2");
        // Ambient: the node a ztunnel serves it from, istio-cni's redirection.
        assert_eq!(e3.node, "node-b");
        assert!(e3.ambient);
        assert!(!set.endpoints[2].ambient);

        // No pod, no node: the slice's zone field.
        let e5 = &set.endpoints[1];
        assert_eq!(e5.pod, "");
        assert!(e5.labels.is_empty());
        assert_eq!(
            e5.locality,
            Locality {
                zone: "zone-from-slice".into(),
                ..Default::default()
            }
        );

        // Joined by targetRef; locality from the pod's node.
        let e9 = &set.endpoints[2];
        assert!(!e9.ready);
        assert_eq!(e9.pod, "reviews-v2");
        assert_eq!(
            e9.locality,
            Locality {
                region: "r1".into(),
                zone: "z1".into(),
                subzone: "s1".into()
            }
        );
    }

    /// A round indexes only the pods of the namespaces it recomputes; a `targetRef`'s pod
    /// elsewhere is looked up, and joins as it would from a whole index.
    #[test]
    fn a_target_ref_outside_the_index_is_looked_up() {
        let slice: EndpointSlice = yaml(SLICE);
        let pods: Vec<Pod> = vec![yaml(POD_V2), yaml(POD_V1)];
        let whole = Workloads::new(&pods, []);
        let want = endpoint_slice(&slice, "c1", &whole).unwrap().unwrap();
        let lookups = std::cell::Cell::new(0);
        let lookup = |ns: &str, name: &str| {
            lookups.set(lookups.get() + 1);
            pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })
        };
        // reviews-v2 is joined by targetRef only; reviews-v1 by IP, from the index.
        let scoped = Workloads::new(&pods[1..], []).with_pod_lookup(&lookup);
        assert_eq!(
            endpoint_slice(&slice, "c1", &scoped).unwrap().unwrap(),
            want
        );
        assert_eq!(lookups.get(), 1);
        assert_eq!(want.endpoints[2].pod, "reviews-v2");
    }

    #[test]
    fn ip_join_skips_host_network_and_finished_pods_and_other_namespaces() {
        let slice: EndpointSlice = yaml(SLICE);
        let mut host: Pod = yaml(POD_V1);
        host.spec.as_mut().unwrap().host_network = Some(true);
        let mut done: Pod = yaml(POD_V1);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut elsewhere: Pod = yaml(POD_V1);
        elsewhere.metadata.namespace = Some("other".into());
        for pod in [host, done, elsewhere] {
            let pods = [pod];
            let w = Workloads::new(&pods, []);
            let set = endpoint_slice(&slice, "c1", &w).unwrap().unwrap();
            assert_eq!(set.endpoints[0].pod, "", "10.1.0.3 must not join");
        }
    }

    #[test]
    fn slice_without_service_label_or_with_fqdn_addresses() {
        let mut slice: EndpointSlice = yaml(SLICE);
        slice.metadata.labels = None;
        let err = endpoint_slice(&slice, "c", &Workloads::default()).unwrap_err();
        assert!(err.reason.contains(SERVICE_NAME_LABEL), "{err}");

        let mut slice: EndpointSlice = yaml(SLICE);
        slice.address_type = "FQDN".into();
        assert_eq!(
            endpoint_slice(&slice, "c", &Workloads::default()).unwrap(),
            None
        );
    }
}

#[cfg(test)]
mod prop_tests;
