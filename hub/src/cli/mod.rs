//! Command-line interface of `kleym`.
//!
//! Each subcommand lives in its own module with an `Args` struct and a `run` function;
//! add a variant to [`Command`] and an arm to [`run`] to add one. The subcommands are
//! `crds`, `spoke`, `hub`, `report`, `credential` (the bundled exec credential plugins) and
//! `trust-config` (the spoke side of keyless access), `issuer` and `explain`.

use clap::{CommandFactory, Parser, Subcommand};

pub mod crds;
pub mod credential;
pub mod explain;
pub mod hub;
pub mod issuer;
pub mod report;
mod signal;
pub mod spoke;
pub mod trust_config;

/// kleym compiles InferenceIdentityBinding objects into SPIRE ClusterSPIFFEIDs across a
/// fleet of Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(
    name = "kleym",
    version,
    about = "kleym compiles InferenceIdentityBinding objects into SPIRE ClusterSPIFFEIDs across a fleet of Kubernetes clusters",
    long_about = None,
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `kleym`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print kleym's CustomResourceDefinitions as multi-document YAML.
    #[command(
        long_about = "Print kleym's CustomResourceDefinitions (InferenceIdentityBinding, \
        kleym.io/v1alpha1) as multi-document YAML on stdout.\n\n\
        Install them with `kleym crds | kubectl apply --server-side -f -`. The Helm chart's \
        charts/kleym/crds/ holds the same documents, generated from this output."
    )]
    Crds(crds::Args),
    /// Run the single-cluster operator: compile this cluster's InferenceIdentityBindings
    /// into SPIRE ClusterSPIFFEIDs.
    #[command(long_about = "Run the single-cluster operator: watch this cluster's \
        InferenceIdentityBindings, InferenceObjectives and InferencePools, compile each binding \
        into a SPIRE ClusterSPIFFEID (server-side apply, field manager `kleym`) and report the \
        verdict in the binding's status.\n\n\
        Connects with --kubeconfig/--context, else KUBECONFIG or ~/.kube/config, else the \
        in-cluster ServiceAccount. Needs the RBAC in deploy/spoke/. Serves /healthz, /readyz \
        and /metrics on --metrics-addr, and /healthz and /readyz alone on --health-addr when \
        given (probes on a port of their own); stops cleanly on SIGTERM or SIGINT.")]
    Spoke(spoke::Args),
    /// Run the fleet hub: engage every healthy ClusterProfile's cluster and compile its
    /// InferenceIdentityBindings there.
    #[command(
        long_about = "Run the fleet hub: watch ClusterProfiles in the hub cluster, \
        build a client per spoke from its access provider and credential plugin \
        (--clusterprofile-provider-file / --clusterprofile-access-provider), and run one spoke \
        reconciler per engaged spoke while this replica holds the leader Lease. The leader writes \
        a ClusterIdentityStatus per profile and the fleet-wide FleetIdentityReport. Serves \
        /healthz, /readyz and /metrics on --metrics-addr, /healthz and /readyz alone on \
        --health-addr when given (probes on a port of their own), and the authenticated API \
        (/v1/report, /v1/clusters) on --api-addr when TLS files or --api-insecure-http are given; stops \
        cleanly on SIGTERM or SIGINT."
    )]
    Hub(Box<hub::Args>),
    /// Print the fleet's identity findings (collisions, duplicate IDs, cross-cluster drift,
    /// warnings); exit 1 when findings at or above --fail-on exist.
    #[command(
        long_about = "Print the fleet's identity findings as a table grouped by finding \
        (kind, severity, SPIFFE ID, members, what to change), or as JSON/YAML with -o.\n\n\
        Reads the FleetIdentityReport from the hub cluster (--kubeconfig/--context, else \
        KUBECONFIG or ~/.kube/config, else in-cluster), the full report from the hub API with \
        --server URL --token-file F [--ca-file F], or a saved report with --file.\n\n\
        Exit status: 0 no findings at or above --fail-on, 1 such findings exist, 2 error."
    )]
    Report(report::Args),
    /// Run a bundled credential plugin (client-go exec protocol): `secret-reader`,
    /// `token-request`, `spiffe-jwt`.
    ///
    /// These are client-go exec plugins (KEP-4322, formerly KEP-5339; `client.authentication.k8s.io` v1 or
    /// v1beta1): the hub (or kubectl, or any client-go based tool) runs them; they read the
    /// request from the `KUBERNETES_EXEC_INFO` environment variable, print one ExecCredential on
    /// stdout and exit 0. Errors go to stderr as `kleym: [<plugin>] <message>` with exit code 1
    /// and never contain the token. They are not meant to be run by hand.
    ///
    /// They talk to the hub cluster with --kubeconfig, else the in-cluster ServiceAccount, else
    /// the usual kubeconfig, and need RBAC there: `secret-reader` get on secrets,
    /// `token-request` create on serviceaccounts/token, `spiffe-jwt` get on the issuer Secret
    /// (see each plugin's --help for the rules
    /// and an example provider entry). Configure them as access providers in the hub's
    /// --clusterprofile-provider-file with `provideClusterInfo: true`, so that
    /// `KUBERNETES_EXEC_INFO` carries `spec.cluster` (the spoke's server URL, and the
    /// `client.authentication.k8s.io/exec` extension as `spec.cluster.config`).
    Credential(credential::Args),
    /// Print what each spoke's operator applies so that the spoke trusts the hub's
    /// JWT-SVIDs: the AuthenticationConfiguration and the RBAC of the hub's user.
    #[command(
        long_about = "Print, per spoke, what its operator applies so that the spoke's \
        API server trusts the JWT-SVIDs of `kleym credential spiffe-jwt`: an \
        apiserver.config.k8s.io/v1 AuthenticationConfiguration for its --authentication-config \
        (issuer URL and CA, audience = that spoke's server URL as its ClusterProfile gives it, or \
        the exec extension's audience; a claim validation rule pinning sub to the hub's SPIFFE ID; \
        the username mapped with --username-prefix; a user validation rule refusing system: \
        names), and the spoke ClusterRole of deploy/spoke/ with a ClusterRoleBinding of that user.\n\n\
        Reads ClusterProfiles from the hub cluster (--kubeconfig/--context). See \
        docs/keyless-access.md."
    )]
    TrustConfig(trust_config::Args),
    /// Operate on the hub's issuer keys: `rotate [--revoke-old]`.
    Issuer(issuer::Args),
    /// Explain which SPIRE identities a pod gets, from which ClusterSPIFFEIDs, and why
    /// others do not apply: `pod NAMESPACE/NAME`.
    Explain(explain::Args),
}

