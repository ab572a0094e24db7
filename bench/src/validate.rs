//! The checks a simulated proxy makes before accepting a resource: a subset of what Envoy
//! rejects (NACKs) a configuration for, chosen because a control plane can get them wrong
//! and they are cheap to check. A resource failing one is NACKed, as Envoy would.
//!
//! - Clusters: a name; an EDS cluster has an `eds_config`; `ORIGINAL_DST` goes with
//!   `CLUSTER_PROVIDED` and no `load_assignment` endpoints, and `CLUSTER_PROVIDED` with
//!   `ORIGINAL_DST` only.
//! - Listeners: a name and a socket address; no two filter chains with the same match; in
//!   each chain the terminal filter (`http_connection_manager`, `tcp_proxy`) comes last and
//!   only there; an HTTP connection manager has a `stat_prefix`, a route specifier (an RDS
//!   `config_source`, or an inline table that passes the route checks) and the router as
//!   its last HTTP filter; a `tcp_proxy` has a `stat_prefix` and a cluster (weighted ones
//!   with weights ≥ 1).
//! - Route tables: virtual host names and domains unique in the table, every virtual host
//!   with a name and a domain, every route with a match and an action.
//! - Across a proxy's listeners (checked by the client): no two with one address.
//!
//! It also collects what a resource refers to — the route tables a listener names over RDS,
//! the clusters its `tcp_proxy` filters and inline routes use, the clusters a route table
//! routes to — so the client can subscribe to the route tables and check that every
//! cluster referred to exists.

use prost::Message;
use shoal_proto::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    Cluster,
};
use shoal_proto::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
use shoal_proto::pb::envoy::config::listener::v3::{filter::ConfigType, FilterChain, Listener};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, RouteConfiguration,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::ClusterSpecifier as TcpClusterSpecifier, TcpProxy,
};
use std::collections::HashSet;

const HCM: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// What a cluster implies.
#[derive(Debug, Clone, Default)]
pub struct ClusterInfo {
    /// The EDS service name, for an EDS cluster.
    pub eds: Option<String>,
    /// Why a proxy would reject it.
    pub problem: Option<String>,
}

/// Decodes and checks a cluster. `Err`: not a Cluster at all.
pub fn cluster(body: &[u8]) -> Result<ClusterInfo, String> {
    let c = Cluster::decode(body).map_err(|e| format!("bad Cluster: {e}"))?;
    let ty = match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t).ok(),
        // cluster_type (extension clusters): none of the checks below apply.
        Some(ClusterDiscoveryType::ClusterType(_)) => None,
        None => Some(DiscoveryType::Static),
    };
    let lb = LbPolicy::try_from(c.lb_policy).ok();
    let mut problem = None;
    if c.name.is_empty() {
        problem = Some("a cluster without a name".to_string());
    } else if ty == Some(DiscoveryType::Eds)
        && c.eds_cluster_config
            .as_ref()
            .is_none_or(|e| e.eds_config.is_none())
    {
        problem = Some(format!("EDS cluster {} without eds_config", c.name));
    } else if ty == Some(DiscoveryType::OriginalDst) && lb != Some(LbPolicy::ClusterProvided) {
        problem = Some(format!(
            "ORIGINAL_DST cluster {} with LB policy {:?}: only CLUSTER_PROVIDED is allowed",
            c.name, lb
        ));
    } else if ty == Some(DiscoveryType::OriginalDst)
        && c.load_assignment
            .as_ref()
            .is_some_and(|l| l.endpoints.iter().any(|e| !e.lb_endpoints.is_empty()))
    {
        problem = Some(format!(
            "ORIGINAL_DST cluster {} with endpoints in load_assignment",
            c.name
        ));
    } else if lb == Some(LbPolicy::ClusterProvided)
        && ty.is_some()
        && ty != Some(DiscoveryType::OriginalDst)
    {
        problem = Some(format!(
            "cluster {} of type {:?} with LB policy CLUSTER_PROVIDED (ORIGINAL_DST only)",
            c.name, ty
        ));
    }
    let eds = (ty == Some(DiscoveryType::Eds)).then(|| {
        c.eds_cluster_config
            .map(|e| e.service_name)
            .filter(|s| !s.is_empty())
            .unwrap_or(c.name)
    });
    Ok(ClusterInfo { eds, problem })
}

/// What a listener implies.
#[derive(Debug, Clone, Default)]
pub struct ListenerInfo {
    /// `ip:port` it listens on.
    pub address: Option<String>,
    /// Route tables its HTTP connection managers name over RDS.
    pub routes: Vec<String>,
    /// Clusters its `tcp_proxy` filters and inline route tables send to.
    pub clusters: Vec<String>,
    /// Why a proxy would reject it.
    pub problem: Option<String>,
}

