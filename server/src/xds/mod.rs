//! The xDS serving side: the ADS gRPC service and the registry of connected proxies.

pub mod ads;
pub mod registry;

pub use ads::AdsService;
pub use registry::{ConnectionStatus, Registry, TypeStatus};
