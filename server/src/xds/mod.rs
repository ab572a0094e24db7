//! The xDS serving side: the ADS gRPC service (SotW and delta on one port) and the registry
//! of connected proxies.

pub mod ads;
mod delta;
#[cfg(test)]
mod fuzz_tests;
mod gather;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod registry;
mod session;
mod sotw;
mod stream;
mod subscription;
#[cfg(test)]
mod subscription_cost_tests;
#[cfg(test)]
mod tests;
pub mod wire;

pub use ads::{AdsServer, AdsService};
pub use gather::{WriteShape, DEFAULT_WRITE_GATHER};
pub use registry::{Connection, ConnectionStatus, Registry, TypeStatus};
pub use session::Mode;
