//! Gateway TLS termination (`SIMPLE`, `MUTUAL` with `credentialName`) as istiod builds it:
//! SNI-matched chains with SDS certificates, a route table per HTTPS server, `tcp` routes
//! after termination on TLS servers; and SDS authorization (each rule of `generate::sds`).

use super::rds_gateway::{cluster_of, ingress, rds, vhost};
use crate::generate::sds::{authorize, Denial};
use crate::index::proxy::{ProvenCluster, Proxy};
use crate::testutil::*;
use prost::Message;
use shoal_common::credential::{CredentialKeys, TlsCredential};
use shoal_common::model::{ConfigSpec, EndpointSet};
use shoal_proto::pb::envoy::config::core::v3::data_source::Specifier;
use shoal_proto::pb::envoy::config::listener::v3::{filter, FilterChain, Listener};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::ClusterSpecifier, TcpProxy,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, secret, DownstreamTlsContext, Secret,
};
use shoal_proto::XdsType;
use std::sync::Arc;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nSERVER\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n";
const CA: &str = "-----BEGIN CERTIFICATE-----\nCLIENTCA\n-----END CERTIFICATE-----\n";

fn credential(
    keys: &CredentialKeys,
    ns: &str,
    name: &str,
    cred: TlsCredential,
) -> shoal_common::model::ConfigObject {
    credential_of(keys, CLUSTER, ns, name, cred)
}

fn credential_of(
    keys: &CredentialKeys,
    cluster: &str,
    ns: &str,
    name: &str,
    cred: TlsCredential,
) -> shoal_common::model::ConfigObject {
    config(
        ns,
        name,
        ConfigSpec::Credential(keys.seal(cluster, ns, name, &cred)),
    )
}

/// A pod behind a Service: an endpoint with labels and a service account, in `cluster`.
fn pod(
    cluster: &str,
    ns: &str,
    svc: &str,
    ip: &str,
    sa: &str,
    labels_: &[(&str, &str)],
) -> EndpointSet {
    let mut ep = endpoint(ip, labels_);
    ep.service_account = sa.into();
    let mut set = slice(
        ns,
        svc,
        &format!("{svc}-{ip}"),
        &[("https", 8443)],
        vec![ep],
    );
    set.cluster = cluster.into();
    set
}

/// The ingress gateway as the secure port leaves it: verified as its pods' service account
/// `ingress`, by a token of the config cluster.
fn gw() -> Proxy {
    as_caller(ingress(), "ingress", ProvenCluster::Token(CLUSTER.into()))
}

fn as_caller(proxy: Proxy, sa: &str, cluster: ProvenCluster) -> Proxy {
    verified_as(proxy, &[sa], cluster)
}

fn server_cred(ca: Option<&str>) -> TlsCredential {
    TlsCredential {
        cert_chain: Some(CERT.into()),
        private_key: Some(KEY.into()),
        ca_cert: ca.map(String::from),
    }
}

fn mesh() -> Mesh {
    let keys = CredentialKeys::ephemeral();
    let mut m = Mesh::new()
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_service(service("shop", "db", &[("tcp", 5432)]))
        .with_config(credential(&keys, "istio-system", "web-cert", server_cred(Some(CA))))
        .with_config(credential(&keys, "shop", "web-cert", server_cred(None)))
        // The gateway's pods run as `ingress`; prometheus (scraping them) and a pod on the
        // namespace's `default` account run there too.
        .with_slice(pod(CLUSTER, "istio-system", "istio-ingressgateway", "10.0.0.1", "ingress", &[("istio", "ingressgateway")]))
        .with_slice(pod(CLUSTER, "istio-system", "prometheus", "10.0.0.2", "prometheus", &[("app", "prometheus")]))
        .with_slice(pod(CLUSTER, "istio-system", "debug", "10.0.0.3", "default", &[("app", "debug")]))
        .with_slice(pod(CLUSTER, "shop", "shop-gateway", "10.0.1.1", "shop-gateway", &[("app", "shop-gateway")]))
        .with_config(gateway(
            "shop",
            "shop-gateway",
            r#"
selector: {app: shop-gateway}
servers:
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: ["shop.example.com"]
  tls: {mode: SIMPLE, credentialName: web-cert}
"#,
        ))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: ["shop/web.example.com"]
  tls: {mode: SIMPLE, credentialName: web-cert}
- port: {number: 443, name: https-admin, protocol: HTTPS}
  hosts: ["admin.example.com"]
  tls: {mode: MUTUAL, credentialName: web-cert}
- port: {number: 5433, name: tls-db, protocol: TLS}
  hosts: ["db.example.com"]
  tls: {mode: SIMPLE, credentialName: web-cert}
"#,
        ))
        .with_config(virtual_service(
            "shop",
            "web",
            "hosts: [web.example.com]\ngateways: [istio-system/public]\nhttp: [{route: [{destination: {host: web}}]}]",
        ))
        .with_config(virtual_service(
            "shop",
            "db",
            "hosts: [db.example.com]\ngateways: [istio-system/public]\ntcp: [{route: [{destination: {host: db}}]}]",
        ));
    m.state.credential_keys = Some(Arc::new(keys));
    m
}

