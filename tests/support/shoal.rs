//! The shoal binaries as child processes.
//!
//! Binaries are looked up next to the test executable (`target/<profile>/`, the parent of
//! the `deps/` directory the test runs from), or in `$SHOAL_BIN_DIR`. Cargo does not build
//! another package's binaries for this crate's tests: run `cargo build --workspace --bins`
//! first (scripts/test.sh does).

use crate::eventually::try_eventually;
use crate::http::{self, Response};
use crate::ports::free_addr;
use crate::process::Process;
use anyhow::bail;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::Command;

/// How long a server may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The directory holding the shoal binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SHOAL_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current test executable");
    let deps = exe.parent().expect("test executable directory");
    // Integration tests run from target/<profile>/deps; unit tests of the lib too.
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent()
            .expect("target profile directory")
            .to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// The path of a shoal binary; panics with instructions when it was not built.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    if !path.is_file() {
        panic!(
            "{} not found: run `cargo build --workspace --bins` first (or set SHOAL_BIN_DIR)",
            path.display()
        );
    }
    path
}

fn command(name: &str, args: &[String]) -> Command {
    let mut cmd = Command::new(binary(name));
    cmd.args(args);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    cmd.env("RUST_BACKTRACE", "1");
    // Logs go to files, not terminals.
    cmd.env("NO_COLOR", "1");
    cmd
}

/// A running `shoal-server` (NATS or standalone mode) with its xDS and admin ports.
pub struct ShoalServer {
    process: Process,
    xds: SocketAddr,
    admin: SocketAddr,
}

impl ShoalServer {
    /// Starts `shoal-server <args> --xds-addr <free> --admin-addr <free>` and waits until
    /// `GET /ready` answers 200.
    pub async fn start(args: &[&str]) -> ShoalServer {
        let mut server = ShoalServer::spawn(args);
        server.wait_ready().await;
        server
    }

    /// A replica reading state from NATS at `nats_url`, once ready.
    pub async fn with_nats(nats_url: &str) -> ShoalServer {
        ShoalServer::start(&["--nats-url", nats_url]).await
    }

    /// A standalone server (file source and in-memory bus in one process), once ready.
    pub async fn standalone(dir: &std::path::Path) -> ShoalServer {
        let dir = dir.to_str().expect("UTF-8 manifest directory");
        ShoalServer::start(&["--standalone", dir]).await
    }

    /// Starts the server without waiting for readiness.
    pub fn spawn(args: &[&str]) -> ShoalServer {
        ShoalServer::spawn_with_xds(args, free_addr())
    }

    /// Starts the server with its xDS endpoint on `xds` (e.g. a test network's host
    /// address, for Envoys in network namespaces) and waits until it is ready.
    pub async fn start_with_xds(args: &[&str], xds: SocketAddr) -> ShoalServer {
        let mut server = ShoalServer::spawn_with_xds(args, xds);
        server.wait_ready().await;
        server
    }

    /// Starts the server with its xDS endpoint on `xds`, without waiting for readiness.
    pub fn spawn_with_xds(args: &[&str], xds: SocketAddr) -> ShoalServer {
        ShoalServer::spawn_limited(args, xds, None)
    }

    /// Starts the server under an open-file limit of `limit` (`ulimit -n`, through `sh`),
    /// without waiting for readiness.
    pub fn spawn_with_open_files(args: &[&str], limit: u32) -> ShoalServer {
        ShoalServer::spawn_limited(args, free_addr(), Some(limit))
    }

    fn spawn_limited(args: &[&str], xds: SocketAddr, open_files: Option<u32>) -> ShoalServer {
        let admin = free_addr();
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend([
            "--xds-addr".into(),
            xds.to_string(),
            "--admin-addr".into(),
            admin.to_string(),
        ]);
        let mut cmd = command("shoal-server", &all);
        if let Some(limit) = open_files {
            // `exec` keeps the process id: the handle kills the server itself.
            let mut wrapped = Command::new("sh");
            wrapped
                .arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(binary("shoal-server"))
                .args(&all);
            for (key, value) in cmd.as_std().get_envs() {
                if let Some(value) = value {
                    wrapped.env(key, value);
                }
            }
            cmd = wrapped;
        }
        let dir = tempfile::tempdir().expect("server temp dir");
        let process = Process::spawn(
            &format!("shoal-server-{}", xds.port()),
            cmd,
            dir,
            "run `cargo build --workspace --bins` first",
        );
        ShoalServer {
            process,
            xds,
            admin,
        }
    }

