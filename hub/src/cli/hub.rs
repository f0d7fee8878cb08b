//! `kleym hub`: the fleet hub. Watches ClusterProfiles in the hub cluster, builds a client
//! per spoke from its access provider and credential plugin, runs one spoke reconciler per
//! engaged spoke (only while this replica holds the leader Lease), writes
//! `ClusterIdentityStatus` per profile and the `FleetIdentityReport` (leader only), and
//! serves `/healthz`, `/readyz` and `/metrics` on `--metrics-addr` (plain HTTP; the probes
//! alone also on `--health-addr` when given) plus the hub API (those three and the authenticated `/v1/report`, `/v1/clusters`) on `--api-addr`
//! (TLS, or `--api-insecure-http`) until SIGTERM or SIGINT. The machinery lives in the
//! library ([`kleym_hub::fleet::runtime`]) so tests and benchmarks run the same code.

use anyhow::Context as _;
use kleym_hub::fleet::runtime::{LogFormat, run_hub};
use kleym_spoke::reconciler::CancellationToken;

/// Arguments of `kleym hub`.
pub type Args = kleym_hub::fleet::runtime::HubArgs;

/// Runs the hub until SIGTERM/SIGINT.
pub fn run(args: &Args) -> anyhow::Result<()> {
    check_access_providers(args)?;
    init_logging(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let shutdown = CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received, shutting down");
            signal_token.cancel();
        });
        run_hub(args, shutdown).await
    })
}

/// The access providers load and there is at least one, before anything connects: a bad
/// provider file or flag fails start-up as a usage error naming the flags, and with no
/// provider at all every ClusterProfile would be refused ("no access provider matches").
fn check_access_providers(args: &Args) -> Result<(), clap::Error> {
    const FLAGS: &str = "--clusterprofile-provider-file / --clusterprofile-access-provider";
    let providers = args.access.provider_set().map_err(|e| {
        super::usage_error("hub", format!("invalid access providers ({FLAGS}): {e}"))
    })?;
    if providers.is_empty() {
        return Err(super::usage_error(
            "hub",
            format!("no access provider ({FLAGS}): without one every ClusterProfile is refused"),
        ));
    }
    Ok(())
}

fn init_logging(args: &Args) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // Already initialised (tests): keep the existing subscriber.
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
