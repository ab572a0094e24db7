//! shoal-server: watches the state bus, keeps a PushContext and EDS shards, and serves
//! Envoy proxies over gRPC ADS.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod debug;
pub mod generate;
pub mod hashing;
pub mod index;
pub mod metrics;
pub mod push;
pub mod security;
pub mod xds;

#[cfg(test)]
mod testutil;
