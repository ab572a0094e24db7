//! The processes under test — nats-server, `shoal-ingester`, `shoal-server` replicas — as
//! children of the benchmark: started on free ports, killed when dropped (also on error),
//! and measured through `/proc` and the servers' `/metrics`.

use anyhow::{bail, Context};
use shoal_tests::eventually::try_eventually;
use shoal_tests::http;
use shoal_tests::ports::{free_addr, free_port};
use shoal_tests::process::Process;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

/// Where the shoal binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `shoal-server`.
    pub server: PathBuf,
    /// `shoal-ingester`.
    pub ingester: PathBuf,
    /// `shoal-replay` (the replay baseline's server), when found: next to the shoal
    /// binaries, else next to the running executable.
    pub replay: Option<PathBuf>,
    /// `shoal-bench` itself (what `--fleet-processes` runs as `--fleet-child`): the
    /// running executable when it is shoal-bench, else next to the shoal binaries (a test
    /// runs from `target/<profile>/deps/`, cargo builds the benchmark next to them).
    pub bench: Option<PathBuf>,
    /// Whether they come from a debug build (results are then not representative).
    pub debug_build: bool,
}

impl Binaries {
    /// Finds the binaries: in `dir` when given, else next to the running executable (the
    /// benchmark lives in `target/<profile>/`, a test in `target/<profile>/deps/`), else in
    /// the workspace's `target/release`, then `target/debug`.
    pub fn locate(dir: Option<&Path>) -> anyhow::Result<Binaries> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(dir) = dir {
            candidates.push(dir.to_path_buf());
        } else {
            if let Some(dir) = std::env::var_os("SHOAL_BIN_DIR") {
                candidates.push(PathBuf::from(dir));
            }
            if let Ok(exe) = std::env::current_exe() {
                if let Some(parent) = exe.parent() {
                    if parent.file_name().is_some_and(|n| n == "deps") {
                        candidates.extend(parent.parent().map(Path::to_path_buf));
                    } else {
                        candidates.push(parent.to_path_buf());
                    }
                }
            }
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
            candidates.push(target.join("release"));
            candidates.push(target.join("debug"));
        }
        for dir in &candidates {
            let server = dir.join("shoal-server");
            let ingester = dir.join("shoal-ingester");
            if server.is_file() && ingester.is_file() {
                let debug_build = dir.components().any(|c| c.as_os_str() == "debug");
                let own_dir = std::env::current_exe()
                    .ok()
                    .and_then(|e| e.parent().map(Path::to_path_buf));
                let replay = [Some(dir.clone()), own_dir]
                    .into_iter()
                    .flatten()
                    .map(|d| d.join("shoal-replay"))
                    .find(|p| p.is_file());
                let own = std::env::current_exe()
                    .ok()
                    .filter(|e| e.file_name().is_some_and(|n| n == "shoal-bench"));
                let bench = own.or_else(|| Some(dir.join("shoal-bench")).filter(|p| p.is_file()));
                return Ok(Binaries {
                    server,
                    ingester,
                    replay,
                    bench,
                    debug_build,
                });
            }
        }
        bail!(
            "shoal-server and shoal-ingester not found in any of {candidates:?}: build them with \
             `cargo build --release --bins` (or pass --bin-dir)"
        )
    }
}

/// How long a process may take to start and become ready.
const STARTUP: Duration = Duration::from_secs(60);

fn temp_dir(what: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("shoal-bench-{what}-"))
        .tempdir()
        .with_context(|| format!("creating a temporary directory for {what}"))
}

/// Fails with the process's log when it has exited.
fn check_running(process: &mut Process) -> anyhow::Result<()> {
    if let Some(status) = process.exited() {
        bail!(
            "{} exited with {status}; its log:\n{}",
            process.name(),
            process.log_tail()
        );
    }
    Ok(())
}

/// A nats-server with JetStream.
pub struct Nats {
    process: Process,
    port: u16,
}

