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
            // Error messages here embed their cause already; print each cause only once.
            let mut message = error.to_string();
            for cause in error.chain().skip(1) {
                let cause = cause.to_string();
                if !message.contains(&cause) {
                    message = format!("{message}: {cause}");
                }
            }
            eprintln!("shoal-ingester: {message}");
            ExitCode::FAILURE
        }
    }
}
