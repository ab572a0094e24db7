//! Gateway TLS termination (`SIMPLE`, `MUTUAL` with `credentialName`) as istiod builds it:
//! SNI-matched chains with SDS certificates, a route table per HTTPS server, `tcp` routes
//! after termination on TLS servers; and SDS authorization (own namespace, gateways only).

use super::rds_gateway::{cluster_of, ingress, rds, vhost};
use crate::generate::sds::{authorize, Denial};
use crate::testutil::*;
use prost::Message;
use shoal_common::credential::{CredentialKeys, TlsCredential};
use shoal_common::model::ConfigSpec;
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
    config(ns, name, ConfigSpec::Credential(keys.seal(ns, name, &cred)))
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
    let s = secret_of(&m, &ingress(), "kubernetes://web-cert").expect("served");
    assert_eq!(s.name, "kubernetes://web-cert");
    let Some(secret::Type::TlsCertificate(tc)) = s.r#type else {
        panic!("a TLS certificate")
    };
    let bytes = |d: Option<shoal_proto::pb::envoy::config::core::v3::DataSource>| match d
        .and_then(|d| d.specifier)
    {
        Some(Specifier::InlineBytes(b)) => String::from_utf8(b).unwrap(),
        other => panic!("inline bytes expected, got {other:?}"),
    };
    assert_eq!(bytes(tc.certificate_chain), CERT);
    assert_eq!(bytes(tc.private_key), KEY);
    // `-cacert` falls back to the `ca.crt` of the Secret itself.
    let ca = secret_of(&m, &ingress(), "kubernetes://web-cert-cacert").expect("CA served");
    let Some(secret::Type::ValidationContext(vc)) = ca.r#type else {
        panic!("a validation context")
    };
    assert_eq!(bytes(vc.trusted_ca), CA);
}

#[test]
fn sds_refuses_other_namespaces_sidecars_and_unknown_names() {
    let m = mesh();
    let snap = m.snapshot();
    let gw = ingress();
    // The shop namespace has a `web-cert` too: a gateway in istio-system never sees it.
    assert_eq!(
        authorize("kubernetes://shop/web-cert", &gw, &snap.ctx).unwrap_err(),
        Denial::OtherNamespace
    );
    assert!(secret_of(&m, &gw, "kubernetes://shop/web-cert").is_none());
    // Its own namespace spelled out is fine.
    assert!(authorize("kubernetes://istio-system/web-cert", &gw, &snap.ctx).is_ok());
    assert_eq!(
        authorize("kubernetes://missing", &gw, &snap.ctx).unwrap_err(),
        Denial::NotFound
    );
    assert_eq!(
        authorize("file:///etc/key.pem", &gw, &snap.ctx).unwrap_err(),
        Denial::UnknownName
    );
    let sidecar = sidecar_proxy("istio-system", &[("app", "x")]);
    assert_eq!(
        authorize("kubernetes://web-cert", &sidecar, &snap.ctx).unwrap_err(),
        Denial::NotGateway
    );
    assert!(secret_of(&m, &sidecar, "kubernetes://web-cert").is_none());
    // A gateway in shop gets shop's Secret (which has no CA: no `-cacert`).
    let shop_gw = router_proxy("shop", &[("istio", "ingressgateway")]);
    assert!(secret_of(&m, &shop_gw, "kubernetes://web-cert").is_some());
    assert!(secret_of(&m, &shop_gw, "kubernetes://web-cert-cacert").is_none());
}

#[test]
fn credentials_without_the_key_or_moved_between_keys_are_not_served() {
    // No key file: sealed credentials stay sealed.
    let mut m = mesh();
    m.state.credential_keys = None;
    assert!(secret_of(&m, &ingress(), "kubernetes://web-cert").is_none());
    // A sealed value copied under another Secret's key does not open.
    let mut m = mesh();
    let keys = m.state.credential_keys.clone().unwrap();
    let sealed = keys.seal("shop", "web-cert", &server_cred(None));
    m.add_config(config(
        "istio-system",
        "stolen",
        ConfigSpec::Credential(sealed),
    ));
    assert!(secret_of(&m, &ingress(), "kubernetes://stolen").is_none());
}
