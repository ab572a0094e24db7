//! Reducing watched Kubernetes objects to the fields shoal reads, as they arrive.
//!
//! The reduced objects are still k8s-openapi objects, so the normalization the file source
//! uses ([`crate::admit::normalize`], [`crate::desired`]) applies unchanged and both sources
//! publish identical state for identical objects. Everything else (managedFields, container specs,
//! status conditions, unrelated annotations) is dropped before storing: that bounds memory,
//! and a change to a dropped field compares equal to the stored object, so it causes no
//! recomputation at all (a Node's heartbeat status, a Pod's container statuses).

use crate::admit::istio;
use crate::admit::normalize::{self, REGION_LABEL, SERVICE_NAME_LABEL, SUBZONE_LABEL, ZONE_LABEL};
use crate::error::InvalidObject;
use crate::selector::Labels;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Node, Pod, PodCondition, PodIP, PodSpec,
    PodStatus, Secret, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as KubeMeta;
use kube::api::DynamicObject;
use shoal_common::model::GATEWAY_API_GROUP;
use shoal_common::model::{ConfigKind, ConfigObject};
use std::collections::BTreeMap;

/// The identity of a watched object within its kind: namespace (empty for cluster-scoped
/// kinds) and name.
pub type ObjKey = (String, String);

/// The key of an object from its metadata.
pub fn key_of(meta: &KubeMeta) -> ObjKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Name, namespace, the given labels, and the annotations shoal interprets.
fn meta(meta: &KubeMeta, labels: Option<Labels>) -> KubeMeta {
    let annotations: Labels = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| normalize::is_interpreted_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    KubeMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels,
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..KubeMeta::default()
    }
}

/// Only the listed labels (absent when none is set).
fn some_labels(meta: &KubeMeta, keys: &[&str]) -> Option<Labels> {
    let labels: Labels = meta
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!labels.is_empty()).then_some(labels)
}

/// A Namespace is its labels (for discovery selectors).
pub fn namespace(ns: Namespace) -> Labels {
    ns.metadata.labels.unwrap_or_default()
}

/// A Service: metadata, type, cluster IPs, ports, selector. Rejected when invalid.
pub fn service(svc: Service) -> Result<Service, InvalidObject> {
    let spec = svc.spec.unwrap_or_default();
    let ports = spec.ports.map(|ports| {
        ports
            .into_iter()
            .map(|p| ServicePort {
                name: p.name,
                port: p.port,
                protocol: p.protocol,
                app_protocol: p.app_protocol,
                target_port: p.target_port,
                ..ServicePort::default()
            })
            .collect()
    });
    let reduced = Service {
        metadata: meta(&svc.metadata, svc.metadata.labels.clone()),
        spec: Some(ServiceSpec {
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            cluster_ips: spec.cluster_ips,
            ports,
            selector: spec.selector,
            // Where other networks reach an east-west gateway Service.
            external_ips: spec.external_ips,
            ..ServiceSpec::default()
        }),
        // Only the load balancer's addresses: an east-west gateway is reached on them.
        status: svc
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .filter(|ingress| !ingress.is_empty())
            .map(|ingress| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ingress
                            .into_iter()
                            .map(|i| LoadBalancerIngress {
                                ip: i.ip,
                                hostname: i.hostname,
                                ..LoadBalancerIngress::default()
                            })
                            .collect(),
                    ),
                }),
                ..ServiceStatus::default()
            }),
    };
    normalize::check_service(&reduced)?;
    Ok(reduced)
}

