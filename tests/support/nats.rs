//! Real `nats-server` processes with JetStream: one server, or a three-node cluster.

use crate::eventually::try_eventually;
use crate::ports::free_port;
use crate::process::Process;
use std::time::Duration;
use tokio::process::Command;

const HINT: &str = "install nats-server (apt-get install nats-server) or run scripts/test.sh";
const STARTUP: Duration = Duration::from_secs(30);

/// One nats-server with JetStream, on a free port with its own store directory.
pub struct NatsServer {
    process: Process,
    port: u16,
    /// The JetStream store directory when it outlives the process ([`NatsServer::restartable`]).
    store: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Starts a single JetStream server and waits until JetStream answers.
    pub async fn start() -> NatsServer {
        // A free port can be taken between finding and binding it: try a few.
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("nats temp dir");
            let mut cmd = Command::new("nats-server");
            cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(dir.path().join("jetstream"));
            let process = Process::spawn(&format!("nats-{port}"), cmd, dir, HINT);
            let mut server = NatsServer {
                process,
                port,
                store: None,
            };
            match server.wait_jetstream().await {
                Ok(()) => return server,
                Err(e) => last = format!("{e}\n{}", server.process.log_tail()),
            }
        }
        panic!("nats-server did not start: {last}")
    }

    /// Starts a single JetStream server from a generated config file that also holds
    /// `extra` (e.g. a `tls { ... }` or `authorization { ... }` block), on a free port with
    /// its own store directory. Readiness is checked on the monitoring port's `/healthz`,
    /// so it needs no client credentials.
    pub async fn start_with_config(extra: &str) -> NatsServer {
        let mut last = String::new();
        for _ in 0..3 {
            let (port, monitor) = (free_port(), free_port());
            let dir = tempfile::tempdir().expect("nats temp dir");
            let config = format!(
                "listen: \"127.0.0.1:{port}\"\n\
                 http: \"127.0.0.1:{monitor}\"\n\
                 jetstream {{\n  store_dir: \"{store}\"\n}}\n{extra}\n",
                store = dir.path().join("jetstream").display(),
            );
            let config_path = dir.path().join("nats.conf");
            std::fs::write(&config_path, config).expect("writing nats config");
            let mut cmd = Command::new("nats-server");
            cmd.arg("-c").arg(&config_path);
            let process = Process::spawn(&format!("nats-{port}"), cmd, dir, HINT);
            let mut server = NatsServer {
                process,
                port,
                store: None,
            };
            match server.wait_healthz(monitor).await {
                Ok(()) => return server,
                Err(e) => last = format!("{e}\n{}", server.process.log_tail()),
            }
        }
        panic!("nats-server did not start: {last}")
    }

    /// Starts a single JetStream server whose store directory outlives the process, so that
    /// [`NatsServer::restart`] brings the same server back (same port, same streams).
    pub async fn restartable() -> NatsServer {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let store = tempfile::tempdir().expect("nats store dir");
            let mut server = NatsServer {
                process: spawn_on(port, store.path()),
                port,
                store: Some(store),
            };
            match server.wait_jetstream().await {
                Ok(()) => return server,
                Err(e) => last = format!("{e}\n{}", server.process.log_tail()),
            }
        }
        panic!("nats-server did not start: {last}")
    }

    /// Starts the server again on the same port with the same store, after [`NatsServer::kill`]
    /// (killing it first if it still runs), and waits until JetStream answers. Only for a
    /// server from [`NatsServer::restartable`].
    pub async fn restart(&mut self) {
        self.process.kill().await;
        let store = self
            .store
            .as_ref()
            .expect("restart needs NatsServer::restartable")
            .path()
            .to_path_buf();
        self.process = spawn_on(self.port, &store);
        if let Err(e) = self.wait_jetstream().await {
            panic!(
                "nats-server did not restart: {e}\n{}",
                self.process.log_tail()
            );
        }
    }

    /// Starts a three-node JetStream cluster (see [`NatsCluster`]).
    pub async fn cluster3() -> NatsCluster {
        NatsCluster::start(3).await
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process (for its log).
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Waits until the monitoring endpoint's `/healthz` (which covers JetStream) answers
    /// 200, failing early when the process exits.
    async fn wait_healthz(&mut self, monitor: u16) -> Result<(), String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], monitor));
        let process = &mut self.process;
        try_eventually(STARTUP, Duration::from_millis(50), || {
            let exited = process.exited();
            async move {
                if let Some(status) = exited {
                    return Ok(Err(format!("exited with {status}")));
                }
                match crate::http::get(addr, "/healthz").await {
                    Ok(r) if r.status == 200 => Ok(Ok(())),
                    Ok(r) => Err(format!("/healthz: {} {}", r.status, r.text())),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await?
    }

    /// Waits until this server's JetStream API answers without error (for a cluster node:
    /// a meta leader is elected), failing early when the process exits.
    async fn wait_jetstream(&mut self) -> Result<(), String> {
        let url = self.url();
        let process = &mut self.process;
        try_eventually(STARTUP, Duration::from_millis(50), || {
            let exited = process.exited();
            let url = url.clone();
            async move {
                if let Some(status) = exited {
                    // Not retried by waiting: fail the whole wait at once.
                    return Ok(Err(format!("exited with {status}")));
                }
                jetstream_ready(&url).await.map(Ok)
            }
        })
        .await?
    }
}

/// A JetStream nats-server on `port` storing under `store` (its log in a directory of its own).
fn spawn_on(port: u16, store: &std::path::Path) -> Process {
    let dir = tempfile::tempdir().expect("nats temp dir");
    let mut cmd = Command::new("nats-server");
    cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.join("jetstream"));
    Process::spawn(&format!("nats-{port}"), cmd, dir, HINT)
}

async fn jetstream_ready(url: &str) -> Result<(), String> {
    let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        client.request("$JS.API.INFO", bytes::Bytes::new()),
    )
    .await
    .map_err(|_| "no JetStream answer within 2 s".to_string())?
    .map_err(|e| e.to_string())?;
    let info: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
    match info.get("error") {
        Some(error) => Err(format!("JetStream not ready: {error}")),
        None => Ok(()),
    }
}

