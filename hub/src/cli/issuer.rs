//! `kleym issuer`: operations on the hub's issuer keys (`rotate`) and X.509 CA (`rotate-ca`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use kleym_hub::issuer::ca::{default_ca_secret, parse_ca_secret};
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
        kleym generates ES256 keys only: with --issuer-key-algorithm RS256 this command is \
        refused (the hub would refuse a Secret whose signing key is not RS256); add a new RSA \
        key to the Secret yourself instead.\n\n\
        Needs get and update on the Secret in the hub cluster."
    )]
    Rotate(RotateArgs),
    /// Rotate the X.509-SVID CA with an overlap: begin (a next CA joins the trusted bundle),
    /// then, once every spoke trusts the new bundle, `--finish` (the next CA signs).
    #[command(
        name = "rotate-ca",
        long_about = "Rotate the hub's X.509-SVID CA (kleym credential spiffe-x509) with an \
        overlap, in two steps. Without --finish: a next CA is added to the CA Secret; the \
        current CA keeps signing, and data[x509-ca-bundle.crt] (what kleym trust-config \
        --credential spiffe-x509 prints) holds both. Give every spoke's API server the new \
        bundle (--client-ca-file), then run again with --finish: the next CA signs from now on \
        and the replaced one stays in the bundle for 24 h + 5 min (the longest X.509-SVID \
        lifetime plus skew), after which the hub's leader removes it.\n\n\
        The hub's leader also rotates on its own as the CA (valid one year) nears its end, \
        unless --issuer-key-rotation off: 30 days before it expires a next CA joins the \
        bundle (the leader logs a warning: distribute the bundle now), 7 days before it \
        signs. This command rotates earlier, on your schedule.\n\n\
        Needs get and update on the Secret in the hub cluster."
    )]
    RotateCa(RotateCaArgs),
}

/// Arguments of `kleym issuer rotate-ca`.
#[derive(Debug, clap::Args)]
pub struct RotateCaArgs {
    /// Kubeconfig of the hub cluster [default: KUBECONFIG, ~/.kube/config, in-cluster].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The X.509 CA Secret, `namespace/name`, as `kleym hub --issuer-x509-ca-secret`.
    /// Required unless `--issuer-key-secret` names the key Secret beside which the CA Secret
    /// has its default name (`<name>-x509-ca`).
    #[arg(long, value_parser = parse_ca_secret, env = "KLEYM_ISSUER_X509_CA_SECRET", required_unless_present = "issuer_key_secret")]
    pub issuer_x509_ca_secret: Option<SecretRef>,
    /// The issuer key Secret, `namespace/name`, as `kleym hub --issuer-key-secret`: only to
    /// derive the default CA Secret name (its data is not read).
    #[arg(long, value_parser = parse_issuer_key_secret, env = "KLEYM_ISSUER_KEY_SECRET")]
    pub issuer_key_secret: Option<SecretRef>,
    /// Accepted for compatibility and ignored: the CA Secret holds no signing key.
    #[arg(
        long,
        value_enum,
        default_value = "ES256",
        value_name = "ES256|RS256",
        hide = true
    )]
    pub issuer_key_algorithm: Algorithm,
    /// Second step: the next CA signs from now on.
    #[arg(long)]
    pub finish: bool,
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
        IssuerCommand::RotateCa(a) => {
            let line = runtime.block_on(rotate_ca(a))?;
            writeln!(std::io::stdout().lock(), "{line}").context("writing to stdout")?;
            Ok(())
        }
    }
}

async fn rotate_ca(a: &RotateCaArgs) -> anyhow::Result<String> {
    let at = match (&a.issuer_x509_ca_secret, &a.issuer_key_secret) {
        (Some(ca), _) => ca.clone(),
        (None, Some(key)) => default_ca_secret(key),
        (None, None) => {
            anyhow::bail!("--issuer-x509-ca-secret (or --issuer-key-secret) is required")
        }
    };
    let client =
        kleym_hub::kubeconfig::client_from_flags(a.kubeconfig.as_deref(), a.context.as_deref())
            .await?;
    let (secret, mut ring) = kleym_hub::issuer::ca::read(client.clone(), &at).await?;
    let now = chrono::Utc::now().timestamp();
    let line = if a.finish {
        ring.finish_rotation(now, kleym_hub::issuer::x509::CA_OVERLAP_SECONDS)
            .with_context(|| format!("X.509 CA Secret {at}"))?;
        format!(
            "X.509 CA Secret {at}: the new CA signs from now; the replaced one stays in data[{}] for 24 h 5 min",
            kleym_hub::issuer::x509::CA_BUNDLE_KEY
        )
    } else {
        ring.begin_rotation(now)
            .with_context(|| format!("X.509 CA Secret {at}"))?;
        format!(
            "X.509 CA Secret {at}: a next CA is in data[{}]; give every spoke that bundle (kleym trust-config --credential spiffe-x509), then run with --finish",
            kleym_hub::issuer::x509::CA_BUNDLE_KEY
        )
    };
    kleym_hub::issuer::ca::write(client, &at, secret, &ring).await?;
    Ok(line)
}

/// Refuses `kleym issuer rotate` flag combinations that cannot succeed, before anything is
/// written: kleym generates ES256 keys only, and a hub configured for RS256 refuses a Secret
/// whose signing key is ES256, so every replica would stop refreshing its keys.
fn check_rotate(a: &RotateArgs) -> anyhow::Result<()> {
    if a.issuer_key_algorithm == Algorithm::Rs256 {
        anyhow::bail!(
            "kleym issuer rotate{} --issuer-key-algorithm RS256: kleym generates ES256 keys only, and a hub with --issuer-key-algorithm RS256 refuses a Secret whose signing key is ES256 (its replicas would stop refreshing the JWKS). Add a new PKCS#8 RSA key to data[{}] of {} yourself, or move the hub and this command to --issuer-key-algorithm ES256",
            if a.revoke_old { " --revoke-old" } else { "" },
            kleym_hub::issuer::SECRET_KEY,
            a.issuer_key_secret
        );
    }
    Ok(())
}

async fn rotate(a: &RotateArgs) -> anyhow::Result<String> {
    check_rotate(a)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: IssuerCommand,
    }

    fn rotate_args(extra: &[&str]) -> RotateArgs {
        let mut v = vec!["kleym", "rotate", "--issuer-key-secret", "kleym/issuer"];
        v.extend_from_slice(extra);
        match Cli::try_parse_from(v).unwrap().command {
            IssuerCommand::Rotate(a) => a,
            IssuerCommand::RotateCa(_) => unreachable!(),
        }
    }

    #[test]
    fn rotate_refuses_rs256_naming_the_flags() {
        assert!(check_rotate(&rotate_args(&[])).is_ok());
        assert!(check_rotate(&rotate_args(&["--revoke-old"])).is_ok());
        for extra in [
            &["--issuer-key-algorithm", "RS256"][..],
            &["--issuer-key-algorithm", "RS256", "--revoke-old"][..],
        ] {
            let e = check_rotate(&rotate_args(extra)).unwrap_err().to_string();
            assert!(
                e.contains("--issuer-key-algorithm RS256") && e.contains("kleym/issuer"),
                "{e}"
            );
        }
        let e = check_rotate(&rotate_args(&[
            "--issuer-key-algorithm",
            "RS256",
            "--revoke-old",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--revoke-old"), "{e}");
    }
}