/// Decodes and checks a listener. `Err`: not a Listener at all.
pub fn listener(body: &[u8]) -> Result<ListenerInfo, String> {
    let l = Listener::decode(body).map_err(|e| format!("bad Listener: {e}"))?;
    let mut info = ListenerInfo {
        address: l.address.as_ref().and_then(|a| match &a.address {
            Some(address::Address::SocketAddress(s)) => match s.port_specifier {
                Some(PortSpecifier::PortValue(p)) => Some(format!("{}:{p}", s.address)),
                _ => Some(s.address.clone()),
            },
            _ => None,
        }),
        ..Default::default()
    };
    let mut problems = Vec::new();
    if l.name.is_empty() {
        problems.push("no name".to_string());
    }
    if info.address.is_none() {
        problems.push("no socket address".to_string());
    }
    let mut matches = Vec::new();
    for (i, chain) in l.filter_chains.iter().enumerate() {
        let m = chain.filter_chain_match.clone().unwrap_or_default();
        if let Some(j) = matches.iter().position(|x| *x == m) {
            problems.push(format!(
                "filter chains {j} ({:?}) and {i} ({:?}) have the same match {m:?}",
                l.filter_chains[j].name, chain.name
            ));
        }
        matches.push(m);
        check_chain(chain, &mut info, &mut problems);
    }
    if let Some(chain) = &l.default_filter_chain {
        check_chain(chain, &mut info, &mut problems);
    }
    if !problems.is_empty() {
        info.problem = Some(format!("listener {}: {}", l.name, problems.join("; ")));
    }
    info.routes.sort();
    info.routes.dedup();
    info.clusters.sort();
    info.clusters.dedup();
    Ok(info)
}

fn check_chain(chain: &FilterChain, info: &mut ListenerInfo, problems: &mut Vec<String>) {
    let name = &chain.name;
    let last = chain.filters.len().saturating_sub(1);
    for (i, f) in chain.filters.iter().enumerate() {
        let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        let terminal = any.type_url == HCM || any.type_url == TCP_PROXY;
        if terminal && i != last {
            problems.push(format!(
                "chain {name:?}: terminal filter {} is not the last",
                f.name
            ));
        }
        if any.type_url == HCM {
            match HttpConnectionManager::decode(any.value.as_slice()) {
                Ok(hcm) => check_hcm(&hcm, name, info, problems),
                Err(e) => problems.push(format!("chain {name:?}: bad HttpConnectionManager: {e}")),
            }
        } else if any.type_url == TCP_PROXY {
            match TcpProxy::decode(any.value.as_slice()) {
                Ok(t) => check_tcp_proxy(&t, name, info, problems),
                Err(e) => problems.push(format!("chain {name:?}: bad TcpProxy: {e}")),
            }
        }
    }
}

fn check_hcm(
    hcm: &HttpConnectionManager,
    chain: &str,
    info: &mut ListenerInfo,
    problems: &mut Vec<String>,
) {
    if hcm.stat_prefix.is_empty() {
        problems.push(format!("chain {chain:?}: HCM without stat_prefix"));
    }
    match &hcm.route_specifier {
        Some(RouteSpecifier::Rds(rds)) => {
            if rds.config_source.is_none() {
                problems.push(format!("chain {chain:?}: RDS without config_source"));
            }
            if rds.route_config_name.is_empty() {
                problems.push(format!("chain {chain:?}: RDS without route_config_name"));
            }
            info.routes.push(rds.route_config_name.clone());
        }
        Some(RouteSpecifier::RouteConfig(rc)) => {
            let r = route_table(rc);
            info.clusters.extend(r.clusters);
            if let Some(p) = r.problem {
                problems.push(format!("chain {chain:?}: inline {p}"));
            }
        }
        Some(RouteSpecifier::ScopedRoutes(_)) => {}
        None => problems.push(format!("chain {chain:?}: HCM without route specifier")),
    }
    let router = |f: &shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter| {
        matches!(&f.config_type, Some(http_filter::ConfigType::TypedConfig(a)) if a.type_url == ROUTER)
    };
    if let Some(pos) = hcm.http_filters.iter().position(router) {
        if pos + 1 != hcm.http_filters.len() {
            problems.push(format!(
                "chain {chain:?}: the router is not the last HTTP filter"
            ));
        }
    } else if !hcm.http_filters.is_empty() {
        problems.push(format!("chain {chain:?}: HTTP filters without the router"));
    }
}

fn check_tcp_proxy(t: &TcpProxy, chain: &str, info: &mut ListenerInfo, problems: &mut Vec<String>) {
    if t.stat_prefix.is_empty() {
        problems.push(format!("chain {chain:?}: tcp_proxy without stat_prefix"));
    }
    match &t.cluster_specifier {
        Some(TcpClusterSpecifier::Cluster(c)) if !c.is_empty() => info.clusters.push(c.clone()),
        Some(TcpClusterSpecifier::WeightedClusters(w)) if !w.clusters.is_empty() => {
            for c in &w.clusters {
                if c.name.is_empty() || c.weight == 0 {
                    problems.push(format!(
                        "chain {chain:?}: tcp_proxy weighted cluster {:?} with weight {}",
                        c.name, c.weight
                    ));
                }
                info.clusters.push(c.name.clone());
            }
        }
        _ => problems.push(format!("chain {chain:?}: tcp_proxy without a cluster")),
    }
}

