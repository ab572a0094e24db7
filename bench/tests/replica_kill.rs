//! A server replica killed (SIGKILL) under many delta proxies (docs/reliability.md,
//! "Server faults"): 400 simulated delta proxies spread over two replicas, one replica
//! killed: all of its proxies reconnect to the survivor and resume with nothing resent.
//!
//! It drives the benchmark's load generator, so it lives in the benchmark's crate rather
//! than in tests/tests/server_faults.rs with the rest of the server fault matrix: the tests
//! crate cannot depend on this one (this one depends on it).
//!
//! Needs the binaries: `cargo build --workspace --bins` first (scripts/test.sh does).
#![forbid(unsafe_code)]

use shoal_bench::client::Mode;
use shoal_bench::manifests::ScenarioKind;
use shoal_bench::{BenchConfig, VsChange};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_kill_with_many_delta_proxies() {
    let cfg = BenchConfig {
        proxies: 400,
        namespaces: 4,
        services: 20,
        endpoints: 3,
        scenario: ScenarioKind::Flat,
        mode: Mode::Delta,
        replicas: 2,
        changes: 1,
        vs_change: VsChange::Mesh,
        timeout: Duration::from_secs(300),
        phase_timeout: Duration::from_secs(120),
        connect_concurrency: 16,
        bin_dir: Some(shoal_tests::shoal::bin_dir()),
        server_args: Vec::new(),
        spread: true,
        ..BenchConfig::default()
    };
    let r = match shoal_bench::run(&cfg).await {
        Ok(r) => r,
        Err(e) => panic!("the benchmark failed: {e:#}"),
    };
    let ctx = || serde_json::to_string_pretty(&r).unwrap_or_default();
    let mv = r.replica_move.as_ref().expect("two replicas: the move ran");
    eprintln!(
        "MEASURED replica kill: {} proxies on the killed replica, {} on the survivor; {} \
         reconnected and reconfigured in {:.2} s; held {}, resent {}, survivor resumed {}",
        mv.expected,
        mv.already_on_b,
        mv.reconfigured,
        mv.all_reconfigured_s,
        mv.held,
        mv.resent,
        mv.server_resumed
    );
    assert_eq!(r.initial.per_proxy_ms.n, cfg.proxies, "{}", ctx());
    assert_eq!(mv.expected, cfg.proxies / 2, "spread over both\n{}", ctx());
    assert_eq!(mv.already_on_b, cfg.proxies / 2, "{}", ctx());
    assert_eq!(mv.reconfigured, mv.expected, "all moved\n{}", ctx());
    assert!(mv.held > 0, "{}", ctx());
    assert_eq!(mv.resent, 0, "nothing already held is resent\n{}", ctx());
    assert!(mv.server_resumed > 0.0, "{}", ctx());
    assert_eq!(r.nacks, 0, "{}", ctx());
    assert_eq!(r.bad_responses, 0, "{}", ctx());
    assert!(r.processes_ok, "{}", ctx());
}
