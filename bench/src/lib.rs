//! `shoal-bench`: a load benchmark of the real shoal processes (see docs/benchmarks.md).
//!
//! One run: generate a mesh into a temporary directory ([`manifests`]); start nats-server,
//! `shoal-ingester --source file:DIR` and one or two `shoal-server` replicas ([`procs`]);
//! connect P simulated Envoy sidecars, each on its own HTTP/2 connection ([`client`]);
//! then measure
//!
//! 1. the time until every proxy is fully configured;
//! 2. server RSS per connected proxy;
//! 3. K endpoint changes and K VirtualService changes: from the ingester's
//!    `observed_at_ms` (read from the bus envelope of the changed key) to receipt by each
//!    affected proxy, with the server CPU and bytes each change cost;
//! 4. with two replicas, all proxies moving from A (killed) to B: how many resources B
//!    resends that a proxy already held at the same version;
//!
//! and optionally
//!
//! - the replay baseline (`--baseline replay`, after 1 and 2): one delta client per proxy
//!   class records what shoal sends it ([`replay`]), `shoal-replay` serves the recording,
//!   and the same proxies connect to it as they did to shoal, so that the initial phase's
//!   figures can be given as ratios to a server that does nothing but send bytes;
//! - the connection storm (`--storm`, after 3, before 4): a VirtualService change seen by
//!   every proxy and, at the same moment, as many fresh proxies connecting to replica A;
//!   they are disconnected afterwards, so the replica move concerns the first proxies only;
//! - the scale-out (`--scale-out`, instead of the replica move): N replicas, the proxies
//!   spread over them, per-replica figures; with `--fleet-processes` the proxies of each
//!   replica run in a process of their own ([`fleetproc`]), so the load generator is not
//!   what sets the wall time.
//!
//! Everything is bounded by timeouts, and every process is killed when [`run`] returns,
//! whether it succeeds or fails.
//!
//! The crate holds the library, the `shoal-bench` binary (`src/main.rs`), the replay
//! baseline's server `shoal-replay` (`src/bin/shoal-replay.rs`) and the tests that run the
//! benchmark (`tests/`); it uses the process harness of the tests crate (`shoal_tests`).
#![forbid(unsafe_code)]

pub mod client;
pub mod fleetproc;
pub mod manifests;
pub mod procs;
pub mod replay;
pub mod report;
pub mod validate;

use anyhow::{bail, Context};
use client::{
    ActiveChange, Event, Fingerprint, Fleet, HeldNames, Mode, ProxyCounters, ProxyIdentity,
    RecordedItem,
};
use futures::StreamExt;
use manifests::{BenchMesh, MeshShape, ScenarioKind};
use procs::{Binaries, Ingester, Nats, Server};
use report::{
    ratio, CacheUse, ChangeReport, ChangeSample, Dist, FleetProcess, Initial, Machine, Memory,
    Ratios, ReplayBaseline, ReplicaInitial, ReplicaMove, Report, Scenario, Soak, Storm,
};
use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::bus::{Bucket, StateBus, WatchEvent};
use shoal_common::envelope::now_ms;
use shoal_common::keys;
use shoal_common::model::ConfigKind;
use shoal_common::Envelope;
use shoal_proto::XdsType;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Which VirtualService a VS change edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VsChange {
    /// `istio-system/shared`, which every proxy sees.
    Mesh,
    /// `ns-0/routes`: with Sidecar isolation only ns-0's proxies see it.
    Namespace,
}

/// Where the ingester reads the mesh from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// `--source file:DIR`: manifests written to a directory the ingester polls.
    File,
    /// `--source kube`: the manifests applied to the Kubernetes API test server
    /// (`shoal_tests::kubeapi`, in this process), which the ingester watches.
    Kube,
}

/// What the initial phase is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// Nothing.
    None,
    /// `shoal-replay`: the same proxies against a server that replays the resources shoal
    /// sent, recorded per proxy class in the same run.
    Replay,
}

/// The benchmark's parameters.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Simulated proxies.
    pub proxies: usize,
    /// Namespaces (proxies and services are spread over them).
    pub namespaces: usize,
    /// Services.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// The mesh and proxies: flat, per-namespace Sidecar isolation, or captured sidecars.
    pub scenario: ScenarioKind,
    /// SotW or delta.
    pub mode: Mode,
    /// Server replicas (1 or 2; with 2, the replica move is measured).
    pub replicas: usize,
    /// Repetitions of each change.
    pub changes: usize,
    /// Which VirtualService the VS change edits.
    pub vs_change: VsChange,
    /// Global time limit.
    pub timeout: Duration,
    /// Time limit for one phase (initial config, one change, the move).
    pub phase_timeout: Duration,
    /// Connection handshakes in flight at most.
    pub connect_concurrency: usize,
    /// Where the shoal binaries are (default: see [`Binaries::locate`]).
    pub bin_dir: Option<PathBuf>,
    /// Extra `shoal-server` arguments.
    pub server_args: Vec<String>,
    /// CPUs the servers are pinned to (`taskset -c LIST`), if any.
    pub server_cpus: Option<String>,
    /// Print progress to stderr.
    pub progress: bool,
    /// The replay baseline of the initial phase.
    pub baseline: Baseline,
    /// Measure a connection storm: as many fresh proxies as `proxies` connecting during a
    /// VirtualService change.
    pub storm: bool,
    /// Spread the proxies over the replicas (proxy i first connects to replica i mod
    /// replicas) instead of starting them all on A; the replica move then moves A's half.
    pub spread: bool,
    /// After the changes: a soak of this long (an endpoint change every second, a
    /// VirtualService change every 30 s).
    pub soak: Option<Duration>,
    /// Scale-out: `replicas` (1 – 8; 1 is the lone replica to compare with) replicas from one ingester, the proxies spread over
    /// them, each replica on its own CPU when `server_cpus` lists one per replica; per
    /// replica figures, no replica move.
    pub scale_out: bool,
    /// Where the ingester reads the mesh from.
    pub source: Source,
    /// With `scale_out`: the proxies of each replica in a process of their own
    /// ([`fleetproc`]) instead of in the benchmark's.
    pub fleet_processes: bool,
    /// With `fleet_processes`: CPUs (`taskset` list) divided among the fleet processes in
    /// equal consecutive shares, one share per process.
    pub fleet_cpus: Option<String>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            proxies: 100,
            namespaces: 4,
            services: 40,
            endpoints: 3,
            scenario: ScenarioKind::Flat,
            mode: Mode::Delta,
            replicas: 1,
            changes: 3,
            vs_change: VsChange::Mesh,
            timeout: Duration::from_secs(600),
            phase_timeout: Duration::from_secs(120),
            connect_concurrency: 64,
            bin_dir: None,
            server_args: Vec::new(),
            server_cpus: None,
            progress: true,
            baseline: Baseline::None,
            storm: false,
            spread: false,
            soak: None,
            scale_out: false,
            source: Source::File,
            fleet_processes: false,
            fleet_cpus: None,
        }
    }
}

/// Runs the benchmark; every process it started is gone when this returns.
pub async fn run(cfg: &BenchConfig) -> anyhow::Result<Report> {
    anyhow::ensure!(cfg.proxies > 0, "--proxies must be at least 1");
    if cfg.scale_out {
        anyhow::ensure!(
            (1..=8).contains(&cfg.replicas),
            "--scale-out needs --replicas 1 to 8"
        );
        anyhow::ensure!(
            cfg.baseline == Baseline::None,
            "--scale-out has no replay baseline: pass --baseline none and compare with a lone replica (--replicas 1, --proxies divided by the replicas)"
        );
        if let Some(list) = &cfg.fleet_cpus {
            anyhow::ensure!(cfg.fleet_processes, "--fleet-cpus needs --fleet-processes");
            fleetproc::split_cpus(list, cfg.replicas)?;
        }
    } else {
        anyhow::ensure!(
            !cfg.fleet_processes && cfg.fleet_cpus.is_none(),
            "--fleet-processes and --fleet-cpus need --scale-out"
        );
        anyhow::ensure!(
            (1..=2).contains(&cfg.replicas),
            "--replicas must be 1 or 2 (more with --scale-out)"
        );
    }
    match tokio::time::timeout(cfg.timeout, Bench::run(cfg)).await {
        Ok(result) => result,
        Err(_) => bail!(
            "the benchmark did not finish within --timeout {:?}; try fewer proxies or a longer timeout",
            cfg.timeout
        ),
    }
}

/// A bus write the benchmark waits for: the changed key and its envelope's time.
struct BusWrite {
    bucket: Bucket,
    key: String,
    observed_at_ms: u64,
    /// When the benchmark's watch had it.
    seen_at_ms: u64,
}

impl BusWrite {
    /// From the ingester's observation until the benchmark's watch had it, ms.
    fn bus_ms(&self) -> f64 {
        self.seen_at_ms.saturating_sub(self.observed_at_ms) as f64
    }
}

/// A running benchmark.
struct Bench<'a> {
    cfg: &'a BenchConfig,
    bins: Binaries,
    mesh: BenchMesh,
    // Field order is drop order: proxies stop before the servers, servers before NATS.
    fleet: Arc<Fleet>,
    proxies: JoinSet<()>,
    /// With `--fleet-processes`: the processes running the main fleet's proxies (then
    /// `fleet` only holds the counters, marked with each proxy's replica).
    fleet_procs: Option<fleetproc::FleetProcs>,
    /// Where the fleet processes' events go (the same channel as `fleet`'s).
    events_tx: mpsc::UnboundedSender<Event>,
    shutdown: watch::Sender<bool>,
    active: watch::Sender<Option<Arc<ActiveChange>>>,
    events: mpsc::UnboundedReceiver<Event>,
    bus_writes: mpsc::UnboundedReceiver<BusWrite>,
    bus_watch: JoinSet<()>,
    servers: Vec<Server>,
    ingester: Ingester,
    nats: Nats,
    _dir: tempfile::TempDir,
    /// With `--source kube`: the API server the ingester watches.
    _kube: Option<Arc<shoal_tests::kubeapi::KubeApiServer>>,
    /// Proxy namespace index, per proxy.
    proxy_ns: Vec<usize>,
    next_change: u64,
    stream_errors: usize,
    streams_ended: usize,
    bad_responses: usize,
    nacks: usize,
    nack_examples: Vec<String>,
    error_examples: Vec<String>,
}

