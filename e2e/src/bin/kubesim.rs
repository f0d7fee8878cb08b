//! `kubesim`: run simulated Kubernetes API servers until SIGTERM/SIGINT (see `--help`).

use clap::Parser;
use kleym_e2e::kubesim::cli::Args;
use kleym_e2e::kubesim::{Kubesim, KubesimOptions, load_crds};
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
    std::fs::create_dir_all(&args.state_dir)?;
    for c in sim.clusters() {
        let dir = args.state_dir.join(c.name());
        std::fs::create_dir_all(&dir)?;
        write_private(&dir.join("kubeconfig"), &c.kubeconfig_yaml())?;
        std::fs::write(dir.join("ca.crt"), c.ca_pem())?;
        write_private(&dir.join("admin.token"), &c.admin_token())?;
        std::fs::write(dir.join("server"), c.url())?;
    }
    write_private(&args.state_dir.join("kubeconfig"), &sim.kubeconfig_yaml())?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    wait_for_signal().await?;
    sim.shutdown();
    Ok(())
}

/// Write a file readable only by the owner (it holds credentials).
fn write_private(path: &std::path::Path, content: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(content.as_bytes())
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