impl Nats {
    /// Starts nats-server with JetStream on a free port and waits until it accepts clients.
    pub async fn start() -> anyhow::Result<Nats> {
        let port = free_port();
        let dir = temp_dir("nats")?;
        let mut cmd = Command::new("nats-server");
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.path().join("jetstream"));
        let mut process = Process::try_spawn("nats-server", cmd, dir).context(
            "nats-server is needed: install it (apt-get install nats-server) or run scripts/test.sh",
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let start = tokio::time::Instant::now();
        loop {
            check_running(&mut process)?;
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(Nats { process, port });
            }
            if start.elapsed() > STARTUP {
                bail!(
                    "nats-server did not accept connections within {STARTUP:?}:\n{}",
                    process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The process.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }
}

fn shoal_command(binary: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .env("RUST_BACKTRACE", "1")
        .env("NO_COLOR", "1");
    cmd
}

/// A `shoal-ingester` following the manifest directory.
pub struct Ingester {
    process: Process,
}

impl Ingester {
    /// Starts `shoal-ingester --nats-url URL --source file:DIR --admin-addr <free>`.
    pub fn start(bins: &Binaries, nats_url: &str, dir: &Path) -> anyhow::Result<Ingester> {
        let args = vec![
            "--nats-url".to_string(),
            nats_url.to_string(),
            "--source".to_string(),
            format!("file:{}", dir.display()),
            // Its own port: the default (15014) would collide with anything else running.
            "--admin-addr".to_string(),
            free_addr().to_string(),
        ];
        let process = Process::try_spawn(
            "shoal-ingester",
            shoal_command(&bins.ingester, &args),
            temp_dir("ingester")?,
        )?;
        Ok(Ingester { process })
    }

    /// Starts `shoal-ingester --nats-url URL --source kube --admin-addr <free>` with
    /// `KUBECONFIG` set to a file holding `kubeconfig` (the API test server's).
    pub fn start_kube(
        bins: &Binaries,
        nats_url: &str,
        kubeconfig: &str,
    ) -> anyhow::Result<Ingester> {
        let dir = temp_dir("ingester")?;
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).with_context(|| format!("writing {}", path.display()))?;
        let args = vec![
            "--nats-url".to_string(),
            nats_url.to_string(),
            "--source".to_string(),
            "kube".to_string(),
            "--admin-addr".to_string(),
            free_addr().to_string(),
        ];
        let mut cmd = shoal_command(&bins.ingester, &args);
        // Never the service account of a pod this may run in.
        cmd.env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &path);
        let process = Process::try_spawn("shoal-ingester", cmd, dir)?;
        Ok(Ingester { process })
    }

    /// Fails with the log when the ingester has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        check_running(&mut self.process)
    }

    /// The process.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }
}

/// A `shoal-server` replica reading from NATS, or the replay baseline's `shoal-replay` (which
/// serves the same `/ready` and `/metrics` names).
pub struct Server {
    process: Process,
    xds: SocketAddr,
    admin: SocketAddr,
    pid: u32,
}

impl Server {
    /// Starts `shoal-server --nats-url URL <extra>` on free ports and waits until `/ready`;
    /// with `cpus`, pinned to those CPUs (`taskset -c CPUS`, which execs the server, so
    /// the process measured is the server itself).
    pub async fn start(
        bins: &Binaries,
        name: &str,
        nats_url: &str,
        extra: &[String],
        cpus: Option<&str>,
    ) -> anyhow::Result<Server> {
        let mut args = vec!["--nats-url".to_string(), nats_url.to_string()];
        args.extend(extra.iter().cloned());
        Server::spawn(&bins.server, name, args, cpus).await
    }

    /// Starts `shoal-replay --recording FILE` (the replay baseline's server) on free ports
    /// and waits until `/ready`, pinned like the replicas with `cpus`.
    pub async fn start_replay(
        bins: &Binaries,
        recording: &Path,
        cpus: Option<&str>,
    ) -> anyhow::Result<Server> {
        let Some(binary) = &bins.replay else {
            bail!(
                "shoal-replay not found next to shoal-server ({}) nor next to this program: \
                 build it with `cargo build --release --bins`",
                bins.server.display()
            );
        };
        let args = vec!["--recording".to_string(), recording.display().to_string()];
        Server::spawn(binary, "shoal-replay", args, cpus).await
    }

    /// Starts `binary ARGS --xds-addr <free> --admin-addr <free>`, optionally under
    /// `taskset -c CPUS`, and waits until its `/ready` answers 200.
    async fn spawn(
        binary: &Path,
        name: &str,
        mut args: Vec<String>,
        cpus: Option<&str>,
    ) -> anyhow::Result<Server> {
        let xds = free_addr();
        let admin = free_addr();
        args.extend([
            "--xds-addr".to_string(),
            xds.to_string(),
            "--admin-addr".to_string(),
            admin.to_string(),
        ]);
        let cmd = match cpus {
            Some(cpus) => {
                let mut taskset_args = vec!["-c".to_string(), cpus.to_string()];
                taskset_args.push(binary.display().to_string());
                taskset_args.extend(args);
                shoal_command(Path::new("taskset"), &taskset_args)
            }
            None => shoal_command(binary, &args),
        };
        let mut process = Process::try_spawn(name, cmd, temp_dir("server")?)
            .with_context(|| format!("starting {name} (taskset is needed for --server-cpus)"))?;
        let pid = process
            .id()
            .with_context(|| format!("{name} exited at once:\n{}", process.log_tail()))?;
        let ready = {
            let process = &mut process;
            try_eventually(STARTUP, Duration::from_millis(100), || {
                let exited = process.exited();
                async move {
                    if let Some(status) = exited {
                        return Ok(Err(format!("exited with {status}")));
                    }
                    match http::get(admin, "/ready").await {
                        Ok(r) if r.status == 200 => Ok(Ok(())),
                        Ok(r) => Err(format!("/ready: {} {}", r.status, r.text().trim())),
                        Err(e) => Err(format!("{e:#}")),
                    }
                }
            })
            .await
            .and_then(|r| r)
        };
        if let Err(e) = ready {
            bail!("{name} not ready: {e}; its log:\n{}", process.log_tail());
        }
        Ok(Server {
            process,
            xds,
            admin,
            pid,
        })
    }

