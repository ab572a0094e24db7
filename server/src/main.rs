#![forbid(unsafe_code)]

use clap::Parser;

/// mimalloc instead of the system allocator: pushes allocate and free large response
/// buffers on many threads, and glibc's per-thread arenas keep freed memory resident
/// (see docs/benchmarks.md, server RSS per proxy).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let args = shoal_server::app::ServerArgs::parse();
    if let Err(error) = shoal_server::app::run(args).await {
        let message = shoal_common::process::error_message(error.as_ref());
        eprintln!("shoal-server: {message}");
        std::process::exit(1);
    }
}