/// An EndpointSlice: its service label, address type, ports, and per endpoint the
/// addresses, readiness, pod reference, node and zone. Rejected when invalid.
pub fn endpoint_slice(slice: EndpointSlice) -> Result<EndpointSlice, InvalidObject> {
    let endpoints = slice
        .endpoints
        .into_iter()
        .map(|e| Endpoint {
            addresses: e.addresses,
            conditions: e.conditions.map(|c| EndpointConditions {
                ready: c.ready,
                ..EndpointConditions::default()
            }),
            target_ref: e.target_ref.map(|r| ObjectReference {
                kind: r.kind,
                name: r.name,
                namespace: r.namespace,
                ..ObjectReference::default()
            }),
            node_name: e.node_name,
            zone: e.zone,
            ..Endpoint::default()
        })
        .collect();
    let ports = slice.ports.map(|ports| {
        ports
            .into_iter()
            .map(|p| EndpointPort {
                name: p.name,
                port: p.port,
                ..EndpointPort::default()
            })
            .collect()
    });
    let labels = some_labels(&slice.metadata, &[SERVICE_NAME_LABEL]);
    let reduced = EndpointSlice {
        metadata: meta(&slice.metadata, labels),
        address_type: slice.address_type,
        endpoints,
        ports,
    };
    normalize::check_endpoint_slice(&reduced)?;
    Ok(reduced)
}

/// A Pod: labels, service account, node, host networking, phase and IPs. No containers.
pub fn pod(pod: Pod) -> Pod {
    let spec = pod.spec.map(|s| PodSpec {
        service_account_name: s.service_account_name,
        service_account: s.service_account,
        node_name: s.node_name,
        host_network: s.host_network,
        containers: Vec::new(),
        ..PodSpec::default()
    });
    let status = pod.status.map(|s| PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        pod_ips: s
            .pod_ips
            .map(|ips| ips.into_iter().map(|p| PodIP { ip: p.ip }).collect()),
        // Only the Ready condition (a pod behind no Service is healthy when it is ready),
        // without its timestamps: other conditions and probes' times change nothing here.
        conditions: s.conditions.map(|c| {
            c.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..PodCondition::default()
                })
                .collect()
        }),
        ..PodStatus::default()
    });
    Pod {
        metadata: meta(&pod.metadata, pod.metadata.labels.clone()),
        spec,
        status,
    }
}

/// A Node: its name and locality labels.
pub fn node(node: Node) -> Node {
    let labels = some_labels(&node.metadata, &[REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL]);
    Node {
        metadata: meta(&node.metadata, labels),
        spec: None,
        status: None,
    }
}

/// A multicluster Secret's data: cluster ID → kubeconfig bytes.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// A Secret is its data.
pub fn secret(secret: Secret) -> SecretData {
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// What shoal needs from a CustomResourceDefinition of an Istio kind it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdInfo {
    /// The kind.
    pub kind: ConfigKind,
    /// The resource's plural name (`virtualservices`).
    pub plural: String,
    /// The served versions.
    pub served: Vec<String>,
}

impl CrdInfo {
    /// The version to watch: the first of the kind's versions (v1 first) that the CRD
    /// serves.
    pub fn preferred_version(&self) -> Option<&'static str> {
        self.kind
            .versions()
            .iter()
            .copied()
            .find(|v| self.served.iter().any(|s| s == v))
    }
}

/// The CRD of an Istio kind shoal reads; `None` for every other CRD.
pub fn crd(crd: CustomResourceDefinition) -> Option<CrdInfo> {
    let spec = crd.spec;
    let Some(kind) = ConfigKind::parse_in(&spec.group, &spec.names.kind) else {
        // Istio's and the Gateway API's kinds shoal does not read: said once, at INFO.
        if spec.group.ends_with("istio.io") || spec.group == GATEWAY_API_GROUP {
            crate::admit::report_unread_kind(&format!("{}/*", spec.group), &spec.names.kind);
        }
        return None;
    };
    let served = spec
        .versions
        .into_iter()
        .filter(|v| v.served)
        .map(|v| v.name)
        .collect();
    Some(CrdInfo {
        kind,
        plural: spec.names.plural,
        served,
    })
}

