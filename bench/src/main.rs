//! `shoal-bench`: load benchmark of shoal with real processes and simulated Envoy proxies.
//! See docs/benchmarks.md and `shoal-bench --help`.
#![forbid(unsafe_code)]

use clap::Parser;
use shoal_bench::client::Mode;
use shoal_bench::manifests::ScenarioKind;
use shoal_bench::{Baseline, BenchConfig, Source, VsChange};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// mimalloc, as the server: the simulated proxies receive a 425 KB route table each per
/// VirtualService change, and with glibc's allocator every few changes found its freed
/// memory returned to the kernel and faulted fresh pages in again (half of the
/// benchmark's CPU in one change in five, doubling that change's latency on the 2-core
/// machine: the client's cost, not the server's).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load benchmark of shoal: generates a mesh, starts nats-server, shoal-ingester and
/// shoal-server (real processes), connects simulated Envoy sidecars (real gRPC ADS clients,
/// one HTTP/2 connection each) and measures initial configuration time, convergence of
/// endpoint and VirtualService changes, server CPU, bytes and memory per proxy, and (with
/// --replicas 2) what a second replica resends when every proxy moves to it.
///
/// Needs nats-server on PATH and the shoal binaries: build them first with
/// `cargo build --release --bins` (found in target/release, else target/debug, or
/// --bin-dir). Every process is killed when the benchmark ends, also on error or Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "shoal-bench", version)]
struct Args {
    /// Simulated proxies (sidecars), spread round-robin over the namespaces.
    #[arg(long, default_value_t = 100, value_name = "N")]
    proxies: usize,

    /// Namespaces (ns-0 ...), holding the services and the proxies.
    #[arg(long, default_value_t = 4, value_name = "N")]
    namespaces: usize,

    /// Services, spread round-robin over the namespaces (one more, `shared` in
    /// istio-system, is always added), each with port 8080 named `http` (captured: some
    /// with more ports, see --scenario).
    #[arg(long, default_value_t = 40, value_name = "N")]
    services: usize,

    /// Endpoints (Pods in one EndpointSlice) per service.
    #[arg(long, default_value_t = 3, value_name = "N")]
    endpoints: usize,

    /// The mesh and its proxies. `flat`: a mesh-wide Sidecar admits every service ("*/*");
    /// `isolated`: one Sidecar per namespace with egress hosts ["./*", "istio-system/*"], so
    /// a proxy sees only its own namespace's services (plus `shared`). Both Sidecars have
    /// one `captureMode: NONE` egress listener on 127.0.0.1:8080 and the proxies send
    /// `INTERCEPTION_MODE: NONE`. `captured`: what most Istio users run — no Sidecar
    /// (every service visible) and proxies with iptables interception (no
    /// INTERCEPTION_MODE), each selected by one service, so they get virtualOutbound,
    /// virtualInbound, per-destination outbound listeners and inbound clusters; every tenth
    /// service also has a TCP port (tcp-db 9000), every tenth an HTTP port (http-api 9080),
    /// every fiftieth a port of unknown protocol (stream 7070).
    #[arg(long, value_enum, default_value_t = ScenarioKind::Flat)]
    scenario: ScenarioKind,

    /// Same as --scenario isolated.
    #[arg(long, conflicts_with = "scenario")]
    sidecar_isolation: bool,

    /// ADS variant the proxies speak.
    #[arg(long, value_enum, default_value_t = Mode::Delta)]
    mode: Mode,

    /// shoal-server replicas. With 2, proxies connect to the first; at the end it is
    /// killed and every proxy moves to the second, which reports what it resent.
    #[arg(long, default_value_t = 1, value_name = "1|2")]
    replicas: usize,

    /// How many endpoint changes and how many VirtualService changes to measure.
    #[arg(long, default_value_t = 3, value_name = "K")]
    changes: usize,

    /// Which VirtualService the VirtualService change edits: `mesh` (istio-system/shared,
    /// seen by every proxy) or `namespace` (ns-0/routes; with --sidecar-isolation only ns-0's
    /// proxies see it).
    #[arg(long, value_enum, default_value_t = VsChange::Mesh)]
    vs_change: VsChange,

    /// Global time limit, in seconds: the benchmark fails (cleaning up) when it is exceeded.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,

    /// Time limit of one phase (publishing the mesh, connecting every proxy, one change,
    /// the replica move), in seconds.
    #[arg(long, default_value_t = 180, value_name = "SECONDS")]
    phase_timeout: u64,

    /// Connection handshakes (TCP + HTTP/2) in flight at most, to bound the connection rate.
    #[arg(long, default_value_t = 64, value_name = "N")]
    connect_concurrency: usize,

    /// Directory holding shoal-server and shoal-ingester (default: next to this binary,
    /// else target/release, else target/debug; or $SHOAL_BIN_DIR).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,

    /// Extra argument for shoal-server (repeatable), e.g. --server-arg=--debounce-after=50ms.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    server_args: Vec<String>,

    /// Pin the server replicas to these CPUs (`taskset -c LIST`, e.g. `1`), so that they
    /// do not share cores with the simulated proxies; run the benchmark itself under
    /// `taskset -c` on the other CPUs (nats-server and the ingester inherit its CPUs).
    #[arg(long, value_name = "LIST")]
    server_cpus: Option<String>,