impl Bench<'_> {
    fn progress(&self, msg: impl AsRef<str>) {
        if self.cfg.progress {
            eprintln!("[shoal-bench] {}", msg.as_ref());
        }
    }

    async fn run(cfg: &BenchConfig) -> anyhow::Result<Report> {
        let bins = Binaries::locate(cfg.bin_dir.as_deref())?;
        if bins.debug_build && cfg.progress {
            eprintln!(
                "[shoal-bench] WARNING: using debug binaries ({}); build with `cargo build --release --bins` for real numbers",
                bins.server.display()
            );
        }
        // One socket per proxy in this process and in the server (which inherits the limit);
        // the replay baseline and the storm connect a second set of proxies.
        let sets = if cfg.storm || cfg.baseline == Baseline::Replay {
            2
        } else {
            1
        };
        // With fleet processes, this process holds none of the main fleet's sockets: each
        // fleet process (which inherits the limit) holds its replica's share.
        let main_fleet = if cfg.fleet_processes {
            cfg.proxies.div_ceil(cfg.replicas)
        } else {
            cfg.proxies
        };
        let side_fleet = if sets > 1 { cfg.proxies } else { 0 };
        procs::ensure_open_files((main_fleet + side_fleet) as u64 + 1024)?;
        let dir = tempfile::Builder::new()
            .prefix("shoal-bench-mesh-")
            .tempdir()
            .context("creating the manifest directory")?;
        // With `--source kube`, the API server the mesh is applied to as it is written.
        let kube = match cfg.source {
            Source::File => None,
            Source::Kube => Some(Arc::new(
                shoal_tests::kubeapi::KubeApiServer::builder()
                    .name("shoal-bench")
                    .start()
                    .await,
            )),
        };
        let mesh = BenchMesh::write(
            dir.path(),
            MeshShape {
                namespaces: cfg.namespaces,
                services: cfg.services,
                endpoints: cfg.endpoints,
                scenario: cfg.scenario,
            },
            kube.clone(),
        )?;
        let bench_cpu0 = procs::proc_cpu(std::process::id())?;
        let mut machine = Machine::detect();
        let servers: Vec<Vec<u32>> = (0..cfg.replicas)
            .filter_map(|r| replica_cpus(cfg, r))
            .filter_map(|list| fleetproc::parse_cpu_list(&list).ok())
            .collect();
        let mut others = procs::proc_allowed_cpus(std::process::id())
            .ok()
            .and_then(|list| fleetproc::parse_cpu_list(&list).ok())
            .unwrap_or_default();
        if let Some(list) = &cfg.fleet_cpus {
            others.extend(fleetproc::parse_cpu_list(list)?);
        }
        machine.note_shared_cores(&servers, &others);

        let mut nats = Nats::start().await?;
        let ingest_start = Instant::now();
        let mut ingester = match &kube {
            None => Ingester::start(&bins, &nats.url(), mesh.dir())?,
            Some(kube) => Ingester::start_kube(&bins, &nats.url(), &kube.kubeconfig())?,
        };
        let bus = connect_bus(&nats.url()).await?;
        wait_published(&bus, &mesh, &mut ingester, cfg.phase_timeout).await?;
        let ingest_s = ingest_start.elapsed().as_secs_f64();
        if let Some(status) = nats.process().exited() {
            bail!("nats-server exited with {status}");
        }

        let (write_tx, bus_writes) = mpsc::unbounded_channel();
        let mut bus_watch = JoinSet::new();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        for bucket in [Bucket::Config, Bucket::Endpoints] {
            bus_watch.spawn(watch_bucket(
                bus.clone(),
                bucket,
                write_tx.clone(),
                ready_tx.clone(),
            ));
        }
        for _ in 0..2 {
            match tokio::time::timeout(cfg.phase_timeout, ready_rx.recv()).await {
                Ok(Some(Ok(()))) => {}
                Ok(Some(Err(e))) => return Err(e),
                _ => bail!("the bus watch did not deliver the initial state"),
            }
        }

        let mut servers = Vec::new();
        for r in 0..cfg.replicas {
            let name = format!("shoal-server-{}", replica_letter(r));
            let cpus = replica_cpus(cfg, r);
            servers.push(
                Server::start(&bins, &name, &nats.url(), &cfg.server_args, cpus.as_deref()).await?,
            );
        }

        let (shutdown, shutdown_rx) = watch::channel(false);
        let (active, active_rx) = watch::channel(None);
        let (events_tx, events) = mpsc::unbounded_channel();
        let fleet = Arc::new(
            Fleet::new(
                cfg.mode,
                servers.iter().map(Server::xds_addr).collect(),
                cfg.proxies,
                cfg.connect_concurrency,
                active_rx,
                events_tx.clone(),
                shutdown_rx,
            )
            .spread(cfg.spread || cfg.scale_out),
        );
        let mut bench = Bench {
            cfg,
            bins: bins.clone(),
            mesh,
            fleet,
            proxies: JoinSet::new(),
            fleet_procs: None,
            events_tx,
            shutdown,
            active,
            events,
            bus_writes,
            bus_watch,
            servers,
            ingester,
            nats,
            _dir: dir,
            _kube: kube,
            proxy_ns: (0..cfg.proxies).map(|i| i % cfg.namespaces).collect(),
            next_change: 0,
            stream_errors: 0,
            streams_ended: 0,
            bad_responses: 0,
            nacks: 0,
            nack_examples: Vec::new(),
            error_examples: Vec::new(),
        };
        let scenario = Scenario {
            proxies: cfg.proxies,
            namespaces: cfg.namespaces,
            services: cfg.services,
            endpoints: cfg.endpoints,
            scenario: cfg.scenario,
            sidecar_isolation: cfg.scenario.isolated(),
            interception: if cfg.scenario.captured() {
                "REDIRECT (default)".to_string()
            } else {
                "NONE".to_string()
            },
            mode: cfg.mode.to_string(),
            replicas: cfg.replicas,
            changes: cfg.changes,
            vs_change: format!("{:?}", cfg.vs_change).to_lowercase(),
            binaries: bins
                .server
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            debug_build: bins.debug_build,
            server_cpus: cfg.server_cpus.clone(),
            source: match cfg.source {
                Source::File => "file write".to_string(),
                Source::Kube => "API server write".to_string(),
            },
            fleet_processes: cfg.fleet_processes,
            fleet_cpus: cfg.fleet_cpus.clone(),
        };
        bench.progress(format!(
            "mesh published in {ingest_s:.1} s; {} replica(s) ready; connecting {} {} proxies ({})",
            cfg.replicas, cfg.proxies, cfg.mode, cfg.scenario
        ));
        let result = bench.measure(scenario, machine, ingest_s, bench_cpu0).await;
        bench.stop().await;
        result
    }

    /// Everything after the setup.
    async fn measure(
        &mut self,
        scenario: Scenario,
        machine: Machine,
        ingest_s: f64,
        bench_cpu0: Duration,
    ) -> anyhow::Result<Report> {
        // Idle: state loaded, no proxy.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_rss: Vec<u64> = self
            .servers
            .iter()
            .map(Server::rss_kib)
            .collect::<anyhow::Result<_>>()?;
        let idle_rss_kib = idle_rss[0];
        let (initial, loaded_rss_kib, connected, fingerprints) =
            self.connect_all(&idle_rss).await?;
        let memory = Memory {
            idle_rss_kib,
            loaded_rss_kib,
            connected,
            per_proxy_kib: loaded_rss_kib.saturating_sub(idle_rss_kib) as f64
                / connected.max(1) as f64,
        };
        self.progress(format!(
            "all {} proxies configured in {:.2} s (per proxy p99 {:.0} ms); server RSS {:.1} → {:.1} MiB ({:.1} KiB/proxy)",
            self.cfg.proxies,
            initial.all_configured_s,
            initial.per_proxy_ms.p99,
            idle_rss_kib as f64 / 1024.0,
            loaded_rss_kib as f64 / 1024.0,
            memory.per_proxy_kib
        ));
        for r in &initial.replicas {
            self.progress(format!(
                "replica {}: {} proxies configured in {:.2} s, CPU {:.2} s, RSS {:.1} MiB ({:.1} KiB/proxy)",
                replica_letter(r.replica),
                r.proxies,
                r.all_configured_s,
                r.server_cpu_s,
                r.rss_kib as f64 / 1024.0,
                r.per_proxy_kib
            ));
        }
        let mut baseline = match self.cfg.baseline {
            Baseline::None => None,
            Baseline::Replay => {
                let b = self
                    .replay_baseline(&initial, &memory, &fingerprints)
                    .await?;
                self.progress(format!(
                    "replay baseline: {} of {} proxies configured in {:.2} s (shoal {:.2} s), replay CPU {:.2} s (shoal {:.2} s), {:.1} KiB/proxy (shoal {:.1})",
                    b.configured,
                    self.cfg.proxies,
                    b.all_configured_s,
                    initial.all_configured_s,
                    b.server_cpu_s,
                    initial.server_cpu_s,
                    b.memory.per_proxy_kib,
                    memory.per_proxy_kib
                ));
                Some(b)
            }
        };

        let mut endpoint = (Vec::new(), Vec::new());
        let mut vs = (Vec::new(), Vec::new());
        for k in 0..self.cfg.changes {
            let (sample, lat) = self.endpoint_change(k).await?;
            self.progress(format!(
                "endpoint change {k}: {}/{} proxies, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, server CPU {:.3} s, {:.0} bytes",
                sample.observed, sample.affected, sample.latency_ms.p50, sample.latency_ms.p99,
                sample.latency_ms.max, sample.server_cpu_s, sample.server_bytes
            ));
            endpoint.0.push(sample);
            endpoint.1.extend(lat);
            let (sample, lat) = self.vs_change(k).await?;
            self.progress(format!(
                "VirtualService change {k}: {}/{} proxies, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, server CPU {:.3} s, {:.0} bytes",
                sample.observed, sample.affected, sample.latency_ms.p50, sample.latency_ms.p99,
                sample.latency_ms.max, sample.server_cpu_s, sample.server_bytes
            ));
            vs.0.push(sample);
            vs.1.extend(lat);
        }
        let storm = if self.cfg.storm {
            let st = self.storm(self.cfg.changes).await?;
            self.progress(format!(
                "storm: {} of {} fresh proxies configured in {:.2} s ({} failed: connect {}, stream {}, not in time {}); VS change reached {}/{} in p99 {:.0} ms",
                st.configured,
                st.proxies,
                st.all_configured_s,
                st.failed,
                st.connect_failures,
                st.stream_failures,
                st.not_configured,
                st.vs_change.observed,
                st.vs_change.affected,
                st.vs_change.latency_ms.p99
            ));
            Some(st)
        } else {
            None
        };
        let soak = match self.cfg.soak {
            Some(duration) => {
                let sk = self.soak(duration).await?;
                self.progress(format!("soak: {}", sk.summary()));
                Some(sk)
            }
            None => None,
        };
        let replica_move = if self.servers.len() > 1 && !self.cfg.scale_out {
            let mv = self.move_replica().await?;
            self.progress(format!(
                "moved {} proxies to replica B in {:.2} s: held {}, B sent {}, resent {}, B resumed {}",
                mv.reconfigured, mv.all_reconfigured_s, mv.held, mv.received, mv.resent, mv.server_resumed
            ));
            Some(mv)
        } else {
            None
        };
        self.drain_events();
        let mut processes_ok = self.ingester.check_running().is_ok();
        let live = if replica_move.is_some() { 1 } else { 0 };
        for s in &mut self.servers[live..] {
            if let Err(e) = s.check_running() {
                processes_ok = false;
                self.error_examples.push(format!("{e:#}"));
            }
        }
        let endpoint_change = ChangeReport::summarize(endpoint.0, &endpoint.1);
        let vs_change = ChangeReport::summarize(vs.0, &vs.1);
        if let Some(b) = &mut baseline {
            if let Some(push) = &b.endpoint_push {
                b.ratios.endpoint_change_cpu =
                    ratio(endpoint_change.server_cpu_s, push.server_cpu_s);
                b.ratios.endpoint_change_all_p99 = ratio(
                    endpoint_change.all_converged_ms.p99,
                    push.all_converged_ms.p99,
                );
            }
            if let Some(push) = &b.vs_push {
                b.ratios.vs_change_cpu = ratio(vs_change.server_cpu_s, push.server_cpu_s);
                b.ratios.vs_change_all_p99 =
                    ratio(vs_change.all_converged_ms.p99, push.all_converged_ms.p99);
            }
        }
        Ok(Report {
            scenario,
            machine,
            ingest_s,
            initial,
            memory,
            endpoint_change,
            vs_change,
            replica_move,
            baseline,
            storm,
            soak,
            bench_cpu_s: (procs::proc_cpu(std::process::id())? - bench_cpu0).as_secs_f64(),
            fleet_cpu_s: match &self.fleet_procs {
                Some(p) => p
                    .children
                    .iter()
                    .map(|c| procs::proc_cpu(c.pid).map(|d| d.as_secs_f64()))
                    .collect::<anyhow::Result<_>>()?,
                None => Vec::new(),
            },
            stream_errors: self.stream_errors,
            streams_ended: self.streams_ended,
            bad_responses: self.bad_responses,
            nacks: self.nacks,
            nack_examples: self.nack_examples.clone(),
            error_examples: self.error_examples.clone(),
            processes_ok,
        })
    }

    /// Stops the proxies (the processes stop when `self` drops).
    async fn stop(&mut self) {
        if let Some(procs) = &mut self.fleet_procs {
            procs.stop().await;
        }
        let _ = self.shutdown.send(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, self.proxies.join_next()).await {}
        self.proxies.abort_all();
        self.bus_watch.abort_all();
    }

    /// Records an event that is not what a phase waits for.
    fn note(&mut self, event: Event) {
        match event {
            Event::StreamError { ended: true, .. } => self.streams_ended += 1,
            Event::StreamError { proxy, error, .. } => {
                self.stream_errors += 1;
                if self.error_examples.len() < 5 {
                    self.error_examples
                        .push(format!("proxy {proxy} stream: {error}"));
                }
            }
            Event::BadResponse { proxy, error } => {
                self.bad_responses += 1;
                if self.error_examples.len() < 5 {
                    self.error_examples
                        .push(format!("proxy {proxy} bad response: {error}"));
                }
            }
            Event::Nack { proxy, error } => {
                self.nacks += 1;
                // One example per distinct reason (the same resource fails on many proxies).
                if self.nack_examples.len() < 5
                    && !self.nack_examples.iter().any(|e| e.ends_with(&error))
                {
                    self.nack_examples.push(format!("proxy {proxy}: {error}"));
                }
            }
            Event::Configured { .. } | Event::Observed { .. } => {}
        }
    }

    fn drain_events(&mut self) {
        while let Ok(e) = self.events.try_recv() {
            self.note(e);
        }
    }

    /// Fails when a server or the ingester died.
    fn check_processes(&mut self, skip_first_server: bool) -> anyhow::Result<()> {
        if let Some(status) = self.nats.process().exited() {
            bail!(
                "nats-server exited with {status}; its log:\n{}",
                self.nats.process().log_tail()
            );
        }
        self.ingester.check_running()?;
        if let Some(procs) = &mut self.fleet_procs {
            procs.check_running()?;
        }
        let skip = usize::from(skip_first_server);
        for s in &mut self.servers[skip..] {
            s.check_running()?;
        }
        Ok(())
    }

    /// Waits for the next event until `deadline`, checking the processes every second.
    async fn next_event(
        &mut self,
        deadline: Instant,
        skip_first_server: bool,
    ) -> anyhow::Result<Option<Event>> {
        loop {
            let tick = (Instant::now() + Duration::from_secs(1)).min(deadline);
            match tokio::time::timeout_at(tick, self.events.recv()).await {
                Ok(Some(e)) => return Ok(Some(e)),
                Ok(None) => bail!("every proxy stopped"),
                Err(_) => {
                    self.check_processes(skip_first_server)?;
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Proxy `i` of the main fleet.
    fn identity(&self, i: usize) -> ProxyIdentity {
        let id = ProxyIdentity::new(i, &manifests::namespace_name(self.proxy_ns[i]));
        if self.cfg.scenario.captured() {
            id.captured(&self.mesh.proxy_app(i))
        } else {
            id
        }
    }

    /// Connects every proxy and waits until all are configured. Returns the phase's
    /// measurements, the server's RSS afterwards, how many proxies it had then and what
    /// each proxy held when configured.
    async fn connect_all(
        &mut self,
        idle_rss: &[u64],
    ) -> anyhow::Result<(Initial, u64, usize, Vec<Option<Fingerprint>>)> {
        let replica_cpu0: Vec<Duration> = self
            .servers
            .iter()
            .map(Server::cpu)
            .collect::<anyhow::Result<_>>()?;
        if self.cfg.fleet_processes {
            self.start_fleet_processes().await?;
        }
        let fleet_cpu0: Vec<Duration> = match &self.fleet_procs {
            Some(procs) => procs
                .children
                .iter()
                .map(|c| procs::proc_cpu(c.pid))
                .collect::<anyhow::Result<_>>()?,
            None => Vec::new(),
        };
        let server = &self.servers[0];
        let cpu0 = server.cpu()?;
        let m0 = server.metrics().await?;
        let start = Instant::now();
        match &mut self.fleet_procs {
            Some(procs) => procs.send_all(&fleetproc::ToChild::Connect).await?,
            None => {
                for i in 0..self.cfg.proxies {
                    let id = self.identity(i);
                    self.proxies
                        .spawn(client::run_proxy(self.fleet.clone(), id));
                }
            }
        }
        let deadline = start + self.cfg.phase_timeout;
        let mut tally = Tally::new(self.cfg.proxies, start);
        let captured = self.cfg.scenario.captured();
        while tally.done < self.cfg.proxies {
            let Some(event) = self.next_event(deadline, false).await? else {
                let pending = match &mut self.fleet_procs {
                    Some(procs) => procs.pending().await,
                    None => tally.pending(self.fleet.counters()),
                };
                bail!(
                    "only {} of {} proxies were configured within {:?}; waiting for: {:?} (stream errors: {}; NACKs: {} {:?}; {:?})",
                    tally.done,
                    self.cfg.proxies,
                    self.cfg.phase_timeout,
                    pending,
                    self.stream_errors,
                    self.nacks,
                    self.nack_examples,
                    self.error_examples
                );
            };
            match tally.on_event(event, &self.mesh, captured, &|p| p) {
                None | Some(Event::Configured { .. } | Event::Observed { .. }) => {}
                Some(other) => self.note(other),
            }
        }
        // Let the last pushes and ACKs finish and the allocator settle.
        self.settle(0).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let server = &self.servers[0];
        let rss = server.rss_kib()?;
        let m1 = server.metrics().await?;
        let on_first_replica = self
            .fleet
            .counters()
            .iter()
            .filter(|c| c.server.load(Ordering::Relaxed) == 0)
            .count();
        let connected = m1.get(CONNECTIONS) as usize;
        let server_cpu_s = (server.cpu()? - cpu0).as_secs_f64();
        let fingerprints = std::mem::take(&mut tally.fingerprints);
        let replicas = if self.cfg.scale_out {
            self.replica_figures(&tally, idle_rss, &replica_cpu0, &fleet_cpu0, start)?
        } else {
            Vec::new()
        };
        Ok((
            Initial {
                replicas,
                on_first_replica,
                server_cpu_s,
                server_bytes: m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES),
                cache: cache_use(&m0, &m1),
                ..tally.initial()
            },
            rss,
            connected,
            fingerprints,
        ))
    }

    /// Each replica's share of the initial phase: the proxies on it now, the time until
    /// the last of them was configured, its CPU since `cpu0` and its RSS growth over
    /// `idle_rss`.
    fn replica_figures(
        &self,
        tally: &Tally,
        idle_rss: &[u64],
        cpu0: &[Duration],
        fleet_cpu0: &[Duration],
        start: Instant,
    ) -> anyhow::Result<Vec<ReplicaInitial>> {
        let wall_s = start.elapsed().as_secs_f64();
        let counters = self.fleet.counters();
        let mut figures = Vec::new();
        for (r, server) in self.servers.iter().enumerate() {
            let on_it: Vec<usize> = (0..self.cfg.proxies)
                .filter(|&p| counters[p].server.load(Ordering::Relaxed) % self.servers.len() == r)
                .collect();
            let last_ms = on_it
                .iter()
                .filter_map(|&p| tally.elapsed[p])
                .fold(0.0, f64::max);
            let rss_kib = server.rss_kib()?;
            figures.push(ReplicaInitial {
                replica: r,
                proxies: on_it.len(),
                all_configured_s: last_ms / 1000.0,
                server_cpu_s: (server.cpu()? - cpu0[r]).as_secs_f64(),
                rss_kib,
                per_proxy_kib: rss_kib.saturating_sub(idle_rss[r]) as f64
                    / on_it.len().max(1) as f64,
                fleet: self.fleet_figures(r, fleet_cpu0, wall_s)?,
            });
        }
        Ok(figures)
    }

    /// Replica `r`'s fleet process over the phase so far (`wall_s` since its start, CPU
    /// since `cpu0`), if the proxies run in fleet processes.
    fn fleet_figures(
        &self,
        r: usize,
        cpu0: &[Duration],
        wall_s: f64,
    ) -> anyhow::Result<Option<FleetProcess>> {
        let Some(c) = self.fleet_procs.as_ref().and_then(|p| p.children.get(r)) else {
            return Ok(None);
        };
        let cpu_s =
            (procs::proc_cpu(c.pid)? - cpu0.get(r).copied().unwrap_or_default()).as_secs_f64();
        let cores = match &c.cpus {
            Some(list) => fleetproc::parse_cpu_list(list)?.len(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(Some(FleetProcess {
            pid: c.pid,
            proxies: c.proxies.len(),
            cpus: c.cpus.clone(),
            allowed_cpus: procs::proc_allowed_cpus(c.pid)?,
            cores,
            cpu_s,
            busy_pct: cpu_s * 100.0 / (wall_s * cores as f64).max(f64::MIN_POSITIVE),
            rss_kib: procs::proc_rss_kib(c.pid)?,
        }))
    }

    /// Starts one fleet process per replica, each with the proxies of its replica (proxy
    /// i on replica i mod N, as in-process), pinned to its share of `--fleet-cpus`.
    async fn start_fleet_processes(&mut self) -> anyhow::Result<()> {
        let Some(exe) = self.bins.bench.clone() else {
            bail!(
                "--fleet-processes: the shoal-bench binary was found neither as this program nor next to shoal-server ({})",
                self.bins.server.display()
            );
        };
        let n = self.servers.len();
        let mut shares: Vec<(std::net::SocketAddr, Vec<ProxyIdentity>)> = self
            .servers
            .iter()
            .map(|s| (s.xds_addr(), Vec::new()))
            .collect();
        for i in 0..self.cfg.proxies {
            shares[i % n].1.push(self.identity(i));
        }
        let cpus = match &self.cfg.fleet_cpus {
            Some(list) => Some(fleetproc::split_cpus(list, n)?),
            None => None,
        };
        let procs = fleetproc::FleetProcs::start(
            &exe,
            self.cfg.mode,
            self.cfg.connect_concurrency,
            shares,
            cpus,
            self.events_tx.clone(),
            self.fleet.counters(),
            self.cfg.phase_timeout,
        )
        .await?;
        for c in &procs.children {
            self.progress(format!(
                "fleet process {} (pid {}): {} proxies of replica {}{}",
                c.replica,
                c.pid,
                c.proxies.len(),
                replica_letter(c.replica),
                c.cpus
                    .as_ref()
                    .map(|l| format!(", on CPUs {l}"))
                    .unwrap_or_default()
            ));
        }
        self.fleet_procs = Some(procs);
        Ok(())
    }

    /// Makes `change` the one the proxies watch for (None: none), in this process and in
    /// the fleet processes; returns once every fleet process has it in place.
    async fn announce(&mut self, change: Option<ActiveChange>) -> anyhow::Result<()> {
        let change = change.map(Arc::new);
        if let Some(procs) = &mut self.fleet_procs {
            procs
                .announce(change.as_deref(), self.cfg.phase_timeout)
                .await?;
        }
        let _ = self.active.send(change);
        Ok(())
    }

    /// Waits for the next event of a side fleet until `deadline`, checking the processes
    /// (and `extra`, the replay server) every second.
    async fn side_event(
        &mut self,
        side: &mut SideFleet,
        deadline: Instant,
        mut extra: Option<&mut Server>,
    ) -> anyhow::Result<Option<Event>> {
        loop {
            let tick = (Instant::now() + Duration::from_secs(1)).min(deadline);
            match tokio::time::timeout_at(tick, side.events.recv()).await {
                Ok(Some(e)) => return Ok(Some(e)),
                Ok(None) => bail!("every proxy stopped"),
                Err(_) => {
                    self.check_processes(false)?;
                    if let Some(server) = extra.as_deref_mut() {
                        server.check_running()?;
                    }
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Records, from replica A, what one delta client of each class (`reps`: a main proxy
    /// of each class) receives until configured.
    async fn record(&mut self, reps: &[usize]) -> anyhow::Result<replay::Recording> {
        let n = self.cfg.proxies;
        let mut side = SideFleet::new(
            Mode::Delta,
            self.servers[0].xds_addr(),
            reps.len(),
            self.cfg.connect_concurrency,
            self.active.subscribe(),
            true,
        );
        for (c, &p) in reps.iter().enumerate() {
            let mut id = self.identity(p).with_node_number(2 * n + c);
            id.index = c;
            side.spawn(id);
        }
        let deadline = Instant::now() + self.cfg.phase_timeout;
        let mut tally = Tally::new(reps.len(), Instant::now());
        let captured = self.cfg.scenario.captured();
        while tally.done < reps.len() {
            let Some(event) = self.side_event(&mut side, deadline, None).await? else {
                bail!(
                    "recording: only {} of {} proxy classes were configured by replica A within {:?}; waiting for {:?}; errors {:?}",
                    tally.done,
                    reps.len(),
                    self.cfg.phase_timeout,
                    tally.pending(side.fleet.counters()),
                    tally.error_examples
                );
            };
            let _ = tally.on_event(event, &self.mesh, captured, &|c| reps[c]);
        }
        side.stop().await;
        let mut builder = replay::RecordingBuilder::default();
        for (c, recording) in tally.recordings.into_iter().enumerate() {
            let Some(items) = recording else {
                bail!("recording: class {c} was configured without a recording");
            };
            builder.add_class(&self.identity(reps[c]).class(), items);
        }
        Ok(builder.finish())
    }

    /// The replay baseline: records every proxy class from replica A, starts
    /// `shoal-replay` on the recording and connects the same proxies to it as the initial
    /// phase did to shoal (the main fleet stays connected to shoal, idle, meanwhile).
    async fn replay_baseline(
        &mut self,
        initial: &Initial,
        memory: &Memory,
        shoal_held: &[Option<Fingerprint>],
    ) -> anyhow::Result<ReplayBaseline> {
        let n = self.cfg.proxies;
        let mut reps = Vec::new();
        let mut seen = HashSet::new();
        for i in 0..n {
            if seen.insert(self.identity(i).class()) {
                reps.push(i);
            }
        }
        self.progress(format!(
            "replay baseline: recording {} proxy classes from replica A",
            reps.len()
        ));
        let record_start = Instant::now();
        let recording = self.record(&reps).await?;
        let dir = tempfile::Builder::new()
            .prefix("shoal-bench-replay-")
            .tempdir()
            .context("creating the recording's directory")?;
        let path = dir.path().join("recording.pb");
        let recording_bytes = recording.write(&path)?;
        let recorded_resources = recording.resources.len();
        drop(recording);
        let record_s = record_start.elapsed().as_secs_f64();
        // Replica A may still be answering the recording clients' ACKs.
        self.settle(0).await?;

        let mut server =
            Server::start_replay(&self.bins, &path, self.cfg.server_cpus.as_deref()).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_rss_kib = server.rss_kib()?;
        self.progress(format!(
            "replay baseline: {} classes, {recorded_resources} distinct resources ({recording_bytes} bytes) recorded in {record_s:.1} s; connecting {n} {} proxies to shoal-replay",
            reps.len(),
            self.cfg.mode
        ));
        let cpu0 = server.cpu()?;
        let m0 = server.metrics().await?;
        let mut side = SideFleet::new(
            self.cfg.mode,
            server.xds_addr(),
            n,
            self.cfg.connect_concurrency,
            self.active.subscribe(),
            false,
        );
        let start = Instant::now();
        for i in 0..n {
            side.spawn(self.identity(i));
        }
        let deadline = start + self.cfg.phase_timeout;
        let mut tally = Tally::new(n, start);
        let captured = self.cfg.scenario.captured();
        while tally.done < n {
            let Some(event) = self
                .side_event(&mut side, deadline, Some(&mut server))
                .await?
            else {
                break;
            };
            let _ = tally.on_event(event, &self.mesh, captured, &|p| p);
        }
        if tally.done < n {
            let pending = tally.pending(side.fleet.counters());
            tally
                .error_examples
                .push(format!("not configured in time: {pending:?}"));
        }
        settle_server(&server, self.cfg.phase_timeout).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let loaded_rss_kib = server.rss_kib()?;
        let m1 = server.metrics().await?;
        let server_cpu_s = (server.cpu()? - cpu0).as_secs_f64();
        let connected = m1.get(CONNECTIONS) as usize;
        let (endpoint_push, vs_push) = if self.cfg.mode == Mode::Delta && self.cfg.changes > 0 {
            let (endpoint, route) = self.replay_pushes(&mut side, &mut server).await?;
            (Some(endpoint), route)
        } else {
            (None, None)
        };
        side.stop().await;
        server.kill().await;
        drop(dir);

        let (mut names_mismatched, mut versions_mismatched) = (0, 0);
        let mut mismatch_example = None;
        for (i, (a, b)) in shoal_held.iter().zip(&tally.fingerprints).enumerate() {
            let (Some(a), Some(b)) = (a, b) else {
                continue;
            };
            if a.names != b.names {
                names_mismatched += 1;
            } else if a.versions != b.versions {
                versions_mismatched += 1;
            } else {
                continue;
            }
            mismatch_example.get_or_insert_with(|| {
                format!(
                    "proxy {i} ({}): {} resources from shoal, {} from the replay ({})",
                    self.identity(i).class(),
                    a.resources,
                    b.resources,
                    if a.names != b.names {
                        "other names"
                    } else {
                        "same names, other versions"
                    }
                )
            });
        }
        let replay_initial = tally.initial();
        let replay_memory = Memory {
            idle_rss_kib,
            loaded_rss_kib,
            connected,
            per_proxy_kib: loaded_rss_kib.saturating_sub(idle_rss_kib) as f64
                / connected.max(1) as f64,
        };
        let server_bytes = m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES);
        Ok(ReplayBaseline {
            classes: reps.len(),
            recorded_resources,
            recording_bytes,
            record_s,
            configured: tally.done,
            not_configured: n - tally.done,
            connect_failures: replay_initial.connect_failures,
            stream_failures: replay_initial.stream_failures,
            all_configured_s: replay_initial.all_configured_s,
            per_proxy_ms: replay_initial.per_proxy_ms.clone(),
            server_cpu_s,
            server_bytes,
            names_mismatched,
            versions_mismatched,
            mismatch_example,
            ratios: Ratios {
                server_cpu: ratio(initial.server_cpu_s, server_cpu_s),
                all_configured: ratio(initial.all_configured_s, replay_initial.all_configured_s),
                per_proxy_p50: ratio(initial.per_proxy_ms.p50, replay_initial.per_proxy_ms.p50),
                per_proxy_p99: ratio(initial.per_proxy_ms.p99, replay_initial.per_proxy_ms.p99),
                rss_per_proxy: ratio(memory.per_proxy_kib, replay_memory.per_proxy_kib),
                loaded_rss: ratio(
                    memory.loaded_rss_kib as f64,
                    replay_memory.loaded_rss_kib as f64,
                ),
                server_bytes: ratio(initial.server_bytes, server_bytes),
                // Filled in after shoal's endpoint changes.
                ..Ratios::default()
            },
            memory: replay_memory,
            endpoint_push,
            vs_push,
            error_examples: tally.error_examples,
        })
    }

    /// The replay's floor of the changes: `--changes` times, `shoal-replay` pushes the
    /// assignments of endpoint change k's service (as recorded, plus change k's address;
    /// every port, as shoal sends them), then (with `--vs-change mesh`) the route table
    /// every proxy holds with change k's marker, to every delta stream that holds them,
    /// each distinct resource encoded once. Returns the endpoint and the route pushes.
    async fn replay_pushes(
        &mut self,
        side: &mut SideFleet,
        server: &mut Server,
    ) -> anyhow::Result<(ChangeReport, Option<ChangeReport>)> {
        let mut endpoint = (Vec::new(), Vec::new());
        let mut route = (Vec::new(), Vec::new());
        for k in 0..self.cfg.changes {
            let (ns, index) = self.mesh.endpoint_change_target(k);
            let host = manifests::service_host(ns, index);
            let ip = manifests::added_endpoint_ip(k);
            let affected = self.affected_in_namespace(self.cfg.scenario.isolated().then_some(ns));
            let (sample, lat) = self
                .replay_push(
                    side,
                    server,
                    (k, XdsType::Endpoint, manifests::cluster_name(&host)),
                    &ip,
                    affected,
                    &format!("/push/endpoint?host={host}&ip={ip}"),
                )
                .await?;
            endpoint.0.push(sample);
            endpoint.1.extend(lat);
            if self.cfg.vs_change == VsChange::Mesh {
                let marker = manifests::vs_marker(k);
                let name = manifests::ROUTE_NAME;
                let (sample, lat) = self
                    .replay_push(
                        side,
                        server,
                        (k, XdsType::Route, name.to_string()),
                        &marker,
                        self.affected_in_namespace(None),
                        &format!("/push/route?name={name}&marker={marker}"),
                    )
                    .await?;
                route.0.push(sample);
                route.1.extend(lat);
            }
        }
        let endpoint = ChangeReport::summarize(endpoint.0, &endpoint.1);
        let route = (!route.0.is_empty()).then(|| ChangeReport::summarize(route.0, &route.1));
        for (what, r) in [
            ("endpoint", Some(&endpoint)),
            ("route table", route.as_ref()),
        ] {
            let Some(r) = r else { continue };
            self.progress(format!(
                "replay baseline: {} {what} pushes to {} proxies each, until the last had it p50 {:.0} ms, max {:.0} ms; replay CPU {:.3} s per push, {}",
                r.samples.len(),
                r.samples.first().map_or(0, |s| s.affected),
                r.all_converged_ms.p50,
                r.all_converged_ms.max,
                r.server_cpu_s,
                report::bytes(r.server_bytes)
            ));
        }
        Ok((endpoint, route))
    }

    /// One push of [`Self::replay_pushes`]: `(k, type, resource)` with `marker`, requested
    /// at the replay's `path`, measured from the request to each affected proxy's receipt,
    /// and in replay CPU and bytes until it is quiet again.
    async fn replay_push(
        &mut self,
        side: &mut SideFleet,
        server: &mut Server,
        (k, ty, resource): (usize, XdsType, String),
        marker: &str,
        affected: Vec<bool>,
        path: &str,
    ) -> anyhow::Result<(ChangeSample, Vec<f64>)> {
        let affected_n = affected.iter().filter(|a| **a).count();
        let id = self.next_change;
        self.next_change += 1;
        while side.events.try_recv().is_ok() {}
        let cpu0 = server.cpu()?;
        let m0 = server.metrics().await?;
        self.announce(Some(ActiveChange {
            id,
            ty,
            resource: resource.clone(),
            marker: memchr::memmem::Finder::new(marker.as_bytes()).into_owned(),
        }))
        .await?;
        let push_ms = now_ms();
        let r = shoal_tests::http::get(server.admin_addr(), path)
            .await
            .context("asking shoal-replay to push")?;
        if r.status != 200 {
            bail!(
                "shoal-replay refused push {k} ({path}): {}",
                r.text().trim()
            );
        }
        let deadline = Instant::now() + self.cfg.phase_timeout;
        let mut receipts = Receipts::new(&affected);
        while receipts.observed < affected_n {
            let Some(event) = self.side_event(side, deadline, Some(server)).await? else {
                break;
            };
            if let Event::Observed {
                proxy,
                change,
                at_us,
            } = event
            {
                if change == id {
                    receipts.record(proxy, at_us);
                }
            }
        }
        self.announce(None).await?;
        settle_server(server, self.cfg.phase_timeout).await?;
        let m1 = server.metrics().await?;
        let latencies = receipts.since_ms(push_ms);
        let sample = ChangeSample {
            k,
            key: resource,
            ingest_ms: 0.0,
            affected: affected_n,
            observed: receipts.observed,
            unexpected: receipts.unexpected,
            latency_ms: Dist::of(&latencies),
            bus_ms: 0.0,
            first_ms: first(&latencies),
            from_write_ms: Dist::of(&latencies),
            server_cpu_s: (server.cpu()? - cpu0).as_secs_f64(),
            server_bytes: m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES),
            server_pushes: m1.get(PUSHES) - m0.get(PUSHES),
            cache: CacheUse::default(),
        };
        Ok((sample, latencies))
    }

    /// The connection storm: a mesh-wide VirtualService change (marker `k`) and, at the
    /// same moment, `proxies` fresh proxies (same classes, node ids of their own)
    /// connecting to replica A only. Measures how many fail and how long until all are
    /// configured, and the change's convergence on the connected proxies; then disconnects
    /// the fresh proxies.
    async fn storm(&mut self, k: usize) -> anyhow::Result<Storm> {
        self.drain_events();
        while self.bus_writes.try_recv().is_ok() {}
        let n = self.cfg.proxies;
        let id = self.next_change;
        self.next_change += 1;
        let server = &self.servers[0];
        let cpu0 = server.cpu()?;
        let m0 = server.metrics().await?;
        let mut side = SideFleet::new(
            self.cfg.mode,
            server.xds_addr(),
            n,
            self.cfg.connect_concurrency,
            self.active.subscribe(),
            false,
        );
        self.progress(format!(
            "storm: VirtualService change and {n} fresh proxies connecting at once"
        ));
        self.announce(Some(ActiveChange {
            id,
            ty: XdsType::Route,
            resource: manifests::ROUTE_NAME.to_string(),
            marker: memchr::memmem::Finder::new(manifests::vs_marker(k).as_bytes()).into_owned(),
        }))
        .await?;
        let write_ms = now_ms();
        self.mesh.change_virtual_service(true, k)?;
        let start = Instant::now();
        for i in 0..n {
            side.spawn(self.identity(i).with_node_number(n + i));
        }
        let deadline = start + self.cfg.phase_timeout;
        let mut tally = Tally::new(n, start);
        let captured = self.cfg.scenario.captured();
        let mut observed_at: Option<BusWrite> = None;
        let mut receipts: HashMap<usize, u64> = HashMap::new();
        let key_matches = |w: &BusWrite| {
            w.bucket == Bucket::Config
                && shoal_common::keys::parse_config_key(&w.key).is_ok_and(|id| {
                    id.kind == ConfigKind::VirtualService
                        && id.namespace == manifests::SYSTEM_NS
                        && id.name == manifests::SHARED_VS
                })
        };
        while tally.done < n || observed_at.is_none() || receipts.len() < n {
            let tick = (Instant::now() + Duration::from_secs(1)).min(deadline);
            tokio::select! {
                w = self.bus_writes.recv() => {
                    let Some(w) = w else { bail!("the bus watch stopped") };
                    if observed_at.is_none() && key_matches(&w) {
                        observed_at = Some(w);
                    }
                }
                e = self.events.recv() => match e {
                    Some(Event::Observed { proxy, change, at_us }) if change == id => {
                        receipts.entry(proxy).or_insert(at_us);
                    }
                    Some(Event::Observed { .. }) | Some(Event::Configured { .. }) => {}
                    Some(other) => self.note(other),
                    None => bail!("every proxy stopped"),
                },
                e = side.events.recv() => match e {
                    Some(event) => { let _ = tally.on_event(event, &self.mesh, captured, &|p| p); }
                    None => bail!("the storm's proxies stopped"),
                },
                _ = tokio::time::sleep_until(tick) => {
                    self.check_processes(false)?;
                    if Instant::now() >= deadline { break; }
                }
            }
        }
        self.announce(None).await?;
        let all_configured_s = (tally.last - start).as_secs_f64();
        let Some(on_bus) = observed_at else {
            bail!(
                "storm: the ingester did not publish the VirtualService change within {:?}",
                self.cfg.phase_timeout
            );
        };
        if tally.done < n {
            let pending = tally.pending(side.fleet.counters());
            tally
                .error_examples
                .push(format!("not configured in time: {pending:?}"));
        }
        self.settle(0).await?;
        let server = &self.servers[0];
        let m1 = server.metrics().await?;
        let server_cpu_s = (server.cpu()? - cpu0).as_secs_f64();
        side.stop().await;
        let latencies: Vec<f64> = receipts
            .values()
            .map(|at_us| *at_us as f64 / 1000.0 - on_bus.observed_at_ms as f64)
            .collect();
        let failed = (0..n)
            .filter(|i| {
                tally.connect_failed[*i] || tally.stream_failed[*i] || tally.elapsed[*i].is_none()
            })
            .count();
        let fresh = tally.initial();
        Ok(Storm {
            proxies: n,
            configured: tally.done,
            connect_failures: fresh.connect_failures,
            stream_failures: fresh.stream_failures,
            not_configured: n - tally.done,
            failed,
            all_configured_s,
            per_proxy_ms: fresh.per_proxy_ms,
            mismatched: fresh.mismatched,
            vs_change: ChangeSample {
                k,
                key: on_bus.key.clone(),
                ingest_ms: on_bus.observed_at_ms.saturating_sub(write_ms) as f64,
                affected: n,
                observed: receipts.len(),
                unexpected: 0,
                latency_ms: Dist::of(&latencies),
                bus_ms: on_bus.bus_ms(),
                first_ms: first(&latencies),
                from_write_ms: Dist::default(),
                server_cpu_s,
                server_bytes: m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES),
                server_pushes: m1.get(PUSHES) - m0.get(PUSHES),
                cache: cache_use(&m0, &m1),
            },
            error_examples: tally.error_examples,
        })
    }

    /// Waits until server `i` is quiet (see [`settle_server`]).
    async fn settle(&self, i: usize) -> anyhow::Result<()> {
        settle_server(&self.servers[i], self.cfg.phase_timeout).await
    }

    fn affected_in_namespace(&self, ns: Option<usize>) -> Vec<bool> {
        self.proxy_ns
            .iter()
            .map(|p| ns.is_none_or(|n| *p == n))
            .collect()
    }

    /// An endpoint change every second and a VirtualService change every 30 s, for
    /// `duration`, each measured like the others; server RSS at the start, every 10 s and
    /// at the end.
    async fn soak(&mut self, duration: Duration) -> anyhow::Result<Soak> {
        self.drain_events();
        let (nacks0, errors0, bad0) = (self.nacks, self.stream_errors, self.bad_responses);
        let ended0 = self.streams_ended;
        let rss_start_kib = self.servers[0].rss_kib()?;
        let mut rss_samples = Vec::new();
        let start = Instant::now();
        let mut endpoint = (Vec::new(), Vec::new());
        let mut vs = (Vec::new(), Vec::new());
        // Change numbers past the measured ones: markers stay unique.
        let first = 2 * self.cfg.changes + 1;
        let mut tick = 0usize;
        while start.elapsed() < duration {
            let next = start + Duration::from_secs(tick as u64 + 1);
            let k = first + tick;
            // Two services per namespace in turn: each change replaces its service's soak
            // endpoint, so after the first few the mesh keeps its size and RSS growth is
            // the server's, not the mesh's. (Cycling over every service grew the mesh by
            // one endpoint a second for its first 1 000 s: +10 % endpoints.)
            let target = tick % (2 * self.cfg.namespaces);
            let (sample, lat) = self.endpoint_change_with(k, Some(target)).await?;
            endpoint.0.push(sample);
            endpoint.1.extend(lat);
            if tick % 30 == 29 {
                let (sample, lat) = self.vs_change(k).await?;
                vs.0.push(sample);
                vs.1.extend(lat);
            }
            // Three samples a 30 s cycle, each at the same point of every cycle: a trend
            // over them is the server's growth, not where in the cycle it was read.
            if tick % 10 == 9 {
                rss_samples.push((start.elapsed().as_secs_f64(), self.servers[0].rss_kib()?));
            }
            if tick % 60 == 59 {
                self.progress(format!(
                    "soak: {:.0} s, {} endpoint and {} VS changes, server RSS {:.1} MiB",
                    start.elapsed().as_secs_f64(),
                    endpoint.0.len(),
                    vs.0.len(),
                    rss_samples.last().map_or(0, |s| s.1) as f64 / 1024.0
                ));
            }
            tokio::time::sleep_until(next.max(Instant::now())).await;
            tick += 1;
        }
        self.drain_events();
        let rss_end_kib = self.servers[0].rss_kib()?;
        Ok(Soak {
            duration_s: start.elapsed().as_secs_f64(),
            rss_start_kib,
            rss_end_kib,
            rss_start_end_pct: (rss_end_kib as f64 - rss_start_kib as f64) * 100.0
                / rss_start_kib.max(1) as f64,
            rss_growth_pct: trend_growth_pct(&rss_samples),
            rss_kib_every_10s: rss_samples.iter().map(|s| s.1).collect(),
            endpoint_change: ChangeReport::summarize(endpoint.0, &endpoint.1),
            vs_change: ChangeReport::summarize(vs.0, &vs.1),
            nacks: self.nacks - nacks0,
            stream_errors: self.stream_errors - errors0,
            streams_ended: self.streams_ended - ended0,
            bad_responses: self.bad_responses - bad0,
        })
    }

    async fn endpoint_change(&mut self, k: usize) -> anyhow::Result<(ChangeSample, Vec<f64>)> {
        self.endpoint_change_with(k, None).await
    }

    /// An endpoint change. With `replace_in`, the soak's: the service is the target of
    /// change `replace_in` and the added endpoint replaces its earlier added ones, so a
    /// soak cycling over a few targets keeps the mesh's size; without, the service is
    /// change `k`'s target and the endpoint joins the others.
    async fn endpoint_change_with(
        &mut self,
        k: usize,
        replace_in: Option<usize>,
    ) -> anyhow::Result<(ChangeSample, Vec<f64>)> {
        let (ns, index) = self.mesh.endpoint_change_target(replace_in.unwrap_or(k));
        let ns_name = manifests::namespace_name(ns);
        let service = format!("svc-{index}");
        let resource = manifests::cluster_name(&manifests::service_host(ns, index));
        let affected = self.affected_in_namespace(self.cfg.scenario.isolated().then_some(ns));
        let marker = manifests::added_endpoint_ip(k);
        let key_matches = move |w: &BusWrite| {
            w.bucket == Bucket::Endpoints
                && shoal_common::keys::parse_endpoints_key(&w.key)
                    .is_ok_and(|id| id.namespace == ns_name && id.service == service)
        };
        self.change(
            k,
            XdsType::Endpoint,
            resource,
            marker,
            affected,
            key_matches,
            |mesh| {
                if replace_in.is_some() {
                    mesh.replace_endpoint(ns, index, k)
                } else {
                    mesh.add_endpoint(ns, index, k)
                }
            },
        )
        .await
    }

    async fn vs_change(&mut self, k: usize) -> anyhow::Result<(ChangeSample, Vec<f64>)> {
        let mesh_wide = self.cfg.vs_change == VsChange::Mesh;
        let affected =
            self.affected_in_namespace((!mesh_wide && self.cfg.scenario.isolated()).then_some(0));
        let (ns, name) = if mesh_wide {
            (manifests::SYSTEM_NS.to_string(), manifests::SHARED_VS)
        } else {
            (manifests::namespace_name(0), manifests::NAMESPACE_VS)
        };
        let key_matches = move |w: &BusWrite| {
            w.bucket == Bucket::Config
                && shoal_common::keys::parse_config_key(&w.key).is_ok_and(|id| {
                    id.kind == ConfigKind::VirtualService && id.namespace == ns && id.name == name
                })
        };
        self.change(
            k,
            XdsType::Route,
            manifests::ROUTE_NAME.to_string(),
            manifests::vs_marker(k),
            affected,
            key_matches,
            |mesh| mesh.change_virtual_service(mesh_wide, k),
        )
        .await
    }

    /// Applies one change and measures it: every affected proxy must receive `resource`
    /// (of type `ty`) containing `marker`.
    #[allow(clippy::too_many_arguments)]
    async fn change(
        &mut self,
        k: usize,
        ty: XdsType,
        resource: String,
        marker: String,
        affected: Vec<bool>,
        key_matches: impl Fn(&BusWrite) -> bool,
        edit: impl FnOnce(&mut BenchMesh) -> anyhow::Result<()>,
    ) -> anyhow::Result<(ChangeSample, Vec<f64>)> {
        self.drain_events();
        while self.bus_writes.try_recv().is_ok() {}
        let affected_n = affected.iter().filter(|a| **a).count();
        let id = self.next_change;
        self.next_change += 1;
        let server = &self.servers[0];
        let cpu0 = server.cpu()?;
        let m0 = server.metrics().await?;
        self.announce(Some(ActiveChange {
            id,
            ty,
            resource,
            marker: memchr::memmem::Finder::new(marker.as_bytes()).into_owned(),
        }))
        .await?;
        let write_ms = now_ms();
        edit(&mut self.mesh)?;
        let deadline = Instant::now() + self.cfg.phase_timeout;
        let mut observed_at: Option<BusWrite> = None;
        let mut receipts = Receipts::new(&affected);
        while observed_at.is_none() || receipts.observed < affected_n {
            let tick = (Instant::now() + Duration::from_secs(1)).min(deadline);
            tokio::select! {
                w = self.bus_writes.recv() => {
                    let Some(w) = w else { bail!("the bus watch stopped") };
                    if observed_at.is_none() && key_matches(&w) {
                        observed_at = Some(w);
                    }
                }
                e = self.events.recv() => match e {
                    Some(Event::Observed { proxy, change, at_us }) if change == id => {
                        receipts.record(proxy, at_us);
                    }
                    Some(Event::Observed { .. }) | Some(Event::Configured { .. }) => {}
                    Some(other) => self.note(other),
                    None => bail!("every proxy stopped"),
                },
                _ = tokio::time::sleep_until(tick) => {
                    self.check_processes(false)?;
                    if Instant::now() >= deadline { break; }
                }
            }
        }
        self.announce(None).await?;
        let Some(on_bus) = observed_at else {
            bail!(
                "change {k}: no write of it was seen on the bus within {:?} ({} of \
                 {affected_n} affected proxies received it); the ingester's log:\n{}",
                self.cfg.phase_timeout,
                receipts.observed,
                self.ingester.process().log_tail()
            );
        };
        self.settle(0).await?;
        let server = &self.servers[0];
        let m1 = server.metrics().await?;
        let latencies = receipts.since_ms(on_bus.observed_at_ms);
        let sample = ChangeSample {
            k,
            key: on_bus.key.clone(),
            ingest_ms: on_bus.observed_at_ms.saturating_sub(write_ms) as f64,
            affected: affected_n,
            observed: receipts.observed,
            unexpected: receipts.unexpected,
            latency_ms: Dist::of(&latencies),
            bus_ms: on_bus.bus_ms(),
            first_ms: first(&latencies),
            from_write_ms: Dist::of(&receipts.since_ms(write_ms)),
            server_cpu_s: (server.cpu()? - cpu0).as_secs_f64(),
            server_bytes: m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES),
            server_pushes: m1.get(PUSHES) - m0.get(PUSHES),
            cache: cache_use(&m0, &m1),
        };
        Ok((sample, latencies))
    }

    /// Kills replica A; every proxy reconnects to B with what it holds. Counts what B
    /// resends.
    async fn move_replica(&mut self) -> anyhow::Result<ReplicaMove> {
        self.drain_events();
        let counters = self.fleet.counters();
        let streams_before: Vec<u32> = counters
            .iter()
            .map(|c| c.streams.load(Ordering::Relaxed))
            .collect();
        // Proxies that gave up on A earlier are on B already: they do not move.
        let on_a: Vec<bool> = counters
            .iter()
            .map(|c| c.server.load(Ordering::Relaxed) == 0)
            .collect();
        let expected = on_a.iter().filter(|a| **a).count();
        for c in counters {
            c.resent.store(0, Ordering::Relaxed);
            c.received_after_reconnect.store(0, Ordering::Relaxed);
            c.held_at_reconnect.store(0, Ordering::Relaxed);
        }
        let errors_before = self.stream_errors;
        let b = &self.servers[1];
        let m0 = b.metrics().await?;
        let cpu0 = b.cpu()?;
        let start = Instant::now();
        self.servers[0].kill().await;
        let deadline = start + self.cfg.phase_timeout;
        let mut moved = vec![false; self.cfg.proxies];
        let mut done = 0;
        let mut last = start;
        while done < expected {
            let Some(event) = self.next_event(deadline, true).await? else {
                break;
            };
            match event {
                Event::Configured { proxy, stream, .. }
                    if on_a[proxy] && stream >= streams_before[proxy] && !moved[proxy] =>
                {
                    moved[proxy] = true;
                    done += 1;
                    last = Instant::now();
                }
                Event::StreamError { ended: true, .. } => self.streams_ended += 1,
                Event::StreamError { .. } => self.stream_errors += 1,
                Event::Configured { .. } | Event::Observed { .. } => {}
                other => self.note(other),
            }
        }
        // Every proxy's old stream broke: those errors are the move, not failures.
        let move_errors = self.stream_errors - errors_before;
        self.stream_errors -= move_errors.min(expected);
        self.settle(1).await?;
        let b = &self.servers[1];
        let m1 = b.metrics().await?;
        let counters = self.fleet.counters();
        let sum = |f: fn(&client::ProxyCounters) -> u64| counters.iter().map(f).sum::<u64>();
        Ok(ReplicaMove {
            expected,
            already_on_b: self.cfg.proxies - expected,
            reconfigured: done,
            all_reconfigured_s: (last - start).as_secs_f64(),
            held: sum(|c| c.held_at_reconnect.load(Ordering::Relaxed)),
            received: sum(|c| c.received_after_reconnect.load(Ordering::Relaxed)),
            resent: sum(|c| c.resent.load(Ordering::Relaxed)),
            server_resumed: m1.get(RESUMED) - m0.get(RESUMED),
            server_resources_sent: m1.get(RESOURCES_SENT) - m0.get(RESOURCES_SENT),
            server_bytes: m1.get(PUSH_BYTES) - m0.get(PUSH_BYTES),
            server_cpu_s: (b.cpu()? - cpu0).as_secs_f64(),
            cache: cache_use(&m0, &m1),
        })
    }
}

/// Waits until `server` is quiet — no response sent and under 10 % of a CPU used for
/// 500 ms — so that a phase's CPU and bytes include all its work (bounded by `timeout`).
async fn settle_server(server: &Server, timeout: Duration) -> anyhow::Result<()> {
    const QUIET: Duration = Duration::from_millis(500);
    let deadline = Instant::now() + timeout;
    let mut last = (server.metrics().await?.get(PUSHES), server.cpu()?);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pushes = server.metrics().await?.get(PUSHES);
        if pushes != last.0 {
            last = (pushes, server.cpu()?);
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= QUIET {
            let cpu = server.cpu()?;
            if cpu.saturating_sub(last.1) < QUIET / 10 {
                return Ok(());
            }
            last.1 = cpu;
            quiet_since = Instant::now();
        }
    }
    Ok(())
}

/// Proxies besides the main fleet (the recording clients, the replay baseline's proxies,
/// the storm's fresh proxies), connected to one server only, with their own events and
/// shutdown.
struct SideFleet {
    fleet: Arc<Fleet>,
    tasks: JoinSet<()>,
    shutdown: watch::Sender<bool>,
    events: mpsc::UnboundedReceiver<Event>,
}

impl SideFleet {
    fn new(
        mode: Mode,
        server: std::net::SocketAddr,
        proxies: usize,
        connect_concurrency: usize,
        active: watch::Receiver<Option<Arc<ActiveChange>>>,
        record: bool,
    ) -> SideFleet {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (events_tx, events) = mpsc::unbounded_channel();
        let fleet = Fleet::new(
            mode,
            vec![server],
            proxies,
            connect_concurrency,
            active,
            events_tx,
            shutdown_rx,
        );
        SideFleet {
            fleet: Arc::new(if record { fleet.recording() } else { fleet }),
            tasks: JoinSet::new(),
            shutdown,
            events,
        }
    }

    /// Starts proxy `id` (its index must be below the fleet's size).
    fn spawn(&mut self, id: ProxyIdentity) {
        self.tasks.spawn(client::run_proxy(self.fleet.clone(), id));
    }

    /// Disconnects every proxy (bounded).
    async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, self.tasks.join_next()).await {}
        self.tasks.abort_all();
    }
}

/// What a connection phase saw, per proxy of one fleet.
struct Tally {
    start: Instant,
    /// When the last proxy was configured.
    last: Instant,
    done: usize,
    /// Per proxy: from connection attempt to configured, ms.
    elapsed: Vec<Option<f64>>,
    /// Per proxy: what it held when configured.
    fingerprints: Vec<Option<Fingerprint>>,
    /// Per proxy (recording fleets): every resource with its bytes.
    recordings: Vec<Option<Vec<RecordedItem>>>,
    /// Per proxy: a connection (TCP connect or HTTP/2 handshake) failed.
    connect_failed: Vec<bool>,
    /// Per proxy: a stream broke after connecting.
    stream_failed: Vec<bool>,
    mismatched: usize,
    mismatch_example: Option<String>,
    clusters: usize,
    endpoints: usize,
    listeners: usize,
    routes: usize,
    with_vo: usize,
    with_vi: usize,
    dangling_references: usize,
    dangling_example: Option<String>,
    example_proxy: Option<HeldNames>,
    error_examples: Vec<String>,
}

impl Tally {
    fn new(n: usize, start: Instant) -> Tally {
        Tally {
            start,
            last: start,
            done: 0,
            elapsed: vec![None; n],
            fingerprints: vec![None; n],
            recordings: (0..n).map(|_| None).collect(),
            connect_failed: vec![false; n],
            stream_failed: vec![false; n],
            mismatched: 0,
            mismatch_example: None,
            clusters: 0,
            endpoints: 0,
            listeners: 0,
            routes: 0,
            with_vo: 0,
            with_vi: 0,
            dangling_references: 0,
            dangling_example: None,
            example_proxy: None,
            error_examples: Vec::new(),
        }
    }

    /// Takes a proxy's first `Configured` (checking its shape against main proxy
    /// `shape_of(proxy)`) and counts stream errors; returns every event but the first
    /// `Configured`s, for the caller to note.
    fn on_event(
        &mut self,
        event: Event,
        mesh: &BenchMesh,
        captured: bool,
        shape_of: &dyn Fn(usize) -> usize,
    ) -> Option<Event> {
        match event {
            Event::Configured {
                proxy,
                elapsed: e,
                clusters: c,
                endpoints: eds,
                listeners,
                routes,
                capture_listeners: (vo, vi),
                inbound_clusters,
                dangling,
                names,
                fingerprint,
                recording,
                ..
            } if self.elapsed.get(proxy).is_some_and(Option::is_none) => {
                self.elapsed[proxy] = Some(e.as_secs_f64() * 1000.0);
                self.fingerprints[proxy] = Some(fingerprint);
                self.recordings[proxy] = recording;
                self.done += 1;
                self.last = Instant::now();
                self.clusters += c;
                self.endpoints += eds;
                self.listeners += listeners;
                self.routes += routes;
                self.with_vo += usize::from(vo);
                self.with_vi += usize::from(vi);
                if let Some((example, n)) = dangling {
                    self.dangling_references += 1;
                    self.dangling_example.get_or_insert_with(|| {
                        format!("proxy {proxy}: {example} ({n} such references)")
                    });
                }
                if let Some(names) = names {
                    self.example_proxy = Some(*names);
                }
                let want = mesh.expected_shape(shape_of(proxy));
                let got = manifests::ExpectedShape {
                    endpoints: eds,
                    listeners,
                    routes,
                    inbound_clusters,
                };
                if got != want || (captured && !(vo && vi)) || (!captured && (vo || vi)) {
                    self.mismatched += 1;
                    self.mismatch_example.get_or_insert_with(|| {
                        format!(
                            "proxy {proxy}: {eds} EDS assignments (want {}), {listeners} listeners (want {}; virtualOutbound {vo}, virtualInbound {vi}), {routes} route tables (want {}), {inbound_clusters} inbound clusters (want {}), {c} clusters",
                            want.endpoints, want.listeners, want.routes, want.inbound_clusters
                        )
                    });
                }
                None
            }
            Event::StreamError {
                proxy,
                connect,
                ref error,
                ..
            } => {
                let failed = if connect {
                    &mut self.connect_failed
                } else {
                    &mut self.stream_failed
                };
                if let Some(f) = failed.get_mut(proxy) {
                    *f = true;
                }
                if self.error_examples.len() < 5 {
                    self.error_examples
                        .push(format!("proxy {proxy} stream: {error}"));
                }
                Some(event)
            }
            other => Some(other),
        }
    }

    /// What the first few unconfigured proxies still lack.
    fn pending(&self, counters: &[ProxyCounters]) -> Vec<String> {
        counters
            .iter()
            .enumerate()
            .filter(|(i, _)| self.elapsed.get(*i).is_some_and(Option::is_none))
            .take(3)
            .map(|(i, c)| {
                let p = c.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
                format!("proxy {i}: {}", p.as_deref().unwrap_or("nothing received"))
            })
            .collect()
    }

    /// The phase's figures, without the server's.
    fn initial(&self) -> Initial {
        let n = self.elapsed.len().max(1) as f64;
        let samples: Vec<f64> = self.elapsed.iter().flatten().copied().collect();
        Initial {
            all_configured_s: (self.last - self.start).as_secs_f64(),
            per_proxy_ms: Dist::of(&samples),
            mismatched: self.mismatched,
            mismatch_example: self.mismatch_example.clone(),
            clusters_per_proxy: self.clusters as f64 / n,
            endpoints_per_proxy: self.endpoints as f64 / n,
            listeners_per_proxy: self.listeners as f64 / n,
            routes_per_proxy: self.routes as f64 / n,
            with_virtual_outbound: self.with_vo,
            with_virtual_inbound: self.with_vi,
            dangling_references: self.dangling_references,
            dangling_example: self.dangling_example.clone(),
            example_proxy: self.example_proxy.clone(),
            connect_failures: self.connect_failed.iter().filter(|f| **f).count(),
            stream_failures: self.stream_failed.iter().filter(|f| **f).count(),
            ..Initial::default()
        }
    }
}

const CONNECTIONS: &str = "shoal_xds_connections";
const PUSH_BYTES: &str = "shoal_xds_push_bytes_total";
const PUSHES: &str = "shoal_xds_pushes_total";
const RESUMED: &str = "shoal_xds_resources_resumed_total";
const RESOURCES_SENT: &str = "shoal_xds_resources_sent_total";

fn cache_use(before: &procs::Metrics, after: &procs::Metrics) -> CacheUse {
    CacheUse {
        hits: after.get("shoal_cache_hits_total") - before.get("shoal_cache_hits_total"),
        misses: after.get("shoal_cache_misses_total") - before.get("shoal_cache_misses_total"),
    }
}

async fn connect_bus(url: &str) -> anyhow::Result<Arc<NatsBus>> {
    let bus = NatsBus::connect(&NatsOptions::new(url))
        .await
        .with_context(|| format!("connecting the benchmark to NATS at {url}"))?;
    Ok(Arc::new(bus))
}

/// Waits until the bus holds every key the mesh should produce.
async fn wait_published(
    bus: &NatsBus,
    mesh: &BenchMesh,
    ingester: &mut Ingester,
    timeout: Duration,
) -> anyhow::Result<()> {
    let (config, services, endpoints) = mesh.expected_keys();
    let want: BTreeMap<Bucket, usize> = [
        (Bucket::Config, config),
        (Bucket::Services, services),
        (Bucket::Endpoints, endpoints),
    ]
    .into();
    let deadline = Instant::now() + timeout;
    loop {
        ingester.check_running()?;
        let mut have = BTreeMap::new();
        for bucket in want.keys() {
            let keys = bus
                .keys(*bucket)
                .await
                .with_context(|| format!("listing {bucket}"))?;
            // Namespace label entries (for Gateway API listener selectors) are the
            // ingester's, one per selected namespace, not the mesh's objects.
            let n = keys
                .iter()
                .filter(|k| {
                    *bucket != Bucket::Config
                        || keys::parse_config_key(k)
                            .map_or(true, |id| id.kind != ConfigKind::Namespace)
                })
                .count();
            have.insert(*bucket, n);
        }
        if have == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the ingester did not publish the mesh within {timeout:?}: keys per bucket {have:?}, expected {want:?}; its log:\n{}",
                ingester.process().log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Forwards every write to `bucket` after its initial state, with the envelope's
/// `observed_at_ms`. Reports on `ready` once the initial state has been delivered. A watch
/// that ends with an error once live (the bus ends watches across a reconnection) is
/// replaced; the new watch's replay forwards the writes newer than the last one seen, so
/// none made in between is lost to the change being timed.
async fn watch_bucket(
    bus: Arc<NatsBus>,
    bucket: Bucket,
    writes: mpsc::UnboundedSender<BusWrite>,
    ready: mpsc::UnboundedSender<anyhow::Result<()>>,
) {
    let fail = |e: anyhow::Error| {
        let _ = ready.send(Err(e.context(format!("watching {bucket}"))));
    };
    // The newest revision seen, initial state included; whether that state is delivered.
    let (mut last, mut live) = (0, false);
    while !writes.is_closed() {
        let mut stream = match bus.watch(bucket).await {
            Ok(s) => s,
            Err(e) if live => {
                eprintln!("[shoal-bench] re-watching {bucket}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return fail(e.into()),
        };
        while let Some(item) = stream.next().await {
            let entry = match item {
                Ok(WatchEvent::InitialDone) => {
                    if !live {
                        live = true;
                        let _ = ready.send(Ok(()));
                    }
                    continue;
                }
                Ok(WatchEvent::Entry(entry)) => entry,
                Err(e) if live => {
                    eprintln!("[shoal-bench] the watch of {bucket} ended: {e}");
                    break;
                }
                Err(e) => return fail(e.into()),
            };
            // The first initial state is not forwarded; a re-watch's replay only past `last`.
            let newer = entry.revision > last;
            last = last.max(entry.revision);
            if !live || !newer {
                continue;
            }
            // Only the envelope's header matters here; the body is skipped.
            let Ok(env) = Envelope::<serde::de::IgnoredAny>::decode(&entry.value) else {
                continue;
            };
            let _ = writes.send(BusWrite {
                bucket,
                key: entry.key,
                observed_at_ms: env.observed_at_ms,
                seen_at_ms: now_ms(),
            });
        }
        if !live {
            return fail(anyhow::anyhow!("the watch ended before its initial state"));
        }
    }
}

/// The smallest latency (the first receipt), 0 when there is none.
fn first(latencies: &[f64]) -> f64 {
    latencies.iter().copied().reduce(f64::min).unwrap_or(0.0)
}

/// The name letter of replica `r`: a, b, c, …
fn replica_letter(r: usize) -> char {
    char::from(b'a' + (r % 26) as u8)
}

/// The CPUs replica `r` is pinned to: with `--scale-out` and one CPU listed per replica
/// (`1,2,3,4`), its own; otherwise the whole `--server-cpus` list.
fn replica_cpus(cfg: &BenchConfig, r: usize) -> Option<String> {
    let list = cfg.server_cpus.as_deref()?;
    let each: Vec<&str> = list.split(',').map(str::trim).collect();
    if cfg.scale_out && each.len() == cfg.replicas {
        Some(each[r].to_string())
    } else {
        Some(list.to_string())
    }
}

/// Each proxy's first receipt of a change, counted against the proxies it affects.
struct Receipts<'a> {
    affected: &'a [bool],
    at_us: HashMap<usize, u64>,
    /// Affected proxies that received it.
    observed: usize,
    /// Proxies that received it though it does not affect them.
    unexpected: usize,
}

impl<'a> Receipts<'a> {
    fn new(affected: &'a [bool]) -> Self {
        Receipts {
            affected,
            at_us: HashMap::new(),
            observed: 0,
            unexpected: 0,
        }
    }

    /// Proxy `proxy` received it at `at_us` (later receipts of a proxy do not count).
    fn record(&mut self, proxy: usize, at_us: u64) {
        if self.at_us.insert(proxy, at_us).is_none() {
            if self.affected[proxy] {
                self.observed += 1
            } else {
                self.unexpected += 1
            }
        }
    }

    /// The affected proxies' receipts, in ms after `from_ms`.
    fn since_ms(&self, from_ms: u64) -> Vec<f64> {
        self.at_us
            .iter()
            .filter(|(p, _)| self.affected[**p])
            .map(|(_, at_us)| *at_us as f64 / 1000.0 - from_ms as f64)
            .collect()
    }
}

/// Growth over a series of `(seconds, KiB)` samples, percent: the least-squares line's rise
/// from the first sample's time to the last's, over its value at the first. A line, not
/// last over first, so that one high or low sample does not decide it. 0 with fewer than
/// two samples.
fn trend_growth_pct(samples: &[(f64, u64)]) -> f64 {
    let n = samples.len() as f64;
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return 0.0;
    };
    if last.0 <= first.0 {
        return 0.0;
    }
    let mean_t = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mean_y = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let (mut sty, mut stt) = (0.0, 0.0);
    for &(t, y) in samples {
        sty += (t - mean_t) * (y as f64 - mean_y);
        stt += (t - mean_t) * (t - mean_t);
    }
    let slope = sty / stt;
    let at_first = mean_y + slope * (first.0 - mean_t);
    slope * (last.0 - first.0) * 100.0 / at_first.max(1.0)
}

#[cfg(test)]
mod trend_tests {
    #[test]
    fn trend_growth_is_the_fitted_lines_rise() {
        // Flat with one high sample at the end: last over first would say +10 %.
        let flat = [
            (0.0, 100),
            (10.0, 102),
            (20.0, 98),
            (30.0, 100),
            (40.0, 110),
        ];
        let g = super::trend_growth_pct(&flat);
        assert!((0.0..8.0).contains(&g), "{g}");
        // A straight rise from 100 to 120: +20 %.
        let rise = [
            (0.0, 100),
            (10.0, 105),
            (20.0, 110),
            (30.0, 115),
            (40.0, 120),
        ];
        assert!((super::trend_growth_pct(&rise) - 20.0).abs() < 1e-9);
        assert_eq!(super::trend_growth_pct(&[(0.0, 100)]), 0.0);
        assert_eq!(super::trend_growth_pct(&[]), 0.0);
    }
}
