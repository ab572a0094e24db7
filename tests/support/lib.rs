//! Test support for shoal's cross-process tests: free ports, and real processes (nats-server,
//! Envoy, the shoal binaries, tiny HTTP backends) that clean up after themselves.
//!
//! Every process is started on free ports with its own temporary directory, so tests run in
//! parallel; every process is killed when its handle drops, even when a test panics, and its
//! log is printed only when the test fails (or always with `SHOAL_TEST_LOGS=1`).
#![forbid(unsafe_code)]

pub mod backend;
pub mod bootstrap;
pub mod envoy;
pub mod eventually;
pub mod http;
pub mod mesh;
pub mod nats;
pub mod ports;
pub mod process;
pub mod shoal;

pub use backend::Backend;
pub use envoy::Envoy;
pub use eventually::eventually;
pub use nats::{NatsCluster, NatsServer};
pub use shoal::{ShoalIngester, ShoalServer};
