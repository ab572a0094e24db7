//! Envoy bootstraps for ADS against shoal, with Istio's node identity (the same shape as
//! `docs/examples/bootstrap/*.yaml`).

use std::fmt::Write;
use std::net::SocketAddr;

/// An Envoy node identity as Istio's bootstrap sets it.
#[derive(Debug, Clone)]
pub struct Node {
    /// `<sidecar|router>~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local`.
    pub id: String,
    /// The node cluster (`<app>.<namespace>` for Istio sidecars).
    pub cluster: String,
    /// Metadata `NAMESPACE`.
    pub namespace: String,
    /// Metadata `LABELS`.
    pub labels: Vec<(String, String)>,
    /// Metadata `INTERCEPTION_MODE`: `None` leaves it out, which means `REDIRECT`
    /// (iptables capture) for a sidecar, as in Istio.
    pub interception: Option<&'static str>,
    /// The pod's service account: the identity of the workload certificate the bootstrap's
    /// `sds-grpc` serves ([`crate::sds::workload_socket`]).
    pub service_account: String,
}

impl Node {
    /// The ingress gateway of the examples: pod `ingress-1` in `istio-system`, labelled
    /// `istio: ingressgateway`.
    pub fn gateway() -> Node {
        Node {
            id: "router~127.0.0.1~ingress-1.istio-system~istio-system.svc.cluster.local".into(),
            cluster: "ingress".into(),
            namespace: "istio-system".into(),
            labels: vec![("istio".into(), "ingressgateway".into())],
            interception: None,
            service_account: "istio-ingressgateway-service-account".into(),
        }
    }

    /// The sidecar of the examples: pod `client-1` in `demo`, labelled `app: client`,
    /// without traffic capture (`INTERCEPTION_MODE: NONE`): it runs beside other Envoys on
    /// the test host and gets the Sidecar's `captureMode: NONE` listeners.
    pub fn sidecar() -> Node {
        Node {
            id: "sidecar~127.0.0.1~client-1.demo~demo.svc.cluster.local".into(),
            cluster: "client.demo".into(),
            namespace: "demo".into(),
            labels: vec![("app".into(), "client".into())],
            interception: Some("NONE"),
            service_account: "client".into(),
        }
    }

    /// A captured sidecar (Istio's default) of pod `<pod>` at `ip` in `namespace`.
    pub fn captured(ip: &str, pod: &str, namespace: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            id: format!("sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local"),
            cluster: format!("{pod}.{namespace}"),
            namespace: namespace.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            interception: None,
            service_account: "default".into(),
        }
    }

    /// This node with the service account `sa`.
    pub fn with_service_account(mut self, sa: &str) -> Node {
        self.service_account = sa.to_string();
        self
    }
}

/// A bootstrap for `node` with its admin on `127.0.0.1:<admin_port>`, getting everything
/// over one SotW ADS stream from the shoal servers at `xds`, and its workload certificate
/// over SDS from istio-agent's `sds-grpc` cluster, as every Istio proxy: here the test
/// process serves it ([`crate::sds::workload_socket`]; [`with_sds`] points it at a
/// `shoal-test-agent` instead).
///
/// The `xds-grpc` cluster is tuned for failover between replicas: round robin, so a stream
/// re-created after its replica died goes to the next replica; a 1 s connect timeout and a
/// 0.1-1 s reconnect backoff (Envoy's default is 0.5-30 s, which after a few failed attempts
/// leaves a proxy without updates for up to half a minute); HTTP/2 and TCP keepalives, so
/// a replica that vanishes without closing its connections (a partition) is noticed.
pub fn bootstrap(node: &Node, admin_port: u16, xds: &[SocketAddr]) -> String {
    bootstrap_with(node, admin_port, xds, AdsMode::Sotw)
}

/// The files of an xDS client certificate: the proxy's certificate and key, and the CA
/// that verifies the server (`localhost`).
#[derive(Debug, Clone)]
pub struct XdsTlsFiles {
    /// CA certificates (PEM) that verify the xDS server.
    pub ca: std::path::PathBuf,
    /// The proxy's certificate (PEM).
    pub cert: std::path::PathBuf,
    /// The proxy's key (PEM).
    pub key: std::path::PathBuf,
}

/// `bootstrap` (from [`bootstrap_with`]) connecting to shoal's secure xDS port with a
/// client certificate, as istio-agent's proxies do (mutual TLS, SNI `localhost`, the
/// server's certificate verified against `files.ca` and for the name `localhost`).
pub fn with_xds_tls(bootstrap: &str, files: &XdsTlsFiles) -> String {
    let path = |p: &std::path::Path| p.to_str().expect("UTF-8 path").to_string();
    let socket = format!(
        r#"    lb_policy: ROUND_ROBIN
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates:
          - certificate_chain: {{ filename: {cert} }}
            private_key: {{ filename: {key} }}
          validation_context:
            trusted_ca: {{ filename: {ca} }}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: localhost }}
"#,
        cert = path(&files.cert),
        key = path(&files.key),
        ca = path(&files.ca),
    );
    assert!(
        bootstrap.contains("    lb_policy: ROUND_ROBIN\n"),
        "a bootstrap_with bootstrap"
    );
    bootstrap.replacen("    lb_policy: ROUND_ROBIN\n", &socket, 1)
}

/// Which ADS variant a bootstrap asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdsMode {
    /// State of the world (`api_type: GRPC`).
    Sotw,
    /// Incremental (`api_type: DELTA_GRPC`).
    Delta,
}

