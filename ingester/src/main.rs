#![forbid(unsafe_code)]

use clap::Parser;
use shoal_ingester::IngesterArgs;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let args = IngesterArgs::parse();
    match shoal_ingester::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let message = shoal_common::process::error_message(error.as_ref());
            eprintln!("shoal-ingester: {message}");
            ExitCode::FAILURE
        }
    }
}