/// What a route table implies.
#[derive(Debug, Clone, Default)]
pub struct RouteInfo {
    /// Clusters its routes send to.
    pub clusters: Vec<String>,
    /// Why a proxy would reject it.
    pub problem: Option<String>,
}

/// Decodes and checks a route table. `Err`: not a RouteConfiguration at all.
pub fn route(body: &[u8]) -> Result<RouteInfo, String> {
    let rc =
        RouteConfiguration::decode(body).map_err(|e| format!("bad RouteConfiguration: {e}"))?;
    Ok(route_table(&rc))
}

fn route_table(rc: &RouteConfiguration) -> RouteInfo {
    let mut problems = Vec::new();
    let mut names = HashSet::new();
    let mut domains: HashSet<&str> = HashSet::new();
    let mut clusters = HashSet::new();
    for vh in &rc.virtual_hosts {
        if vh.name.is_empty() {
            problems.push("a virtual host without a name".to_string());
        } else if !names.insert(vh.name.as_str()) {
            problems.push(format!("duplicate virtual host name {:?}", vh.name));
        }
        if vh.domains.is_empty() {
            problems.push(format!("virtual host {:?} without domains", vh.name));
        }
        for d in &vh.domains {
            if !domains.insert(d.as_str()) {
                problems.push(format!(
                    "duplicate domain {d:?} (virtual host {:?})",
                    vh.name
                ));
            }
        }
        for r in &vh.routes {
            if r.r#match
                .as_ref()
                .is_none_or(|m| m.path_specifier.is_none())
            {
                problems.push(format!(
                    "virtual host {:?}: route {:?} without a path match",
                    vh.name, r.name
                ));
            }
            match &r.action {
                None => problems.push(format!(
                    "virtual host {:?}: route {:?} without an action",
                    vh.name, r.name
                )),
                Some(Action::Route(ra)) => match &ra.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => {
                        clusters.insert(c.clone());
                    }
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        clusters.extend(w.clusters.iter().map(|c| c.name.clone()));
                    }
                    Some(_) => {}
                    None => problems.push(format!(
                        "virtual host {:?}: route {:?} without a cluster",
                        vh.name, r.name
                    )),
                },
                Some(_) => {}
            }
        }
    }
    problems.truncate(5);
    let mut clusters: Vec<String> = clusters.into_iter().collect();
    clusters.sort();
    RouteInfo {
        clusters,
        problem: (!problems.is_empty())
            .then(|| format!("route table {:?}: {}", rc.name, problems.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;
    use shoal_proto::pb::envoy::config::core::v3::ConfigSource;
    use shoal_proto::pb::envoy::config::listener::v3::{Filter, FilterChainMatch};
    use shoal_proto::pb::envoy::config::route::v3::VirtualHost;
    use shoal_proto::pb::google::protobuf::{Any, UInt32Value};

    fn tcp_filter(cluster: &str) -> Filter {
        let t = TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(TcpClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        };
        Filter {
            name: "envoy.filters.network.tcp_proxy".into(),
            config_type: Some(ConfigType::TypedConfig(Any {
                type_url: TCP_PROXY.into(),
                value: t.encode_to_vec(),
            })),
        }
    }

    #[test]
    fn finds_duplicate_chain_matches_and_collects_clusters() {
        let chain = |name: &str, port: u32| FilterChain {
            name: name.into(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: Some(UInt32Value { value: port }),
                ..Default::default()
            }),
            filters: vec![tcp_filter(&format!("c{port}"))],
            ..Default::default()
        };
        let mut l = Listener {
            name: "l".into(),
            filter_chains: vec![chain("a", 1), chain("b", 2)],
            ..Default::default()
        };
        let info = listener(&l.encode_to_vec()).unwrap();
        assert_eq!(info.clusters, ["c1", "c2"]);
        // No address.
        assert!(info.problem.unwrap().contains("no socket address"));
        l.filter_chains.push(chain("c", 1));
        let info = listener(&l.encode_to_vec()).unwrap();
        assert!(info.problem.unwrap().contains("same match"));
    }

    #[test]
    fn checks_clusters_and_routes() {
        let mut c = Cluster {
            name: "outbound|80||a".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                eds_config: Some(ConfigSource::default()),
                service_name: String::new(),
            }),
            ..Default::default()
        };
        let info = cluster(&c.encode_to_vec()).unwrap();
        assert_eq!(info.eds.as_deref(), Some("outbound|80||a"));
        assert!(info.problem.is_none());
        c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        ));
        assert!(cluster(&c.encode_to_vec()).unwrap().problem.is_some());
        c.lb_policy = LbPolicy::ClusterProvided as i32;
        assert!(cluster(&c.encode_to_vec()).unwrap().problem.is_none());

        let vh = |name: &str, domain: &str| VirtualHost {
            name: name.into(),
            domains: vec![domain.into()],
            ..Default::default()
        };
        let rc = RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![vh("a", "a"), vh("b", "a")],
            ..Default::default()
        };
        let p = route(&rc.encode_to_vec()).unwrap().problem.unwrap();
        assert!(p.contains("duplicate domain"), "{p}");
    }
}