/// An Istio config object of `kind`, typed and validated like a manifest document.
pub fn config(kind: ConfigKind, obj: DynamicObject) -> Result<ConfigObject, InvalidObject> {
    // A missing or null spec is an empty spec (validation then says what is missing).
    let spec = match obj.data.get("spec") {
        None | Some(serde_json::Value::Null) => serde_json::Value::Object(Default::default()),
        Some(spec) => spec.clone(),
    };
    let spec = istio::config_spec(kind, spec)
        .map_err(|e| InvalidObject::new(format!("spec does not decode: {e}")))?;
    istio::config_object(normalize::object_meta(&obj.metadata), spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reduced pod keeps its Ready condition (ambient's status of a pod behind no
    /// Service), and nothing of the other conditions.
    #[test]
    fn pod_keeps_only_its_ready_condition() {
        let full: Pod = shoal_common::yaml::from_str(
            "metadata: {name: p, namespace: a}\n\
             status: {phase: Running, podIP: 10.0.0.1, conditions: [\
             {type: PodScheduled, status: 'True', lastTransitionTime: '2026-01-01T00:00:00Z'},\
             {type: Ready, status: 'True', lastTransitionTime: '2026-01-01T00:00:00Z'}]}",
        )
        .unwrap();
        let conditions = pod(full).status.unwrap().conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (conditions[0].type_.as_str(), conditions[0].status.as_str()),
            ("Ready", "True")
        );
        assert!(conditions[0].last_transition_time.is_none());
    }
    use crate::admit::normalize::Workloads;
    use crate::desired;
    use crate::source::file::manifest::{parse_file, test_path, ManifestObject};
    use crate::source::file::store;

    fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
        shoal_common::yaml::from_str(s).expect("test manifest parses")
    }

    const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: bookinfo
  labels: {app: reviews}
  annotations:
    networking.istio.io/exportTo: "."
    kubectl.kubernetes.io/last-applied-configuration: "{}"
  managedFields: [{manager: kubectl, operation: Apply}]
  resourceVersion: "42"
  uid: "1234"
spec:
  type: ClusterIP
  clusterIP: 10.0.0.5
  clusterIPs: [10.0.0.5]
  selector: {app: reviews}
  sessionAffinity: None
  ports: [{name: http, port: 9080, targetPort: 9080, protocol: TCP, appProtocol: http}]
status: {loadBalancer: {}}
"#;

    const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: reviews-abc
  namespace: bookinfo
  labels: {kubernetes.io/service-name: reviews, endpointslice.kubernetes.io/managed-by: x}
  generation: 7
addressType: IPv4
ports: [{name: http, port: 9080, protocol: TCP}]
endpoints:
- addresses: [10.1.0.9]
  conditions: {ready: true, serving: true, terminating: false}
  targetRef: {kind: Pod, name: reviews-v1, namespace: bookinfo, uid: abc, resourceVersion: "9"}
  nodeName: node-a
  zone: z1
  hints: {forZones: [{name: z1}]}
"#;

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: bookinfo, labels: {app: reviews, version: v1}}
spec:
  serviceAccountName: reviews-sa
  nodeName: node-a
  containers: [{name: app, image: reviews:1, env: [{name: A, value: b}]}]
  volumes: [{name: v, emptyDir: {}}]
status:
  phase: Running
  podIP: 10.1.0.9
  podIPs: [{ip: 10.1.0.9}]
  hostIP: 192.168.0.1
  conditions: [{type: Ready, status: "True"}]
  containerStatuses: [{name: app, ready: true, restartCount: 0, image: x, imageID: y}]
"#;

    const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/region: r1
    topology.kubernetes.io/zone: z1
    kubernetes.io/hostname: node-a