fn listener(m: &Mesh, name: &str) -> Listener {
    listeners(&gen(XdsType::Listener, &ingress(), &m.snapshot(), &[]))
        .remove(name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn tls_context(chain: &FilterChain) -> DownstreamTlsContext {
    let ts = chain
        .transport_socket
        .as_ref()
        .expect("a TLS transport socket");
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let Some(shoal_proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = &ts.config_type
    else {
        panic!("typed config")
    };
    DownstreamTlsContext::decode(any.value.as_slice()).expect("a DownstreamTlsContext")
}

fn chain_for<'a>(l: &'a Listener, sni: &str) -> &'a FilterChain {
    l.filter_chains
        .iter()
        .find(|c| {
            c.filter_chain_match
                .as_ref()
                .is_some_and(|m| m.server_names == [sni])
        })
        .unwrap_or_else(|| panic!("no chain for SNI {sni}"))
}

#[test]
fn https_servers_terminate_with_sds_certificates_on_sni_chains() {
    let m = mesh();
    let l = listener(&m, "0.0.0.0_443");
    assert_eq!(
        l.listener_filters[0].name, "envoy.filters.listener.tls_inspector",
        "SNI needs the TLS inspector"
    );
    assert_eq!(l.filter_chains.len(), 2);

    let simple = tls_context(chain_for(&l, "web.example.com"));
    let common = simple.common_tls_context.as_ref().unwrap();
    let sds = &common.tls_certificate_sds_secret_configs;
    assert_eq!(sds.len(), 1);
    assert_eq!(sds[0].name, "kubernetes://web-cert");
    assert!(sds[0].sds_config.is_some(), "over ADS");
    assert_eq!(common.alpn_protocols, ["h2", "http/1.1"]);
    assert!(common.validation_context_type.is_none());
    assert_eq!(
        simple.require_client_certificate.map(|b| b.value),
        Some(false)
    );
    // After termination: the HTTP connection manager on the server's own route table.
    let hcm = hcm(&Listener {
        filter_chains: vec![chain_for(&l, "web.example.com").clone()],
        ..Default::default()
    });
    match hcm.route_specifier {
        Some(shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::Rds(r)) => {
            assert_eq!(r.route_config_name, "https.443.https.public.istio-system")
        }
        other => panic!("RDS expected, got {other:?}"),
    }

    let mutual = tls_context(chain_for(&l, "admin.example.com"));
    assert_eq!(
        mutual.require_client_certificate.map(|b| b.value),
        Some(true)
    );
    match &mutual.common_tls_context.unwrap().validation_context_type {
        Some(ValidationContextType::ValidationContextSdsSecretConfig(c)) => {
            assert_eq!(c.name, "kubernetes://web-cert-cacert")
        }
        other => panic!("client CA over SDS expected, got {other:?}"),
    }
}

#[test]
fn each_https_server_has_its_own_route_table() {
    let m = mesh();
    let rc = rds(&m, &ingress(), "https.443.https.public.istio-system");
    let vh = vhost(&rc, "web.example.com:443");
    assert_eq!(
        cluster_of(&vh.routes[0]),
        "outbound|80||web.shop.svc.cluster.local"
    );
    // The admin server admits no VirtualService host: an empty table, not the other's.
    let admin = rds(&m, &ingress(), "https.443.https-admin.public.istio-system");
    assert!(admin.virtual_hosts.is_empty(), "{admin:?}");
    // A plain HTTP table for the port does not take the HTTPS servers' hosts.
    let plain = route_configs(&gen(
        XdsType::Route,
        &ingress(),
        &m.snapshot(),
        &["http.443"],
    ));
    assert!(plain.values().all(|rc| rc.virtual_hosts.is_empty()));
}

#[test]
fn tls_servers_terminate_then_route_tcp() {
    let m = mesh();
    let l = listener(&m, "0.0.0.0_5433");
    let chain = chain_for(&l, "db.example.com");
    let ctx = tls_context(chain);
    assert!(ctx.common_tls_context.unwrap().alpn_protocols.is_empty());
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!("typed filter")
    };
    let tcp = TcpProxy::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        tcp.cluster_specifier,
        Some(ClusterSpecifier::Cluster(
            "outbound|5432||db.shop.svc.cluster.local".into()
        ))
    );
}

