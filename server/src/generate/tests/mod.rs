//! Generator tests: build a mesh, generate for a proxy, decode the resources and check them
//! against Istio's behaviour.

mod ambient;
mod authz;
mod authz_fail_closed;
mod captured;
mod cds;
mod delegate;
mod destination_rule;
mod determinism;
mod eds;
mod entries;
mod gateway_credentials;
mod gateway_semantics;
mod golden;
mod grpc;
mod hbone;
mod http_features;
mod lds;
mod locality;
mod mtls;
mod network;
mod rds_gateway;
mod rds_sidecar;
mod telemetry;
