//! The PushContext: an immutable, indexed snapshot of services and Istio config that the
//! generators read. Rebuilt (off the hot path) only when config or services change; readers
//! hold an `Arc` and never lock.

use crate::index::config::Config;
use crate::index::destination_rule::{destination_hash, DestinationRuleIndex, MergedRule};
use crate::index::hosts::{labels_match, resolve_host};
use crate::index::mesh_config::MeshSettings;
use crate::index::service::{ServiceSource, ServiceView};
use crate::index::store::MeshState;
use shoal_common::credential::TlsCredential;
use shoal_common::model::{
    AuthorizationPolicy, ConfigSpec, ConsistentHashLb, DestinationRule, Gateway,
    PeerAuthentication, Protocol, RequestAuthentication, Resolution, ServiceEntry, ServicePort,
    Sidecar, VirtualService, WorkloadEntry,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The indexed snapshot.
#[derive(Debug, Default)]
pub struct PushContext {
    /// Services by hostname: the first definition of each host.
    pub services: BTreeMap<String, Arc<ServiceView>>,
    /// Further definitions of a host from other namespaces (ServiceEntries), in order: a
    /// proxy sees its own namespace's definition first (see `ProxyScope::compute`).
    pub shadowed: BTreeMap<String, Vec<Arc<ServiceView>>>,
    /// VirtualServices in istiod's precedence order: creation time, then name, then
    /// namespace (see `ObjectMeta::precedence`). Roots come merged with their delegates
    /// (`crate::index::delegation`).
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Every DestinationRule, by `namespace/name`.
    pub destination_rules: BTreeMap<String, Arc<Config<DestinationRule>>>,
    /// DestinationRules indexed and merged as istiod does (see [`DestinationRuleIndex`]).
    pub destination_rule_index: DestinationRuleIndex,
    /// Gateways in (namespace, name) order.
    pub gateways: Vec<Arc<Config<Gateway>>>,
    /// Sidecars by namespace, in name order.
    pub sidecars: BTreeMap<String, Vec<Arc<Config<Sidecar>>>>,
    /// PeerAuthentications by namespace, oldest first (istiod's order: creation time, then
    /// name; see `crate::index::peer_authentication`).
    pub peer_authentications: BTreeMap<String, Vec<Arc<Config<PeerAuthentication>>>>,
    /// AuthorizationPolicies by namespace, in name order.
    pub authorization_policies: BTreeMap<String, Vec<Arc<Config<AuthorizationPolicy>>>>,
    /// WorkloadEntries in (namespace, name) order, their `spec.labels` merged with their
    /// metadata labels (the metadata's win), as istiod's ambient index reads them
    /// (`ConvertClientWorkloadEntry`): ztunnel's workloads (`generate::ambient`).
    pub workload_entries: Vec<Arc<Config<WorkloadEntry>>>,
    /// ServiceEntries in (namespace, name) order: ztunnel's workloads of their inline
    /// endpoints (`generate::ambient`).
    pub service_entries: Vec<Arc<Config<ServiceEntry>>>,
    /// RequestAuthentications by namespace, in name order.
    pub request_authentications: BTreeMap<String, Vec<Arc<Config<RequestAuthentication>>>>,
    /// Keys fetched for RequestAuthentications' `jwksUri`s, by URI (a JWKS document each).
    pub jwks: Arc<BTreeMap<String, Arc<str>>>,
    /// Mesh-wide settings.
    pub mesh: Arc<MeshSettings>,
    /// Gateway credentials, opened, by (namespace, Secret name), then by the cluster the
    /// Secret is in.
    pub credentials: BTreeMap<(String, String), BTreeMap<String, Arc<TlsCredential>>>,
    /// The clusters with a published token issuer: the clusters whose tokens are accepted,
    /// so whose workloads the CA may have issued a client certificate to (see
    /// `generate::sds`).
    pub token_issuers: BTreeSet<String>,
    /// Every label key that config reads from a proxy's own labels when building its
    /// outbound configuration (clusters' DestinationRules, routes, endpoints): Sidecar and
    /// DestinationRule workload selectors, Gateway selectors, VirtualService
    /// `sourceLabels`, DestinationRule `failoverPriority`. Two proxies that agree on these
    /// keys get the same outbound configuration, so they share it (`push::view`'s parts).
    pub outbound_label_keys: BTreeSet<String>,
    /// What load assignments read from the context (services, ServiceEntries,
    /// WorkloadEntries, Sidecars, DestinationRules, mesh settings), as an epoch: two
    /// contexts with the same value have the same of those, so an assignment whose
    /// endpoint shards did not change is the same in both. Unique per build unless the
    /// pipeline carries it over a change that touched none of them
    /// ([`PushContext::keep_endpoint_inputs`]).
    pub endpoint_inputs: u64,
    /// The east-west gateways of every network (from gateway Services and `meshNetworks`):
    /// load assignments replace other networks' endpoints by them.
    pub network_gateways: Arc<crate::index::network::NetworkGateways>,
    /// `meshNetworks` of the mesh settings, shared by the load assignments' keys.
    pub mesh_networks: Arc<crate::index::network::MeshNetworks>,
    /// Each cluster's network, from its system namespace's `topology.istio.io/network`
    /// label (as the ingester publishes it with the cluster's endpoint slices): the network
    /// of a proxy without `NETWORK` metadata. The pipeline rebuilds the context when it
    /// changes.
    pub cluster_networks: BTreeMap<String, String>,
    /// This context's identity, unique in the process: what outputs built from it record
    /// instead of holding the context (see `push::view`).
    pub id: ContextId,
    /// What proxy scopes read from the context ([`ProxyScope::compute`]: the services, the
    /// Sidecars, the mesh's root namespace and outbound traffic policy), as an identity:
    /// two contexts with the same value have the same of those, so a view keeps its scope
    /// across them. Fresh for every context made, unless [`PushContext::share_unchanged`]
    /// finds all of them the same as in the context before and takes over its value.
    ///
    /// [`ProxyScope::compute`]: crate::index::scope::ProxyScope::compute
    pub scope_inputs: ContextId,
}

/// A PushContext's identity: unique per context made (built or defaulted), so that what
/// was computed from a context can remember which one without keeping it alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextId(u64);

/// Source of fresh [`ContextId`]s.
static CONTEXT_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Default for ContextId {
    fn default() -> Self {
        ContextId(CONTEXT_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Source of fresh [`PushContext::endpoint_inputs`] epochs.
static ENDPOINT_INPUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl PushContext {
    /// Builds the context from the store.
    pub fn build(state: &MeshState) -> PushContext {
        let mut ctx = PushContext {
            mesh: state.mesh.clone(),
            token_issuers: state.token_issuers.clone(),
            jwks: state.jwks.clone(),
            endpoint_inputs: ENDPOINT_INPUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            network_gateways: Arc::new(crate::index::network::NetworkGateways::build(
                state.services.values().map(|s| &**s),
                &state.mesh.mesh_networks,
            )),
            mesh_networks: Arc::new(state.mesh.mesh_networks.clone()),
            cluster_networks: state.endpoints.cluster_networks(),
            ..PushContext::default()
        };
        // Kubernetes services: merge clusters by hostname. The (cluster, ns, name) order makes
        // the merge deterministic: the first cluster's ports win, VIPs are unioned.
        for svc in state.services.values() {
            let view = ctx.services.entry(svc.hostname.clone()).or_insert_with(|| {
                let mut ports = svc.ports.clone();
                ports.sort_by_key(|p| p.port);
                Arc::new(ServiceView {
                    hostname: svc.hostname.clone(),
                    name: svc.meta.name.clone(),
                    namespace: svc.meta.namespace.clone(),
                    ports,
                    target_ports: BTreeMap::new(),
                    vips: Vec::new(),
                    cluster_vips: BTreeMap::new(),
                    export_to: svc.export_to.clone(),
                    source: ServiceSource::Kubernetes,
                    selector: svc.selector.clone(),
                })
            });
            let view = Arc::make_mut(view);
            if !svc.cluster_ips.is_empty() {
                view.cluster_vips
                    .entry(svc.cluster.clone())
                    .or_default()
                    .extend(svc.cluster_ips.iter().cloned());
            }
            for ip in &svc.cluster_ips {
                if !view.vips.contains(ip) {
                    view.vips.push(ip.clone());
                }
            }
        }

        let mut workload_entries: BTreeMap<String, Vec<(String, WorkloadEntry)>> = BTreeMap::new();
        for obj in state.config.values() {
            if let ConfigSpec::WorkloadEntry(we) = &obj.spec {
                workload_entries
                    .entry(obj.meta.namespace.clone())
                    .or_default()
                    .push((obj.meta.name.clone(), we.clone()));
            }
        }

        // The Gateway API, as istiod serves it: Istio Gateways and VirtualServices.
        let translated = super::gateway_api::translate(state.config.values().map(|o| &**o));
        ctx.gateways
            .extend(translated.gateways.into_iter().map(Arc::new));
        ctx.virtual_services
            .extend(translated.virtual_services.into_iter().map(Arc::new));

        for obj in state.config.values() {
            let meta = obj.meta.clone();
            match &obj.spec {
                ConfigSpec::VirtualService(vs) => ctx.virtual_services.push(Arc::new(Config {
                    meta,
                    spec: vs.clone(),
                })),
                ConfigSpec::DestinationRule(dr) => {
                    let key = format!("{}/{}", meta.namespace, meta.name);
                    ctx.destination_rules.insert(
                        key,
                        Arc::new(Config {
                            meta,
                            spec: dr.clone(),
                        }),
                    );
                }
                ConfigSpec::Gateway(gw) => ctx.gateways.push(Arc::new(Config {
                    meta,
                    spec: gw.clone(),
                })),
                ConfigSpec::PeerAuthentication(pa) => ctx
                    .peer_authentications
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: pa.clone(),
                    })),
                ConfigSpec::AuthorizationPolicy(ap) => ctx
                    .authorization_policies
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: ap.clone(),
                    })),
                ConfigSpec::RequestAuthentication(ra) => ctx
                    .request_authentications
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: ra.clone(),
                    })),
                ConfigSpec::Sidecar(sc) => ctx
                    .sidecars
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: sc.clone(),
                    })),
                ConfigSpec::ServiceEntry(se) => {
                    ctx.service_entries.push(Arc::new(Config {
                        meta: meta.clone(),
                        spec: se.clone(),
                    }));
                    let mut endpoints = se.endpoints.clone();
                    if let Some(sel) = &se.workload_selector {
                        for (_, we) in workload_entries.get(&meta.namespace).into_iter().flatten() {
                            if labels_match(&sel.labels, &we.labels) {
                                endpoints.push(we.clone());
                            }
                        }
                    }
                    endpoints.sort_by(|a, b| a.address.cmp(&b.address));
                    let mut ports: Vec<ServicePort> = Vec::new();
                    let mut target_ports = BTreeMap::new();
                    for p in &se.ports {
                        let Ok(number) = u16::try_from(p.number) else {
                            continue;
                        };
                        ports.push(ServicePort {
                            name: p.name.clone(),
                            port: number,
                            protocol: Protocol::parse(&p.protocol),
                            target_port: None,
                        });
                        if let Some(t) = p.target_port.and_then(|t| u16::try_from(t).ok()) {
                            target_ports.insert(number, t);
                        }
                    }
                    ports.sort_by_key(|p| p.port);
                    let resolution = se.resolution.unwrap_or(Resolution::None);
                    for host in &se.hosts {
                        let view = || {
                            Arc::new(ServiceView {
                                hostname: host.clone(),
                                name: host.clone(),
                                namespace: meta.namespace.clone(),
                                ports: ports.clone(),
                                target_ports: target_ports.clone(),
                                vips: se.addresses.clone(),
                                cluster_vips: BTreeMap::new(),
                                export_to: se.export_to.clone(),
                                source: ServiceSource::ServiceEntry {
                                    resolution,
                                    endpoints: endpoints.clone(),
                                    mesh_internal: se.location.as_deref() == Some("MESH_INTERNAL"),
                                },
                                selector: se
                                    .workload_selector
                                    .as_ref()
                                    .map(|w| w.labels.clone())
                                    .unwrap_or_default(),
                            })
                        };
                        // A Kubernetes service of the same name keeps precedence, as in
                        // Istio. The same host defined in another namespace is kept too:
                        // which one a proxy sees depends on its namespace (see
                        // `ProxyScope`), as istiod resolves hosts per namespace.
                        match ctx.services.get(host) {
                            None => {
                                ctx.services.insert(host.clone(), view());
                            }
                            Some(first)
                                if first.namespace != meta.namespace
                                    && !ctx.shadowed.get(host).is_some_and(|v| {
                                        v.iter().any(|s| s.namespace == meta.namespace)
                                    }) =>
                            {
                                ctx.shadowed.entry(host.clone()).or_default().push(view());
                            }
                            Some(_) => {}
                        }
                    }
                }
                ConfigSpec::WorkloadEntry(we) => {
                    let mut spec = we.clone();
                    spec.labels
                        .extend(meta.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                    ctx.workload_entries.push(Arc::new(Config { meta, spec }));
                }
                // Translated above (`gateway_api::translate`).
                ConfigSpec::GatewayClass(_)
                | ConfigSpec::KubeGateway(_)
                | ConfigSpec::HTTPRoute(_)
                | ConfigSpec::GRPCRoute(_)
                | ConfigSpec::TCPRoute(_)
                | ConfigSpec::TLSRoute(_)
                | ConfigSpec::ReferenceGrant(_)
                // Read by the translation: namespace labels for `allowedRoutes` selectors.
                | ConfigSpec::Namespace(_) => {}
                ConfigSpec::Credential(sealed) => {
                    let secret = format!("{}/{}", meta.namespace, meta.name);
                    let Some(keys) = &state.credential_keys else {
                        tracing::warn!(
                            %secret, cluster = %sealed.cluster,
                            "gateway credential on the bus, but no --credential-key-file to \
                             open it: not served"
                        );
                        continue;
                    };
                    match keys.open(&sealed.cluster, &meta.namespace, &meta.name, sealed) {
                        Ok(c) => {
                            ctx.credentials
                                .entry((meta.namespace, meta.name))
                                .or_default()
                                .insert(sealed.cluster.clone(), Arc::new(c));
                        }
                        Err(error) => tracing::warn!(
                            %secret, cluster = %sealed.cluster, %error,
                            "gateway credential does not open: not served"
                        ),
                    }
                }
            }
        }
        let rules: Vec<_> = ctx.destination_rules.values().cloned().collect();
        ctx.destination_rule_index = DestinationRuleIndex::build(&rules, &ctx.mesh.root_namespace);
        ctx.virtual_services
            .sort_by(|a, b| a.meta.precedence().cmp(&b.meta.precedence()));
        for policies in ctx.peer_authentications.values_mut() {
            policies.sort_by(|a, b| a.meta.precedence().cmp(&b.meta.precedence()));
        }
        ctx.virtual_services = crate::index::delegation::merge_delegates(&ctx.virtual_services);
        ctx.service_entries.sort_by(|a, b| {
            (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name))
        });
        ctx.workload_entries.sort_by(|a, b| {
            (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name))
        });
        ctx.outbound_label_keys = outbound_label_keys(&ctx);
        ctx
    }

    /// Takes `prev`'s instance of every service view that is the same in this context, so
    /// that consecutive contexts share what did not change. Generated resources' cache
    /// keys hold service views (a route table's key holds every service it routes to):
    /// without this, each context's keys kept a set of views of their own alive, a
    /// thousand per VirtualService change in a 1 000-service mesh, for as long as a key
    /// outlived its context (keys are freed after their entries, not with them). Shared
    /// views also compare equal by address, so key lookups across contexts are cheaper.
    ///
    /// When every service view is the same, in the same order, and so are the Sidecars and
    /// the mesh settings scopes read, this context takes `prev`'s
    /// [`PushContext::scope_inputs`]: proxies keep their scopes.
    pub fn share_unchanged(&mut self, prev: &PushContext) {
        let mut same = self.services.len() == prev.services.len()
            && self.shadowed.len() == prev.shadowed.len();
        for (host, view) in &mut self.services {
            match prev.services.get(host) {
                Some(old) if old == view => *view = old.clone(),
                _ => same = false,
            }
        }
        for (host, views) in &mut self.shadowed {
            let Some(olds) = prev.shadowed.get(host) else {
                same = false;
                continue;
            };
            if olds == views {
                views.clone_from(olds);
                continue;
            }
            same = false;
            for view in views.iter_mut() {
                if let Some(old) = olds.iter().find(|o| *o == view) {
                    *view = old.clone();
                }
            }
        }
        if same
            && self.sidecars == prev.sidecars
            && self.mesh.root_namespace == prev.mesh.root_namespace
            && self.mesh.outbound_traffic_policy == prev.mesh.outbound_traffic_policy
        {
            self.scope_inputs = prev.scope_inputs;
        }
    }

    /// Marks this context as having the same load-assignment inputs as `prev`, the context
    /// it replaces: the caller knows the changes between them touched none of them.
    pub fn keep_endpoint_inputs(&mut self, prev: &PushContext) {
        self.endpoint_inputs = prev.endpoint_inputs;
    }

    /// The Sidecar that applies to a workload: the one in its namespace whose selector
    /// matches its labels, else the namespace's selector-less one, else the root
    /// namespace's selector-less one.
    pub fn sidecar_for(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        root_namespace: &str,
    ) -> Option<&Arc<Config<Sidecar>>> {
        let in_ns = self
            .sidecars
            .get(namespace)
            .map(Vec::as_slice)
            .unwrap_or_default();
        in_ns
            .iter()
            .find(|s| {
                s.spec
                    .workload_selector
                    .as_ref()
                    .is_some_and(|w| labels_match(&w.labels, labels))
            })
            .or_else(|| in_ns.iter().find(|s| s.spec.workload_selector.is_none()))
            .or_else(|| {
                self.sidecars
                    .get(root_namespace)
                    .and_then(|v| v.iter().find(|s| s.spec.workload_selector.is_none()))
            })
    }

    /// The DestinationRule that applies to a proxy's traffic to a service, as istiod
    /// looks it up (proxy namespace, service namespace, root namespace; `exportTo`,
    /// `workloadSelector`; several rules for a host merged).
    pub fn destination_rule(
        &self,
        proxy_namespace: &str,
        proxy_labels: &BTreeMap<String, String>,
        svc: &ServiceView,
    ) -> Option<Arc<MergedRule>> {
        self.destination_rule_index
            .for_proxy(proxy_namespace, proxy_labels, svc)
    }

    /// The Gateways whose selector matches a gateway proxy's labels. A Gateway without a
    /// selector applies to every gateway proxy, as in Istio.
    /// A Gateway translated from the Gateway API applies only to proxies of its namespace.
    pub fn gateways_for(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<&Arc<Config<Gateway>>> {
        self.gateways
            .iter()
            .filter(|g| !g.spec.namespace_scoped || g.meta.namespace == namespace)
            .filter(|g| labels_match(&g.spec.selector, labels))
            .collect()
    }
}

