//! LDS: the httpbin sidecar's listeners (authz-configdump), and the clusters they name.

use super::*;

fn json_chain_match(fc: &Value) -> String {
    let m = &fc["filter_chain_match"];
    let prefixes = m["prefix_ranges"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| format!("{}/{}", s(&p["address_prefix"]), s(&p["prefix_len"])))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    format!(
        "{}|{}|{}|{}|{}",
        s(&fc["name"]),
        s(&m["destination_port"]),
        s(&m["transport_protocol"]),
        strings(&m["application_protocols"]),
        prefixes
    )
}

fn json_filters(fc: &Value, out: &mut Facts, key: &str) {
    let mut summary = Vec::new();
    for f in fc["filters"].as_array().into_iter().flatten() {
        let name = s(&f["name"]);
        let tc = &f["typed_config"];
        match name.as_str() {
            "envoy.filters.network.tcp_proxy" => {
                summary.push(format!("tcp_proxy({})", s(&tc["cluster"])));
                out.insert(
                    format!("{key}/tcp_proxy/stat_prefix"),
                    s(&tc["stat_prefix"]),
                );
            }
            "envoy.filters.network.http_connection_manager" => {
                let route = if tc["rds"].is_object() {
                    format!("rds={}", s(&tc["rds"]["route_config_name"]))
                } else {
                    "inline".into()
                };
                summary.push(format!("hcm({route})"));
                out.insert(format!("{key}/hcm/stat_prefix"), s(&tc["stat_prefix"]));
                http_filter_facts(
                    out,
                    key,
                    tc["http_filters"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| s(&f["name"]))
                        .collect(),
                );
                let rbac: Vec<String> = tc["http_filters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|f| s(&f["name"]) == "envoy.filters.http.rbac")
                    .map(|f| json_rbac(&f["typed_config"]))
                    .collect();
                if !rbac.is_empty() {
                    out.insert(format!("{key}/hcm/rbac_rules"), rbac.join(" | "));
                }
                for field in [
                    "server_name",
                    "use_remote_address",
                    "normalize_path",
                    "path_with_escaped_slashes_action",
                    "stream_idle_timeout",
                    "forward_client_cert_details",
                ] {
                    if !tc[field].is_null() {
                        out.insert(format!("{key}/hcm/{field}"), s(&tc[field]));
                    }
                }
                for field in ["tracing", "request_id_extension"] {
                    if !tc[field].is_null() {
                        out.insert(format!("{key}/hcm/{field}"), "set".into());
                    }
                }
                if tc["rds"].is_object() {
                    out.insert(
                        format!("{key}/hcm/rds/initial_fetch_timeout"),
                        s(&tc["rds"]["config_source"]["initial_fetch_timeout"]),
                    );
                }
            }
            "envoy.filters.network.rbac" => {
                out.insert(format!("{key}/rbac_rules"), json_rbac(tc));
                summary.push(name);
            }
            _ => summary.push(name),
        }
    }
    insert_summary(out, key, summary);
}

/// An RBAC config as `<action>: <policy names>` (shadow rules aside).
fn json_rbac(tc: &Value) -> String {
    let rules = &tc["rules"];
    let action = rules["action"].as_str().unwrap_or("ALLOW");
    let mut names: Vec<String> = rules["policies"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    format!("{action}: {}", names.join(","))
}

fn pb_rbac(rules: Option<&shoal_proto::pb::envoy::config::rbac::v3::Rbac>) -> String {
    let Some(rules) = rules else {
        return String::new();
    };
    let action = shoal_proto::pb::envoy::config::rbac::v3::rbac::Action::try_from(rules.action)
        .map(|a| a.as_str_name().to_string())
        .unwrap_or_default();
    let mut names: Vec<&String> = rules.policies.keys().collect();
    names.sort();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    format!("{action}: {}", names.join(","))
}

/// istio-proxy's own filters (telemetry, peer metadata, its authn filter): facts of their
/// own, so one allowance covers them; RBAC likewise.
const ISTIO_PROXY_FILTERS: &[&str] = &[
    "istio_authn",
    "istio.metadata_exchange",
    "istio.stats",
    "envoy.filters.http.grpc_stats",
    "istio.alpn",
];

fn insert_summary(out: &mut Facts, key: &str, summary: Vec<String>) {
    let (special, rest): (Vec<String>, Vec<String>) = summary
        .into_iter()
        .partition(|f| ISTIO_PROXY_FILTERS.contains(&f.as_str()) || f.ends_with(".rbac"));
    let (rbac, istio): (Vec<String>, Vec<String>) =
        special.into_iter().partition(|f| f.ends_with(".rbac"));
    if !istio.is_empty() {
        out.insert(format!("{key}/istio_proxy_filters"), istio.join(","));
    }
    if !rbac.is_empty() {
        out.insert(format!("{key}/rbac"), rbac.join(","));
    }
    out.insert(key.to_string(), rest.join(", "));
}

fn http_filter_facts(out: &mut Facts, key: &str, filters: Vec<String>) {
    let hkey = format!("{key}/hcm/http_filters");
    insert_summary(out, &hkey, filters);
}

fn json_listener_facts(l: &Value, out: &mut Facts) {
    let name = s(&l["name"]);
    let key = format!("lds/{name}");
    let sa = &l["address"]["socket_address"];
    out.insert(
        format!("{key}/address"),
        format!("{}:{}", s(&sa["address"]), s(&sa["port_value"])),
    );
    out.insert(
        format!("{key}/bind_to_port"),
        l["bind_to_port"].as_bool().unwrap_or(true).to_string(),
    );
    out.insert(
        format!("{key}/use_original_dst"),
        l["use_original_dst"].as_bool().unwrap_or(false).to_string(),
    );
    out.insert(
        format!("{key}/traffic_direction"),
        s(&l["traffic_direction"]),
    );
    out.insert(
        format!("{key}/listener_filters"),
        names(&l["listener_filters"], "name"),
    );
    out.insert(
        format!("{key}/listener_filters_timeout"),
        s(&l["listener_filters_timeout"]),
    );
    out.insert(
        format!("{key}/continue_on_listener_filters_timeout"),
        l["continue_on_listener_filters_timeout"]
            .as_bool()
            .unwrap_or(false)
            .to_string(),
    );
    for fc in l["filter_chains"].as_array().into_iter().flatten() {
        json_filters(fc, out, &format!("{key}/chain[{}]", json_chain_match(fc)));
    }
    if l["default_filter_chain"].is_object() {
        let fc = &l["default_filter_chain"];
        json_filters(fc, out, &format!("{key}/default[{}]", s(&fc["name"])));
    }
}

// ---------------------------------------------------------------------------------------
// Reading shoal's listeners the same way

fn pb_chain_match(fc: &FilterChain) -> String {
    let m = fc.filter_chain_match.clone().unwrap_or_default();
    let prefixes = m
        .prefix_ranges
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p.address_prefix,
                p.prefix_len.as_ref().map_or(0, |l| l.value)
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "{}|{}|{}|{}|{}",
        fc.name,
        m.destination_port
            .map(|p| p.value.to_string())
            .unwrap_or_default(),
        m.transport_protocol,
        m.application_protocols.join(","),
        prefixes
    )
}

fn pb_filters(fc: &FilterChain, out: &mut Facts, key: &str) {
    let mut summary = Vec::new();
    for f in &fc.filters {
        match f.name.as_str() {
            "envoy.filters.network.tcp_proxy" => {
                let tp: TcpProxy = typed(f).expect("tcp_proxy decodes");
                let cluster = match tp.cluster_specifier {
                    Some(TcpCluster::Cluster(c)) => c,
                    Some(TcpCluster::WeightedClusters(_)) => "<weighted>".into(),
                    None => String::new(),
                };
                summary.push(format!("tcp_proxy({cluster})"));
                out.insert(format!("{key}/tcp_proxy/stat_prefix"), tp.stat_prefix);
            }
            "envoy.filters.network.http_connection_manager" => {
                let h: HttpConnectionManager = typed(f).expect("HCM decodes");
                let route = match &h.route_specifier {
                    Some(RouteSpecifier::Rds(r)) => format!("rds={}", r.route_config_name),
                    _ => "inline".into(),
                };
                summary.push(format!("hcm({route})"));
                out.insert(format!("{key}/hcm/stat_prefix"), h.stat_prefix.clone());
                http_filter_facts(
                    out,
                    key,
                    h.http_filters.iter().map(|f| f.name.clone()).collect(),
                );
                let rbac: Vec<String> = h
                    .http_filters
                    .iter()
                    .filter(|f| f.name == "envoy.filters.http.rbac")
                    .filter_map(|f| match &f.config_type {
                        Some(shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(any)) => {
                            shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac::decode(&*any.value).ok()
                        }
                        _ => None,
                    })
                    .map(|r| pb_rbac(r.rules.as_ref()))
                    .collect();
                if !rbac.is_empty() {
                    out.insert(format!("{key}/hcm/rbac_rules"), rbac.join(" | "));
                }
                if !h.server_name.is_empty() {
                    out.insert(format!("{key}/hcm/server_name"), h.server_name.clone());
                }
                if let Some(b) = h.use_remote_address {
                    out.insert(format!("{key}/hcm/use_remote_address"), b.value.to_string());
                }
                if let Some(b) = h.normalize_path {
                    out.insert(format!("{key}/hcm/normalize_path"), b.value.to_string());
                }
                if h.path_with_escaped_slashes_action != 0 {
                    let a = shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::PathWithEscapedSlashesAction::try_from(h.path_with_escaped_slashes_action)
                        .map(|a| a.as_str_name().to_string())
                        .unwrap_or_default();
                    out.insert(format!("{key}/hcm/path_with_escaped_slashes_action"), a);
                }
                if h.stream_idle_timeout.is_some() {
                    out.insert(
                        format!("{key}/hcm/stream_idle_timeout"),
                        dur(&h.stream_idle_timeout),
                    );
                }
                if h.forward_client_cert_details != 0 {
                    let a = shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::ForwardClientCertDetails::try_from(h.forward_client_cert_details)
                        .map(|a| a.as_str_name().to_string())
                        .unwrap_or_default();
                    out.insert(format!("{key}/hcm/forward_client_cert_details"), a);
                }
                if h.tracing.is_some() {
                    out.insert(format!("{key}/hcm/tracing"), "set".into());
                }
                if h.request_id_extension.is_some() {
                    out.insert(format!("{key}/hcm/request_id_extension"), "set".into());
                }
                if let Some(RouteSpecifier::Rds(r)) = &h.route_specifier {
                    out.insert(
                        format!("{key}/hcm/rds/initial_fetch_timeout"),
                        dur(&r
                            .config_source
                            .as_ref()
                            .and_then(|c| c.initial_fetch_timeout)),
                    );
                }
            }
            "envoy.filters.network.rbac" => {
                use shoal_proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac;
                let r: Rbac = typed(f).expect("network RBAC decodes");
                out.insert(format!("{key}/rbac_rules"), pb_rbac(r.rules.as_ref()));
                summary.push(f.name.clone());
            }
            other => summary.push(other.to_string()),
        }
    }
    insert_summary(out, key, summary);
}

fn pb_listener_facts(l: &Listener, out: &mut Facts) {
    let key = format!("lds/{}", l.name);
    let address = l.address.as_ref().map(socket).unwrap_or_default();
    out.insert(format!("{key}/address"), address);
    out.insert(
        format!("{key}/bind_to_port"),
        l.bind_to_port.as_ref().is_none_or(|b| b.value).to_string(),
    );
    out.insert(
        format!("{key}/use_original_dst"),
        l.use_original_dst
            .as_ref()
            .is_some_and(|b| b.value)
            .to_string(),
    );
    let direction = match l.traffic_direction {
        1 => "INBOUND",
        2 => "OUTBOUND",
        _ => "",
    };
    out.insert(format!("{key}/traffic_direction"), direction.into());
    let lf: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
    out.insert(format!("{key}/listener_filters"), lf.join(","));
    out.insert(
        format!("{key}/listener_filters_timeout"),
        dur(&l.listener_filters_timeout),
    );
    out.insert(
        format!("{key}/continue_on_listener_filters_timeout"),
        l.continue_on_listener_filters_timeout.to_string(),
    );
    for fc in &l.filter_chains {
        pb_filters(fc, out, &format!("{key}/chain[{}]", pb_chain_match(fc)));
    }
    if let Some(fc) = &l.default_filter_chain {
        pb_filters(fc, out, &format!("{key}/default[{}]", fc.name));
    }
}

// ---------------------------------------------------------------------------------------
// LDS: the httpbin sidecar (authz-configdump)

/// The services the httpbin sidecar's listeners imply, with the ports and protocols of
/// their upstream manifests (Istio 1.18 install, bookinfo, httpbin, sleep, helloworld,
/// kube-dns, metallb, Gateway API). The dump's ambient waypoint Services
/// (`*-istio-waypoint.ambient`) are left out: shoal has no ambient mode.
fn sidecar_mesh() -> Mesh {
    use Protocol::*;
    let mut httpbin = svc("default", "httpbin", "10.96.100.1", &[("http", 8000, Http)]);
    httpbin.ports[0].target_port = Some(TargetPort::Number(80));
    httpbin.selector = labels(&[("app", "httpbin")]);
    let mut m = Mesh::new()
        .with_service(httpbin)
        .with_service(svc(
            "default",
            "kubernetes",
            "10.96.0.1",
            &[("https", 443, Https)],
        ))
        .with_service(svc(
            "istio-system",
            "istiod",
            "10.108.65.203",
            &[
                ("grpc-xds", 15010, Grpc),
                ("https-dns", 15012, Https),
                ("https-webhook", 443, Https),
                ("http-monitoring", 15014, Http),
            ],
        ))
        // kube-dns: `dns` (UDP 53) never reaches the model; `dns-tcp` names no mesh
        // protocol, and 53 is one of Istio's well-known ports: TCP.
        .with_service(svc(
            "kube-system",
            "kube-dns",
            "10.96.0.10",
            &[("dns-tcp", 53, Tcp), ("metrics", 9153, Unsupported)],
        ))
        .with_service(svc(
            "metallb-system",
            "webhook-service",
            "10.100.4.52",
            &[("", 443, Unsupported)],
        ))
        .with_service(svc(
            "gateway-system",
            "gateway-api-admission-server",
            "10.98.166.148",
            &[("https", 443, Https)],
        ))
        .with_service(svc(
            "istio-ingress",
            "gateway-istio",
            "10.100.160.191",
            // Istio's gateway Services name it `appProtocol: tcp`.
            &[("status-port", 15021, Tcp)],
        ))
        .with_service(svc(
            "default",
            "sleep",
            "10.96.100.2",
            &[("http", 80, Http)],
        ))
        .with_service(svc(
            "default",
            "helloworld",
            "10.96.100.3",
            &[("http", 5000, Http)],
        ));
    // The dump's policy, as its RBAC filters spell it out (Istio's authorization docs'
    // example): from `sleep` or namespace `test`, GET /info* or POST /data, with a Google
    // token.
    m.add_config(authorization_policy(
        "default",
        "httpbin",
        "selector: {matchLabels: {app: httpbin}}\n\
         action: ALLOW\n\
         rules:\n\
         - from:\n  \
           - source: {principals: [cluster.local/ns/default/sa/sleep]}\n  \
           - source: {namespaces: [test]}\n  \
           to:\n  \
           - operation: {methods: [GET], paths: [/info*]}\n  \
           - operation: {methods: [POST], paths: [/data]}\n  \
           when:\n  \
           - key: request.auth.claims[iss]\n    \
             values: [\"https://accounts.google.com\"]\n",
    ));
    for (i, name) in ["productpage", "reviews", "ratings", "details"]
        .iter()
        .enumerate()
    {
        m.add_service(svc(
            "default",
            name,
            &format!("10.96.101.{i}"),
            &[("http", 9080, Http)],
        ));
    }
    m
}

/// The dump's proxy: istio-proxy 1.18 (so it gets Istio's telemetry filters).
fn httpbin_sidecar() -> Proxy {
    let mut p = captured_proxy(
        "default",
        "10.244.0.20",
        &[("app", "httpbin"), ("version", "v1")],
    );
    p.istio_version = Some(crate::index::proxy::IstioVersion::parse("1.18.0"));
    p.internal_listener = true;
    p
}

#[test]
fn sidecar_listeners_match_istiod() {
    let dump = golden("authz-configdump.4f44e198240.yaml");
    let mut istiod = Facts::new();
    for l in dump["configs"][0]["dynamic_listeners"]
        .as_array()
        .expect("dynamic listeners")
    {
        json_listener_facts(&l["active_state"]["listener"], &mut istiod);
    }
    let mut shoal = Facts::new();
    let resources = gen(
        XdsType::Listener,
        &httpbin_sidecar(),
        &sidecar_mesh().snapshot(),
        &[],
    );
    for l in listeners(&resources).values() {
        pb_listener_facts(l, &mut shoal);
    }
    compare(
        "LDS of the httpbin sidecar",
        &istiod,
        &shoal,
        SIDECAR_LDS_ALLOWED,
    );
}

/// Why shoal's listeners for the httpbin sidecar differ from istiod's (Istio 1.18/1.19-dev,
/// June 2023).
const SIDECAR_LDS_ALLOWED: &[Allowed] = &[
    // Ambient: the four `*-istio-waypoint.ambient` Services (HBONE 15008, status 15021)
    // are left out of the input; shoal serves no ambient mode.
    allow("lds/10.102.11.148_*", "ambient waypoint ratings"),
    allow("lds/10.111.137.16_*", "ambient waypoint reviews"),
    allow("lds/10.109.111.153_*", "ambient waypoint httpbin"),
    allow("lds/10.100.228.83_*", "ambient waypoint productpage"),
    allow("lds/connect_*", "ambient: HBONE tunnel listeners"),
    allow("lds/main_internal*", "ambient: internal listener"),
    allow(
        "lds/virtualInbound/*istio_proxy_filters",
        "version drift: istiod 1.18 put istio-proxy's `istio_authn` network filter on \
         inbound chains; istiod dropped it in 1.21 (istio/istio#47395); shoal sends the \
         rest of istio-proxy's filters as istiod at HEAD",
    ),
    allow(
        "lds/*/listener_filters",
        "deliberate: no TLS inspector on outbound HTTP listeners; their chains match \
         raw_buffer, which is the transport without it, and TLS falls to the TCP chain alike",
    ),
    allow(
        "lds/virtualInbound/chain[virtualInbound|*",
        "version drift: istiod 1.18 named the cluster InboundPassthroughClusterIpv4; \
         since the dual-stack change (Istio 1.20) it is InboundPassthroughCluster, as shoal",
    ),
    allow(
        "lds/virtualInbound/chain[virtualInbound-catchall-http*]/hcm/stat_prefix",
        "version drift: InboundPassthroughClusterIpv4 (istiod 1.18) is InboundPassthroughCluster",
    ),
];

// ---------------------------------------------------------------------------------------
// CDS: the clusters the other dumps name

#[test]
fn clusters_the_dumps_name_exist_with_istiods_types() {
    let lds = golden("authz-configdump.4f44e198240.yaml");
    let mut named = BTreeSet::new();
    let mut facts = Facts::new();
    for l in lds["configs"][0]["dynamic_listeners"]
        .as_array()
        .expect("dynamic listeners")
    {
        json_listener_facts(&l["active_state"]["listener"], &mut facts);
    }
    for v in facts.values() {
        for part in v.split(", ") {
            if let Some(c) = part
                .strip_prefix("tcp_proxy(")
                .and_then(|c| c.strip_suffix(')'))
            {
                named.insert(c.to_string());
            }
        }
    }
    let shoal = clusters(&gen(
        XdsType::Cluster,
        &httpbin_sidecar(),
        &sidecar_mesh().snapshot(),
        &[],
    ));
    let kind = |c: &Cluster| match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => match t {
            0 => "STATIC",
            1 => "STRICT_DNS",
            2 => "LOGICAL_DNS",
            3 => "EDS",
            4 => "ORIGINAL_DST",
            _ => "?",
        },
        _ => "",
    };
    // istiod's types for these names (its cluster builder): outbound service clusters
    // over EDS, the passthrough clusters to the original destination, the black hole
    // static and empty.
    let istiod_kind = |name: &str| {
        if name.starts_with("outbound|") {
            "EDS"
        } else if name == "BlackHoleCluster" {
            "STATIC"
        } else {
            "ORIGINAL_DST"
        }
    };
    let mut istiod = Facts::new();
    let mut ours = Facts::new();
    for name in &named {
        istiod.insert(format!("cds/{name}/type"), istiod_kind(name).into());
        ours.insert(
            format!("cds/{name}/type"),
            shoal.get(name).map(kind).unwrap_or("<absent>").into(),
        );
    }
    compare("CDS names and types", &istiod, &ours, CDS_ALLOWED);
}

const CDS_ALLOWED: &[Allowed] = &[
    allow(
        "cds/InboundPassthroughClusterIpv4/type",
        "version drift: InboundPassthroughCluster since Istio 1.20 (present in shoal)",
    ),
    allow(
        "cds/outbound|*istio-waypoint.ambient*",
        "ambient: waypoint Services are not in shoal's mesh",
    ),
];
