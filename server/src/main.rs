#![forbid(unsafe_code)]

use clap::Parser;

#[tokio::main]
async fn main() {
    let args = shoal_server::app::ServerArgs::parse();
    if let Err(error) = shoal_server::app::run(args).await {
        eprintln!("shoal-server: {error:#}");
        std::process::exit(1);
    }
}
