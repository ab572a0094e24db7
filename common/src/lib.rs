//! shoal-common: the normalized mesh model, the KV key scheme, the wire envelope and the
//! state bus that connects the ingester tier to the server tier.
//!
//! This crate never depends on Kubernetes or gRPC crates: both tiers share it.
#![forbid(unsafe_code)]

pub mod admin;
pub mod bus;
pub mod credential;
pub mod defaults;
pub mod envelope;
pub mod gateway_api;
pub mod keys;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod ownership;
pub mod process;
pub mod secret;
pub mod synced;
pub mod time;
pub mod yaml;
pub mod yaml_depth;

pub use bus::{
    memory::MemoryBus, nats::NatsBus, Bucket, BusError, Entry, Op, StateBus, WatchEvent,
};
pub use envelope::{Envelope, EnvelopeError, SCHEMA_VERSION};

/// How many cases a property test runs: `PROPTEST_CASES` when set (to run many more), else
/// `default`, which is kept small so that the whole suite stays fast. For tests.
#[doc(hidden)]
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
