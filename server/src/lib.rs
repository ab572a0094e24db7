//! shoal-server: watches the state bus, keeps a PushContext and EDS shards, and serves
//! Envoy proxies over gRPC ADS.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod auth;
pub mod ca;
pub mod debug;
pub mod delegation;
pub mod destination_rule;
pub mod endpoints;
pub mod generate;
pub mod mesh_config;
pub mod metrics;
pub mod peer_authentication;
pub mod pipeline;
pub mod proxy;
pub mod push_context;
pub mod reload;
pub mod scope;
pub mod store;
pub mod view;
pub mod xds;

#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod store_prop_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod testutil;
