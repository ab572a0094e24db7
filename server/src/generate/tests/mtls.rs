//! Istio mutual TLS: auto mTLS and DestinationRule TLS on outbound clusters, `tlsMode`
//! endpoint metadata, and `virtualInbound`'s chains per PeerAuthentication mode — each
//! checked against what istiod generates for the same config.

use crate::generate::mtls::sds_secret;
use crate::index::mesh_config::MeshSettings;
use crate::index::proxy::Proxy;
use crate::testutil::*;
use prost::Message;
use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
use shoal_proto::pb::envoy::config::core::v3::{
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, grpc_service,
    transport_socket::ConfigType, ApiVersion, TransportSocket,
};
use shoal_proto::pb::envoy::config::listener::v3::{FilterChain, Listener};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::ForwardClientCertDetails, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, DownstreamTlsContext, UpstreamTlsContext,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use shoal_proto::pb::google::protobuf::value::Kind;
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;

const REVIEWS: &str = "reviews.shop.svc.cluster.local";
const POD_IP: &str = "10.1.0.5";

/// `reviews` (HTTP 9080, gRPC 9090, TCP 3306) with two pods with sidecars (service
/// accounts `reviews` and `reviews-v2`); `legacy`, headless, one pod with and one without a
/// sidecar; `db`, headless, all pods with sidecars.
fn mesh() -> Mesh {
    let mut reviews = service(
        "shop",
        "reviews",
        &[("http", 9080), ("grpc", 9090), ("tcp-db", 3306)],
    );
    reviews.cluster_ips = vec!["10.96.0.10".into()];
    reviews.selector = labels(&[("app", "reviews")]);
    let injected = |ip: &str, sa: &str| {
        let mut e = endpoint(
            ip,
            &[("app", "reviews"), ("security.istio.io/tlsMode", "istio")],
        );
        e.service_account = sa.into();
        e
    };
    let legacy = service("shop", "legacy", &[("http", 8080)]);
    let db = service("shop", "db", &[("tcp", 5432)]);
    Mesh::new()
        .with_service(reviews)
        .with_slice(slice(
            "shop",
            "reviews",
            "reviews-1",
            &[("http", 9080), ("grpc", 9090), ("tcp-db", 3306)],
            vec![
                injected("10.1.0.1", "reviews"),
                injected("10.1.0.2", "reviews-v2"),
                endpoint("10.1.0.3", &[("app", "reviews")]),
            ],
        ))
        .with_service(legacy)
        .with_slice(slice(
            "shop",
            "legacy",
            "legacy-1",
            &[("http", 8080)],
            vec![injected("10.2.0.1", "legacy"), endpoint("10.2.0.2", &[])],
        ))
        .with_service(db)
        .with_slice(slice(
            "shop",
            "db",
            "db-1",
            &[("tcp", 5432)],
            vec![injected("10.3.0.1", "db")],
        ))
}

fn client() -> Proxy {
    captured_proxy("web", POD_IP, &[("app", "web")])
}

/// The `reviews` workload itself (selected by the service: inbound ports 9080, 9090, 3306).
fn server() -> Proxy {
    captured_proxy("shop", "10.1.0.1", &[("app", "reviews")])
}

fn cds(mesh: &Mesh, p: &Proxy) -> BTreeMap<String, Cluster> {
    clusters(&gen(XdsType::Cluster, p, &mesh.snapshot(), &[]))
}

fn virtual_inbound(mesh: &Mesh, p: &Proxy) -> Listener {
    listeners(&gen(XdsType::Listener, p, &mesh.snapshot(), &[]))
        .remove("virtualInbound")
        .expect("virtualInbound")
}

fn upstream(ts: &TransportSocket) -> UpstreamTlsContext {
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    match &ts.config_type {
        Some(ConfigType::TypedConfig(any)) => {
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
            );
            UpstreamTlsContext::decode(&*any.value).unwrap()
        }
        other => panic!("{other:?}"),
    }
}

