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
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut authentication_configs = std::collections::BTreeMap::new();
    for (cluster, path) in &args.authentication_config {
        authentication_configs.insert(cluster.clone(), read(path)?);
    }
    let mut client_cas = std::collections::BTreeMap::new();
    for (cluster, path) in &args.client_ca {
        client_cas.insert(cluster.clone(), read(path)?);
    }
    // Each reload task compares the file with what its cluster started with. Reading the file
    // again when the task first runs would take a file changed right after `ready` for the
    // start, and never apply it.
    let started_with = authentication_configs.clone();
    let options = KubesimOptions {
        crds,
        client_certs: !args.no_client_certs,
        authentication_configs,
        client_cas,
        ..Default::default()
    };
    let names: Vec<&str> = args.clusters.iter().map(String::as_str).collect();
    let sim = Kubesim::start(&names, options)
        .await
        .map_err(|e| format!("--authentication-config/--client-ca or start-up: {e}"))?;
    for (cluster, path) in &args.authentication_config {
        if let Some(handle) = sim.cluster(cluster) {
            let first = started_with.get(cluster).cloned();
            tokio::spawn(reload_on_change(handle, path.clone(), first));
        }
    }
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

/// Re-reads an `--authentication-config` file when its content differs from `last` (what the
/// cluster runs with), as kube-apiserver does; an invalid new version keeps the previous
/// configuration and is logged.
async fn reload_on_change(
    handle: kubesim::ClusterHandle,
    path: std::path::PathBuf,
    mut last: Option<String>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        match handle.set_authentication_config(&text) {
            Ok(()) => {
                tracing::info!(cluster = %handle.name(), file = %path.display(), "authentication configuration reloaded")
            }
            Err(e) => {
                tracing::error!(cluster = %handle.name(), file = %path.display(), error = %e, "invalid authentication configuration; keeping the previous one")
            }
        }
        last = Some(text);
    }
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
