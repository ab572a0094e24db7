//! One simulated-proxy process per replica (`--scale-out --fleet-processes`).
//!
//! In-process, every simulated proxy of a scale-out run shares the benchmark's cores, and
//! at 18 000 proxies that process saturated them: the wall time measured was the load
//! generator's, not the replicas'. In this mode the proxies of replica r run in a child
//! process of their own (`shoal-bench --fleet-child`, optionally pinned with `taskset -c`),
//! and the benchmark keeps everything else: the mesh, the ingester, NATS, the replicas, the
//! changes and the report.
//!
//! Parent and child speak JSON lines over the child's stdin and stdout:
//!
//! - parent → child: [`ToChild::Start`] (server, mode, the proxies' identities), then
//!   [`ToChild::Connect`] when the measured phase starts, [`ToChild::Active`] /
//!   [`ToChild::Clear`] around each change, [`ToChild::Shutdown`] at the end (or EOF);
//! - child → parent: [`FromChild::Ready`] once set up, [`FromChild::Ack`] once an active
//!   change is in place (the parent edits the mesh only after every child acknowledged,
//!   so no receipt can be missed), and every proxy [`Event`], with the proxy's index in
//!   the benchmark (not in the child).
//!
//! The child writes nothing else on stdout; its diagnostics go to stderr.

use crate::client::{self, ActiveChange, Event, Fleet, Mode};
use crate::client::{ProxyCounters, ProxyIdentity};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use shoal_proto::XdsType;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The hidden flag that makes `shoal-bench` a fleet process.
pub const CHILD_FLAG: &str = "--fleet-child";

/// Who a proxy is, on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireIdentity {
    /// Index in the benchmark's fleet.
    pub index: usize,
    /// Namespace.
    pub namespace: String,
    /// Istio node id.
    pub node_id: String,
    /// Label `app`.
    pub app: String,
    /// `INTERCEPTION_MODE`, when sent.
    pub interception: Option<String>,
}

impl From<&ProxyIdentity> for WireIdentity {
    fn from(id: &ProxyIdentity) -> Self {
        WireIdentity {
            index: id.index,
            namespace: id.namespace.clone(),
            node_id: id.node_id.clone(),
            app: id.app.clone(),
            interception: id.interception.clone(),
        }
    }
}

/// Parent → child.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToChild {
    /// Set up a fleet (first line, once).
    Start {
        /// ADS variant.
        mode: Mode,
        /// The replica every proxy of this child connects (and reconnects) to.
        server: SocketAddr,
        /// Connection handshakes in flight at most, in this child.
        connect_concurrency: usize,
        /// The proxies.
        proxies: Vec<WireIdentity>,
    },
    /// Start every proxy.
    Connect,
    /// A change to watch for (see [`ActiveChange`]).
    Active {
        /// Change number.
        id: u64,
        /// Type URL of the resource that carries it.
        type_url: String,
        /// The resource.
        resource: String,
        /// Bytes that appear in it once the change is applied.
        marker: Vec<u8>,
    },
    /// No change to watch for.
    Clear,
    /// Say what the first few unconfigured proxies still lack (a diagnostic, when the
    /// parent gives up waiting).
    Pending,
    /// Disconnect every proxy and exit.
    Shutdown,
}

/// Child → parent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromChild {
    /// The fleet is set up; waiting for [`ToChild::Connect`].
    Ready,
    /// Change `change` is active in the child.
    Ack {
        /// Change number.
        change: u64,
    },
    /// A proxy's event.
    Event(Event),
    /// The answer to [`ToChild::Pending`]: up to three unconfigured proxies and what each
    /// lacks.
    Pending {
        /// `proxy <index>: <what it lacks>`.
        proxies: Vec<String>,
    },
}

