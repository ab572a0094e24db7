//! The admin HTTP server (`--admin-addr`): `/ready`, `/healthz`, `/metrics`,
//! `/debug/clusters`.

use crate::coordination::readiness::Readiness;
use crate::source::kubernetes::metrics::KubeMetrics;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use shoal_common::admin::{response, Body};
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Readiness.
    pub readiness: Readiness,
    /// Every metric, for `/metrics`.
    pub registry: prometheus::Registry,
    /// The assigned clusters' states, for `/debug/clusters` (none for the file source).
    pub clusters: KubeMetrics,
}

/// Binds the admin address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the admin endpoints on a bound listener until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    policy: shoal_common::admin::AdminPolicy,
    state: AdminState,
) {
    shoal_common::admin::serve(listener, policy, move |req| route(&state, &req)).await
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    response(status, content_type, body)
}

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Body> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET is supported\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/ready" => {
            if state.readiness.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            } else {
                let waiting = state.readiness.waiting_for().join(", ");
                let body = format!("not ready; waiting for the initial sync of: {waiting}\n");
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, body)
            }
        }
        "/metrics" => {
            // Evaluates readiness deadlines, so the gauge is current even unpolled.
            state.readiness.is_ready();
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                shoal_common::metrics::render(&state.registry),
            )
        }
        // Every cluster this fleet is assigned and what it does with it: syncing, synced,
        // or refused (with the fleet that owns it).
        "/debug/clusters" => {
            let states = state.clusters.cluster_states();
            match serde_json::to_string_pretty(&states) {
                Ok(body) => text(StatusCode::OK, "application/json", body + "\n"),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    format!("{error}\n"),
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; try /ready /healthz /metrics /debug/clusters\n".into(),
        ),
    }
}
