//! Pods with Istio's sidecar capture, as Linux network namespaces: a Rust wrapper over
//! `scripts/mesh-netns.sh` (read its header for the recipe and the address plan).
//!
//! A [`MeshNet`] is one test network `198.18.N.0/24` (N picked free, so tests run in
//! parallel) whose bridge lives in its own namespace; the test process in the root namespace
//! reaches every pod, and every pod reaches the root namespace at [`MeshNet::host_ip`]
//! (where shoal listens). A [`Pod`] is a namespace on it; [`Pod::capture`] installs the nat
//! rules of `istio-iptables`, so the pod's TCP goes to its Envoy ([`crate::Envoy::start_in_pod`],
//! uid/gid 1337) on 15001 (outbound) and 15006 (inbound).
//!
//! Everything is removed when the `MeshNet` and its pods drop, also when a test panics, and
//! networks left behind by test processes that died are removed at the next
//! [`MeshNet::create`].
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), `ip`, `setpriv` and iptables (scripts/test.sh
//! installs it). Tests call [`skip_if_unavailable`] first: without these they fail, unless
//! `SHOAL_SKIP_NETNS=1` says to skip them.

use crate::process::Process;
use crate::shoal::binary;
use anyhow::{anyhow, bail, Context};
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::process::Command;

/// The uid and gid the sidecar runs as (what istio-iptables excludes from capture).
pub const PROXY_UID: u32 = 1337;
/// Envoy's admin port in a pod (excluded from inbound capture, so the test reaches it).
pub const ADMIN_PORT: u16 = 15000;
/// Where the pod's outbound TCP is redirected (Envoy's `virtualOutbound`).
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
/// Where the pod's inbound TCP is redirected (Envoy's `virtualInbound`).
pub const INBOUND_CAPTURE_PORT: u16 = 15006;
/// Envoy's inbound passthrough connects to the app from this address.
pub const INBOUND_PASSTHROUGH_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);

/// How long a client command in a pod may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server in a pod may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(15);
const HINT: &str = "build it: cargo build -p shoal-tests --bins";

/// The recipe.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/mesh-netns.sh")
}

/// Whether network namespaces, iptables and setpriv can be used here (root, CAP_NET_ADMIN,
/// CAP_SYS_ADMIN); `Err` says what is missing. Checked once per process.
pub fn available() -> Result<(), String> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED.get_or_init(check_available).clone()
}

fn check_available() -> Result<(), String> {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
        })
        .ok_or("cannot read the effective uid from /proc/self/status")?;
    if euid != "0" {
        return Err(format!("must run as root (effective uid is {euid})"));
    }
    if !script().is_file() {
        return Err(format!("{} is missing", script().display()));
    }
    for (program, arg) in [("ip", "-V"), ("setpriv", "--version")] {
        sh(program, &[arg]).map_err(|e| format!("{program}: {e}"))?;
    }
    if sh("iptables-nft", &["--version"]).is_err() && sh("iptables-legacy", &["--version"]).is_err()
    {
        return Err("iptables is not installed (apt-get install -y iptables)".into());
    }
    // The real test: creating and deleting a namespace needs CAP_SYS_ADMIN too.
    let probe = format!("shoalcheck{}", std::process::id());
    sh("ip", &["netns", "add", &probe]).map_err(|e| format!("ip netns add: {e}"))?;
    sh("ip", &["netns", "del", &probe]).map_err(|e| format!("ip netns del: {e}"))?;
    Ok(())
}

/// For the first line of a test: `true` (skip the test) when namespaces are unavailable
/// and `SHOAL_SKIP_NETNS=1`; panics, naming what is missing, when they are unavailable
/// otherwise (so a broken environment fails loudly instead of passing silently).
pub fn skip_if_unavailable() -> bool {
    match available() {
        Ok(()) => false,
        Err(e) if std::env::var("SHOAL_SKIP_NETNS").is_ok_and(|v| v == "1") => {
            eprintln!("skipped (SHOAL_SKIP_NETNS=1): network namespaces unavailable: {e}");
            true
        }
        Err(e) => panic!(
            "network namespace tests cannot run: {e}\n\
             (run as root with iptables installed, e.g. scripts/test.sh; or set \
             SHOAL_SKIP_NETNS=1 to skip them)"
        ),
    }
}

