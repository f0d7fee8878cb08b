//! The `kleym` binary: one image, one binary, with a subcommand per role.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // Usage errors found after parsing: as clap reports its own, with exit code 2.
        Err(err) => match err.downcast_ref::<clap::Error>() {
            Some(usage) => usage.exit(),
            None => {
                eprintln!("kleym: {err:#}");
                ExitCode::FAILURE
            }
        },
    }
}