/// `event` of the child's proxy `local`, renumbered with `global` (child index →
/// benchmark index), as it goes on the wire: a fleet process records no bodies, and the
/// report's example of what a proxy holds is the benchmark's proxy 0, as in-process.
/// None for an index outside `global` (cannot happen).
fn renumbered(mut event: Event, global: &[usize]) -> Option<Event> {
    let proxy = event.proxy_mut();
    *proxy = global.get(*proxy).copied()?;
    if let Event::Configured {
        proxy,
        names,
        recording,
        ..
    } = &mut event
    {
        if *proxy != 0 {
            *names = None;
        }
        *recording = None;
    }
    Some(event)
}

// ---------------------------------------------------------------------------------------
// The child

/// `shoal-bench --fleet-child`: runs the fleet the parent describes on stdin until told
/// to shut down or stdin closes (the parent died). Exit status 0 on a clean shutdown.
pub fn child_main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal-bench fleet process: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_child()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shoal-bench fleet process: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_child() -> anyhow::Result<()> {
    // Blocking stdin and stdout on threads of their own: the workspace's tokio has no
    // `io-std`, and a feature for one child would rebuild tokio for every crate.
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<std::io::Result<String>>();
    std::thread::Builder::new()
        .name("fleet-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let stop = line.is_err();
                if lines_tx.send(line).is_err() || stop {
                    return;
                }
            }
        })
        .context("starting the stdin thread")?;
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<FromChild>();
    let writer = std::thread::Builder::new()
        .name("fleet-stdout".into())
        .spawn(move || -> std::io::Result<()> {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            while let Some(msg) = out_rx.blocking_recv() {
                serde_json::to_writer(&mut out, &msg)?;
                out.write_all(b"\n")?;
                // Flush when nothing else is queued: events arrive in bursts.
                if out_rx.is_empty() {
                    out.flush()?;
                }
            }
            out.flush()
        })
        .context("starting the stdout thread")?;

    let first = match lines.recv().await {
        Some(line) => line.context("reading stdin")?,
        None => bail!("stdin closed before the start message"),
    };
    let ToChild::Start {
        mode,
        server,
        connect_concurrency,
        proxies,
    } = serde_json::from_str(&first).context("the start message")?
    else {
        bail!("the first message is not a start message: {first}");
    };
    let global: Arc<Vec<usize>> = Arc::new(proxies.iter().map(|p| p.index).collect());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (active, active_rx) = watch::channel(None);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let fleet = Arc::new(Fleet::new(
        mode,
        vec![server],
        proxies.len(),
        connect_concurrency,
        active_rx,
        events_tx,
        shutdown_rx,
    ));
    // Which of the child's proxies were configured (for `Pending`), kept by the forwarder.
    let configured = Arc::new(std::sync::Mutex::new(vec![false; proxies.len()]));
    let forward = {
        let out_tx = out_tx.clone();
        let global = global.clone();
        let configured = configured.clone();
        tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                if let Event::Configured { proxy, .. } = &e {
                    let mut c = configured.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(done) = c.get_mut(*proxy) {
                        *done = true;
                    }
                }
                if let Some(w) = renumbered(e, &global) {
                    if out_tx.send(FromChild::Event(w)).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let _ = out_tx.send(FromChild::Ready);

    let mut tasks = JoinSet::new();
    let mut identities = Some(proxies);
    while let Some(line) = lines.recv().await {
        let line = line.context("reading stdin")?;
        let msg: ToChild =
            serde_json::from_str(&line).with_context(|| format!("bad message {line}"))?;
        match msg {
            ToChild::Start { .. } => bail!("a second start message"),
            ToChild::Connect => {
                // The child's own indices: the fleet's counters are per child.
                for (local, w) in identities.take().into_iter().flatten().enumerate() {
                    let id = ProxyIdentity {
                        index: local,
                        namespace: w.namespace,
                        node_id: w.node_id,
                        app: w.app,
                        interception: w.interception,
                    };
                    tasks.spawn(client::run_proxy(fleet.clone(), id));
                }
            }
            ToChild::Active {
                id,
                type_url,
                resource,
                marker,
            } => {
                let Some(ty) = XdsType::from_type_url(&type_url) else {
                    bail!("unknown type {type_url}");
                };
                let _ = active.send(Some(Arc::new(ActiveChange {
                    id,
                    ty,
                    resource,
                    marker: memchr::memmem::Finder::new(&marker).into_owned(),
                })));
                let _ = out_tx.send(FromChild::Ack { change: id });
            }
            ToChild::Clear => {
                let _ = active.send(None);
            }
            ToChild::Pending => {
                let done = configured.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let proxies = fleet
                    .counters()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !done.get(*i).copied().unwrap_or(true))
                    .take(3)
                    .map(|(i, c)| {
                        let p = c.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        format!(
                            "proxy {}: {}",
                            global.get(i).copied().unwrap_or(i),
                            p.as_deref().unwrap_or("nothing received")
                        )
                    })
                    .collect();
                let _ = out_tx.send(FromChild::Pending { proxies });
            }
            ToChild::Shutdown => break,
        }
    }
    let _ = shutdown.send(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(Some(_)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {}
    tasks.abort_all();
    drop(fleet);
    // The fleet's event sender is gone with the proxies: the forwarder drains and ends.
    let _ = tokio::time::timeout(Duration::from_secs(5), forward).await;
    drop(out_tx);
    match writer.join() {
        Ok(r) => r.context("writing stdout"),
        Err(_) => bail!("the stdout thread panicked"),
    }
}

// ---------------------------------------------------------------------------------------
// The parent

/// What a child said besides events.
enum Control {
    Ready,
    Ack(u64),
    Pending(Vec<String>),
    /// Its stdout ended or carried garbage.
    Gone(String),
}

/// One fleet process.
pub struct FleetChild {
    /// The replica its proxies connect to.
    pub replica: usize,
    /// Its process id.
    pub pid: u32,
    /// The CPUs it is pinned to, if any.
    pub cpus: Option<String>,
    /// Benchmark indices of its proxies.
    pub proxies: Vec<usize>,
    child: Child,
    stdin: ChildStdin,
    reader: tokio::task::JoinHandle<()>,
}

/// The fleet processes of a run; killed when dropped.
pub struct FleetProcs {
    /// One per replica.
    pub children: Vec<FleetChild>,
    control: mpsc::UnboundedReceiver<(usize, Control)>,
}

/// The CPUs of a `taskset`-style list (`4-15`, `1,3,5-7`).
pub fn parse_cpu_list(list: &str) -> anyhow::Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| -> anyhow::Result<u32> {
            s.trim()
                .parse()
                .with_context(|| format!("{s:?} in the CPU list {list:?} is not a CPU number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                anyhow::ensure!(a <= b, "bad range {part:?} in the CPU list {list:?}");
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    anyhow::ensure!(!cpus.is_empty(), "the CPU list {list:?} is empty");
    Ok(cpus)
}

/// `--fleet-cpus LIST` divided among `n` children: consecutive equal shares (the
/// remainder unused), e.g. `4-15` for 4 children: `4,5,6`, `7,8,9`, `10,11,12`, `13,14,15`.
pub fn split_cpus(list: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let cpus = parse_cpu_list(list)?;
    let each = cpus.len() / n.max(1);
    anyhow::ensure!(
        each >= 1,
        "--fleet-cpus {list:?} has {} CPUs, fewer than the {n} fleet processes",
        cpus.len()
    );
    Ok(cpus
        .chunks(each)
        .take(n)
        .map(|c| c.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .collect())
}

impl FleetProcs {
    /// Starts one child per element of `shares` (replica r's server and its proxies),
    /// running `exe --fleet-child`, pinned to `cpus[r]` when given, and waits until each
    /// is set up. Their events go to `events` with benchmark indices; the parent's
    /// `counters` are marked with each proxy's replica (what the report tallies by).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        exe: &Path,
        mode: Mode,
        connect_concurrency: usize,
        shares: Vec<(SocketAddr, Vec<ProxyIdentity>)>,
        cpus: Option<Vec<String>>,
        events: mpsc::UnboundedSender<Event>,
        counters: &[ProxyCounters],
        timeout: Duration,
    ) -> anyhow::Result<FleetProcs> {
        let (control_tx, control) = mpsc::unbounded_channel();
        let mut children = Vec::new();
        let n = shares.len();
        for (r, (server, ids)) in shares.into_iter().enumerate() {
            let cpus = cpus.as_ref().and_then(|c| c.get(r).cloned());
            let mut cmd = match &cpus {
                Some(list) => {
                    // taskset execs the program: the pid is the fleet process's.
                    let mut c = Command::new("taskset");
                    c.arg("-c").arg(list).arg(exe);
                    c
                }
                None => Command::new(exe),
            };
            cmd.arg(CHILD_FLAG)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            let mut child = cmd.spawn().with_context(|| {
                format!(
                    "starting fleet process {r} ({} {CHILD_FLAG}{})",
                    exe.display(),
                    if cpus.is_some() {
                        ", under taskset"
                    } else {
                        ""
                    }
                )
            })?;
            let pid = child.id().context("a fleet process exited at once")?;
            let stdin = child.stdin.take().context("fleet process stdin")?;
            let stdout = child.stdout.take().context("fleet process stdout")?;
            let reader = tokio::spawn(read_child(r, stdout, events.clone(), control_tx.clone()));
            for id in &ids {
                if let Some(c) = counters.get(id.index) {
                    c.server.store(r, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let proxies = ids.iter().map(|id| id.index).collect();
            let mut fc = FleetChild {
                replica: r,
                pid,
                cpus,
                proxies,
                child,
                stdin,
                reader,
            };
            fc.send(&ToChild::Start {
                mode,
                server,
                connect_concurrency,
                proxies: ids.iter().map(WireIdentity::from).collect(),
            })
            .await?;
            children.push(fc);
        }
        let mut procs = FleetProcs { children, control };
        let mut ready = vec![false; n];
        let deadline = Instant::now() + timeout;
        while ready.iter().any(|r| !r) {
            match procs.control_until(deadline).await? {
                (r, Control::Ready) => ready[r] = true,
                (_, Control::Ack(_) | Control::Pending(_)) => {}
                (r, Control::Gone(why)) => bail!("fleet process {r}: {why}"),
            }
        }
        Ok(procs)
    }

    async fn control_until(&mut self, deadline: Instant) -> anyhow::Result<(usize, Control)> {
        match tokio::time::timeout_at(deadline, self.control.recv()).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => bail!("every fleet process is gone"),
            Err(_) => bail!("a fleet process did not answer in time"),
        }
    }

    /// Sends `msg` to every child.
    pub async fn send_all(&mut self, msg: &ToChild) -> anyhow::Result<()> {
        for c in &mut self.children {
            c.send(msg).await?;
        }
        Ok(())
    }

    /// Makes `change` (None: no change) active in every child; with a change, waits
    /// until each has acknowledged it.
    pub async fn announce(
        &mut self,
        change: Option<&ActiveChange>,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let Some(change) = change else {
            return self.send_all(&ToChild::Clear).await;
        };
        self.send_all(&ToChild::Active {
            id: change.id,
            type_url: change.ty.type_url().to_string(),
            resource: change.resource.clone(),
            marker: change.marker.needle().to_vec(),
        })
        .await?;
        let mut acked = vec![false; self.children.len()];
        let deadline = Instant::now() + timeout;
        while acked.iter().any(|a| !a) {
            match self.control_until(deadline).await? {
                (r, Control::Ack(id)) if id == change.id => acked[r] = true,
                (_, Control::Ack(_) | Control::Ready | Control::Pending(_)) => {}
                (r, Control::Gone(why)) => bail!("fleet process {r}: {why}"),
            }
        }
        Ok(())
    }

    /// Up to three unconfigured proxies of each child and what they lack, as far as the
    /// children answer within a few seconds (a diagnostic: never fails).
    pub async fn pending(&mut self) -> Vec<String> {
        if self.send_all(&ToChild::Pending).await.is_err() {
            return vec!["(a fleet process did not take the question)".to_string()];
        }
        let mut out = Vec::new();
        let mut answered = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while answered < self.children.len() {
            match self.control_until(deadline).await {
                Ok((_, Control::Pending(p))) => {
                    answered += 1;
                    out.extend(p);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if answered < self.children.len() {
            out.push(format!(
                "({} fleet process(es) did not answer)",
                self.children.len() - answered
            ));
        }
        out
    }

    /// Fails when a child exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for c in &mut self.children {
            if let Ok(Some(status)) = c.child.try_wait() {
                bail!(
                    "fleet process {} (pid {}) exited with {status}",
                    c.replica,
                    c.pid
                );
            }
        }
        Ok(())
    }

    /// Tells every child to shut down and waits for them (bounded), then kills what is
    /// left.
    pub async fn stop(&mut self) {
        let _ = self.send_all(&ToChild::Shutdown).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        for c in &mut self.children {
            if tokio::time::timeout_at(deadline, c.child.wait())
                .await
                .is_err()
            {
                let _ = c.child.kill().await;
            }
            c.reader.abort();
        }
    }
}

impl FleetChild {
    async fn send(&mut self, msg: &ToChild) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(msg).context("encoding a fleet message")?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .with_context(|| format!("writing to fleet process {}", self.replica))?;
        self.stdin
            .flush()
            .await
            .with_context(|| format!("writing to fleet process {}", self.replica))
    }
}

/// Forwards child `r`'s stdout: events to `events`, the rest to `control`.
async fn read_child(
    r: usize,
    stdout: tokio::process::ChildStdout,
    events: mpsc::UnboundedSender<Event>,
    control: mpsc::UnboundedSender<(usize, Control)>,
) {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => {
                let _ = control.send((r, Control::Gone("its stdout closed".into())));
                return;
            }
            Err(e) => {
                let _ = control.send((r, Control::Gone(format!("reading its stdout: {e}"))));
                return;
            }
        };
        match serde_json::from_str::<FromChild>(&line) {
            Ok(FromChild::Event(w)) => {
                let _ = events.send(w);
            }
            Ok(FromChild::Ready) => {
                let _ = control.send((r, Control::Ready));
            }
            Ok(FromChild::Ack { change }) => {
                let _ = control.send((r, Control::Ack(change)));
            }
            Ok(FromChild::Pending { proxies }) => {
                let _ = control.send((r, Control::Pending(proxies)));
            }
            Err(e) => {
                let _ = control.send((r, Control::Gone(format!("bad line {line:?}: {e}"))));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_split_into_equal_shares() {
        assert_eq!(parse_cpu_list("1,3,5-7").unwrap(), vec![1, 3, 5, 6, 7]);
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("5-3").is_err());
        assert_eq!(
            split_cpus("4-15", 4).unwrap(),
            vec!["4,5,6", "7,8,9", "10,11,12", "13,14,15"]
        );
        assert_eq!(split_cpus("1-5", 2).unwrap(), vec!["1,2", "3,4"]);
        assert!(split_cpus("1", 2).is_err());
    }

    #[test]
    fn events_cross_the_wire_with_benchmark_indices() {
        let global = [7, 10];
        let e = Event::Observed {
            proxy: 1,
            change: 3,
            at_us: 42,
        };
        let w = renumbered(e, &global).unwrap();
        let line = serde_json::to_string(&FromChild::Event(w)).unwrap();
        let FromChild::Event(w) = serde_json::from_str(&line).unwrap() else {
            panic!("an event");
        };
        assert!(matches!(
            w,
            Event::Observed {
                proxy: 10,
                change: 3,
                at_us: 42
            }
        ));
        let e = Event::Nack {
            proxy: 2,
            error: "x".into(),
        };
        assert!(renumbered(e, &global).is_none());
    }
}