/// Runs a short command synchronously; `Err` holds its output.
fn sh<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}\n{}{}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs the recipe script synchronously; `Err` holds its output.
fn try_recipe(args: &[&str]) -> Result<String, String> {
    let script = script();
    let mut all = vec![script.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    sh("bash", &all)
}

/// Runs the recipe script synchronously; panics with its output on failure.
fn recipe(args: &[&str]) -> String {
    try_recipe(args).unwrap_or_else(|e| panic!("{e}"))
}

/// One test network (see the module docs). Removed (with its pods, and whatever still runs
/// in them) when it and all its [`Pod`]s have dropped.
pub struct MeshNet {
    inner: Arc<NetInner>,
}

struct NetInner {
    name: String,
    octet: u8,
    next_host: AtomicU8,
}

impl MeshNet {
    /// Creates a network named `sh<pid>n<counter>` on a free `198.18.N.0/24`, first removing
    /// the networks of test processes that have exited.
    pub fn create() -> MeshNet {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        static SWEPT: OnceLock<()> = OnceLock::new();
        if let Err(e) = available() {
            panic!("network namespaces unavailable: {e}");
        }
        SWEPT.get_or_init(remove_stale);
        let name = format!(
            "sh{}n{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        assert!(name.len() <= 12, "network name {name} too long");
        // From here on the network exists (maybe half): drop must remove it.
        let mut inner = NetInner {
            name,
            octet: 0,
            next_host: AtomicU8::new(2),
        };
        let subnet = match try_recipe(&["up", &inner.name, "auto"]) {
            Ok(out) => out,
            Err(e) => {
                drop(inner); // runs `down`
                panic!("creating the test network: {e}");
            }
        };
        let subnet = subnet.trim();
        inner.octet = subnet
            .strip_prefix("198.18.")
            .and_then(|s| s.strip_suffix(".0/24"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("mesh-netns.sh up printed {subnet:?}, not 198.18.N.0/24"));
        MeshNet {
            inner: Arc::new(inner),
        }
    }

    /// The network's name (the prefix of its namespaces).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// `198.18.N.0/24`.
    pub fn subnet(&self) -> String {
        format!("198.18.{}.0/24", self.inner.octet)
    }

    /// The root namespace's address on this network (`198.18.N.254`): where processes of
    /// the test (shoal) listen for the pods.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.inner.octet, 254)
    }

    /// The pods' default gateway (`198.18.N.1`, the bridge; it never forwards).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.inner.octet, 1)
    }

    /// Adds a pod (not captured yet) with the next free address, `198.18.N.2` onwards.
    /// `name`: `[a-z0-9-]`.
    pub fn add_pod(&self, name: &str) -> Pod {
        let host = self.inner.next_host.fetch_add(1, Ordering::Relaxed);
        assert!(
            (2..=253).contains(&host),
            "too many pods in {}",
            self.name()
        );
        let ip = Ipv4Addr::new(198, 18, self.inner.octet, host);
        recipe(&["pod", &self.inner.name, name, &ip.to_string()]);
        Pod {
            net: self.inner.clone(),
            name: name.to_string(),
            ip,
        }
    }
}

impl MeshNet {
    /// Gives `pod` (of another network) a second interface on this network, with the next
    /// free address here, and returns that address: the pod is then reachable from this
    /// network's pods on it, while the rest of its own network stays unreachable (an
    /// east-west gateway's external address).
    pub fn attach(&self, pod: &Pod) -> Ipv4Addr {
        let host = self.inner.next_host.fetch_add(1, Ordering::Relaxed);
        assert!(
            (2..=253).contains(&host),
            "too many pods in {}",
            self.name()
        );
        let ip = Ipv4Addr::new(198, 18, self.inner.octet, host);
        recipe(&[
            "attach",
            &pod.net.name,
            &pod.name,
            &self.inner.name,
            &ip.to_string(),
        ]);
        ip
    }
}

impl Drop for NetInner {
    fn drop(&mut self) {
        if let Err(e) = try_recipe(&["down", &self.name]) {
            eprintln!("removing test network {}: {e}", self.name);
        }
    }
}

/// Removes the networks (namespaces, root veths) whose creating test process has exited:
/// names `sh<pid>n<counter>...` with no process `<pid>`.
fn remove_stale() {
    let mut nets: Vec<String> = Vec::new();
    let namespaces = sh("ip", &["netns", "list"]).unwrap_or_default();
    let links = sh("ip", &["-o", "link", "show"]).unwrap_or_default();
    let candidates = namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .chain(
            links
                .lines()
                .filter_map(|l| l.split(": ").nth(1))
                .map(|n| n.split('@').next().unwrap_or(n)),
        );
    for candidate in candidates {
        let Some((net, _)) = candidate.split_once('-') else {
            continue;
        };
        let Some(pid) = owner_pid(net) else { continue };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && !nets.iter().any(|n| n == net)
        {
            nets.push(net.to_string());
        }
    }
    for net in nets {
        eprintln!("removing stale test network {net}");
        if let Err(e) = try_recipe(&["down", &net]) {
            eprintln!("{e}");
        }
    }
}

/// The pid in a network name `sh<pid>n<counter>`.
fn owner_pid(net: &str) -> Option<u32> {
    let (pid, counter) = net.strip_prefix("sh")?.split_once('n')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if all_digits(pid) && all_digits(counter) {
        pid.parse().ok()
    } else {
        None
    }
}

/// A pod: a network namespace on a [`MeshNet`] (see the module docs). Holds its network
/// alive.
pub struct Pod {
    net: Arc<NetInner>,
    name: String,
    ip: Ipv4Addr,
}

/// What a client command run in a pod printed.
#[derive(Debug)]
pub struct RunOutput {
    /// How it exited.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl RunOutput {
    /// Whether it exited with 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The standard output; panics with everything it printed unless it exited with 0.
    pub fn expect_success(&self, what: &str) -> &str {
        if !self.success() {
            panic!(
                "{what}: {}\nstdout:\n{}\nstderr:\n{}",
                self.status, self.stdout, self.stderr
            );
        }
        &self.stdout
    }

    /// For `shoal-testapp http-get` (single request): the status and the body as JSON
    /// (`Null` when the body is not JSON).
    pub fn http(&self) -> anyhow::Result<(u16, serde_json::Value)> {
        let (first, body) = self.stdout.split_once('\n').unwrap_or((&self.stdout, ""));
        let body = match body.split_once('\n') {
            Some((h, rest)) if h.starts_with("headers: ") => rest,
            _ => body,
        };
        let status = first
            .strip_prefix("status: ")
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| anyhow!("not http-get output: {self:?}"))?;
        let json = serde_json::from_str(body.trim()).unwrap_or(serde_json::Value::Null);
        Ok((status, json))
    }

    /// For `http-get --show-headers`: the response headers (lowercase names).
    pub fn response_headers(&self) -> serde_json::Map<String, serde_json::Value> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix("headers: "))
            .and_then(|h| serde_json::from_str(h).ok())
            .unwrap_or_default()
    }

    /// The body of `http-get` output as text.
    pub fn body_text(&self) -> String {
        self.stdout
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with("headers: "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The standard output as JSON (`http-get --count`).
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(self.stdout.trim()).with_context(|| format!("not JSON: {self:?}"))
    }
}

