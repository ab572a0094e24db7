//! Test support for shoal's cross-process tests: free ports, and real processes (nats-server,
//! Envoy, the shoal binaries, tiny HTTP backends) that clean up after themselves.
//!
//! Every process is started on free ports with its own temporary directory, so tests run in
//! parallel; every process is killed when its handle drops, even when a test panics, and its
//! log is printed only when the test fails (or always with `SHOAL_TEST_LOGS=1`).
//!
//! Running: `cargo build --workspace --bins` (the tests run the shoal binaries, which cargo
//! does not build for another package's tests), then `cargo test -p shoal-tests`; or
//! `bash scripts/test.sh`, which also installs nats-server and Envoy when missing.
//!
//! Environment: `SHOAL_BIN_DIR` (where the shoal binaries are; default: next to the test
//! executable's `deps/`), `SHOAL_TEST_LOGS=1` (print every process log), and
//! `SHOAL_ENVOY_LOG_LEVEL` (Envoy's `-l`, default `warning`). When a test fails, each Envoy's
//! config dump is saved under `$TMPDIR/shoal-test-failures/` and each server's
//! `/debug/syncz` is printed.
//!
//! [`netns`] runs pods as Linux network namespaces with Istio's iptables capture and an
//! Envoy sidecar as uid 1337 (`scripts/mesh-netns.sh`, `tests/tests/netns_capture.rs`); it
//! needs root and iptables, and its tests fail without them unless `SHOAL_SKIP_NETNS=1`. The
//! pods run `shoal-testapp` (`tests/app/`).
//!
//! [`agent`] runs `shoal-test-agent` (`tests/agent/`), istio-agent's stand-in: it gets a
//! workload certificate from shoal's CA and serves it to Envoy over SDS on a Unix socket.
//!
//! The load benchmark, which uses this harness, is a crate of its own: `shoal-bench`
//! (`bench/`, docs/benchmarks.md).
#![forbid(unsafe_code)]

pub mod agent;
pub mod backend;
pub mod bootstrap;
pub mod envoy;
pub mod eventually;
pub mod grpc_xds;
pub mod http;
pub mod kubeapi;
pub mod mesh;
pub mod nats;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod process;
pub mod sds;
pub mod shoal;

pub use backend::Backend;
pub use envoy::Envoy;
pub use eventually::eventually;
pub use nats::{NatsCluster, NatsServer};
pub use netns::{MeshNet, Pod};
pub use shoal::{ShoalIngester, ShoalServer};