spec: {podCIDR: 10.1.0.0/24}
status: {conditions: [{type: Ready, status: "True"}]}
"#;

    #[test]
    fn reduction_drops_what_shoal_does_not_read() {
        let svc = service(yaml(SERVICE)).unwrap();
        assert!(svc.metadata.managed_fields.is_none());
        assert!(svc.metadata.resource_version.is_none());
        assert_eq!(
            svc.metadata.annotations.as_ref().map(|a| a.len()),
            Some(1),
            "only exportTo"
        );
        let spec = svc.spec.as_ref().unwrap();
        assert!(spec.session_affinity.is_none());
        // targetPort is kept: it names the workload port captured sidecars accept on.
        assert!(spec.ports.as_ref().unwrap()[0].target_port.is_some());

        let pod = pod(yaml(POD));
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.containers.is_empty(), "no container specs");
        assert!(spec.volumes.is_none());
        let status = pod.status.as_ref().unwrap();
        assert!(status.container_statuses.is_none());
        // Only the Ready condition is kept (ambient: a pod behind no Service's status).
        assert_eq!(status.conditions.as_ref().map(Vec::len), Some(1));

        let node = node(yaml(NODE));
        assert_eq!(node.metadata.labels.as_ref().map(|l| l.len()), Some(2));
        assert!(node.status.is_none());

        let slice = endpoint_slice(yaml(SLICE)).unwrap();
        assert_eq!(slice.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        assert!(slice.endpoints[0].hints.is_none());
        assert!(slice.endpoints[0]
            .target_ref
            .as_ref()
            .unwrap()
            .uid
            .is_none());
    }

    /// An east-west gateway Service keeps the addresses other networks reach it on: the
    /// load balancer's ingress and the external IPs, nothing else of its status.
    #[test]
    fn gateway_service_keeps_its_external_addresses() {
        let mut gw: Service = yaml(SERVICE);
        let mut spec = gw.spec.take().unwrap();
        spec.external_ips = Some(vec!["192.0.2.9".into()]);
        gw.spec = Some(spec);
        gw.status = Some(yaml(
            "loadBalancer: {ingress: [{ip: 192.0.2.1, ipMode: VIP, ports: [{port: 15443, protocol: TCP}]}]}\nconditions: []",
        ));
        let reduced = service(gw).unwrap();
        let ingress = reduced
            .status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap();
        let ingress = &ingress.ingress.as_ref().unwrap()[0];
        assert!(ingress.ip_mode.is_none() && ingress.ports.is_none());
        assert!(reduced.status.as_ref().unwrap().conditions.is_none());
        let normalized = crate::admit::normalize::service(&reduced, "c1")
            .unwrap()
            .unwrap();
        assert_eq!(normalized.external_addresses, ["192.0.2.1", "192.0.2.9"]);
        // No load balancer address: no status kept at all.
        assert!(service(yaml(SERVICE)).unwrap().status.is_none());
    }

    #[test]
    fn irrelevant_changes_reduce_to_equal_objects() {
        let mut changed: Pod = yaml(POD);
        let status = changed.status.as_mut().unwrap();
        // Another condition, or the Ready condition's timestamps, change nothing.
        let mut conditions: Vec<PodCondition> = yaml(
            "[{type: Ready, status: 'True', lastProbeTime: '2026-01-01T00:00:00Z'}, \
             {type: PodScheduled, status: 'True'}]",
        );
        conditions.rotate_left(1);
        status.conditions = Some(conditions);
        status.host_ip = Some("192.168.0.2".into());
        changed.metadata.resource_version = Some("100".into());
        assert_eq!(pod(yaml(POD)), pod(changed));

        let mut changed: Node = yaml(NODE);
        changed.status = None;
        changed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubernetes.io/arch".into(), "arm64".into());
        assert_eq!(node(yaml(NODE)), node(changed));
    }

    /// Both sources publish the same state for the same objects: the file source from the
    /// full objects, the Kubernetes source from the reduced ones.
    #[test]
    fn reduced_objects_normalize_like_full_ones() {
        let text = format!("{SERVICE}---{SLICE}---{POD}---{NODE}");
        let path = test_path("all.yaml");
        let parsed = parse_file(&path, &text).unwrap();
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let from_files = store::desired_state(
            parsed.objects.iter().map(|o| (path.as_path(), o)),
            "c1",
            &Default::default(),
            None,
        );

        let pods = [pod(yaml(POD))];
        let nodes = [node(yaml(NODE))];
        let workloads = Workloads::new(&pods, &nodes);
        let mut from_kube = desired::DesiredState::new();
        let (k, v) = desired::service_entry(&service(yaml(SERVICE)).unwrap(), "c1")
            .unwrap()
            .unwrap();
        from_kube.insert(k, v);
        let slice = endpoint_slice(yaml(SLICE)).unwrap();
        let (k, v) = desired::endpoints_entry(&slice, "c1", &workloads, "")
            .unwrap()
            .unwrap();
        from_kube.insert(k, v);
        assert_eq!(from_files.len(), 2);
        assert_eq!(from_kube, from_files);
    }

    #[test]
    fn invalid_objects_are_rejected_with_the_field() {
        let mut svc: Service = yaml(SERVICE);
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 0;
        assert!(service(svc)
            .unwrap_err()
            .reason
            .contains("spec.ports[0].port"));
        let mut slice: EndpointSlice = yaml(SLICE);
        slice.metadata.labels = None;
        assert!(endpoint_slice(slice)
            .unwrap_err()
            .reason
            .contains(SERVICE_NAME_LABEL));
    }

    #[test]
    fn istio_config_from_dynamic_objects() {
        let obj: DynamicObject = yaml(
            r#"
apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo, annotations: {a: b}, generation: 3}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
"#,
        );
        let dr = config(ConfigKind::DestinationRule, obj.clone()).unwrap();
        assert_eq!(dr.meta.namespace, "bookinfo");
        assert!(dr.meta.annotations.is_empty());
        // The same document through the file source gives the same object.
        let text = shoal_common::yaml::to_string(&obj).unwrap();
        let parsed = parse_file(&test_path("dr.yaml"), &text).unwrap();
        let ManifestObject::Config(from_file) = &parsed.objects[0].object else {
            panic!("not config: {parsed:?}")
        };
        assert_eq!(from_file.as_ref(), &dr);

        let mut bad = obj;
        bad.data["spec"] = serde_json::json!({"subsets": []});
        assert_eq!(
            config(ConfigKind::DestinationRule, bad).unwrap_err().reason,
            "host is empty"
        );
        let odd: DynamicObject = yaml(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: x}\nspec: {servers: 3}\n",
        );
        assert!(config(ConfigKind::Gateway, odd)
            .unwrap_err()
            .reason
            .starts_with("spec does not decode"));
    }

    #[test]
    fn crd_versions_prefer_v1() {
        let crd_yaml = |group: &str, versions: &str| -> CustomResourceDefinition {
            yaml(&format!(
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
                 metadata: {{name: virtualservices.{group}}}\n\
                 spec:\n  group: {group}\n  scope: Namespaced\n  \
                 names: {{kind: VirtualService, plural: virtualservices}}\n  versions: {versions}\n"
            ))
        };
        let info = crd(crd_yaml(
            "networking.istio.io",
            "[{name: v1alpha3, served: true, storage: false}, {name: v1beta1, served: true, storage: false}, {name: v1, served: true, storage: true}]",
        ))
        .unwrap();
        assert_eq!(info.kind, ConfigKind::VirtualService);
        assert_eq!(info.plural, "virtualservices");
        assert_eq!(info.preferred_version(), Some("v1"));
        let old = crd(crd_yaml(
            "networking.istio.io",
            "[{name: v1alpha3, served: true, storage: true}, {name: v1, served: false, storage: false}]",
        ))
        .unwrap();
        assert_eq!(old.preferred_version(), Some("v1alpha3"));
        let none = crd(crd_yaml(
            "networking.istio.io",
            "[{name: v2, served: true, storage: true}]",
        ))
        .unwrap();
        assert_eq!(none.preferred_version(), None);
        assert!(crd(crd_yaml(
            "example.com",
            "[{name: v1, served: true, storage: true}]"
        ))
        .is_none());
    }
}