fn secret_of(m: &Mesh, proxy: &crate::index::proxy::Proxy, name: &str) -> Option<Secret> {
    gen(XdsType::Secret, proxy, &m.snapshot(), &[name])
        .into_iter()
        .find(|r| r.name == name)
        .map(|r| Secret::decode(r.any.value.as_slice()).unwrap())
}

#[test]
fn sds_serves_certificate_and_client_ca_of_the_gateways_namespace() {
    let m = mesh();
    let s = secret_of(&m, &gw(), "kubernetes://web-cert").expect("served");
    assert_eq!(s.name, "kubernetes://web-cert");
    let Some(secret::Type::TlsCertificate(tc)) = s.r#type else {
        panic!("a TLS certificate")
    };
    assert_eq!(bytes(tc.certificate_chain), CERT);
    assert_eq!(bytes(tc.private_key), KEY);
    // `-cacert` falls back to the `ca.crt` of the Secret itself.
    let ca = secret_of(&m, &gw(), "kubernetes://web-cert-cacert").expect("CA served");
    let Some(secret::Type::ValidationContext(vc)) = ca.r#type else {
        panic!("a validation context")
    };
    assert_eq!(bytes(vc.trusted_ca), CA);
}

fn bytes(d: Option<shoal_proto::pb::envoy::config::core::v3::DataSource>) -> String {
    match d.and_then(|d| d.specifier) {
        Some(Specifier::InlineBytes(b)) => String::from_utf8(b).unwrap(),
        other => panic!("inline bytes expected, got {other:?}"),
    }
}

/// Why `proxy` does not get `name` (`Ok(())` when it does).
fn verdict(m: &Mesh, proxy: &Proxy, name: &str) -> Result<(), Denial> {
    let snap = m.snapshot();
    let result = authorize(name, proxy, &snap).map(|_| ());
    // The generator serves exactly what `authorize` allows.
    assert_eq!(
        secret_of(m, proxy, name).is_some(),
        result.is_ok(),
        "{name}"
    );
    result
}

#[test]
fn sds_refuses_other_namespaces_sidecars_and_unknown_names() {
    let m = mesh();
    let gw = gw();
    // The shop namespace has a `web-cert` too: a gateway in istio-system never sees it.
    assert_eq!(
        verdict(&m, &gw, "kubernetes://shop/web-cert"),
        Err(Denial::OtherNamespace)
    );
    // Its own namespace spelled out is fine.
    assert_eq!(
        verdict(&m, &gw, "kubernetes://istio-system/web-cert"),
        Ok(())
    );
    assert_eq!(
        verdict(&m, &gw, "kubernetes://missing"),
        Err(Denial::NotFound)
    );
    assert_eq!(
        verdict(&m, &gw, "file:///etc/key.pem"),
        Err(Denial::UnknownName)
    );
    let sidecar = as_caller(
        sidecar_proxy("istio-system", &[("istio", "ingressgateway")]),
        "ingress",
        ProvenCluster::Token(CLUSTER.into()),
    );
    assert_eq!(
        verdict(&m, &sidecar, "kubernetes://web-cert"),
        Err(Denial::NotGateway)
    );
    // A gateway in shop, running as its pods' account, gets shop's Secret (which has no
    // CA: no `-cacert`).
    let shop_gw = as_caller(
        router_proxy("shop", &[("app", "shop-gateway")]),
        "shop-gateway",
        ProvenCluster::Token(CLUSTER.into()),
    );
    assert_eq!(verdict(&m, &shop_gw, "kubernetes://web-cert"), Ok(()));
    assert_eq!(
        verdict(&m, &shop_gw, "kubernetes://web-cert-cacert"),
        Err(Denial::NotFound)
    );
}