    /// What the initial phase is compared with. `replay`: after shoal's initial phase, one
    /// delta client per proxy class (namespace, label `app`, interception mode) records
    /// what replica A sends it, `shoal-replay` (built with the other binaries, pinned like
    /// the replicas) serves that recording without generating anything, and the same
    /// proxies connect to it the same way; the report gives each initial-phase figure
    /// next to the replay's and the ratio shoal / replay. `none`: skip it.
    #[arg(long, value_enum, default_value_t = Baseline::Replay)]
    baseline: Baseline,

    /// After the changes (before the replica move): a mesh-wide VirtualService change and,
    /// at the same moment, as many fresh proxies as --proxies connecting to replica A
    /// (same classes, their own node ids); reports how many fail (connection, broken
    /// stream, not configured within --phase-timeout) and how long until all are
    /// configured. They are disconnected afterwards.
    #[arg(long)]
    storm: bool,

    /// With two replicas: spread the proxies over both (proxy i starts on replica i mod 2)
    /// instead of starting them all on A; the replica move then moves A's half.
    #[arg(long)]
    spread: bool,

    /// After the measured changes (before the replica move): a soak of this many seconds,
    /// an endpoint change every second (to two services of each namespace in turn, each
    /// replacing its service's previous soak endpoint, so the mesh does not grow) and a VirtualService change every 30 s, each
    /// measured; reports the server's RSS growth (target ≤ 5 % over 30 minutes), NACKs,
    /// stream errors and missed changes. Raise --timeout to cover it.
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,

    /// Scale-out: --replicas N (1 – 8; 1: the lone replica to compare with, measured the
    /// same way) replicas fed by one ingester, the proxies spread
    /// over them (proxy i on replica i mod N), each replica pinned to its own CPU when
    /// --server-cpus lists one per replica (`1,2,3,4`). Reports each replica's CPU, RSS
    /// per proxy and the time until its proxies were configured; no replica move and no
    /// replay baseline (pass --baseline none). Compare with a lone replica: the same
    /// command with --replicas 1 and --proxies divided by N.
    #[arg(long)]
    scale_out: bool,

    /// Where the ingester reads the mesh: `file` (a manifest directory, `--source
    /// file:DIR`) or `kube` (the Kubernetes API test server, run inside this process, with
    /// the ingester watching it as a cluster: `--source kube`); with `kube`, endpoint
    /// changes are EndpointSlice writes to the API server and the report gives the time
    /// from that write to the last affected proxy.
    #[arg(long, value_enum, default_value_t = Source::File)]
    source: Source,

    /// With --scale-out: run the simulated proxies of each replica in a process of their
    /// own (this program, started as a fleet process), so that the load generator does
    /// not saturate the benchmark's cores; the benchmark keeps the mesh, the ingester,
    /// NATS, the replicas, the changes and the report. Each replica's line in the report
    /// then gives its fleet process's CPU (and how busy its cores were) and RSS.
    #[arg(long, requires = "scale_out")]
    fleet_processes: bool,

    /// With --fleet-processes: CPUs (`taskset -c` list, e.g. `5-16`) divided among the
    /// fleet processes in equal consecutive shares (4 replicas, `5-16`: 5-7, 8-10, 11-13,
    /// 14-16), so that no fleet process shares a core with a server (--server-cpus).
    #[arg(long, value_name = "LIST", requires = "fleet_processes")]
    fleet_cpus: Option<String>,

    /// Internal: run as a fleet process of --fleet-processes (messages on stdin/stdout).
    #[arg(long = "fleet-child", hide = true)]
    fleet_child: bool,

    /// Print the results as JSON on stdout (progress, and then the table unless --quiet,
    /// still go to stderr).
    #[arg(long)]
    json: bool,

    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.fleet_child {
        return shoal_bench::fleetproc::child_main();
    }
    let cfg = BenchConfig {
        proxies: args.proxies,
        namespaces: args.namespaces,
        services: args.services,
        endpoints: args.endpoints,
        scenario: if args.sidecar_isolation {
            ScenarioKind::Isolated
        } else {
            args.scenario
        },
        mode: args.mode,
        replicas: args.replicas,
        changes: args.changes,
        vs_change: args.vs_change,
        timeout: Duration::from_secs(args.timeout),
        phase_timeout: Duration::from_secs(args.phase_timeout),
        connect_concurrency: args.connect_concurrency,
        bin_dir: args.bin_dir,
        server_args: args.server_args,
        server_cpus: args.server_cpus,
        progress: !args.quiet,
        baseline: args.baseline,
        storm: args.storm,
        spread: args.spread,
        soak: args.soak.map(Duration::from_secs),
        scale_out: args.scale_out,
        source: args.source,
        fleet_processes: args.fleet_processes,
        fleet_cpus: args.fleet_cpus,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        tokio::select! {
            r = shoal_bench::run(&cfg) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    // Dropping the runtime drops the benchmark's tasks, which kills their processes.
    drop(runtime);
    match result {
        Ok(report) => {
            if args.json {
                if !args.quiet {
                    eprint!("{}", report.table());
                }
                match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("shoal-bench: cannot encode the report: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", report.table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shoal-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