/// A JetStream cluster of nats-servers on free ports, configured through generated config
/// files (`server_name`, `jetstream { store_dir }`, a `cluster` block routing to every peer).
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    async fn start(size: usize) -> NatsCluster {
        let client_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let route_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        for i in 0..size {
            let dir = tempfile::tempdir().expect("nats temp dir");
            let routes: Vec<String> = route_ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| format!("\"nats-route://127.0.0.1:{p}\""))
                .collect();
            let config = format!(
                "server_name: n{i}\n\
                 listen: \"127.0.0.1:{client}\"\n\
                 jetstream {{\n  store_dir: \"{store}\"\n}}\n\
                 cluster {{\n  name: shoal-test\n  listen: \"127.0.0.1:{route}\"\n  routes: [{routes}]\n}}\n",
                client = client_ports[i],
                store = dir.path().join("jetstream").display(),
                route = route_ports[i],
                routes = routes.join(", "),
            );
            let config_path = dir.path().join("nats.conf");
            std::fs::write(&config_path, config).expect("writing nats config");
            let mut cmd = Command::new("nats-server");
            cmd.arg("-c").arg(&config_path);
            let process = Process::spawn(&format!("nats-n{i}"), cmd, dir, HINT);
            nodes.push(NatsServer {
                process,
                port: client_ports[i],
                store: None,
            });
        }
        for node in &mut nodes {
            if let Err(e) = node.wait_jetstream().await {
                panic!(
                    "nats cluster node {} not ready: {e}\n{}",
                    node.process.name(),
                    node.process.log_tail()
                );
            }
        }
        let cluster = NatsCluster { nodes };
        cluster.wait_placement(size).await;
        cluster
    }

    /// Waits until the JetStream meta group knows every peer: each node answering is not
    /// enough, a replicated stream created before the routes settle fails with "no
    /// suitable peers for placement" (seen on a loaded machine).
    async fn wait_placement(&self, replicas: usize) {
        use async_nats::jetstream::{self, stream};
        let url = self.nodes[0].url();
        let probe = || async {
            let client = async_nats::connect(&url).await.map_err(|e| e.to_string())?;
            let js = jetstream::new(client);
            js.create_stream(stream::Config {
                name: "shoal-placement-probe".into(),
                subjects: vec!["shoal.placement.probe".into()],
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
            js.delete_stream("shoal-placement-probe")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        };
        crate::eventually(Duration::from_secs(30), Duration::from_millis(250), probe).await;
    }

    /// Every node's client URL, comma-separated (what `NatsOptions::url` takes).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes.
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// Kills node `i`.
    pub async fn kill(&mut self, i: usize) {
        self.nodes[i].kill().await;
    }
}