    /// Waits until `GET /ready` answers 200; panics with the log otherwise.
    pub async fn wait_ready(&mut self) {
        let admin = self.admin;
        let process = &mut self.process;
        let ready = try_eventually(READY_TIMEOUT, Duration::from_millis(50), || {
            let exited = process.exited();
            async move {
                if let Some(status) = exited {
                    return Ok(Err(format!("exited with {status}")));
                }
                match http::get(admin, "/ready").await {
                    Ok(r) if r.status == 200 => Ok(Ok(())),
                    Ok(r) => Err(format!("/ready: {} {}", r.status, r.text())),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
        .and_then(|r| r);
        if let Err(e) = ready {
            panic!(
                "{} not ready: {e}\n{}",
                self.process.name(),
                self.process.log_tail()
            );
        }
    }

    /// The xDS (ADS gRPC) address.
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// The admin HTTP address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The process (for its log).
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// GETs an admin path.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<Response> {
        http::get(self.admin, path).await
    }

    /// `/debug/syncz` as JSON.
    pub async fn syncz(&self) -> anyhow::Result<serde_json::Value> {
        let r = self.admin_get("/debug/syncz").await?;
        if r.status != 200 {
            bail!("/debug/syncz: status {}: {}", r.status, r.text());
        }
        r.json()
    }

    /// Whether a proxy whose node id is `node_id` is connected to this replica, according
    /// to `/debug/syncz` (any string field equal to the id counts, whatever the layout).
    pub async fn serves(&self, node_id: &str) -> anyhow::Result<bool> {
        Ok(contains_string(&self.syncz().await?, node_id))
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }
}

impl Drop for ShoalServer {
    fn drop(&mut self) {
        // A failed test shows which proxies this replica served and what they acked or
        // rejected.
        if std::thread::panicking() && self.process.exited().is_none() {
            match http::blocking_get(self.admin, "/debug/syncz") {
                Ok(r) => eprintln!("----- {} /debug/syncz\n{}", self.process.name(), r.text()),
                Err(e) => eprintln!(
                    "----- {} /debug/syncz unavailable: {e}",
                    self.process.name()
                ),
            }
        }
    }
}

fn contains_string(v: &serde_json::Value, s: &str) -> bool {
    match v {
        serde_json::Value::String(x) => x == s,
        serde_json::Value::Array(a) => a.iter().any(|x| contains_string(x, s)),
        serde_json::Value::Object(o) => o.values().any(|x| contains_string(x, s)),
        _ => false,
    }
}

/// A running `shoal-ingester`.
pub struct ShoalIngester {
    process: Process,
    admin: Option<SocketAddr>,
}

impl ShoalIngester {
    /// Starts `shoal-ingester <args>`. It has no readiness endpoint: wait for its effects.
    pub fn start(args: &[&str]) -> ShoalIngester {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let dir = tempfile::tempdir().expect("ingester temp dir");
        let process = Process::spawn(
            "shoal-ingester",
            command("shoal-ingester", &args),
            dir,
            "run `cargo build --workspace --bins` first",
        );
        ShoalIngester {
            process,
            admin: None,
        }
    }

    /// An ingester publishing the manifests under `dir` to NATS at `nats_url`.
    /// Its admin port is a free one, so ingesters of parallel tests do not collide.
    pub fn for_dir(nats_url: &str, dir: &std::path::Path) -> ShoalIngester {
        ShoalIngester::for_dir_with(nats_url, dir, &[])
    }

    /// [`Self::for_dir`] with more arguments.
    pub fn for_dir_with(nats_url: &str, dir: &std::path::Path, extra: &[&str]) -> ShoalIngester {
        let source = format!("file:{}", dir.display());
        let admin = SocketAddr::from(([127, 0, 0, 1], crate::ports::free_port()));
        let admin_arg = admin.to_string();
        let mut args = vec![
            "--nats-url",
            nats_url,
            "--source",
            &source,
            "--admin-addr",
            &admin_arg,
        ];
        args.extend_from_slice(extra);
        let mut ingester = ShoalIngester::start(&args);
        ingester.admin = Some(admin);
        ingester
    }

    /// GET a path on the ingester's admin port (ingesters started by [`Self::for_dir`]).
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<Response> {
        let admin = self
            .admin
            .ok_or_else(|| anyhow::anyhow!("this ingester has no known admin address"))?;
        http::get(admin, path).await
    }

    /// The process (for its log, or to check it is still running).
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// Kills the ingester (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }
}

/// Runs the binary `name` with `args` (a start that must fail) and returns how long it took
/// to exit and what it printed; panics when it succeeds or is still running after `limit`.
pub async fn failed_start(name: &str, args: &[&str], limit: Duration) -> (Duration, String) {
    let started = std::time::Instant::now();
    let mut cmd = Command::new(binary(name));
    cmd.args(args).env("NO_COLOR", "1").kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{name} {args:?} still running after {limit:?}"))
        .expect("running the binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{name} {args:?} succeeded: {text}");
    (started.elapsed(), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_node_ids_anywhere_in_syncz() {
        let v = serde_json::json!([{"node": {"id": "router~a"}, "types": {}}]);
        assert!(contains_string(&v, "router~a"));
        assert!(!contains_string(&v, "sidecar~a"));
    }
}
