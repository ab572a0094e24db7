//! The load benchmark (`shoal-bench`, bench/) in a tiny configuration, as a CI check
//! that it still works end to end: real nats-server, ingester and two server replicas,
//! simulated proxies in both ADS modes, and captured sidecars (Istio's default interception).
//! Only functional outcomes are asserted — every proxy configured with the configuration's
//! expected shape, nothing NACKed, every change received by every affected proxy and no
//! other, nothing resent on a delta move to the second replica; with the replay baseline,
//! every proxy configured by `shoal-replay` with the same resources as by shoal; in the
//! connection storm, every fresh proxy configured without a failure — never timings.
//!
//! Needs the binaries: `cargo build --workspace --bins` first (scripts/test.sh does).
#![forbid(unsafe_code)]

use shoal_bench::client::Mode;
use shoal_bench::manifests::ScenarioKind;
use shoal_bench::report::Report;
use shoal_bench::{Baseline, BenchConfig, Source, VsChange};
use std::time::Duration;

fn smoke(mode: Mode, scenario: ScenarioKind, vs_change: VsChange) -> BenchConfig {
    BenchConfig {
        proxies: 20,
        namespaces: 4,
        services: 20,
        endpoints: 3,
        scenario,
        mode,
        replicas: 2,
        changes: 2,
        vs_change,
        timeout: Duration::from_secs(240),
        phase_timeout: Duration::from_secs(60),
        connect_concurrency: 8,
        bin_dir: Some(shoal_tests::shoal::bin_dir()),
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

async fn run(cfg: BenchConfig) -> Report {
    match shoal_bench::run(&cfg).await {
        Ok(report) => {
            eprintln!("{}", report.table());
            report
        }
        Err(e) => panic!("the benchmark failed: {e:#}"),
    }
}

fn assert_functional(r: &Report, cfg: &BenchConfig) {
    let ctx = || serde_json::to_string_pretty(r).unwrap_or_default();
    assert_eq!(
        r.initial.per_proxy_ms.n,
        cfg.proxies,
        "all configured\n{}",
        ctx()
    );
    assert_eq!(r.initial.mismatched, 0, "config shape\n{}", ctx());
    assert_eq!(r.bad_responses, 0, "{}", ctx());
    assert_eq!(r.nacks, 0, "nothing Envoy would reject\n{}", ctx());
    assert_eq!(
        r.initial.dangling_references,
        0,
        "every cluster used exists\n{}",
        ctx()
    );
    for (what, c) in [
        ("endpoint", &r.endpoint_change),
        ("VirtualService", &r.vs_change),
    ] {
        assert_eq!(c.samples.len(), cfg.changes, "{what} changes\n{}", ctx());
        assert_eq!(c.missing, 0, "{what}: every affected proxy\n{}", ctx());
        for s in &c.samples {
            assert!(s.affected > 0, "{what}: {s:?}");
            assert_eq!(s.unexpected, 0, "{what}: only affected proxies\n{}", ctx());
        }
    }
    assert!(r.processes_ok, "{}", ctx());
    if cfg.scale_out {
        return;
    }
    let mv = r.replica_move.as_ref().expect("two replicas: the move ran");
    assert!(mv.expected > 0, "proxies were on replica A\n{}", ctx());
    assert_eq!(mv.reconfigured, mv.expected, "all moved\n{}", ctx());
    assert!(mv.held > 0, "{}", ctx());
    match cfg.mode {
        Mode::Delta => {
            assert_eq!(
                mv.resent,
                0,
                "delta resends nothing already held\n{}",
                ctx()
            );
            assert!(
                mv.server_resumed > 0.0,
                "B counts resumed resources\n{}",
                ctx()
            );
        }
        // SotW has no way to say what the proxy holds: everything comes again.
        Mode::Sotw => assert!(mv.resent > 0, "{}", ctx()),
    }
    if cfg.baseline == Baseline::Replay {
        let b = r
            .baseline
            .as_ref()
            .expect("--baseline replay: the baseline ran");
        assert!(b.classes > 0, "{}", ctx());
        assert_eq!(
            b.configured,
            cfg.proxies,
            "replay configured all\n{}",
            ctx()
        );
        assert_eq!(b.connect_failures, 0, "{}", ctx());
        assert_eq!(
            b.names_mismatched,
            0,
            "the replay gives every proxy the resources shoal gave it\n{}",
            ctx()
        );
        assert_eq!(b.versions_mismatched, 0, "same versions too\n{}", ctx());
        assert!(b.server_bytes > 0.0, "{}", ctx());
        // Delta: the replay pushes what each change changes to the same proxies (the
        // route table only for a mesh-wide VirtualService change).
        let vs_pushed = cfg.vs_change == VsChange::Mesh;
        let pushes = [
            (&b.endpoint_push, &r.endpoint_change, true),
            (&b.vs_push, &r.vs_change, vs_pushed),
        ];
        for (push, change, expected) in pushes {
            match (cfg.mode, push) {
                (Mode::Delta, Some(push)) if expected => {
                    assert_eq!(push.samples.len(), cfg.changes, "{}", ctx());
                    assert_eq!(push.missing, 0, "every push arrived\n{}", ctx());
                    for (p, c) in push.samples.iter().zip(&change.samples) {
                        assert_eq!(p.affected, c.affected, "{}", ctx());
                        assert_eq!(p.unexpected, 0, "{}", ctx());
                    }
                }
                (Mode::Delta, None) if !expected => {}
                (Mode::Sotw, None) => {}
                (mode, push) => panic!(
                    "{mode:?}: replay pushes {} (expected: {expected})\n{}",
                    push.is_some(),
                    ctx()
                ),
            }
        }
    }
    if cfg.storm {
        let st = r.storm.as_ref().expect("--storm: the storm ran");
        assert_eq!(st.proxies, cfg.proxies, "{}", ctx());
        assert_eq!(st.configured, cfg.proxies, "every fresh proxy\n{}", ctx());
        assert_eq!(st.failed, 0, "no failure in the storm\n{}", ctx());
        assert_eq!(st.mismatched, 0, "{}", ctx());
        assert_eq!(
            st.vs_change.observed,
            st.vs_change.affected,
            "the change reached every connected proxy\n{}",
            ctx()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_isolated() {
    let cfg = BenchConfig {
        baseline: Baseline::Replay,
        storm: true,
        ..smoke(Mode::Delta, ScenarioKind::Isolated, VsChange::Mesh)
    };
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    // Isolation: an endpoint change reaches only its namespace's proxies.
    assert_eq!(
        r.endpoint_change.samples[0].affected,
        cfg.proxies / cfg.namespaces
    );
    assert_eq!(r.vs_change.samples[0].affected, cfg.proxies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_flat() {
    let cfg = BenchConfig {
        baseline: Baseline::Replay,
        storm: true,
        ..smoke(Mode::Sotw, ScenarioKind::Flat, VsChange::Namespace)
    };
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    assert_eq!(r.endpoint_change.samples[0].affected, cfg.proxies);
    assert_eq!(r.initial.with_virtual_outbound, 0, "INTERCEPTION_MODE NONE");
}

/// Captured sidecars (no INTERCEPTION_MODE, no Sidecar): virtualOutbound, virtualInbound,
/// per-destination outbound listeners (HTTP, TCP, sniffed) and their route tables, inbound
/// clusters for the service selecting the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_captured() {
    let cfg = BenchConfig {
        changes: 1,
        baseline: Baseline::Replay,
        // A short soak: an endpoint change a second, each replacing the last.
        soak: Some(Duration::from_secs(3)),
        ..smoke(Mode::Delta, ScenarioKind::Captured, VsChange::Mesh)
    };
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    let ctx = || serde_json::to_string_pretty(&r).unwrap_or_default();
    let soak = r.soak.as_ref().expect("the soak ran");
    assert!(soak.endpoint_change.samples.len() >= 3, "{}", ctx());
    assert_eq!(soak.endpoint_change.missing, 0, "{}", ctx());
    assert_eq!((soak.nacks, soak.stream_errors), (0, 0), "{}", ctx());
    assert_eq!(r.initial.with_virtual_outbound, cfg.proxies, "{}", ctx());
    assert_eq!(r.initial.with_virtual_inbound, cfg.proxies, "{}", ctx());
    assert_eq!(r.endpoint_change.samples[0].affected, cfg.proxies);
    // Proxy 0 is in ns-0, selected by svc-0.ns-0 (port 8080). Service g = 1 has the TCP
    // port 9000 (ClusterIP 10.96.0.2), g = 2 the HTTP port 9080, g = 3 (svc-0.ns-3,
    // ClusterIP 10.96.0.4) the sniffed port 7070.
    let p0 = r.initial.example_proxy.as_ref().expect("proxy 0's names");
    for l in [
        "virtualOutbound",
        "virtualInbound",
        "0.0.0.0_8080",
        "0.0.0.0_9080",
        "10.96.0.2_9000",
        "10.96.0.4_7070",
    ] {
        assert!(
            p0.listeners.iter().any(|n| n == l),
            "listener {l}\n{}",
            ctx()
        );
    }
    for rt in ["8080", "9080", "svc-0.ns-3.svc.cluster.local:7070"] {
        assert!(p0.routes.iter().any(|n| n == rt), "route {rt}\n{}", ctx());
    }
    assert!(
        p0.other_clusters.iter().any(|c| c == "inbound|8080||"),
        "{}",
        ctx()
    );
}

/// The Kubernetes path and the scale-out: the mesh applied to the API test server, the
/// ingester watching it (`--source kube`), endpoint changes as EndpointSlice writes, three
/// replicas each serving a third of the proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_source_scale_out() {
    let cfg = BenchConfig {
        changes: 1,
        replicas: 3,
        proxies: 21,
        scale_out: true,
        source: Source::Kube,
        ..smoke(Mode::Delta, ScenarioKind::Captured, VsChange::Mesh)
    };
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    let ctx = || serde_json::to_string_pretty(&r).unwrap_or_default();
    assert!(r.replica_move.is_none(), "{}", ctx());
    let per_replica: Vec<usize> = r.initial.replicas.iter().map(|x| x.proxies).collect();
    assert_eq!(per_replica, vec![7, 7, 7], "{}", ctx());
    assert!(
        r.initial.replicas.iter().all(|x| x.server_cpu_s > 0.0),
        "{}",
        ctx()
    );
    // Measured from the API server write, which precedes the ingester's observation.
    let ep = &r.endpoint_change;
    assert!(
        ep.from_write_all_ms.n == 1 && ep.from_write_all_ms.max >= ep.all_converged_ms.max,
        "{}",
        ctx()
    );
}

/// The scale-out with one simulated-proxy process per replica (`--fleet-processes`):
/// three replicas, each with its seven proxies in a `shoal-bench --fleet-child` process of
/// its own; every proxy configured, every change seen by every proxy through its child,
/// nothing NACKed, and each replica's line naming a separate process that did the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_fleet_processes() {
    let cfg = BenchConfig {
        changes: 2,
        replicas: 3,
        proxies: 21,
        scale_out: true,
        fleet_processes: true,
        ..smoke(Mode::Delta, ScenarioKind::Captured, VsChange::Mesh)
    };
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    let ctx = || serde_json::to_string_pretty(&r).unwrap_or_default();
    assert!(r.scenario.fleet_processes, "{}", ctx());
    let per_replica: Vec<usize> = r.initial.replicas.iter().map(|x| x.proxies).collect();
    assert_eq!(per_replica, vec![7, 7, 7], "{}", ctx());
    let mut pids = Vec::new();
    for x in &r.initial.replicas {
        let f = x
            .fleet
            .as_ref()
            .expect("each replica has its fleet process");
        assert_eq!(f.proxies, 7, "{}", ctx());
        assert!(f.rss_kib > 0 && !f.allowed_cpus.is_empty(), "{}", ctx());
        assert_ne!(f.pid, std::process::id(), "{}", ctx());
        pids.push(f.pid);
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 3, "one process per replica\n{}", ctx());
    // The children did the proxies' work (CPU is counted in 10 ms ticks: the sum over the
    // run, not each child's share of the short initial phase).
    assert_eq!(r.fleet_cpu_s.len(), 3, "{}", ctx());
    assert!(r.fleet_cpu_s.iter().sum::<f64>() > 0.0, "{}", ctx());
    // Every change reached all 21 proxies, each through its replica's child.
    for c in [&r.endpoint_change, &r.vs_change] {
        assert!(c.samples.iter().all(|s| s.observed == 21), "{}", ctx());
    }
}
