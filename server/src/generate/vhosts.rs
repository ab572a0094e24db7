//! Sidecar route tables' default virtual hosts, encoded once and shared by every table.
//!
//! In Istio's default mesh a sidecar route table of a port lists a virtual host for every
//! service with that port, and all but the few a VirtualService claims are the service's
//! default one: its domains and one route to its outbound cluster. Between the tables of
//! different namespaces they differ only by the short-name domain (a table of the
//! service's own namespace has it). So each default virtual host is built and encoded once
//! per (service, port, same namespace or not) and its bytes are copied into every table
//! that lists it ([`super::rds`]). A VirtualService change rebuilds the tables of its port,
//! but builds only the virtual hosts the VirtualService claims, not the thousand others.
//!
//! Entries are kept in a [`Fingerprinted`] cache, like the generator cache's, keyed by
//! their inputs. The cache is the process's (route tables are built from their keys
//! alone); a generator cache made with its assert mode on (`--cache-assert`) turns on the
//! same check here: every hit is rebuilt and the process aborts if the bytes differ.

use super::cache::{Digest, Fingerprinted, Mismatch};
use super::http_route::{catch_all_match, default_retry_policy};
use super::pb_duration;
use crate::hashing::FastSet;
use crate::index::service::{ServiceSource, ServiceView};
use prost::Message as _;
use shoal_proto::outbound_cluster_name;
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, Route, RouteAction, VirtualHost,
};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// How long an entry no table asked for stays: longer than the time between config
/// changes, which are what rebuild tables (a change of a service makes a new entry for it;
/// the old one goes after this).
const IDLE: Duration = Duration::from_secs(600);

/// Most bytes of encoded virtual hosts kept (about 400 B each: 1 000 services with one
/// port take under 1 MB, both variants).
const MAX_BYTES: u64 = 64 << 20;

/// Per-entry overhead counted on top of the encoded bytes (inputs, domains, bookkeeping).
const ENTRY_OVERHEAD: usize = 512;

/// A service's default virtual host on one port, for the tables of one side of its
/// namespace.
pub(crate) struct DefaultHost {
    /// Its domains, sorted, as the virtual host lists them.
    pub domains: Vec<String>,
    /// The encoded `VirtualHost`.
    pub encoded: Vec<u8>,
}

/// What a default virtual host is built from: borrowed from the service to look it up,
/// owned in the cache.
#[derive(Clone, Hash, PartialEq, Eq)]
struct Inputs<'a> {
    hostname: Cow<'a, str>,
    name: Cow<'a, str>,
    namespace: Cow<'a, str>,
    kubernetes: bool,
    vips: Cow<'a, [String]>,
    port: u32,
    same_namespace: bool,
}

impl<'a> Inputs<'a> {
    fn of(svc: &'a ServiceView, port: u32, proxy_namespace: &str) -> Inputs<'a> {
        Inputs {
            hostname: Cow::Borrowed(&svc.hostname),
            name: Cow::Borrowed(&svc.name),
            namespace: Cow::Borrowed(&svc.namespace),
            kubernetes: svc.source == ServiceSource::Kubernetes,
            vips: Cow::Borrowed(&svc.vips),
            port,
            same_namespace: svc.namespace == proxy_namespace,
        }
    }

    fn into_owned(self) -> Inputs<'static> {
        Inputs {
            hostname: Cow::Owned(self.hostname.into_owned()),
            name: Cow::Owned(self.name.into_owned()),
            namespace: Cow::Owned(self.namespace.into_owned()),
            kubernetes: self.kubernetes,
            vips: Cow::Owned(self.vips.into_owned()),
            port: self.port,
            same_namespace: self.same_namespace,
        }
    }
}

static HOSTS: LazyLock<Fingerprinted<Inputs<'static>, Arc<DefaultHost>>> = LazyLock::new(|| {
    Fingerprinted::new(MAX_BYTES, IDLE, |h: &Arc<DefaultHost>| {
        h.encoded.len().saturating_add(ENTRY_OVERHEAD)
    })
});

/// Whether hits are checked against a rebuild (see [`check_hits`]).
static ASSERT: AtomicBool = AtomicBool::new(false);

/// Checks every hit from now on against a rebuild, aborting the process on a difference
/// (the generator cache's assert mode, for the whole process).
pub(crate) fn check_hits() {
    ASSERT.store(true, Ordering::Relaxed);
}

