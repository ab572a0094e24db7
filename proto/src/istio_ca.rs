//! Istio's certificate API (`istio.v1.auth.IstioCertificateService`, `security/proto/pb/ca.proto`),
//! what istio-agent calls to get its workload certificate. Written by hand: two messages.

use envoy_types::pb::google::protobuf::Struct;

/// The gRPC path of `CreateCertificate`.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// A certificate signing request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded certificate request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested validity in seconds (0: the CA's default).
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Options, e.g. `ImpersonatedIdentity`.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<Struct>,
}

/// The signed chain: the certificate first, the root last, one PEM certificate each.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    /// PEM-encoded certificates.
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}
