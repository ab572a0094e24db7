//! What a server knows: the mesh state read from the bus ([`store`]), the immutable
//! [`push_context::PushContext`] built from it with its config indexes
//! ([`destination_rule`], [`delegation`], [`peer_authentication`]), the endpoint shards
//! ([`endpoints`]), each proxy's scope ([`scope`]) and a connected proxy's description
//! ([`proxy`]).
//!
//! The bottom layer: nothing here imports [`crate::generate`], [`crate::push`],
//! [`crate::xds`] or [`crate::security`].

pub mod config;
pub mod delegation;
pub mod destination_rule;
pub mod endpoints;
pub mod gateway_api;
pub mod hosts;
pub mod mesh_config;
pub mod network;
pub mod peer_authentication;
pub mod proxy;
pub mod push_context;
pub mod scope;
pub mod service;
pub mod store;
pub mod tls_mode;

#[cfg(test)]
mod store_prop_tests;
#[cfg(test)]
mod store_tests;