fn downstream(c: &FilterChain) -> DownstreamTlsContext {
    let ts = c.transport_socket.as_ref().expect("a TLS chain");
    match &ts.config_type {
        Some(ConfigType::TypedConfig(any)) => DownstreamTlsContext::decode(&*any.value).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// (exact SANs or prefixes) checked and the SDS names used by a TLS context.
fn identity(
    ctx: &shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::CommonTlsContext,
) -> (Vec<String>, Vec<String>) {
    let Some(ValidationContextType::CombinedValidationContext(v)) = &ctx.validation_context_type
    else {
        panic!("expected istiod's combined validation context");
    };
    #[allow(deprecated)]
    let sans = v
        .default_validation_context
        .as_ref()
        .unwrap()
        .match_subject_alt_names
        .iter()
        .map(|m| match &m.match_pattern {
            Some(MatchPattern::Exact(s)) => s.clone(),
            Some(MatchPattern::Prefix(s)) => format!("{s}*"),
            other => panic!("{other:?}"),
        })
        .collect();
    let mut sds: Vec<String> = ctx
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|s| s.name.clone())
        .collect();
    sds.push(
        v.validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name
            .clone(),
    );
    (sans, sds)
}

#[test]
fn sds_secrets_are_referenced_as_istiod_does() {
    for name in ["default", "ROOTCA"] {
        let s = sds_secret(name);
        assert_eq!(s.name, name);
        let cs = s.sds_config.unwrap();
        assert_eq!(cs.resource_api_version, ApiVersion::V3 as i32);
        assert_eq!(cs.initial_fetch_timeout.unwrap().seconds, 0);
        let Some(ConfigSourceSpecifier::ApiConfigSource(api)) = cs.config_source_specifier else {
            panic!("api config source");
        };
        assert_eq!(api.api_type, ApiType::Grpc as i32);
        assert!(api.set_node_on_first_message_only);
        assert_eq!(api.transport_api_version, ApiVersion::V3 as i32);
        assert_eq!(api.grpc_services.len(), 1);
        match &api.grpc_services[0].target_specifier {
            Some(grpc_service::TargetSpecifier::EnvoyGrpc(g)) => {
                assert_eq!(g.cluster_name, "sds-grpc")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn auto_mtls_matches_endpoints_with_a_sidecar() {
    let cs = cds(&mesh(), &client());
    let c = &cs[&format!("outbound|9080||{REVIEWS}")];
    assert!(c.transport_socket.is_none());
    let names: Vec<&str> = c
        .transport_socket_matches
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["tlsMode-istio", "tlsMode-disabled"]);
    let m = &c.transport_socket_matches[0]
        .r#match
        .as_ref()
        .unwrap()
        .fields;
    assert_eq!(m.len(), 1);
    assert_eq!(m["tlsMode"].kind, Some(Kind::StringValue("istio".into())));
    assert!(c.transport_socket_matches[1]
        .r#match
        .as_ref()
        .unwrap()
        .fields
        .is_empty());
    assert_eq!(
        c.transport_socket_matches[1]
            .transport_socket
            .as_ref()
            .unwrap()
            .name,
        "envoy.transport_sockets.raw_buffer"
    );
    let tls = upstream(
        c.transport_socket_matches[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    assert_eq!(tls.sni, format!("outbound_.9080_._.{REVIEWS}"));
    let common = tls.common_tls_context.as_ref().unwrap();
    assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "istio"]);
    let (sans, sds) = identity(common);
    // The identities of the service's pods, sorted.
    assert_eq!(
        sans,
        [
            "spiffe://cluster.local/ns/shop/sa/reviews",
            "spiffe://cluster.local/ns/shop/sa/reviews-v2"
        ]
    );
    assert_eq!(sds, ["default", "ROOTCA"]);
    // HTTP/2 (gRPC) clusters add h2; TCP clusters get the TCP in-mesh ALPN.
    let grpc = &cs[&format!("outbound|9090||{REVIEWS}")];
    let tls = upstream(
        grpc.transport_socket_matches[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    assert_eq!(
        tls.common_tls_context.unwrap().alpn_protocols,
        ["istio-peer-exchange", "istio", "h2"]
    );
    let tcp = &cs[&format!("outbound|3306||{REVIEWS}")];
    assert_eq!(tcp.transport_socket_matches.len(), 2);
}

#[test]
fn auto_mtls_sni_names_the_subset() {
    let m = mesh().with_config(destination_rule(
        "shop",
        "reviews",
        "host: reviews\nsubsets: [{name: v2, labels: {version: v2}}]",
    ));
    let c = &cds(&m, &client())[&format!("outbound|9080|v2|{REVIEWS}")];
    let tls = upstream(
        c.transport_socket_matches[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    assert_eq!(tls.sni, format!("outbound_.9080_.v2_.{REVIEWS}"));
}

#[test]
fn a_disabled_destination_namespace_or_mesh_setting_gets_plaintext() {
    for m in [
        mesh().with_config(peer_authentication("shop", "off", "mtls: {mode: DISABLE}")),
        mesh().with_config(peer_authentication(
            "istio-system",
            "mesh",
            "mtls: {mode: DISABLE}",
        )),
        {
            let mut m = mesh();
            m.state.mesh = Arc::new(MeshSettings {
                enable_auto_mtls: false,
                ..MeshSettings::default()
            });
            m
        },
    ] {
        let c = &cds(&m, &client())[&format!("outbound|9080||{REVIEWS}")];
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());
    }
    // A workload policy does not turn a client's auto mTLS off (istiod reads only
    // namespace and mesh policies there); nor does another namespace's.
    let m = mesh()
        .with_config(peer_authentication(
            "shop",
            "wl",
            "selector: {matchLabels: {app: reviews}}\nmtls: {mode: DISABLE}",
        ))
        .with_config(peer_authentication("web", "off", "mtls: {mode: DISABLE}"));
    let c = &cds(&m, &client())[&format!("outbound|9080||{REVIEWS}")];
    assert_eq!(c.transport_socket_matches.len(), 2);
}

#[test]
fn headless_destinations_get_mtls_only_when_every_pod_has_a_sidecar() {
    let cs = cds(&mesh(), &client());
    // ORIGINAL_DST: no per-endpoint metadata to match, so all or nothing.
    let db = &cs["outbound|5432||db.shop.svc.cluster.local"];
    assert!(db.transport_socket_matches.is_empty());
    let tls = upstream(db.transport_socket.as_ref().expect("mTLS"));
    assert_eq!(tls.sni, "outbound_.5432_._.db.shop.svc.cluster.local");
    let legacy = &cs["outbound|8080||legacy.shop.svc.cluster.local"];
    assert!(legacy.transport_socket.is_none() && legacy.transport_socket_matches.is_empty());
}

#[test]
fn destination_rule_istio_mutual_is_always_mtls() {
    let m = mesh().with_config(destination_rule(
        "shop",
        "reviews",
        r#"
host: reviews
trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
subsets:
- name: pinned
  labels: {version: v1}
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL, sni: reviews.example, subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/pinned"]}}
"#,
    ));
    let cs = cds(&m, &client());
    // Set by the user: a plain transport socket, whatever the endpoints.
    let c = &cs[&format!("outbound|9080||{REVIEWS}")];
    assert!(c.transport_socket_matches.is_empty());
    let tls = upstream(c.transport_socket.as_ref().unwrap());
    assert_eq!(tls.sni, format!("outbound_.9080_._.{REVIEWS}"));
    assert_eq!(
        identity(tls.common_tls_context.as_ref().unwrap()).0.len(),
        2
    );
    let c = &cs[&format!("outbound|9080|pinned|{REVIEWS}")];
    let tls = upstream(c.transport_socket.as_ref().unwrap());
    assert_eq!(tls.sni, "reviews.example");
    assert_eq!(
        identity(tls.common_tls_context.as_ref().unwrap()).0,
        ["spiffe://cluster.local/ns/shop/sa/pinned"]
    );
    // Even to a namespace whose policy disables mTLS.
    let m = m.with_config(peer_authentication("shop", "off", "mtls: {mode: DISABLE}"));
    assert!(cds(&m, &client())[&format!("outbound|9080||{REVIEWS}")]
        .transport_socket
        .is_some());
}

#[test]
fn destination_rule_mutual_reads_the_client_certificate_files() {
    let m = mesh().with_config(destination_rule(
        "shop",
        "reviews",
        "host: reviews\ntrafficPolicy: {tls: {mode: MUTUAL, clientCertificate: /etc/c.pem, privateKey: /etc/k.pem, caCertificates: /etc/ca.pem}}",
    ));
    let c = &cds(&m, &client())[&format!("outbound|9080||{REVIEWS}")];
    assert!(c.transport_socket_matches.is_empty());
    let tls = upstream(c.transport_socket.as_ref().unwrap());
    let common = tls.common_tls_context.unwrap();
    assert_eq!(common.tls_certificates.len(), 1);
    let file = |d: &Option<shoal_proto::pb::envoy::config::core::v3::DataSource>| {
        format!("{:?}", d.as_ref().unwrap().specifier)
    };
    assert!(file(&common.tls_certificates[0].certificate_chain).contains("/etc/c.pem"));
    assert!(file(&common.tls_certificates[0].private_key).contains("/etc/k.pem"));
    // DISABLE and SIMPLE are the user's choice: no auto mTLS.
    let m = mesh().with_config(destination_rule(
        "shop",
        "reviews",
        "host: reviews\ntrafficPolicy: {tls: {mode: DISABLE}}",
    ));
    let c = &cds(&m, &client())[&format!("outbound|9080||{REVIEWS}")];
    assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());
}

#[test]
fn service_entries_get_auto_mtls_only_inside_the_mesh() {
    let m = mesh()
        .with_config(service_entry(
            "shop",
            "ext",
            "hosts: [api.example.com]\nports: [{number: 443, name: tls, protocol: TLS}]\nresolution: DNS",
        ))
        .with_config(service_entry(
            "shop",
            "vm",
            r#"
hosts: [vm.shop.internal]
location: MESH_INTERNAL
ports: [{number: 8080, name: http, protocol: HTTP}]
resolution: STATIC
endpoints:
- {address: 10.9.0.1, serviceAccount: vm-sa}
- {address: 10.9.0.2}
"#,
        ));
    let cs = cds(&m, &client());
    let ext = &cs["outbound|443||api.example.com"];
    assert!(ext.transport_socket.is_none() && ext.transport_socket_matches.is_empty());
    let vm = &cs["outbound|8080||vm.shop.internal"];
    let tls = upstream(
        vm.transport_socket_matches[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    assert_eq!(
        identity(tls.common_tls_context.as_ref().unwrap()).0,
        ["spiffe://cluster.local/ns/shop/sa/vm-sa"]
    );
    // EDS marks the endpoint with a service account (a sidecar, as istiod infers it).
    let eds = load_assignments(&gen(
        XdsType::Endpoint,
        &client(),
        &m.snapshot(),
        &["outbound|8080||vm.shop.internal"],
    ));
    let marked: Vec<bool> = eds["outbound|8080||vm.shop.internal"].endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| e.metadata.is_some())
        .collect();
    assert_eq!(marked, [true, false]);
}

#[test]
fn eds_marks_endpoints_with_a_sidecar() {
    let name = format!("outbound|9080||{REVIEWS}");
    let eds = load_assignments(&gen(
        XdsType::Endpoint,
        &client(),
        &mesh().snapshot(),
        &[&name],
    ));
    let eps = &eds[&name].endpoints[0].lb_endpoints;
    let marks: Vec<Option<String>> = eps
        .iter()
        .map(|e| {
            let md = e.metadata.as_ref()?;
            // Beside it, only istiod's `istio.workload` telemetry label.
            assert!(md
                .filter_metadata
                .keys()
                .all(|k| k == "istio" || k == "envoy.transport_socket_match"));
            match &md
                .filter_metadata
                .get("envoy.transport_socket_match")?
                .fields["tlsMode"]
                .kind
            {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(marks, [Some("istio".into()), Some("istio".into()), None]);
}

/// (name, transport protocol, ALPN, terminates mTLS) of each chain of a port (0: the
/// passthrough chains without a port).
fn chains_of(l: &Listener, port: u32) -> Vec<(String, String, Vec<String>, bool)> {
    l.filter_chains
        .iter()
        .filter(|c| {
            let m = c.filter_chain_match.clone().unwrap_or_default();
            m.destination_port.map(|p| p.value).unwrap_or(0) == port
                && c.name != "virtualInbound-blackhole"
        })
        .map(|c| {
            let m = c.filter_chain_match.clone().unwrap_or_default();
            (
                c.name.clone(),
                m.transport_protocol,
                m.application_protocols,
                c.transport_socket.is_some(),
            )
        })
        .collect()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn permissive_inbound_has_mtls_and_plaintext_chains() {
    let l = virtual_inbound(&mesh(), &server());
    let istio_alpn = strs(&[
        "istio",
        "istio-peer-exchange",
        "istio-http/1.0",
        "istio-http/1.1",
        "istio-h2",
    ]);
    assert_eq!(
        chains_of(&l, 9080),
        [
            (
                "0.0.0.0_9080".into(),
                "tls".into(),
                istio_alpn.clone(),
                true
            ),
            ("0.0.0.0_9080".into(), "raw_buffer".into(), vec![], false),
        ]
    );
    assert_eq!(
        chains_of(&l, 3306),
        [
            ("0.0.0.0_3306".into(), "tls".into(), istio_alpn, true),
            ("0.0.0.0_3306".into(), "tls".into(), vec![], false),
            ("0.0.0.0_3306".into(), "raw_buffer".into(), vec![], false),
        ]
    );
    let mtls_http = strs(&["istio-http/1.0", "istio-http/1.1", "istio-h2"]);
    let plain_http = strs(&["http/1.1", "h2c"]);
    let http = "virtualInbound-catchall-http".to_string();
    let tcp = "virtualInbound".to_string();
    assert_eq!(
        chains_of(&l, 0),
        [
            (http.clone(), "tls".into(), mtls_http, true),
            (http, "raw_buffer".into(), plain_http, false),
            (
                tcp.clone(),
                "tls".into(),
                strs(&["istio-peer-exchange", "istio"]),
                true
            ),
            (tcp.clone(), "raw_buffer".into(), vec![], false),
            (tcp, "tls".into(), vec![], false),
        ]
    );
    // The server side of istiod's inbound mTLS.
    let c = l
        .filter_chains
        .iter()
        .find(|c| c.name == "0.0.0.0_9080" && c.transport_socket.is_some())
        .unwrap();
    let tls = downstream(c);
    assert!(tls.require_client_certificate.unwrap().value);
    let common = tls.common_tls_context.unwrap();
    assert_eq!(common.alpn_protocols, ["h2", "http/1.1"]);
    assert_eq!(common.tls_params.as_ref().unwrap().cipher_suites.len(), 6);
    assert_eq!(
        identity(&common),
        (
            strs(&["spiffe://cluster.local/*"]),
            strs(&["default", "ROOTCA"])
        )
    );
    let tcp_tls = downstream(
        l.filter_chains
            .iter()
            .find(|c| c.name == "0.0.0.0_3306" && c.transport_socket.is_some())
            .unwrap(),
    );
    assert_eq!(
        tcp_tls.common_tls_context.unwrap().alpn_protocols,
        ["istio-peer-exchange", "h2", "http/1.1"]
    );
    // The app sees the caller's identity.
    let f = c.filters.last().unwrap();
    let Some(shoal_proto::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &f.config_type
    else {
        panic!()
    };
    let hcm = HttpConnectionManager::decode(&*any.value).unwrap();
    assert_eq!(
        hcm.forward_client_cert_details,
        ForwardClientCertDetails::AppendForward as i32
    );
    let d = hcm.set_current_client_cert_details.unwrap();
    assert!(d.subject.unwrap().value && d.uri && d.dns && !d.cert && !d.chain);
}

#[test]
fn strict_refuses_plaintext_and_disable_refuses_tls() {
    let strict = mesh().with_config(peer_authentication("shop", "s", "mtls: {mode: STRICT}"));
    let l = virtual_inbound(&strict, &server());
    for port in [0, 9080, 9090, 3306] {
        let chains = chains_of(&l, port);
        assert!(!chains.is_empty());
        assert!(
            chains.iter().all(|(_, t, _, mtls)| t == "tls" && *mtls),
            "{port}: {chains:?}"
        );
    }
    let disable = mesh().with_config(peer_authentication("shop", "d", "mtls: {mode: DISABLE}"));
    let l = virtual_inbound(&disable, &server());
    for port in [0, 9080, 9090, 3306] {
        let chains = chains_of(&l, port);
        assert!(
            chains
                .iter()
                .all(|(_, t, _, mtls)| t == "raw_buffer" && !*mtls),
            "{port}: {chains:?}"
        );
    }
    // No chain needs TLS: no TLS inspector.
    assert!(!l
        .listener_filters
        .iter()
        .any(|f| f.name == "envoy.filters.listener.tls_inspector"));
}

#[test]
fn port_level_mtls_overrides_per_workload_port() {
    let m = mesh()
        .with_config(peer_authentication("istio-system", "mesh", "mtls: {mode: STRICT}"))
        .with_config(peer_authentication(
            "shop",
            "reviews",
            "selector: {matchLabels: {app: reviews}}\nportLevelMtls: {3306: {mode: DISABLE}, 7070: {mode: PERMISSIVE}}",
        ));
    let l = virtual_inbound(&m, &server());
    assert!(chains_of(&l, 9080).iter().all(|c| c.3));
    assert!(chains_of(&l, 3306).iter().all(|c| !c.3));
    // 7070 is no service's port: passthrough chains of its own, PERMISSIVE.
    let extra = chains_of(&l, 7070);
    assert_eq!(extra.len(), 5);
    assert!(extra.iter().any(|c| !c.3) && extra.iter().any(|c| c.3));
    // The TLS inspector runs by default (the passthrough is STRICT), except where no chain
    // needs it: 3306 and the blackhole.
    let tls = l
        .listener_filters
        .iter()
        .find(|f| f.name == "envoy.filters.listener.tls_inspector")
        .unwrap();
    let disabled = format!("{:?}", tls.filter_disabled);
    assert!(
        disabled.contains("start: 3306") && disabled.contains("start: 15006"),
        "{disabled}"
    );
    assert!(
        !disabled.contains("9080") && !disabled.contains("NotMatch"),
        "{disabled}"
    );
    // Another workload of the namespace keeps the mesh mode everywhere.
    let other = captured_proxy("shop", "10.1.0.9", &[("app", "other")]);
    let l = virtual_inbound(&m, &other);
    assert!(chains_of(&l, 0).iter().all(|c| c.3));
}

#[test]
fn the_inbound_listener_key_carries_the_mode() {
    let a = gen(XdsType::Listener, &server(), &mesh().snapshot(), &[]);
    let strict = mesh().with_config(peer_authentication("shop", "s", "mtls: {mode: STRICT}"));
    let b = gen(XdsType::Listener, &server(), &strict.snapshot(), &[]);
    let version = |rs: &[crate::generate::Resource]| {
        rs.iter()
            .find(|r| r.name == "virtualInbound")
            .unwrap()
            .version
            .clone()
    };
    assert_ne!(version(&a), version(&b));
}
