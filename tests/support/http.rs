//! A minimal HTTP/1.1 client for tests: one request per connection (`Connection: close`),
//! with a timeout, so a test never hangs on a proxy that accepts and stalls.

use anyhow::{anyhow, bail, Context};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a whole request may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A response.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("status {} body is not JSON: {}", self.status, self.text()))
    }
}

/// A request to send.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Host` header (defaults to the address).
    pub host: Option<String>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// HTTP/1.0 instead of HTTP/1.1 (the request line's version).
    pub http10: bool,
}

impl Request {
    /// A GET of `path`.
    pub fn get(path: &str) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            host: None,
            headers: Vec::new(),
            body: Vec::new(),
            http10: false,
        }
    }

    /// Sets the `Host` header.
    pub fn host(mut self, host: &str) -> Request {
        self.host = Some(host.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends the request to `addr`.
    pub async fn send(&self, addr: SocketAddr) -> anyhow::Result<Response> {
        tokio::time::timeout(TIMEOUT, self.exchange(addr))
            .await
            .map_err(|_| {
                anyhow!(
                    "{} {} to {addr}: no response within {TIMEOUT:?}",
                    self.method,
                    self.path
                )
            })?
            .with_context(|| format!("{} {} to {addr}", self.method, self.path))
    }

    async fn exchange(&self, addr: SocketAddr) -> anyhow::Result<Response> {
        let mut stream = TcpStream::connect(addr).await?;
        let host = self.host.clone().unwrap_or_else(|| addr.to_string());
        let version = if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut head = format!(
            "{} {} {version}\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.method,
            self.path,
            self.body.len()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&self.body).await?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            // Envoy keeps a connection whose response it generated itself (a 404, a
            // redirect) open for its delayed-close timeout, 1 s: a response whose length
            // is known is done when it is all here.
            let done = if self.method == "HEAD" {
                raw.windows(4).any(|w| w == b"\r\n\r\n")
            } else {
                framed_and_complete(&raw)
            };
            if done {
                break;
            }
        }
        if self.method == "HEAD" {
            // A HEAD response says how long the body would be, and has none.
            return parse_head(&raw);
        }
        parse_response(&raw)
    }
}

/// GET `path` from `addr`.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<Response> {
    Request::get(path).send(addr).await
}

/// A blocking GET, for code that cannot await (diagnostics in `Drop` while a test fails).
pub fn blocking_get(addr: SocketAddr, path: &str) -> anyhow::Result<Response> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Whether `raw` is a whole response whose body is framed (a content-length, or chunked).
fn framed_and_complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let framed = head.lines().any(|l| {
        l.starts_with("content-length:")
            || (l.starts_with("transfer-encoding:") && l.contains("chunked"))
    });
    framed && parse_response(raw).is_ok()
}

/// The status and headers of a response to HEAD.
fn parse_head(raw: &[u8]) -> anyhow::Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |end| end + 4);
    parse_response(&strip_length(&raw[..end]))
}

/// `head` without its content-length and transfer-encoding lines (the body they describe
/// is absent), ending with one empty `content-length: 0`.
fn strip_length(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("content-length:") || lower.starts_with("transfer-encoding:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("content-length: 0\r\n\r\n");
    out.into_bytes()
}

fn parse_response(raw: &[u8]) -> anyhow::Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("incomplete response ({} bytes)", raw.len()))?;
    let head = std::str::from_utf8(&raw[..end]).context("response head is not UTF-8")?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    response.body = if response
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        dechunk(rest)?
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len.parse().context("bad content-length")?;
        if rest.len() < len {
            bail!("body has {} of {len} bytes", rest.len());
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunk size"))?;
        let size_text = std::str::from_utf8(&data[..eol])?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).context("bad chunk size")?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let r =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi").unwrap();
        assert_eq!(
            (r.status, r.text(), r.header("x-a")),
            (200, "hi".into(), Some("b"))
        );
        let r = parse_response(
            b"HTTP/1.1 301 Moved\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.text()), (301, "abcde".into()));
    }
}
