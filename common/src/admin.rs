//! The HTTP/1.1 server behind both binaries' admin ports (`/ready`, `/healthz`, `/metrics`,
//! `/debug/*`): each binary supplies only its routes.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A complete response body.
pub type Body = Full<Bytes>;

/// Serves `route` on a bound listener until the task is dropped.
pub async fn serve<F>(listener: TcpListener, route: F)
where
    F: Fn(Request<Incoming>) -> Response<Body> + Clone + Send + Sync + 'static,
{
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
        let route = route.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let resp = route(req);
                async move { Ok::<_, std::convert::Infallible>(resp) }
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

/// A response with a status, a content type and a body.
pub fn response(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_default()
}
