//! The load benchmark (`shoal-bench`, tests/bench/) in a tiny configuration, as a CI check
//! that it still works end to end: real nats-server, ingester and two server replicas,
//! simulated proxies in both ADS modes. Only functional outcomes are asserted — every proxy
//! configured, every change received by every affected proxy and no other, nothing resent
//! on a delta move to the second replica — never timings.
//!
//! Needs the binaries: `cargo build --workspace --bins` first (scripts/test.sh does).
#![forbid(unsafe_code)]

use shoal_tests::bench::client::Mode;
use shoal_tests::bench::report::Report;
use shoal_tests::bench::{self, BenchConfig, VsChange};
use std::time::Duration;

fn smoke(mode: Mode, sidecar_isolation: bool, vs_change: VsChange) -> BenchConfig {
    BenchConfig {
        proxies: 20,
        namespaces: 4,
        services: 20,
        endpoints: 3,
        sidecar_isolation,
        mode,
        replicas: 2,
        changes: 2,
        vs_change,
        timeout: Duration::from_secs(240),
        phase_timeout: Duration::from_secs(60),
        connect_concurrency: 8,
        bin_dir: Some(shoal_tests::shoal::bin_dir()),
        server_args: Vec::new(),
        progress: true,
    }
}

async fn run(cfg: BenchConfig) -> Report {
    match bench::run(&cfg).await {
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
    assert!(r.processes_ok, "{}", ctx());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_isolated() {
    let cfg = smoke(Mode::Delta, true, VsChange::Mesh);
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
    let cfg = smoke(Mode::Sotw, false, VsChange::Namespace);
    let r = run(cfg.clone()).await;
    assert_functional(&r, &cfg);
    assert_eq!(r.endpoint_change.samples[0].affected, cfg.proxies);
}
