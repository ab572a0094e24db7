//! Tiny HTTP/1.1 backends that say who they are and what they received, as JSON:
//! `{"backend": name, "path": path-and-query, "host": Host header, "headers": {...}}`.
//!
//! A request header `x-delay-ms: N` (or the query `delay=1s`, `delay=500ms`) delays the
//! answer and `x-status: N` sets the status, for timeout and retry tests;
//! `x-echo-set-header: Name:value,...` adds response headers. A request header sent more
//! than once is reported comma-joined.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A running backend; stops (closing its open connections too) on drop.
pub struct Backend {
    name: String,
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    task: Option<JoinHandle<()>>,
}

impl Backend {
    /// Starts a backend named `name` on `addr` (port 0 picks a free port).
    pub async fn start(name: &str, addr: SocketAddr) -> Backend {
        Backend::start_answering(name, addr, StatusCode::OK).await
    }

    /// Starts a backend whose answers have `status` unless a request says otherwise
    /// (`x-status`): a failing endpoint, for outlier detection.
    pub async fn start_answering(name: &str, addr: SocketAddr, status: StatusCode) -> Backend {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("backend {name}: binding {addr}: {e}"));
        let addr = listener.local_addr().expect("backend local address");
        let requests = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(listener, name.to_string(), requests.clone(), status));
        Backend {
            name: name.to_string(),
            addr,
            requests,
            task: Some(task),
        }
    }

    /// The backend's name (as it reports it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The IP it listens on.
    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Stops listening and closes open connections.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: TcpListener,
    name: String,
    requests: Arc<AtomicU64>,
    default_status: StatusCode,
) {
    // Owning the connections here means aborting this task closes them all.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let name = name.clone();
                let requests = requests.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        requests.fetch_add(1, Ordering::Relaxed);
                        answer(name.clone(), default_status, req)
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn answer(
    name: String,
    default_status: StatusCode,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(ms) = header("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    // The Gateway API conformance echo server's `?delay=1s` / `?delay=500ms`.
    let query_delay = req
        .uri()
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| {
            let v = kv.strip_prefix("delay=")?;
            match v.strip_suffix("ms") {
                Some(ms) => ms.parse().ok().map(Duration::from_millis),
                None => v.strip_suffix('s')?.parse().ok().map(Duration::from_secs),
            }
        });
    if let Some(delay) = query_delay {
        tokio::time::sleep(delay).await;
    }
    let status = header("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(default_status);
    // A header sent more than once is one comma-joined value, as the conformance echo
    // server reports it.
    let mut headers = serde_json::Map::new();
    for (n, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        let joined = match headers.get(n.as_str()).and_then(|old| old.as_str()) {
            Some(old) => format!("{old},{v}"),
            None => v,
        };
        headers.insert(n.as_str().to_string(), joined.into());
    }
    let body = serde_json::json!({
        "backend": name,
        "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "host": header("host").unwrap_or_default(),
        "headers": headers,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    // `x-echo-set-header: Name:value,Name:value` adds response headers (the conformance
    // echo server's way to test response header filters).
    for pair in header("x-echo-set-header")
        .iter()
        .flat_map(|h| h.split(','))
    {
        let Some((n, v)) = pair.split_once(':') else {
            continue;
        };
        if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(n.trim().as_bytes()),
            hyper::header::HeaderValue::from_str(v.trim()),
        ) {
            response.headers_mut().append(n, v);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Request as Get;
    use crate::ports::loopback;

    #[tokio::test]
    async fn answers_with_its_name_path_and_host() {
        let mut b = Backend::start("b1", SocketAddr::from((loopback(9), 0))).await;
        let r = Get::get("/x?y=1")
            .host("web.demo")
            .header("x-status", "418")
            .send(b.addr())
            .await
            .unwrap();
        assert_eq!(r.status, 418);
        let j = r.json().unwrap();
        assert_eq!(j["backend"], "b1");
        assert_eq!(j["path"], "/x?y=1");
        assert_eq!(j["host"], "web.demo");
        assert_eq!(j["headers"]["x-status"], "418");
        assert_eq!(b.requests(), 1);
        b.stop();
        crate::eventually(
            Duration::from_secs(2),
            Duration::from_millis(20),
            || async {
                match tokio::net::TcpStream::connect(b.addr()).await {
                    Ok(_) => Err("still accepting"),
                    Err(_) => Ok(()),
                }
            },
        )
        .await;
    }
}