    /// The xDS address.
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// The admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The process's name.
    pub fn name(&self) -> &str {
        self.process.name()
    }

    /// Fails with the log when the server has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        check_running(&mut self.process)
    }

    /// The process.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// `/metrics`, parsed: each metric name with its samples summed over labels.
    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        let r = http::get(self.admin, "/metrics")
            .await
            .with_context(|| format!("reading {}'s /metrics", self.name()))?;
        if r.status != 200 {
            bail!("{} /metrics: status {}", self.name(), r.status);
        }
        Ok(Metrics::parse(&r.text()))
    }

    /// CPU time used so far (user + system).
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        proc_cpu(self.pid)
    }

    /// Resident set size now, in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        proc_rss_kib(self.pid)
    }
}

/// Prometheus samples summed by metric name (labels dropped).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    sums: BTreeMap<String, f64>,
}

impl Metrics {
    /// Parses the text exposition format.
    pub fn parse(text: &str) -> Metrics {
        let mut sums = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name_part, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let name = name_part.split('{').next().unwrap_or(name_part).trim();
            if let Ok(v) = value.parse::<f64>() {
                *sums.entry(name.to_string()).or_insert(0.0) += v;
            }
        }
        Metrics { sums }
    }

    /// The sum of a metric's samples (0 when absent).
    pub fn get(&self, name: &str) -> f64 {
        self.sums.get(name).copied().unwrap_or(0.0)
    }
}

/// Clock ticks per second for `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// User + system CPU time of a process, from `/proc/<pid>/stat`.
pub fn proc_cpu(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("unexpected {path}: {stat}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based).
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("field {n} of {path}: {stat}"))
    };
    let ticks = field(14)? + field(15)?;
    Ok(Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64))
}

/// The value of `field` in `/proc/<pid>/status`, trimmed.
fn proc_status_field(pid: u32, field: &str) -> anyhow::Result<String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("no {field} in {path}"))
}

/// Resident set size of a process in KiB, from `/proc/<pid>/status` (`VmRSS`).
pub fn proc_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let rss = proc_status_field(pid, "VmRSS")?;
    rss.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("VmRSS of {pid} is not a number of kB: {rss:?}"))
}

/// The CPUs a process may run on (`Cpus_allowed_list` of `/proc/<pid>/status`, e.g.
/// `4-6`): shows that a `taskset` pinning took.
pub fn proc_allowed_cpus(pid: u32) -> anyhow::Result<String> {
    proc_status_field(pid, "Cpus_allowed_list")
}

/// The soft and hard limits on open files of this process, from `/proc/self/limits`.
pub fn open_files_limit() -> anyhow::Result<(u64, u64)> {
    let limits =
        std::fs::read_to_string("/proc/self/limits").context("reading /proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no 'Max open files' in /proc/self/limits")?;
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| match w {
            "unlimited" => Some(u64::MAX),
            w => w.parse().ok(),
        })
        .collect();
    match nums.as_slice() {
        [soft, hard, ..] => Ok((*soft, *hard)),
        _ => bail!("cannot parse {line:?}"),
    }
}

/// Makes sure this process (and so the servers it starts, which inherit the limit) may
/// open `needed` files: raises the soft limit with `prlimit(1)` when the hard limit allows,
/// else fails with what to do.
pub fn ensure_open_files(needed: u64) -> anyhow::Result<()> {
    let (soft, hard) = open_files_limit()?;
    if soft >= needed {
        return Ok(());
    }
    if hard >= needed {
        let status = std::process::Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={hard}:{hard}"))
            .status();
        if matches!(status, Ok(s) if s.success()) && open_files_limit()?.0 >= needed {
            return Ok(());
        }
    }
    bail!(
        "the open-files limit is {soft} (hard {hard}) but {needed} are needed for this many \
         proxies (one socket each, in the benchmark and in the server): run `ulimit -n {needed}` \
         (as root, or after raising the hard limit) before the benchmark"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let m = Metrics::parse(
            "# HELP x y\n# TYPE x counter\nshoal_xds_push_bytes_total{type=\"cds\"} 10\n\
             shoal_xds_push_bytes_total{type=\"eds\"} 5\nshoal_ready 1\n",
        );
        assert_eq!(m.get("shoal_xds_push_bytes_total"), 15.0);
        assert_eq!(m.get("shoal_ready"), 1.0);
        assert_eq!(m.get("missing"), 0.0);
    }

    #[test]
    fn reads_own_process_stats() {
        let pid = std::process::id();
        assert!(proc_rss_kib(pid).unwrap() > 0);
        proc_cpu(pid).unwrap();
        let (soft, hard) = open_files_limit().unwrap();
        assert!(soft <= hard);
    }
}
