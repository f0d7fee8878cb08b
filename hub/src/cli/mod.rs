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
    /// Print kleym's four CustomResourceDefinitions as multi-document YAML.
    #[command(
        long_about = "Print kleym's four CustomResourceDefinitions (group kleym.io, \
        v1alpha1) as multi-document YAML on stdout: InferenceIdentityBinding (namespaced; \
        every spoke, and the single cluster), ClusterIdentityStatus (namespaced), \
        FleetIdentityReport (cluster-scoped) and ClusterIdentityObservation (namespaced, \
        the hub's internal record of each spoke for the fleet report), which only the hub \
        cluster needs.\n\n\
        Install them with `kleym crds | kubectl apply --server-side -f -`; applying all \
        four everywhere is harmless. The Helm chart's charts/kleym/crds/ holds the same \
        documents, one file each, written by `kleym crds --write charts/kleym/crds`."
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
    /// `token-request`, `spiffe-jwt`, `spiffe-x509`.
    ///
    /// These are client-go exec plugins (KEP-4322, formerly KEP-5339; `client.authentication.k8s.io` v1 or
    /// v1beta1): the hub (or kubectl, or any client-go based tool) runs them; they read the
    /// request from the `KUBERNETES_EXEC_INFO` environment variable, print one ExecCredential on
    /// stdout and exit 0. Errors go to stderr as `kleym: [<plugin>] <message>` with exit code 1
    /// and never contain the token. They are not meant to be run by hand.
    ///
    /// They talk to the hub cluster with --kubeconfig, else the in-cluster ServiceAccount, else
    /// the usual kubeconfig, and need RBAC there: `secret-reader` get on secrets,
    /// `token-request` create on serviceaccounts/token, `spiffe-jwt` and `spiffe-x509` get on
    /// the issuer Secret
    /// (see each plugin's --help for the rules
    /// and an example provider entry). Configure them as access providers in the hub's
    /// --clusterprofile-provider-file with `provideClusterInfo: true`, so that
    /// `KUBERNETES_EXEC_INFO` carries `spec.cluster` (the spoke's server URL, and the
    /// `client.authentication.k8s.io/exec` extension as `spec.cluster.config`).
    Credential(credential::Args),
    /// Print what each spoke's operator applies so that the spoke accepts the hub: the
    /// AuthenticationConfiguration or client CA, and the one RBAC binding of the hub.
    #[command(
        long_about = "Print, per spoke, what its operator applies so that the spoke's \
        API server accepts the hub, for every credential method; the ClusterRoleBinding it \
        prints (`kleym-hub-access`, to the spoke ClusterRole `kleym-spoke` of deploy/spoke/) is the \
        one binding of the hub's identity in a spoke.\n\n\
        --credential spiffe-jwt (default) and token-request: an AuthenticationConfiguration \
        for the API server's --authentication-config (apiVersion from --apiserver-version: \
        v1beta1 by default, v1 for 1.34+), with the issuer URL and CA, audience = the one the \
        hub decides for that spoke (kleym.io/clusterprofile/<namespace>/<name>, never the \
        profile's server URL; see --profile-sourced-audience), a claim \
        validation rule pinning sub to the hub's SPIFFE ID (or its ServiceAccount), the \
        username mapped with --username-prefix and a user validation rule refusing system: \
        names. spiffe-x509: the CA bundle for the API server's --client-ca-file. external \
        (secret-reader, aws eks get-token, gke-gcloud-auth-plugin, kubelogin): the RBAC \
        alone, for the --user or --group the spoke's own authenticator yields.\n\n\
        Reads ClusterProfiles from the hub cluster (--kubeconfig/--context). See \
        docs/install.md (step 5) and docs/keyless-access.md."
    )]
    TrustConfig(Box<trust_config::Args>),
    /// Operate on the hub's issuer keys and X.509 CA: `rotate [--revoke-old]`,
    /// `rotate-ca [--finish]`.
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

    fn about(cmd: &clap::Command) -> String {
        format!(
            "{} {}",
            cmd.get_about().map(|a| a.to_string()).unwrap_or_default(),
            cmd.get_long_about()
                .map(|a| a.to_string())
                .unwrap_or_default()
        )
    }

    fn sub<'a>(cmd: &'a clap::Command, name: &str) -> &'a clap::Command {
        cmd.find_subcommand(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"))
    }

    /// `kleym --help` names every bundled plugin and every issuer operation there is, read
    /// from the command tree itself, so a new one cannot be left out of the summary.
    #[test]
    fn the_summary_names_every_plugin_and_issuer_operation() {
        let mut cli = Cli::command();
        cli.build();
        for group in ["credential", "issuer"] {
            let cmd = sub(&cli, group);
            let summary = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
            for op in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
                assert!(
                    summary.contains(&format!("`{}", op.get_name())),
                    "`kleym --help` line of {group} lacks {}: {summary}",
                    op.get_name()
                );
            }
        }
    }

    /// `kleym crds --help` says how many CRDs it prints and names each kind.
    #[test]
    fn crds_help_names_every_crd_it_prints() {
        let cli = Cli::command();
        let text = about(sub(&cli, "crds"));
        let crds = kleym_api::crds::all();
        assert_eq!(crds.len(), 4, "update the count in `kleym crds --help`");
        assert!(text.contains("four"), "{text}");
        for crd in crds {
            assert!(
                text.contains(&crd.spec.names.kind),
                "{text} lacks {}",
                crd.spec.names.kind
            );
        }
    }

    /// `kleym report --help` says which audience the token needs (the hub's default
    /// `--api-audience`), and its example host is the chart's Service for a release
    /// `kleym` in `kleym-system` (`<fullname>.<namespace>.svc`).
    #[test]
    fn report_help_names_the_audience_and_the_charts_service() {
        let mut cli = Cli::command();
        cli.build();
        let report = sub(&cli, "report");
        let text = format!(
            "{}{}",
            report
                .get_after_long_help()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            report
                .get_arguments()
                .filter_map(|a| a.get_long_help().or(a.get_help()).map(|h| h.to_string()))
                .collect::<String>()
        );
        let audience = sub(&cli, "hub")
            .get_arguments()
            .find(|a| a.get_id() == "api_audience")
            .and_then(|a| a.get_default_values().first().cloned())
            .expect("--api-audience has a default");
        assert!(
            text.contains(&format!("--audience {}", audience.to_string_lossy())),
            "{text}"
        );
        assert!(
            text.contains("https://kleym.kleym-system.svc:8443"),
            "{text}"
        );
        assert!(!text.contains("kleym-hub.kleym.svc"), "{text}");
    }

    /// `--issuer-key-secret` names every verb the hub uses on the Secret: rotation updates it.
    #[test]
    fn issuer_key_secret_help_names_get_create_and_update() {
        let mut cli = Cli::command();
        cli.build();
        let help = sub(&cli, "hub")
            .get_arguments()
            .find(|a| a.get_id() == "issuer_key_secret")
            .and_then(|a| a.get_long_help().or(a.get_help()).map(|h| h.to_string()))
            .expect("--issuer-key-secret help");
        for verb in ["get", "create", "update"] {
            assert!(help.contains(verb), "{help} lacks {verb}");
        }
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
