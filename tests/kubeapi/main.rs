//! `shoal-kubeapi`: the Kubernetes API test server (`shoal_tests::kubeapi`) as a process, for
//! tests outside Rust: the Helm chart tests render the chart against it, so that the
//! chart's `lookup` calls meet a real API protocol. Prints its kubeconfig on stdout, then
//! serves until killed. Objects are created through its HTTP API (POST), as with a cluster.
#![forbid(unsafe_code)]

use shoal_tests::kubeapi::KubeApiServer;
use std::io::Write;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let server = KubeApiServer::builder().name("kubeapi").start().await;
    let mut stdout = std::io::stdout().lock();
    // The kubeconfig, then an empty line: the caller reads up to it.
    let written = writeln!(stdout, "{}\n", server.kubeconfig()).and_then(|()| stdout.flush());
    if let Err(error) = written {
        eprintln!("shoal-kubeapi: cannot write the kubeconfig: {error}");
        std::process::exit(1);
    }
    drop(stdout);
    std::future::pending::<()>().await;
}
