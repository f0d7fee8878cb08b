//! `kleym hub`: the fleet hub. Watches ClusterProfiles in the hub cluster, builds a client
//! per spoke from its access provider and credential plugin, runs one spoke reconciler per
//! engaged spoke (only while this replica holds the leader Lease), writes
//! `ClusterIdentityStatus` per profile and the `FleetIdentityReport` (leader only), and
//! serves `/healthz`, `/readyz` and `/metrics` on `--metrics-addr` (plain HTTP; the probes
//! alone also on `--health-addr` when given) plus the hub API (those three and the authenticated `/v1/report`, `/v1/clusters`) on `--api-addr`
//! (TLS, or `--api-insecure-http`) until SIGTERM or SIGINT. The machinery lives in the
//! library ([`kleym_hub::runtime`]) so tests and benchmarks run the same code; this command
//! adds only what a process needs: the access-provider check, logging and signals.

use kleym_hub::observe::logging;
use kleym_hub::runtime::run_hub;
use kleym_spoke::reconciler::CancellationToken;

/// Arguments of `kleym hub`.
pub type Args = kleym_hub::runtime::HubArgs;

/// Runs the hub until SIGTERM/SIGINT.
pub fn run(args: &Args) -> anyhow::Result<()> {
    check_access_providers(args)?;
    args.svid
        .policy()
        .map_err(|e| super::usage_error("hub", format!("invalid SVID policy: {e}")))?;
    logging::init(args.log_format, &args.log_level)?;
    let rt = super::runtime(args.runtime.worker_threads)?;
    rt.block_on(async {
        let shutdown = CancellationToken::new();
        super::signal::cancel_on_signal(shutdown.clone());
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
