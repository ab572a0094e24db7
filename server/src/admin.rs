//! The admin HTTP server: readiness, health, metrics and debug endpoints.

use crate::metrics::Metrics;
use crate::push::pipeline::Published;
use crate::xds::Registry;
use bytes::Bytes;
use hyper::{body::Incoming, Method, Request, Response, StatusCode};
use serde_json::json;
use shoal_common::admin::{response, Body};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// The latest snapshot (None until the initial state is loaded).
    pub snapshots: watch::Receiver<Option<Published>>,
    /// Connected proxies.
    pub registry: Registry,
    /// Metrics.
    pub metrics: Metrics,
    /// True once the server is shutting down.
    pub draining: watch::Receiver<bool>,
    /// The generator cache.
    pub cache: crate::generate::cache::GeneratorCache,
    /// The proxies' views.
    pub views: crate::push::view::Views,
}

/// Serves the admin endpoints on an already-bound listener until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    policy: shoal_common::admin::AdminPolicy,
    state: AdminState,
) {
    shoal_common::admin::serve(listener, policy, move |req| route(&state, req)).await
}

fn metrics_response(metrics: &Metrics) -> Response<Body> {
    response(
        StatusCode::OK,
        "text/plain; version=0.0.4",
        metrics.render(),
    )
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    response(status, "text/plain; charset=utf-8", body)
}

fn json_response(value: serde_json::Value) -> Response<Body> {
    let body = serde_json::to_vec_pretty(&value).unwrap_or_default();
    response(StatusCode::OK, "application/json", body)
}

fn route(state: &AdminState, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is supported\n");
    }
    let snapshot = state
        .snapshots
        .borrow()
        .as_ref()
        .map(|p| p.snapshot.clone());
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/ready" => match snapshot {
            _ if *state.draining.borrow() => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
            // Ready on the last state while the bus is unreachable (degraded), like istiod
            // serving from its informer caches while the API server is down: proxies keep
            // working config, and an unready replica would be taken out of the Service.
            Some(_) if state.metrics.push.bus_connected.get() == 0 => text(
                StatusCode::OK,
                "ready (degraded: state bus unreachable, serving the last state)\n",
            ),
            Some(_) => text(StatusCode::OK, "ready\n"),
            None if state.metrics.push.fleets_waiting.get() > 0 => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "waiting for {} expected fleet(s) to sync (--expect-fleets)\n",
                    state.metrics.push.fleets_waiting.get()
                ),
            ),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "initial state not loaded yet\n",
            ),
        },
        "/debug/cachez" => {
            let (entries, bytes) = state.cache.stats();
            let (hosts, host_bytes) = crate::generate::vhosts::stats();
            json_response(json!({
                "entries": entries,
                "bytes": bytes,
                "hits": state.metrics.cache.cache_hits.get(),
                "misses": state.metrics.cache.cache_misses.get(),
                "assert": state.cache.asserting(),
                "views": state.views.live(),
                "shared_virtual_hosts": { "entries": hosts, "bytes": host_bytes },
            }))
        }
        "/metrics" => {
            let (entries, bytes) = state.cache.stats();
            state.metrics.cache.cache_entries.set(entries as i64);
            state.metrics.cache.cache_bytes.set(bytes as i64);
            state.metrics.xds.views.set(state.views.live() as i64);
            metrics_response(&state.metrics)
        }
        "/debug/syncz" => json_response(json!(state.registry.snapshot())),
        "/debug/push_status" => match state.snapshots.borrow().as_ref() {
            Some(p) => json_response(crate::debug::push_status(p, &state.registry)),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        },
        "/debug/config_dump" => {
            let Some(snap) = snapshot else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n");
            };
            let Some(node) = query_param(req.uri().query(), "proxy") else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "usage: /debug/config_dump?proxy=<node id> (see /debug/syncz)\n",
                );
            };
            match crate::debug::config_dump(&state.registry, &snap, &node) {
                Some(v) => json_response(v),
                None => text(
                    StatusCode::NOT_FOUND,
                    format!("no proxy {node:?} is connected to this replica\n"),
                ),
            }
        }
        "/debug/configz" => {
            let Some(snap) = snapshot else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n");
            };
            let ctx = &snap.ctx;
            json_response(json!({
                "snapshot": snap.number,
                "services": ctx.services.values().map(|s| json!({
                    "hostname": s.hostname, "namespace": s.namespace,
                    "ports": s.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "protocol": format!("{:?}", p.protocol)})).collect::<Vec<_>>(),
                    "source": match &s.source { crate::index::service::ServiceSource::Kubernetes => "Kubernetes", _ => "ServiceEntry" },
                })).collect::<Vec<_>>(),
                "virtualServices": ctx.virtual_services.iter().map(|c| json!({"namespace": c.meta.namespace, "name": c.meta.name, "spec": c.spec})).collect::<Vec<_>>(),
                "destinationRules": ctx.destination_rules.values().map(|c| json!({"namespace": c.meta.namespace, "name": c.meta.name, "spec": c.spec})).collect::<Vec<_>>(),
                "gateways": ctx.gateways.iter().map(|c| json!({"namespace": c.meta.namespace, "name": c.meta.name, "spec": c.spec})).collect::<Vec<_>>(),
                "sidecars": ctx.sidecars.values().flatten().map(|c| json!({"namespace": c.meta.namespace, "name": c.meta.name, "spec": c.spec})).collect::<Vec<_>>(),
            }))
        }
        "/debug/endpointz" => {
            let Some(snap) = snapshot else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n");
            };
            let hosts: serde_json::Map<String, serde_json::Value> = snap
                .endpoints
                .iter()
                .map(|(host, shards)| {
                    let slices: Vec<_> = shards.values().map(|s| json!(s.as_ref())).collect();
                    (host.clone(), json!(slices))
                })
                .collect();
            json_response(json!(hosts))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /ready /healthz /metrics /debug/syncz /debug/configz /debug/endpointz \
             /debug/push_status /debug/config_dump?proxy=ID /debug/cachez\n",
        ),
    }
}

/// A query parameter, percent-decoded.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                // `get` is None past the end, so a truncated escape stays literal.
                match s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_decoded() {
        let q = Some("a=1&proxy=router%7E1.2.3.4%7Egw.ns%7Ens.svc.cluster.local");
        assert_eq!(
            query_param(q, "proxy").as_deref(),
            Some("router~1.2.3.4~gw.ns~ns.svc.cluster.local")
        );
        assert_eq!(query_param(q, "b"), None);
        assert_eq!(
            query_param(Some("proxy=a%2"), "proxy").as_deref(),
            Some("a%2")
        );
    }
}
