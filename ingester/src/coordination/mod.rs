//! Coordination of the replicas and fleets that write the bus.
//!
//! - [`lease`]: leader election between the replicas of one fleet; only the leader writes,
//!   stamping its lease epoch ([`lease::Leadership`] is what every writer checks).
//! - [`ownership`]: which fleet publishes which cluster (owner records in `shoal-meta`).
//! - [`readiness`]: when the ingester is ready, and the fleet's sync marker the servers
//!   wait for (`--expect-fleets`).
//! - [`bus_guard`]: heals a bus that lost its data.
//! - [`metrics`]: their metrics.

pub mod bus_guard;
pub mod lease;
pub mod metrics;
pub mod ownership;
pub mod readiness;
