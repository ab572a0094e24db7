//! `shoal-replay`: the replay baseline of `shoal-bench` (see docs/benchmarks.md): a minimal
//! ADS server that answers proxies with resources recorded from shoal-server, encoded once
//! at start, without generating anything. Started by the benchmark; not for other use.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use shoal_bench::replay::{self, Recording, Replay};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::net::TcpListener;

/// mimalloc, as shoal-server: the baseline compares the work done, not the allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Replays recorded xDS resources to proxies, per proxy class (namespace, label `app`,
/// interception mode); serves `/ready` and `/metrics` on the admin address.
#[derive(Debug, Parser)]
#[command(name = "shoal-replay", version)]
struct Args {
    /// The recording written by shoal-bench.
    #[arg(long, value_name = "FILE")]
    recording: PathBuf,

    /// Address to serve ADS on.
    #[arg(long, value_name = "ADDR")]
    xds_addr: SocketAddr,

    /// Address to serve /ready and /metrics on.
    #[arg(long, value_name = "ADDR")]
    admin_addr: SocketAddr,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal-replay: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shoal-replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let replay = Arc::new(Replay::new(Recording::read(&args.recording)?)?);
    let xds = TcpListener::bind(args.xds_addr)
        .await
        .with_context(|| format!("binding the xDS address {}", args.xds_addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding the admin address {}", args.admin_addr))?;
    eprintln!(
        "shoal-replay: {} proxy classes, {} distinct resources; ADS on {}, admin on {}",
        replay.classes(),
        replay.resources(),
        args.xds_addr,
        args.admin_addr
    );
    tokio::spawn(replay::serve_admin(replay.clone(), admin));
    replay::serve(replay, xds).await;
    Ok(())
}
