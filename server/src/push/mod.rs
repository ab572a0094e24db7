//! The push path: the [`pipeline`] turns bus changes into published snapshots, [`impact`]
//! says which proxies and types a change can affect, and [`view`]s share one generation
//! among every proxy with the same inputs.
//!
//! Imports [`crate::index`] and [`crate::generate`]; never [`crate::xds`].

pub mod chunks;
pub mod impact;
pub mod metrics;
pub mod pipeline;
pub mod view;

#[cfg(test)]
mod pipeline_tests;
