//! `shoal-test-agent` (tests/agent/), istio-agent's stand-in, as a child process: it gets the
//! pod's workload certificate from shoal's CA and serves it to Envoy over SDS on a Unix
//! socket in its own temporary directory ([`Agent::socket`], for
//! [`crate::bootstrap::with_sds`]).
//!
//! In a pod it runs as uid/gid 1337 like istio-agent, so the socket belongs to Envoy's user;
//! on the host it runs as the test's user.

use crate::netns::{self, Pod};
use crate::pki::Pem;
use crate::process::Process;
use crate::shoal::binary;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::Command;

/// How long the first certificate may take.
const FIRST_CERTIFICATE: Duration = Duration::from_secs(20);
const HINT: &str = "build it: cargo build -p shoal-tests --bins";
/// What the agent logs for each certificate it receives.
const ISSUED: &str = "certificate issued for ";

/// How the agent authenticates to the CA.
#[derive(Clone)]
pub enum Credential {
    /// A service-account token (the content of `--token-file`).
    Token(String),
    /// A client certificate and key.
    Certificate(Pem),
}

/// What an agent is started with.
#[derive(Clone)]
pub struct AgentConfig {
    /// shoal's TLS port.
    pub ca: SocketAddr,
    /// The CA certificate (PEM) of the TLS port's serving certificate.
    pub ca_cert_pem: String,
    /// The credential.
    pub credential: Credential,
    /// `--ttl` (e.g. `1h`, `4s`); `None`: the agent's default (24 h).
    pub ttl: Option<String>,
    /// `--identity`: the SPIFFE ID the CSR asks for.
    pub identity: Option<String>,
    /// `--cluster-id`; `None`: the agent's default (`Kubernetes`).
    pub cluster_id: Option<String>,
}

impl AgentConfig {
    /// An agent authenticating with `credential` to the CA at `ca`, whose serving certificate
    /// (issued for `localhost`: [`crate::pki::ServerPki`]) chains to `ca_cert_pem`.
    pub fn new(ca: SocketAddr, ca_cert_pem: &str, credential: Credential) -> AgentConfig {
        AgentConfig {
            ca,
            ca_cert_pem: ca_cert_pem.to_string(),
            credential,
            ttl: None,
            identity: None,
            cluster_id: None,
        }
    }

    /// Writes the agent's files into `dir` and returns its arguments.
    fn args(&self, dir: &Path) -> Vec<String> {
        let path = |name: &str| dir.join(name).display().to_string();
        std::fs::write(dir.join("ca.crt"), &self.ca_cert_pem).expect("writing the CA");
        let mut args = vec![
            "--ca-addr".to_string(),
            self.ca.to_string(),
            "--ca-server-name".into(),
            "localhost".into(),
            "--ca-cert".into(),
            path("ca.crt"),
            "--sds-socket".into(),
            path("socket"),
        ];
        match &self.credential {
            Credential::Token(token) => {
                std::fs::write(dir.join("token"), token).expect("writing the token");
                args.extend(["--token-file".into(), path("token")]);
            }
            Credential::Certificate(pem) => {
                pem.write(dir, "client");
                args.extend([
                    "--cert".into(),
                    path("client.crt"),
                    "--key".into(),
                    path("client.key"),
                ]);
            }
        }
        for (flag, value) in [
            ("--ttl", &self.ttl),
            ("--identity", &self.identity),
            ("--cluster-id", &self.cluster_id),
        ] {
            if let Some(v) = value {
                args.extend([flag.to_string(), v.clone()]);
            }
        }
        args
    }
}

/// A running agent; killed on drop, its log printed when the test fails.
pub struct Agent {
    process: Process,
    socket: PathBuf,
}

impl Agent {
    /// Starts the agent in `pod` as uid/gid 1337 and waits for its first certificate.
    pub async fn start_in_pod(pod: &Pod, config: &AgentConfig) -> Agent {
        let dir = tempfile::tempdir().expect("agent temp dir");
        let args = config.args(dir.path());
        // uid 1337 reads its files and creates the socket here.
        netns::share_dir(dir.path()).expect("making the agent's files readable");
        std::os::unix::fs::chown(dir.path(), Some(netns::PROXY_UID), Some(netns::PROXY_UID))
            .expect("giving the agent's directory to uid 1337");
        let program = netns::readable_by_all(&binary("shoal-test-agent"));
        let mut cmd = pod.command_as(netns::PROXY_UID, netns::PROXY_UID, program);
        cmd.args(args);
        Agent::spawn(&format!("agent-{}", pod.name()), cmd, dir).await
    }

    /// Starts the agent on the host and waits for its first certificate.
    pub async fn start(config: &AgentConfig) -> Agent {
        let dir = tempfile::tempdir().expect("agent temp dir");
        let mut cmd = Command::new(binary("shoal-test-agent"));
        cmd.args(config.args(dir.path()));
        Agent::spawn("agent", cmd, dir).await
    }

    /// Runs the agent on the host until it exits (for requests the CA refuses): its exit
    /// status and log.
    pub async fn run_to_exit(config: &AgentConfig) -> (ExitStatus, String) {
        let dir = tempfile::tempdir().expect("agent temp dir");
        let mut cmd = Command::new(binary("shoal-test-agent"));
        cmd.args(config.args(dir.path()));
        let mut process = Process::spawn("agent", cmd, dir, HINT);
        let deadline = tokio::time::Instant::now() + FIRST_CERTIFICATE;
        loop {
            if let Some(status) = process.exited() {
                return (status, process.log());
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "the agent still runs after {FIRST_CERTIFICATE:?}:\n{}",
                    process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn spawn(name: &str, cmd: Command, dir: tempfile::TempDir) -> Agent {
        let socket = dir.path().join("socket");
        let process = Process::spawn(name, cmd, dir, HINT);
        let mut agent = Agent { process, socket };
        agent.wait_issued(1, FIRST_CERTIFICATE).await;
        let deadline = tokio::time::Instant::now() + FIRST_CERTIFICATE;
        while !agent.process.log().contains("serving SDS on ") {
            agent.process.assert_running();
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} does not serve SDS:\n{}",
                agent.process.name(),
                agent.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        agent
    }

    /// The SDS socket (for [`crate::bootstrap::with_sds`]).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The URI SANs of the certificates issued so far, in order (one per SAN).
    pub fn issued(&self) -> Vec<String> {
        issued_sans(&self.process.log())
    }

    /// Waits until `count` certificates were issued; panics with the log if the agent exits
    /// or `timeout` passes.
    pub async fn wait_issued(&mut self, count: usize, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.issued().len() < count {
            self.process.assert_running();
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{}: {} of {count} certificates issued after {timeout:?}:\n{}",
                    self.process.name(),
                    self.issued().len(),
                    self.process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process (for its log).
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }
}

/// The SANs of the agent's `certificate issued for <SAN>` log lines.
fn issued_sans(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split_once(ISSUED))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_issued_identities_from_the_log() {
        let log = "2026-11-24T10:00:00Z  INFO shoal_test_agent: certificate issued for spiffe://cluster.local/ns/a/sa/b san=spiffe://cluster.local/ns/a/sa/b\n\
                   2026-11-24T10:00:01Z  INFO shoal_test_agent: serving SDS on /tmp/x/socket\n";
        assert_eq!(issued_sans(log), ["spiffe://cluster.local/ns/a/sa/b"]);
    }
}
