//! `shoal-testapp`: the application processes of the network-namespace tests (servers that say
//! who they are, and clients), run inside the test pods next to their Envoy sidecars.
//!
//! Servers print `listening on <addr>` once they accept connections (the harness waits for
//! it). Clients never resolve names: URLs and addresses carry IPs, or a name given with
//! `--resolve NAME=IP` (the pods have no DNS). Every client operation has a timeout; failures
//! print a clear error and exit non-zero.
#![forbid(unsafe_code)]

mod hbone;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use shoal_tests::http;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Test application for shoal's captured-pod tests.
#[derive(Debug, Parser)]
#[command(name = "shoal-testapp")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// HTTP/1.1 server answering every request with JSON:
    /// `{"backend": NAME, "method", "path", "host", "headers": {...}, "peer": "ip:port",
    /// "local": "ip:port"}`. Request header `x-delay-ms: N` delays the answer, `x-status: N`
    /// sets its status.
    HttpServer {
        /// Port to listen on.
        #[arg(long)]
        port: u16,
        /// The name the server answers with.
        #[arg(long)]
        name: String,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
    },
    /// TCP echo server: answers each line `MSG` received with `NAME:MSG`.
    TcpEcho {
        /// Port to listen on.
        #[arg(long)]
        port: u16,
        /// The prefix of every answer.
        #[arg(long, default_value = "echo")]
        name: String,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
    },
    /// GETs a URL. Prints `status: N` then the body; with --count, sends N requests (one
    /// connection each) and prints a JSON tally: `{"total", "statuses": {"200": n},
    /// "responders": {"<backend>": n}, "errors": {"<error>": n}}`.
    HttpGet {
        /// `http://IP[:PORT]/path`, or a name mapped with --resolve.
        url: String,
        /// Extra request header `NAME:VALUE` (repeatable); `host:...` replaces the Host.
        #[arg(long = "header", short = 'H', value_name = "NAME:VALUE")]
        headers: Vec<String>,
        /// Requests to send; prints a tally instead of the body.
        #[arg(long)]
        count: Option<u32>,
        /// Resolve NAME to IP (repeatable), like curl's --resolve.
        #[arg(long, value_name = "NAME=IP")]
        resolve: Vec<String>,
        /// Fail (exit 1) unless the status is this (single request) or every status is
        /// this (--count).
        #[arg(long, value_name = "STATUS")]
        expect_status: Option<u16>,
        /// Timeout per request (at most 5 s, the limit of the underlying client).
        #[arg(long, default_value_t = 5000, value_name = "MS")]
        timeout_ms: u64,
        /// The request method (single requests and --count alike).
        #[arg(long, short = 'X', default_value = "GET")]
        method: String,
        /// Print the response headers as a JSON object on a `headers: ` line after the
        /// status line.
        #[arg(long)]
        show_headers: bool,
        /// Send HTTP/1.0 instead of HTTP/1.1.
        #[arg(long)]
        http10: bool,
    },
    /// HBONE terminator (ztunnel's inbound side, for the tests): mutual TLS 1.3 with ALPN
    /// `h2`, HTTP/2 CONNECT to `ip:port` in the pod; prints `hbone <caller's SPIFFE id> ->
    /// <ip:port>` for every tunnel.
    HboneServer {
        /// Port to listen on (HBONE's is 15008).
        #[arg(long, default_value_t = 15008)]
        port: u16,
        /// The pod's certificate chain (PEM).
        #[arg(long)]
        cert: std::path::PathBuf,
        /// The pod's private key (PEM).
        #[arg(long)]
        key: std::path::PathBuf,
        /// The mesh root callers' certificates must chain to (PEM).
        #[arg(long)]
        root: std::path::PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
    },
    /// Connects to ADDR, sends MSG and a newline, prints the line answered.
    TcpSend {
        /// `IP:PORT`.
        addr: SocketAddr,
        /// The message (one line).
        message: String,
        /// Timeout for the whole exchange.
        #[arg(long, default_value_t = 5000, value_name = "MS")]
        timeout_ms: u64,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Cmd::HttpServer { port, name, bind } => {
            http_server(SocketAddr::new(bind, port), name).await
        }
        Cmd::TcpEcho { port, name, bind } => tcp_echo(SocketAddr::new(bind, port), name).await,
        Cmd::HboneServer {
            port,
            cert,
            key,
            root,
            bind,
        } => {
            let identity = hbone::Identity {
                cert: &cert,
                key: &key,
                root: &root,
            };
            hbone::serve(SocketAddr::new(bind, port), identity).await
        }
        Cmd::HttpGet {
            url,
            headers,
            count,
            resolve,
            expect_status,
            timeout_ms,
            method,
            show_headers,
            http10,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            match Get::parse(&url, &headers, &resolve) {
                Ok(mut get) => match count {
                    _ if http10 && count.is_some() => Err(anyhow!("--http10 sends one request")),
                    None => {
                        get.request.method = method;
                        get.show_headers = show_headers;
                        get.request.http10 = http10;
                        get.once(expect_status, timeout).await
                    }
                    Some(n) => get.tally(n, expect_status, timeout).await,
                },
                Err(e) => Err(e),
            }
        }
        Cmd::TcpSend {
            addr,
            message,
            timeout_ms,
        } => tcp_send(addr, &message, Duration::from_millis(timeout_ms)).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shoal-testapp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The next connection; an accept error (out of file descriptors, a connection reset
/// before it was taken) is logged and the listener tried again shortly.
async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Tells the harness the server is up (stdout goes to a log file: flush).
fn announce(addr: SocketAddr) {
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
}

async fn http_server(addr: SocketAddr, name: String) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    announce(listener.local_addr()?);
    loop {
        let (stream, peer) = accept(&listener).await;
        let local = stream.local_addr().ok();
        let name = name.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(name.clone(), peer, local, req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    name: String,
    peer: SocketAddr,
    local: Option<SocketAddr>,
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
    let status = header("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
            )
        })
        .collect();
    let body = json!({
        "backend": name,
        "method": req.method().as_str(),
        "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "host": header("host").unwrap_or_default(),
        "headers": headers,
        "peer": peer.to_string(),
        "local": local.map(|l| l.to_string()).unwrap_or_default(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn tcp_echo(addr: SocketAddr, name: String) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    announce(listener.local_addr()?);
    loop {
        let (stream, _) = accept(&listener).await;
        let name = name.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if write
                    .write_all(format!("{name}:{line}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
}

async fn tcp_send(addr: SocketAddr, message: &str, timeout: Duration) -> anyhow::Result<()> {
    if message.contains('\n') {
        bail!("the message must be one line");
    }
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream
            .write_all(format!("{message}\n").as_bytes())
            .await
            .context("sending")?;
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        // One line (the echo keeps the connection open for more).
        loop {
            let n = stream.read(&mut byte).await.context("reading the reply")?;
            if n == 0 {
                if reply.is_empty() {
                    bail!("connection closed without a reply");
                }
                break;
            }
            if byte[0] == b'\n' {
                break;
            }
            reply.push(byte[0]);
        }
        anyhow::Ok(String::from_utf8_lossy(&reply).into_owned())
    };
    let reply = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow!("{addr}: no reply within {timeout:?}"))??;
    println!("{reply}");
    Ok(())
}

/// A parsed `http-get`.
struct Get {
    addr: SocketAddr,
    request: http::Request,
    show_headers: bool,
}

impl Get {
    fn parse(url: &str, headers: &[String], resolve: &[String]) -> anyhow::Result<Get> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("{url}: only http:// URLs"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().with_context(|| format!("{url}: bad port"))?),
            None => (authority, 80),
        };
        let ip: IpAddr = match host.parse() {
            Ok(ip) => ip,
            Err(_) => resolve
                .iter()
                .filter_map(|r| r.split_once('='))
                .find(|(name, _)| *name == host)
                .ok_or_else(|| {
                    anyhow!("{url}: {host} is not an IP; map it with --resolve {host}=IP")
                })?
                .1
                .parse()
                .with_context(|| format!("--resolve {host}: bad IP"))?,
        };
        let mut request = http::Request::get(path).host(authority);
        for h in headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| anyhow!("header {h:?} is not NAME:VALUE"))?;
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("host") {
                request = request.host(value);
            } else {
                request = request.header(name, value);
            }
        }
        Ok(Get {
            addr: SocketAddr::new(ip, port),
            request,
            show_headers: false,
        })
    }

    async fn send(&self, timeout: Duration) -> anyhow::Result<http::Response> {
        tokio::time::timeout(timeout, self.request.send(self.addr))
            .await
            .map_err(|_| anyhow!("GET {}: no response within {timeout:?}", self.addr))?
    }

    async fn once(&self, expect: Option<u16>, timeout: Duration) -> anyhow::Result<()> {
        let r = self.send(timeout).await?;
        println!("status: {}", r.status);
        if self.show_headers {
            let headers: serde_json::Map<String, serde_json::Value> = r
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            println!("headers: {}", serde_json::Value::Object(headers));
        }
        println!("{}", r.text());
        match expect {
            Some(want) if want != r.status => bail!("status {} (expected {want})", r.status),
            _ => Ok(()),
        }
    }

    async fn tally(
        &self,
        count: u32,
        expect: Option<u16>,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let mut statuses = BTreeMap::<String, u32>::new();
        let mut responders = BTreeMap::<String, u32>::new();
        let mut errors = BTreeMap::<String, u32>::new();
        for _ in 0..count {
            match self.send(timeout).await {
                Ok(r) => {
                    *statuses.entry(r.status.to_string()).or_default() += 1;
                    let backend = r
                        .json()
                        .ok()
                        .and_then(|j| j["backend"].as_str().map(str::to_string));
                    if let Some(b) = backend {
                        *responders.entry(b).or_default() += 1;
                    }
                }
                Err(e) => *errors.entry(format!("{e:#}")).or_default() += 1,
            }
        }
        let report = json!({
            "total": count,
            "statuses": statuses,
            "responders": responders,
            "errors": errors,
        });
        println!("{report}");
        if let Some(want) = expect {
            let ok = statuses.get(&want.to_string()).copied().unwrap_or(0);
            if ok != count {
                bail!("{ok} of {count} requests had status {want}");
            }
        }
        Ok(())
    }
}
