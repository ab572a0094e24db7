//! The admin HTTP server (`--admin-addr`): `/ready`, `/healthz`, `/metrics`.

use crate::metrics::Metrics;
use crate::readiness::Readiness;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Readiness.
    pub readiness: Readiness,
    /// Metrics.
    pub metrics: Metrics,
}

/// Binds the admin address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the admin endpoints on a bound listener until the task is dropped.
pub async fn serve(listener: TcpListener, state: AdminState) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%error, "admin accept failed");
                // Out of file descriptors and the like: do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(route(&state, &req)) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, %peer, "admin connection ended with an error");
            }
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
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
                state.metrics.render(),
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; try /ready /healthz /metrics\n".into(),
        ),
    }
}
