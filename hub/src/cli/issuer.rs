//! `kleym issuer`: operations on the hub's issuer keys (`rotate`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::rotation::RotationPolicy;
use kleym_hub::issuer::secret::{SecretRef, parse_issuer_key_secret, read, write};

/// Arguments of `kleym issuer`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: IssuerCommand,
}

/// The `kleym issuer` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum IssuerCommand {
    /// Rotate now: a new ES256 key signs from now on (after a compromise, or to test).
    #[command(
        long_about = "Rotate the issuer key now: add a new ES256 key to the issuer Secret \
        that signs from now on. The other keys stay published until every token they signed has \
        expired (15 min + 5 min skew), so nothing fails; with --revoke-old they are removed at \
        once, and tokens they signed fail as soon as each spoke's API server refetches the JWKS \
        (the hub then re-runs the plugin on the 401). Every hub replica publishes the change \
        within its Secret refresh period (30 s); the plugin signs with the new key at once.\n\n\
        Needs get and update on the Secret in the hub cluster."
    )]
    Rotate(RotateArgs),
}

/// Arguments of `kleym issuer rotate`.
#[derive(Debug, clap::Args)]
pub struct RotateArgs {
    /// Kubeconfig of the hub cluster [default: KUBECONFIG, ~/.kube/config, in-cluster].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The issuer Secret, `namespace/name`, as `kleym hub --issuer-key-secret`.
    #[arg(long, value_parser = parse_issuer_key_secret, env = "KLEYM_ISSUER_KEY_SECRET")]
    pub issuer_key_secret: SecretRef,
    /// The current signing key's algorithm, as `kleym hub --issuer-key-algorithm`.
    #[arg(long, value_enum, default_value = "ES256", value_name = "ES256|RS256")]
    pub issuer_key_algorithm: Algorithm,
    /// Remove every other key at once instead of letting it retire.
    #[arg(long)]
    pub revoke_old: bool,
}

/// Runs `kleym issuer`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match &args.command {
        IssuerCommand::Rotate(a) => {
            let line = runtime.block_on(rotate(a))?;
            writeln!(std::io::stdout().lock(), "{line}").context("writing to stdout")?;
            Ok(())
        }
    }
}

async fn rotate(a: &RotateArgs) -> anyhow::Result<String> {
    let client =
        kleym_hub::kubeconfig::client_from_flags(a.kubeconfig.as_deref(), a.context.as_deref())
            .await?;
    let (secret, mut ring) =
        read(client.clone(), &a.issuer_key_secret, a.issuer_key_algorithm).await?;
    let now = chrono::Utc::now().timestamp();
    let old: Vec<String> = ring
        .published(now)
        .iter()
        .map(|k| k.kid().to_string())
        .collect();
    let kid = ring.rotate_now(now, &RotationPolicy::default(), a.revoke_old)?;
    write(client, &a.issuer_key_secret, secret, &ring).await?;
    Ok(format!(
        "issuer Secret {}: key {kid} signs from now; {} {}",
        a.issuer_key_secret,
        if a.revoke_old {
            "revoked"
        } else {
            "retiring in 20 min"
        },
        if old.is_empty() {
            "nothing".to_string()
        } else {
            old.join(", ")
        }
    ))
}