impl Pod {
    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pod's IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The network namespace (for `ip netns exec`).
    pub fn netns(&self) -> String {
        format!("{}-{}", self.net.name, self.name)
    }

    /// Installs istio-iptables' nat rules (see scripts/mesh-netns.sh): outbound TCP to
    /// 15001, inbound TCP to 15006, except traffic of uid/gid 1337 and inbound ports 15008,
    /// 15090, 15021, 15020 and 15000. Idempotent.
    pub fn capture(&self) {
        self.capture_excluding(&[]);
    }

    /// [`Pod::capture`], excluding more inbound ports from capture.
    pub fn capture_excluding(&self, inbound_ports: &[u16]) {
        let mut args = vec!["capture", &self.net.name, &self.name];
        let ports = inbound_ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if !ports.is_empty() {
            args.extend(["-d", &ports]);
        }
        recipe(&args);
    }

    /// The pod's nat table (`iptables-save -t nat`), for diagnostics.
    pub fn iptables_save(&self) -> String {
        recipe(&["iptables", &self.net.name, &self.name])
    }

    /// `program` to run in the pod as root (`ip netns exec`). Add arguments, then spawn it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec"])
            .arg(self.netns())
            .arg(program)
            .kill_on_drop(true);
        cmd
    }

    /// `program` to run in the pod as `uid`/`gid` without supplementary groups or
    /// capabilities (`setpriv`). `program` must be readable by that user: see
    /// [`readable_by_all`].
    pub fn command_as(&self, uid: u32, gid: u32, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = self.command("setpriv");
        cmd.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .args(["--clear-groups", "--"])
            .arg(program);
        cmd
    }

    /// Starts `shoal-testapp ARGS` in the pod as root, as a [`Process`] named
    /// `<pod>-<name>` (killed on drop, its log printed when the test fails). Does not wait.
    pub fn spawn_app(&self, name: &str, args: &[&str]) -> Process {
        let mut cmd = self.command(binary("shoal-testapp"));
        cmd.args(args);
        let dir = tempfile::tempdir().expect("app temp dir");
        Process::spawn(&format!("{}-{name}", self.name), cmd, dir, HINT)
    }

    /// Starts `shoal-testapp http-server` on 0.0.0.0:`port` answering as `name`, and waits
    /// until it listens.
    pub async fn http_server(&self, name: &str, port: u16) -> Process {
        let port = port.to_string();
        let args = ["http-server", "--port", &port, "--name", name];
        let mut process = self.spawn_app(name, &args);
        wait_listening(&mut process).await;
        process
    }

    /// Starts `shoal-testapp tcp-echo` on 0.0.0.0:`port` answering `<name>:<line>`, and
    /// waits until it listens.
    pub async fn tcp_echo(&self, name: &str, port: u16) -> Process {
        let port = port.to_string();
        let args = ["tcp-echo", "--port", &port, "--name", name];
        let mut process = self.spawn_app(name, &args);
        wait_listening(&mut process).await;
        process
    }

    /// Runs `shoal-testapp ARGS` (a client: `http-get`, `tcp-send`) in the pod as root and
    /// returns what it printed. Panics if it cannot start or runs over 30 s.
    pub async fn run(&self, args: &[&str]) -> RunOutput {
        let mut cmd = self.command(binary("shoal-testapp"));
        cmd.args(args);
        run(cmd, args).await
    }

    /// [`Pod::run`] as `uid`/`gid` (e.g. [`PROXY_UID`], whose traffic is not captured).
    pub async fn run_as(&self, uid: u32, gid: u32, args: &[&str]) -> RunOutput {
        let app = readable_by_all(&binary("shoal-testapp"));
        let mut cmd = self.command_as(uid, gid, app);
        cmd.args(args);
        run(cmd, args).await
    }
}

