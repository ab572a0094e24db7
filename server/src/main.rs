#![forbid(unsafe_code)]

use clap::Parser;
use std::time::Duration;

/// mimalloc instead of the system allocator: pushes allocate and free large response
/// buffers on many threads, and glibc's per-thread arenas keep freed memory resident
/// (see docs/benchmarks.md, server RSS per proxy).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long an idle blocking-pool thread lives: as long as the process. Generation runs
/// there (`push::view::Generation`, one task per core at most), and the outputs it builds
/// outlive the task. With tokio's default (10 s), generation threads exited between
/// bursts; mimalloc abandons an exited thread's segments, whose freed space is neither
/// reused soon nor returned, and the server's RSS grew a quarter over a 30-minute soak
/// (docs/benchmarks.md). Threads that stay keep their heaps in use.
const BLOCKING_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(365 * 24 * 3600);

fn main() {
    let args = shoal_server::app::ServerArgs::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("shoal-server: cannot start the async runtime: {error}");
            std::process::exit(1);
        }
    };
    if let Err(error) = runtime.block_on(shoal_server::app::run(args)) {
        let message = shoal_common::process::error_message(error.as_ref());
        eprintln!("shoal-server: {message}");
        std::process::exit(1);
    }
}