#[test]
fn sds_needs_an_authenticated_stream() {
    let m = mesh();
    // The plaintext port: no verified identity, whatever the node says.
    let mut plain = ingress();
    plain.service_account = Some("ingress".into());
    assert_eq!(
        verdict(&m, &plain, "kubernetes://web-cert"),
        Err(Denial::Unauthenticated)
    );
}

#[test]
fn sds_goes_only_to_the_service_account_of_the_workloads_serving_the_secret() {
    let m = mesh();
    // Other service accounts of the gateway's namespace, with the gateway's node id,
    // labels and even its SERVICE_ACCOUNT metadata: the verified identity decides.
    for sa in ["default", "prometheus", "some-app"] {
        let mut proxy = as_caller(ingress(), sa, ProvenCluster::Token(CLUSTER.into()));
        assert_eq!(
            verdict(&m, &proxy, "kubernetes://web-cert"),
            Err(Denial::NotGatewayIdentity),
            "{sa}"
        );
        proxy.service_account = Some("ingress".into());
        assert_eq!(
            verdict(&m, &proxy, "kubernetes://web-cert-cacert"),
            Err(Denial::NotGatewayIdentity),
            "{sa}"
        );
    }
    // The gateway's account without SERVICE_ACCOUNT metadata: served.
    assert_eq!(gw().service_account, None);
    assert_eq!(verdict(&m, &gw(), "kubernetes://web-cert"), Ok(()));
    // A caller holding several identities is served if one of them runs the gateway.
    let several = verified_as(
        ingress(),
        &["default", "ingress"],
        ProvenCluster::Token(CLUSTER.into()),
    );
    assert_eq!(verdict(&m, &several, "kubernetes://web-cert"), Ok(()));

    // Only the pods a Gateway naming the Secret selects count: without its label the
    // gateway pod serves nothing.
    let mut relabelled = mesh();
    relabelled.add_slice(pod(
        CLUSTER,
        "istio-system",
        "istio-ingressgateway",
        "10.0.0.1",
        "ingress",
        &[("istio", "other")],
    ));
    assert_eq!(
        verdict(&relabelled, &gw(), "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
    // A Gateway without a selector names no workload: it authorizes nobody.
    let mut open = mesh();
    open.add_config(gateway(
        "istio-system",
        "public",
        "servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: web-cert}}]",
    ));
    assert_eq!(
        verdict(&open, &gw(), "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
    // A Gateway of another namespace cannot make prometheus a reader of istio-system's
    // Secret by selecting its pods.
    let mut foreign = mesh();
    foreign.add_config(gateway(
        "shop",
        "grab",
        "selector: {app: prometheus}\nservers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: web-cert}}]",
    ));
    let prometheus = as_caller(
        ingress(),
        "prometheus",
        ProvenCluster::Token(CLUSTER.into()),
    );
    assert_eq!(
        verdict(&foreign, &prometheus, "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
    // A Gateway that names another Secret does not authorize this one.
    let mut other_secret = mesh();
    other_secret.add_config(gateway(
        "istio-system",
        "metrics",
        "selector: {app: prometheus}\nservers: [{port: {number: 9443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: metrics-cert}}]",
    ));
    assert_eq!(
        verdict(&other_secret, &prometheus, "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
}

#[test]
fn sds_serves_a_secret_only_to_callers_of_its_cluster() {
    let mut m = mesh();
    // `east` runs a gateway with the same namespace and service account.
    m.add_slice(pod(
        "east",
        "istio-system",
        "istio-ingressgateway",
        "10.9.0.1",
        "ingress",
        &[("istio", "ingressgateway")],
    ));
    let east = as_caller(ingress(), "ingress", ProvenCluster::Token("east".into()));
    // The config cluster's Secret is not east's.
    assert_eq!(
        verdict(&m, &east, "kubernetes://web-cert"),
        Err(Denial::OtherCluster)
    );
    assert_eq!(
        verdict(&m, &east, "kubernetes://web-cert-cacert"),
        Err(Denial::OtherCluster)
    );
    // East's own Secret of that name is served to east's gateway, and only to it.
    let keys = m.state.credential_keys.clone().unwrap();
    let mut east_cred = server_cred(None);
    east_cred.private_key = Some("EAST KEY".into());
    m.add_config(credential_of(
        &keys,
        "east",
        "istio-system",
        "web-cert",
        east_cred,
    ));
    let s = secret_of(&m, &east, "kubernetes://web-cert").expect("east's own");
    let Some(secret::Type::TlsCertificate(tc)) = s.r#type else {
        panic!("a TLS certificate")
    };
    assert_eq!(bytes(tc.private_key), "EAST KEY");
    let s = secret_of(&m, &gw(), "kubernetes://web-cert").expect("the config cluster's");
    let Some(secret::Type::TlsCertificate(tc)) = s.r#type else {
        panic!("a TLS certificate")
    };
    assert_eq!(bytes(tc.private_key), KEY);
    // Without a gateway workload in east, east's account serves nothing there, even though
    // the same account serves the config cluster's gateway.
    let mut no_east_pod = mesh();
    no_east_pod.add_config(credential_of(
        &keys,
        "east",
        "istio-system",
        "web-cert",
        server_cred(None),
    ));
    no_east_pod.state.credential_keys = Some(keys.clone());
    assert_eq!(
        verdict(&no_east_pod, &east, "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
    // A token several clusters' keys verify proves no cluster.
    let ambiguous = as_caller(ingress(), "ingress", ProvenCluster::Ambiguous);
    assert_eq!(
        verdict(&m, &ambiguous, "kubernetes://web-cert"),
        Err(Denial::UnprovenCluster)
    );
}

#[test]
fn a_client_certificate_proves_a_cluster_only_while_one_clusters_tokens_are_accepted() {
    let cert = as_caller(ingress(), "ingress", ProvenCluster::Certificate);
    let with_issuers = |issuers: &[&str]| {
        let mut m = mesh();
        m.state.token_issuers = issuers.iter().map(|c| c.to_string()).collect();
        m
    };
    // No token accepted (standalone, or certificates only): the Secret's one cluster.
    assert_eq!(
        verdict(&with_issuers(&[]), &cert, "kubernetes://web-cert"),
        Ok(())
    );
    // Only the config cluster's tokens: every certificate the CA issued is that cluster's.
    assert_eq!(
        verdict(&with_issuers(&[CLUSTER]), &cert, "kubernetes://web-cert"),
        Ok(())
    );
    // Only another cluster's tokens: the certificate is that cluster's.
    assert_eq!(
        verdict(&with_issuers(&["east"]), &cert, "kubernetes://web-cert"),
        Err(Denial::OtherCluster)
    );
    // Several clusters' tokens: the CA may have certified east's `ingress` too.
    assert_eq!(
        verdict(
            &with_issuers(&[CLUSTER, "east"]),
            &cert,
            "kubernetes://web-cert"
        ),
        Err(Denial::UnprovenCluster)
    );
    // The workload rule holds for certificates too.
    let other = as_caller(ingress(), "default", ProvenCluster::Certificate);
    assert_eq!(
        verdict(&with_issuers(&[]), &other, "kubernetes://web-cert"),
        Err(Denial::NotGatewayIdentity)
    );
}

#[test]
fn credentials_without_the_key_or_moved_between_keys_are_not_served() {
    // No key file: sealed credentials stay sealed.
    let mut m = mesh();
    m.state.credential_keys = None;
    assert!(secret_of(&m, &gw(), "kubernetes://web-cert").is_none());
    // A sealed value copied under another Secret's key does not open.
    let mut m = mesh();
    let keys = m.state.credential_keys.clone().unwrap();
    let sealed = keys.seal(CLUSTER, "shop", "web-cert", &server_cred(None));
    m.add_config(config(
        "istio-system",
        "stolen",
        ConfigSpec::Credential(sealed),
    ));
    m.add_config(gateway(
        "istio-system",
        "stolen",
        "selector: {istio: ingressgateway}\nservers: [{port: {number: 8443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: stolen}}]",
    ));
    assert!(secret_of(&m, &gw(), "kubernetes://stolen").is_none());
    // Nor does another cluster's, relabelled as the config cluster's.
    let mut m = mesh();
    let mut sealed = keys.seal("east", "istio-system", "web-cert", &server_cred(None));
    sealed.cluster = CLUSTER.into();
    m.state.credential_keys = Some(keys.clone());
    m.add_config(config(
        "istio-system",
        "web-cert",
        ConfigSpec::Credential(sealed),
    ));
    assert!(secret_of(&m, &gw(), "kubernetes://web-cert").is_none());
}