async fn run(mut cmd: Command, args: &[&str]) -> RunOutput {
    cmd.stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("shoal-testapp {args:?} ran over {RUN_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run shoal-testapp {args:?}: {e}; {HINT}"));
    RunOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits until a `shoal-testapp` server printed `listening on`; panics with its log if it
/// exits or takes too long.
pub async fn wait_listening(process: &mut Process) {
    let deadline = tokio::time::Instant::now() + LISTEN_TIMEOUT;
    while !process.log().contains("listening on ") {
        process.assert_running();
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{} not listening after {LISTEN_TIMEOUT:?}:\n{}",
                process.name(),
                process.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `path` if every user can read and execute it, else a copy that they can: in
/// `$TMPDIR/shoal-bin-<key>/` (mode 0755), keyed by the file's path, size and modification
/// time, made once and shared by test processes. Use it for programs run as another user
/// (the sidecar's uid 1337 cannot enter /root, where pip puts Envoy).
pub fn readable_by_all(path: &Path) -> PathBuf {
    // One copy at a time in this process (parallel tests want the same binary); other
    // processes copy to their own partial file and rename.
    static COPYING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = COPYING.lock().unwrap_or_else(|e| e.into_inner());
    match try_readable_by_all(path) {
        Ok(p) => p,
        Err(e) => panic!("making {} readable by every user: {e:#}", path.display()),
    }
}

fn try_readable_by_all(path: &Path) -> anyhow::Result<PathBuf> {
    let path = path
        .canonicalize()
        .with_context(|| format!("resolving {}", path.display()))?;
    let meta = std::fs::metadata(&path)?;
    if meta.permissions().mode() & 0o005 == 0o005 && dirs_traversable(&path) {
        return Ok(path);
    }
    let mut key = std::collections::hash_map::DefaultHasher::new();
    (&path, meta.len(), meta.mtime(), meta.mtime_nsec()).hash(&mut key);
    let dir = std::env::temp_dir().join(format!("shoal-bin-{:016x}", key.finish()));
    let file_name = path.file_name().ok_or_else(|| anyhow!("no file name"))?;
    let copy = dir.join(file_name);
    if copy.is_file() && dirs_traversable(&copy) {
        return Ok(copy);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    // Copy under a private name, then rename: parallel test processes never see half a file.
    let partial = dir.join(format!(
        ".{}.{}.partial",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::copy(&path, &partial).with_context(|| format!("copying to {}", partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &copy)?;
    if !dirs_traversable(&copy) {
        bail!(
            "{} is not reachable by other users (a directory above it lacks o+x): set TMPDIR",
            copy.display()
        );
    }
    Ok(copy)
}

/// Whether every directory above `path` lets every user through (o+x).
fn dirs_traversable(path: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// Makes a directory (and the files in it) readable by every user: for the temporary
/// directory holding the bootstrap of an Envoy that runs as uid 1337.
pub fn share_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// `bootstrap_yaml` with its admin listening on `ip`, port [`ADMIN_PORT`]: the bootstraps of
/// [`crate::bootstrap`] put the admin on 127.0.0.1, which the test (in the root namespace)
/// cannot reach in a pod.
pub fn admin_on(bootstrap_yaml: &str, ip: Ipv4Addr) -> String {
    let mut doc: serde_json::Value =
        shoal_common::yaml::from_str(bootstrap_yaml).expect("the bootstrap is YAML");
    doc["admin"] = shoal_common::yaml::from_str(&format!(
        "address: {{ socket_address: {{ address: {ip}, port_value: {ADMIN_PORT} }} }}"
    ))
    .expect("admin YAML");
    shoal_common::yaml::to_string(&doc).expect("serializing the bootstrap")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_owner_pids_of_network_names_only() {
        assert_eq!(owner_pid("sh1234n0"), Some(1234));
        assert_eq!(owner_pid("sh1234n17"), Some(1234));
        assert_eq!(owner_pid("sh1234"), None);
        assert_eq!(owner_pid("shn1"), None);
        assert_eq!(owner_pid("demo"), None);
        assert_eq!(owner_pid("sh12x4n1"), None);
    }

    #[test]
    fn moves_the_admin_to_the_pod_ip() {
        let y = "admin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 9 }\nnode: { id: x }\n";
        let doc: serde_json::Value =
            shoal_common::yaml::from_str(&admin_on(y, Ipv4Addr::new(198, 18, 0, 2))).unwrap();
        let a = &doc["admin"]["address"]["socket_address"];
        assert_eq!(a["address"].as_str(), Some("198.18.0.2"));
        assert_eq!(a["port_value"].as_u64(), Some(15000));
        assert_eq!(doc["node"]["id"].as_str(), Some("x"));
    }
}
