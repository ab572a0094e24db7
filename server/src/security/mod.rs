//! Who may ask for what: proxy authentication and authorization ([`auth`]), the workload CA
//! ([`ca`]), the secure port's TLS ([`tls`]) and its serving certificate issued from the CA
//! ([`serving_cert`]), and files reloaded without a restart ([`reload`]).
//!
//! Imports only [`crate::index`] (a proxy's description); the streams in [`crate::xds`]
//! call it.

pub mod auth;
pub mod ca;
pub mod jwks;
pub mod metrics;
pub mod reload;
pub mod serving_cert;
pub mod tls;
