//! The `kleym` binary: one image, one binary, with a subcommand per role.

mod cli;

/// jemalloc, not the platform's malloc: the hub keeps millions of small objects (every
/// spoke's caches), and glibc's per-allocation header and the room it keeps after frees
/// added about 40 % to its live heap (docs/benchmarks.md, "What moved the numbers").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // First, before any thread exists: as the container's PID 1, fork an init that reaps
    // orphaned processes (a killed plugin's children) and run kleym in the child.
    if let Some(code) = kleym_hub::init::init_if_pid1() {
        return code;
    }
    // Before any client is built: every TLS client then offers AES-128-GCM first, as
    // client-go does (see the module).
    kleym_hub::credentials::transport::crypto::install_client_crypto_provider();
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
