//! Where objects come from. Each source reads objects, admits them ([`crate::admit`]),
//! computes its desired bus state ([`crate::desired`]) in the namespaces the discovery
//! selectors select, and publishes it ([`crate::publish`]).
//!
//! - [`file`](mod@file): a directory of YAML/JSON manifests, polled (`--source file:DIR`,
//!   and the server's standalone mode).
//! - [`kubernetes`]: Kubernetes clusters, watched (`--source kube`): the config cluster,
//!   the remote clusters of the fleet's multicluster Secrets, Istio CRDs.
//! - [`mesh_config`]: the MeshConfig file whose `discoverySelectors` both sources follow.

pub mod file;
pub mod kubernetes;
pub mod mesh_config;