/// The label keys of [`PushContext::outbound_label_keys`], from the indexed config.
fn outbound_label_keys(ctx: &PushContext) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut add = |labels: &BTreeMap<String, String>| keys.extend(labels.keys().cloned());
    for sidecar in ctx.sidecars.values().flatten() {
        if let Some(w) = &sidecar.spec.workload_selector {
            add(&w.labels);
        }
    }
    for gw in &ctx.gateways {
        add(&gw.spec.selector);
    }
    for vs in &ctx.virtual_services {
        vs.spec
            .http
            .iter()
            .flat_map(|r| &r.matches)
            .for_each(|m| add(&m.source_labels));
        vs.spec
            .tcp
            .iter()
            .flat_map(|r| &r.matches)
            .for_each(|m| add(&m.source_labels));
        vs.spec
            .tls
            .iter()
            .flat_map(|r| &r.matches)
            .for_each(|m| add(&m.source_labels));
    }
    let mut priorities = Vec::new();
    for dr in ctx.destination_rules.values() {
        if let Some(w) = &dr.spec.workload_selector {
            add(&w.match_labels);
        }
        let policies = dr.spec.traffic_policy.as_deref().into_iter().chain(
            dr.spec
                .subsets
                .iter()
                .filter_map(|s| s.traffic_policy.as_ref()),
        );
        for policy in policies {
            let balancers = policy.load_balancer.iter().chain(
                policy
                    .port_level_settings
                    .iter()
                    .filter_map(|p| p.load_balancer.as_ref()),
            );
            for lb in balancers {
                if let Some(locality) = &lb.locality_lb_setting {
                    priorities.extend(locality.failover_priority.iter().cloned());
                }
            }
        }
    }
    // `key` or `key=value`: the proxy's value of `key` is read either way.
    for p in priorities {
        let key = p.split_once('=').map_or(p.as_str(), |(k, _)| k);
        keys.insert(key.to_string());
    }
    keys
}

