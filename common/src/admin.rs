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

/// The `--debug-from-anywhere` flag of both binaries.
#[derive(Debug, Clone, clap::Args)]
pub struct DebugArgs {
    /// Serve the /debug endpoints to every client of the admin port. By default they
    /// answer only on localhost (kubectl port-forward), as they reveal mesh state and
    /// proxies' configuration.
    #[arg(
        long,
        env = "SHOAL_DEBUG_FROM_ANYWHERE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub debug_from_anywhere: bool,
}

impl DebugArgs {
    /// The access the flag gives.
    pub fn access(&self) -> DebugAccess {
        DebugAccess::from_anywhere(self.debug_from_anywhere)
    }
}

/// Who may read the `/debug/*` endpoints, which reveal the mesh's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugAccess {
    /// Only clients on the loopback interface (`kubectl port-forward`, `kubectl exec`): the
    /// default.
    Localhost,
    /// Any client that reaches the admin port.
    Anywhere,
}

impl DebugAccess {
    /// From a `--debug-from-anywhere` flag.
    pub fn from_anywhere(anywhere: bool) -> Self {
        if anywhere {
            DebugAccess::Anywhere
        } else {
            DebugAccess::Localhost
        }
    }

    fn allows(self, path: &str, peer: std::net::IpAddr) -> bool {
        self == DebugAccess::Anywhere
            || !path.starts_with("/debug")
            || peer.to_canonical().is_loopback()
    }
}

/// Serves `route` on a bound listener until the task is dropped. `/debug/*` requests from
/// clients `debug` does not allow get 403.
pub async fn serve<F>(listener: TcpListener, debug: DebugAccess, route: F)
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
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = if debug.allows(req.uri().path(), peer.ip()) {
                    route(req)
                } else {
                    response(
                        StatusCode::FORBIDDEN,
                        "text/plain; charset=utf-8",
                        "/debug endpoints reveal mesh configuration and answer only on \
                         localhost (use kubectl port-forward); start with \
                         --debug-from-anywhere to serve them to every client\n",
                    )
                };
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

#[cfg(test)]
mod tests {
    use super::DebugAccess;

    #[test]
    fn debug_endpoints_answer_only_on_loopback_by_default() {
        let remote = "10.0.0.7".parse().unwrap();
        let local = "127.0.0.1".parse().unwrap();
        let mapped = "::ffff:127.0.0.1".parse().unwrap();
        let d = DebugAccess::Localhost;
        assert!(!d.allows("/debug/configz", remote));
        assert!(d.allows("/debug/configz", local));
        assert!(d.allows("/debug/configz", mapped));
        assert!(d.allows("/metrics", remote));
        assert!(d.allows("/ready", remote));
        assert!(DebugAccess::Anywhere.allows("/debug/configz", remote));
    }
}
