//! The `kleym` binary: one image, one binary, with a subcommand per role.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kleym: {err:#}");
            ExitCode::FAILURE
        }
    }
}