/// Entries and weighted size (bytes) of the shared virtual hosts, for `/debug/cachez`.
pub fn stats() -> (u64, u64) {
    HOSTS.stats()
}

/// `svc`'s default virtual host on `port` in a table of `proxy_namespace`'s sidecars
/// (Envoy sidecars': bare-host domains), shared.
pub(crate) fn default_host(
    svc: &ServiceView,
    port: u32,
    proxy_namespace: &str,
) -> Arc<DefaultHost> {
    let inputs = Inputs::of(svc, port, proxy_namespace);
    let entry = || {
        (
            inputs.clone().into_owned(),
            build(svc, port, proxy_namespace),
        )
    };
    let (host, hit) = HOSTS.get(&inputs, |kept| *kept == inputs, entry);
    if hit && ASSERT.load(Ordering::Relaxed) {
        let fresh = build(svc, port, proxy_namespace);
        if fresh.encoded != host.encoded || fresh.domains != host.domains {
            let digest = |h: &DefaultHost| Digest {
                resources: h.domains.len(),
                bytes: h.encoded.len(),
                hash: shoal_proto::content_version(&h.encoded),
            };
            Mismatch {
                what: "shared virtual host",
                key: format!("{}:{port} for namespace {proxy_namespace}", svc.hostname),
                served: digest(&host),
                fresh: digest(&fresh),
            }
            .abort();
        }
    }
    host
}

fn build(svc: &ServiceView, port: u32, proxy_namespace: &str) -> Arc<DefaultHost> {
    let domains = unique_domains(
        service_domains(svc, None, proxy_namespace),
        &mut FastSet::default(),
    );
    let vh = virtual_host(svc, port, domains, Vec::new());
    Arc::new(DefaultHost {
        encoded: vh.encode_to_vec(),
        domains: vh.domains,
    })
}

/// `svc`'s virtual host on `port` with these domains and routes; no routes: the default
/// route to the service's outbound cluster.
pub(crate) fn virtual_host(
    svc: &ServiceView,
    port: u32,
    domains: Vec<String>,
    mut routes: Vec<Route>,
) -> VirtualHost {
    if routes.is_empty() {
        routes.push(default_route(&outbound_cluster_name(
            port,
            "",
            &svc.hostname,
        )));
    }
    VirtualHost {
        name: format!("{}:{port}", svc.hostname),
        domains,
        routes,
        include_request_attempt_count: true,
        ..Default::default()
    }
}

/// The domains a sidecar reaches a service by, as Istio builds them: the FQDN, `name.ns`
/// and `name.ns.svc` (Kubernetes), the short name (same namespace only), the VIPs — each
/// also with `:port` when `port` is given.
pub(crate) fn service_domains(svc: &ServiceView, port: Option<u32>, proxy_ns: &str) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    if svc.source == ServiceSource::Kubernetes {
        if svc.namespace == proxy_ns {
            names.push(svc.name.clone());
        }
        names.push(format!("{}.{}", svc.name, svc.namespace));
        names.push(format!("{}.{}.svc", svc.name, svc.namespace));
    }
    names.extend(svc.vips.iter().cloned());
    match port {
        Some(port) => names
            .into_iter()
            .flat_map(|n| [format!("{n}:{port}"), n])
            .collect(),
        None => names,
    }
}

/// Drops domains already used by an earlier virtual host (recorded in `seen`), sorted:
/// Envoy rejects a route table in which two virtual hosts share a domain.
pub(crate) fn unique_domains(domains: Vec<String>, seen: &mut FastSet<String>) -> Vec<String> {
    let mut out: Vec<String> = domains
        .into_iter()
        .filter(|d| seen.insert(d.clone()))
        .collect();
    out.sort();
    out
}

fn default_route(cluster: &str) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(catch_all_match()),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
            timeout: Some(pb_duration(std::time::Duration::ZERO)),
            // istiod's `setTimeout`: `grpc-timeout` honoured, without a cap.
            #[allow(deprecated)]
            max_grpc_timeout: Some(pb_duration(std::time::Duration::ZERO)),
            retry_policy: Some(default_retry_policy()),
            ..Default::default()
        })),
        ..Default::default()
    }
}
