//! `Gateway`: servers (ports, hosts, bind) selected by gateway proxy labels.

use super::*;

/// `Gateway` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Gateway {
    /// Labels of the gateway proxies this gateway applies to.
    pub selector: BTreeMap<String, String>,
    /// The servers (listeners) of the gateway.
    pub servers: Vec<GatewayServer>,
    /// Translated from a Gateway API Gateway (never read from input, never on the bus): it
    /// applies only to gateway proxies of its own namespace, as istiod scopes them.
    #[serde(skip)]
    pub namespace_scoped: bool,
}

/// One `Server` of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayServer {
    /// The port the proxy listens on.
    pub port: Port,
    /// The bind address (defaults to `0.0.0.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// Hosts exposed by this server (`ns/host` or `host`).
    pub hosts: Vec<String>,
    /// The server's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// TLS settings: `httpsRedirect` on plain HTTP servers; the TLS modes that terminate or
    /// pass TLS through (only what shoal implements is accepted at ingest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
}

/// A Gateway server's `tls` block (the subset shoal models).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerTlsSettings {
    /// Redirect plain HTTP requests to HTTPS (301).
    pub https_redirect: bool,
    /// `PASSTHROUGH`, `SIMPLE`, `MUTUAL`, `AUTO_PASSTHROUGH`, `ISTIO_MUTUAL`,
    /// `OPTIONAL_MUTUAL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The Secret (in the gateway proxy's namespace) holding the server certificate and key
    /// for `SIMPLE` and `MUTUAL`; its CA bundle (`ca.crt`, or the Secret
    /// `<credentialName>-cacert`) validates client certificates under `MUTUAL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
}

/// A port description (`Port` in Istio's API).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Port {
    /// Port number.
    pub number: u32,
    /// Protocol: HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP, TLS.
    pub protocol: String,
    /// Label of the port.
    pub name: String,
    /// The port on the workload, where it differs (ServiceEntry ports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}