/// [`bootstrap`] with a chosen ADS variant.
pub fn bootstrap_with(node: &Node, admin_port: u16, xds: &[SocketAddr], mode: AdsMode) -> String {
    let api_type = match mode {
        AdsMode::Sotw => "GRPC",
        AdsMode::Delta => "DELTA_GRPC",
    };
    let mut labels = String::new();
    for (k, v) in &node.labels {
        let _ = writeln!(labels, "      {k}: {v:?}");
    }
    let interception = match node.interception {
        Some(mode) => format!("    INTERCEPTION_MODE: {mode}\n"),
        None => String::new(),
    };
    let mut endpoints = String::new();
    for addr in xds {
        let _ = write!(
            endpoints,
            "        - endpoint:\n            address:\n              socket_address: {{ address: {}, port_value: {} }}\n",
            addr.ip(),
            addr.port()
        );
    }
    format!(
        r#"node:
  id: {id}
  cluster: {cluster}
  metadata:
    NAMESPACE: {namespace}
    CLUSTER_ID: Kubernetes
{interception}    LABELS:
{labels}admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc:
        cluster_name: xds-grpc
        retry_policy:
          retry_back_off: {{ base_interval: 0.1s, max_interval: 1s }}
  cds_config:
    ads: {{}}
    resource_api_version: V3
  lds_config:
    ads: {{}}
    resource_api_version: V3
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive: {{ interval: 30s, timeout: 5s }}
    upstream_connection_options:
      tcp_keepalive: {{ keepalive_time: 30, keepalive_interval: 5, keepalive_probes: 3 }}
    load_assignment:
      cluster_name: xds-grpc
      endpoints:
      - lb_endpoints:
{endpoints}{sds}"#,
        id = node.id,
        cluster = node.cluster,
        namespace = node.namespace,
        sds = sds_cluster(&crate::sds::workload_socket(
            &node.namespace,
            &node.service_account
        )),
    )
}

/// istio-agent's `sds-grpc` cluster (a `static_resources.clusters` entry): HTTP/2 to the
/// agent's SDS server on the Unix socket `socket`.
fn sds_cluster(socket: &std::path::Path) -> String {
    format!(
        r#"  - name: sds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: sds-grpc
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              pipe: {{ path: {path:?} }}
"#,
        path = socket.display().to_string()
    )
}

/// `bootstrap_yaml` with istio-agent's `sds-grpc` cluster on the Unix socket `socket` (a
/// `shoal-test-agent`'s; Istio: `./var/run/secrets/workload-spiffe-uds/socket`) instead of
/// the test process's. The transport sockets shoal generates name their secrets (`default`,
/// `ROOTCA`) with this cluster as their SDS source, as istiod's do.
pub fn with_sds(bootstrap_yaml: &str, socket: &std::path::Path) -> String {
    let mut doc: serde_json::Value =
        shoal_common::yaml::from_str(bootstrap_yaml).expect("the bootstrap is YAML");
    let clusters = doc["static_resources"]["clusters"]
        .as_array_mut()
        .expect("the bootstrap has static clusters");
    clusters.retain(|c| c["name"].as_str() != Some("sds-grpc"));
    // `sds_cluster` is a one-entry list, as it stands in the bootstrap's `clusters`.
    let cluster: Vec<serde_json::Value> =
        shoal_common::yaml::from_str(&sds_cluster(socket)).expect("sds-grpc cluster YAML");
    clusters.extend(cluster);
    shoal_common::yaml::to_string(&doc).expect("serializing the bootstrap")
}

/// `bootstrap_yaml` loading Envoy's internal listener extension
/// (`envoy.bootstrap.internal_listener`, as istio-proxy's bootstrap does) and saying so to
/// shoal with node metadata `SHOAL_INTERNAL_LISTENER: "true"`: shoal then sends this
/// upstream Envoy HBONE origination to ambient pods (the `connect_originate` internal
/// listener and cluster), which Envoy would reject without the extension.
pub fn with_internal_listener(bootstrap_yaml: &str) -> String {
    let mut doc: serde_json::Value =
        shoal_common::yaml::from_str(bootstrap_yaml).expect("the bootstrap is YAML");
    doc["node"]["metadata"]["SHOAL_INTERNAL_LISTENER"] = "true".into();
    doc["bootstrap_extensions"] = serde_json::json!([{
        "name": "envoy.bootstrap.internal_listener",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"
        }
    }]);
    shoal_common::yaml::to_string(&doc).expect("serializing the bootstrap")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_the_internal_listener_and_says_so() {
        let node = Node::sidecar();
        let yaml = with_internal_listener(&bootstrap(
            &node,
            15000,
            &["127.0.0.1:15010".parse().unwrap()],
        ));
        let doc: serde_json::Value = shoal_common::yaml::from_str(&yaml).unwrap();
        assert_eq!(
            doc["node"]["metadata"]["SHOAL_INTERNAL_LISTENER"].as_str(),
            Some("true")
        );
        assert_eq!(doc["node"]["metadata"]["NAMESPACE"].as_str(), Some("demo"));
        assert_eq!(
            doc["bootstrap_extensions"][0]["name"].as_str(),
            Some("envoy.bootstrap.internal_listener")
        );
    }

    #[test]
    fn adds_the_sds_cluster_on_the_socket() {
        let node = Node::sidecar();
        let yaml = with_sds(
            &bootstrap(&node, 15000, &["127.0.0.1:15010".parse().unwrap()]),
            std::path::Path::new("/run/agent/socket"),
        );
        let doc: serde_json::Value = shoal_common::yaml::from_str(&yaml).unwrap();
        let clusters = doc["static_resources"]["clusters"].as_array().unwrap();
        let names: Vec<_> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["xds-grpc", "sds-grpc"]);
        let endpoint = &clusters[1]["load_assignment"]["endpoints"][0]["lb_endpoints"][0];
        assert_eq!(
            endpoint["endpoint"]["address"]["pipe"]["path"].as_str(),
            Some("/run/agent/socket")
        );
    }
}
