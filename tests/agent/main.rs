//! `shoal-test-agent`: the certificate half of istio-agent, for the mesh-security tests.
//!
//! It authenticates to shoal's TLS port (istiod's 15012) with the pod's service-account
//! token (`authorization: Bearer`, `clusterid`, as istio-agent sends them) or with a client
//! certificate, generates a P-256 key and a CSR, calls `CreateCertificate`
//! (`istio.v1.auth.IstioCertificateService`) and serves the result to Envoy over SDS on a
//! Unix socket, as istio-agent does (`./var/run/secrets/workload-spiffe-uds/socket`):
//! `default` is the workload certificate (chain and key), `ROOTCA` the mesh root. At half of
//! the certificate's life it gets a new one with a new key and pushes it to Envoy.
//!
//! Log lines the test harness waits for (tests/support/agent.rs): `certificate issued for
//! <SAN>` after each issuance and `serving SDS on <path>` once Envoy can connect. When the
//! CA refuses the first request the agent prints the gRPC status and exits with 1.
#![forbid(unsafe_code)]

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use shoal_proto::istio_ca::{
    IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE_PATH,
};
use shoal_tests::pki::{self, Pem};
use shoal_tests::sds;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// istio-agent's certificate half: CreateCertificate from shoal, SDS to Envoy.
#[derive(Debug, Parser)]
#[command(name = "shoal-test-agent")]
#[command(group(clap::ArgGroup::new("credential").required(true).args(["token_file", "cert"])))]
struct Args {
    /// The CA: shoal's TLS xDS port (`--xds-tls-addr`).
    #[arg(long, value_name = "IP:PORT")]
    ca_addr: SocketAddr,
    /// The name the CA's serving certificate is verified for.
    #[arg(long, default_value = "istiod.istio-system.svc", value_name = "NAME")]
    ca_server_name: String,
    /// PEM file of the CA that issued the TLS port's serving certificate.
    #[arg(long, value_name = "FILE")]
    ca_cert: PathBuf,
    /// The pod's service-account token (audience `istio-ca`), read again at every request.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The `clusterid` header sent with the token.
    #[arg(long, default_value = "Kubernetes", value_name = "ID")]
    cluster_id: String,
    /// A client certificate (PEM) to authenticate with instead of a token.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// The validity asked for (`90s`, `10m`, `24h`, `2d`, or seconds); renewed at half.
    #[arg(long, default_value = "24h", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// The SPIFFE ID written into the CSR (istio-agent writes the pod's own). The CA
    /// certifies the caller's identity whatever this says.
    #[arg(long, value_name = "URI")]
    identity: Option<String>,
    /// The Unix socket to serve SDS on (replaced if it exists).
    #[arg(long, value_name = "PATH")]
    sds_socket: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("shoal-test-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let ca = CaClient::connect(&args).await?;
    // Envoy gets nothing before the first certificate: SDS starts once it is in.
    let first = ca.issue().await?;
    let (tx, rx) = watch::channel(Arc::new(first));
    let server = sds::serve(&args.sds_socket, rx).await?;
    info!(socket = %args.sds_socket.display(), "serving SDS on {}", args.sds_socket.display());
    tokio::select! {
        result = server => result.context("the SDS server stopped"),
        () = rotate(&ca, tx) => Ok(()),
    }
}

/// Renews the certificate at half its remaining life, forever; a failed renewal keeps the
/// current certificate and is retried.
async fn rotate(ca: &CaClient, tx: watch::Sender<Arc<sds::Secrets>>) {
    let mut next = tx.borrow().renew_in();
    loop {
        tokio::time::sleep(next).await;
        match ca.issue().await {
            Ok(secrets) => {
                next = secrets.renew_in();
                tx.send_replace(Arc::new(secrets));
            }
            Err(e) => {
                next = tx.borrow().renew_in().max(Duration::from_secs(1));
                warn!(error = %format!("{e:#}"), retry_in = ?next, "certificate renewal failed; keeping the current certificate");
            }
        }
    }
}

/// How the agent authenticates to the CA.
enum Credential {
    /// A token file, read at every request (projected tokens rotate).
    Token { file: PathBuf, cluster_id: String },
    /// A client certificate (presented in the TLS handshake).
    Certificate,
}

/// A client of shoal's `CreateCertificate`.
struct CaClient {
    channel: tonic::transport::Channel,
    credential: Credential,
    ttl: Duration,
    identity: Option<String>,
    issued: std::sync::atomic::AtomicU64,
}

impl CaClient {
    async fn connect(args: &Args) -> anyhow::Result<CaClient> {
        let ca_pem = read(&args.ca_cert)?;
        let client = match (&args.cert, &args.key) {
            (Some(cert), Some(key)) => Some(Pem {
                cert: read(cert)?,
                key: read(key)?,
            }),
            _ => None,
        };
        let config = pki::try_client_config(&ca_pem, client.as_ref())
            .with_context(|| format!("TLS configuration (--ca-cert {})", args.ca_cert.display()))?;
        let channel = pki::tls_channel_to(args.ca_addr, &args.ca_server_name, config)
            .await
            .with_context(|| format!("connecting to the CA at {}", args.ca_addr))?;
        let credential = match &args.token_file {
            Some(file) => Credential::Token {
                file: file.clone(),
                cluster_id: args.cluster_id.clone(),
            },
            None => Credential::Certificate,
        };
        Ok(CaClient {
            channel,
            credential,
            ttl: args.ttl,
            identity: args.identity.clone(),
            issued: 0.into(),
        })
    }

