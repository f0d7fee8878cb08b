//! `kubesim`: run simulated Kubernetes API servers until SIGTERM/SIGINT (see `--help`).

use clap::Parser;
use kubesim::cli::Args;
use kubesim::{Kubesim, KubesimOptions, load_crds};
use std::io::Write;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubesim: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.validate()?;
    let mut crds = Vec::new();
    for p in &args.crds {
        crds.extend(load_crds(p)?);
    }
    let options = KubesimOptions {
        crds,
        client_certs: !args.no_client_certs,
        ..Default::default()
    };
    let names: Vec<&str> = args.clusters.iter().map(String::as_str).collect();
    let sim = Kubesim::start(&names, options).await?;
    sim.write_state_dir(&args.state_dir)?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    wait_for_signal().await?;
    sim.shutdown();
    Ok(())
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
