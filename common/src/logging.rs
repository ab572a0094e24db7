//! Logging setup shared by the binaries.

use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber. `filter` uses `RUST_LOG` syntax
/// (e.g. `info,shoal_server=debug`); `json` selects JSON lines instead of text.
pub fn init(filter: &str, json: bool) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("invalid log filter {filter:?} ({e}); using \"info\"");
        EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    if let Err(e) = result {
        eprintln!("logging already initialised: {e}");
    }
}