    /// A new key, a CSR, `CreateCertificate`: the secrets to serve.
    async fn issue(&self) -> anyhow::Result<sds::Secrets> {
        let key = rcgen::KeyPair::generate().context("generating a P-256 key")?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        if let Some(id) = &self.identity {
            let uri = id
                .clone()
                .try_into()
                .map_err(|e| anyhow!("--identity {id}: {e}"))?;
            params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
        }
        let csr = params
            .serialize_request(&key)
            .and_then(|csr| csr.pem())
            .context("building the CSR")?;
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: self.ttl.as_secs() as i64,
            metadata: None,
        });
        if let Credential::Token { file, cluster_id } = &self.credential {
            let token = read(file)?;
            let metadata = request.metadata_mut();
            let bearer = format!("Bearer {}", token.trim());
            metadata.insert(
                "authorization",
                bearer.parse().context("the token is not a valid header")?,
            );
            metadata.insert(
                "clusterid",
                cluster_id
                    .parse()
                    .context("--cluster-id is not a valid header")?,
            );
        }
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.context("the CA connection")?;
        let codec =
            tonic_prost::ProstCodec::<IstioCertificateRequest, IstioCertificateResponse>::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE_PATH);
        let response = grpc.unary(request, path, codec).await.map_err(|status| {
            anyhow!(
                "the CA refused the certificate request: status {:?}: {}",
                status.code(),
                status.message()
            )
        })?;
        let chain = response.into_inner().cert_chain;
        let issuance = self
            .issued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let secrets = sds::Secrets::from_chain(chain, key.serialize_pem(), issuance)?;
        let expires_in = secrets
            .not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        for san in &secrets.sans {
            info!(
                %san, serial = %secrets.serial, version = %secrets.version, ?expires_in,
                "certificate issued for {san}"
            );
        }
        if let Some(asked) = &self.identity {
            if !secrets.sans.contains(asked) {
                warn!(asked = %asked, issued = ?secrets.sans, "the CA certified another identity than the CSR asked for (it certifies the caller)");
            }
        }
        Ok(secrets)
    }
}

fn read(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `90s`, `10m`, `24h`, `2d`, or a number of seconds.
fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| anyhow!("{s:?} is not a duration (90s, 10m, 24h, 2d)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        other => bail!("{s:?}: unknown unit {other:?} (s, m, h, d)"),
    };
    if secs == 0 {
        bail!("{s:?}: the validity must be positive");
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172800));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