/// A usage error found after parsing (a check spanning several flags, or of a file a flag
/// names), reported as clap reports its own: `error: …`, the subcommand's usage, exit code
/// 2. [`crate::main`] exits with it when [`run`] returns it.
pub fn usage_error(subcommand: &str, message: impl std::fmt::Display) -> clap::Error {
    let mut cli = Cli::command();
    // Built, so that the subcommand's usage line reads `kleym <subcommand> [OPTIONS]`.
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(cmd) => cmd.error(clap::error::ErrorKind::ValueValidation, message),
        None => cli.error(clap::error::ErrorKind::ValueValidation, message),
    }
}

/// The async runtime of a long-running command (`hub`, `spoke`), with `worker_threads`
/// threads. Always the multi-threaded scheduler, also for one thread: the code and its
/// blocking sections run the same way whatever the operator chooses.
fn runtime(worker_threads: u16) -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(worker_threads).max(1))
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds(args) => crds::run(&args, &mut std::io::stdout().lock()),
        Command::Spoke(args) => spoke::run(&args),
        Command::Credential(args) => credential::run(&args),
        Command::Hub(args) => hub::run(&args),
        Command::Report(args) => report::run(&args),
        Command::TrustConfig(args) => trust_config::run(&args),
        Command::Issuer(args) => issuer::run(&args),
        Command::Explain(args) => explain::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn worker_threads_default_to_one_and_size_the_runtime() {
        let threads = |argv: &[&str]| match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Hub(a)) => Ok(a.runtime.worker_threads),
            Ok(Command::Spoke(a)) => Ok(a.runtime.worker_threads),
            Ok(_) => panic!("{argv:?} parsed as another command"),
            Err(e) => Err(e.to_string()),
        };
        let spoke = ["kleym", "spoke", "--trust-domain", "td.example"];
        assert_eq!(threads(&["kleym", "hub"]), Ok(1));
        assert_eq!(threads(&spoke), Ok(1));
        assert_eq!(threads(&["kleym", "hub", "--worker-threads", "3"]), Ok(3));
        assert_eq!(
            threads(&[&spoke[..], &["--worker-threads", "2"]].concat()),
            Ok(2)
        );
        for bad in ["0", "1025", "-1", "two"] {
            let flag = format!("--worker-threads={bad}");
            let e = threads(&["kleym", "hub", &flag]).expect_err(bad);
            assert!(e.contains("--worker-threads"), "{bad}: {e}");
        }
        for n in [1, 3] {
            let rt = runtime(n).unwrap();
            assert_eq!(rt.metrics().num_workers(), usize::from(n));
        }
    }

    #[test]
    fn parses_crds() {
        let cli = Cli::try_parse_from(["kleym", "crds"]).unwrap();
        assert!(matches!(cli.command, Command::Crds(_)));
        assert!(Cli::try_parse_from(["kleym"]).is_err());
        assert!(Cli::try_parse_from(["kleym", "nope"]).is_err());
    }
}