/// The consistent hash of each HTTP route destination of some VirtualServices, for one
/// proxy: `(host, subset, port)` → hash. Route tables depend on it (it goes into their
/// generator key), as istiod's `hashForVirtualService`.
pub type DestinationHashes = BTreeMap<(String, String, Option<u32>), ConsistentHashLb>;

/// The consistent hashes of the HTTP route destinations of `vss`, as the DestinationRules
/// that apply to the proxy define them.
pub fn destination_hashes(
    vss: &[Arc<Config<VirtualService>>],
    proxy_ns: &str,
    proxy_labels: &BTreeMap<String, String>,
    ctx: &PushContext,
) -> DestinationHashes {
    let mut out = DestinationHashes::new();
    for vs in vss {
        for d in vs.spec.http.iter().flat_map(|r| r.route.iter()) {
            let d = &d.destination;
            let host = resolve_host(&d.host, &vs.meta.namespace);
            let Some(svc) = ctx.services.get(&host) else {
                continue;
            };
            let Some(rule) = ctx.destination_rule(proxy_ns, proxy_labels, svc) else {
                continue;
            };
            let subset = d.subset.clone().unwrap_or_default();
            if let Some(h) =
                destination_hash(&rule.spec, &subset, d.port.as_ref().map(|p| p.number))
            {
                out.insert((host, subset, d.port.as_ref().map(|p| p.number)), h);
            }
        }
    }
    out
}
