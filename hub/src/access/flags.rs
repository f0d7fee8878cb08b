//! Command-line flags of the access layer, for `kleym hub` to flatten into its arguments.

use std::path::PathBuf;

use super::provider_config::{ProviderConfigError, ProviderSet};
use super::select::SelectOptions;

/// `--clusterprofile-provider-file`, `--clusterprofile-access-provider` (repeated) and
/// `--allow-insecure-skip-tls-verify`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct AccessFlags {
    /// Provider file in the Go reference library's format (JSON; YAML also accepted).
    ///
    /// Per provider: `name`, `execConfig` (client-go's ExecConfig: `apiVersion`
    /// client.authentication.k8s.io/v1 or /v1beta1, `command`, `args`, `env`,
    /// `provideClusterInfo`, `installHint`), `profileSourcedCLIArgsPolicy` (Ignore, the default,
    /// or Append) and `profileSourcedEnvVarsPolicy` (Ignore, the default, AppendIfNotExists or
    /// Replace), deciding whether a ClusterProfile's additional-args / additional-envs
    /// extensions are used. Keys match case-insensitively; unknown keys are logged. See
    /// docs/access-providers.md.
    #[arg(
        long = "clusterprofile-provider-file",
        env = "KLEYM_CLUSTERPROFILE_PROVIDER_FILE"
    )]
    pub provider_file: Option<PathBuf>,
    /// An access provider as `NAME=COMMAND [ARGS...]` (repeatable).
    ///
    /// The part after `=` is split into words with POSIX-shell quoting and no expansion; the
    /// KEP's `NAME='COMMAND ARGS'` (one quoted string) is split once more. Replaces the file's
    /// provider of the same name; new names come after the file's. A flag-defined provider
    /// runs with apiVersion client.authentication.k8s.io/v1, provideClusterInfo true, no env
    /// and the Ignore policies (a ClusterProfile's additional-args / additional-envs
    /// extensions are not used); use --clusterprofile-provider-file for anything else. See
    /// docs/access-providers.md.
    #[arg(
        long = "clusterprofile-access-provider",
        value_name = "NAME=COMMAND [ARGS]"
    )]
    pub access_providers: Vec<String>,
    /// Accept ClusterProfiles that set `insecure-skip-tls-verify: true` (refused by default).
    ///
    /// See docs/access-providers.md.
    #[arg(long)]
    pub allow_insecure_skip_tls_verify: bool,
}

impl AccessFlags {
    /// Loads and validates the provider configuration.
    pub fn provider_set(&self) -> Result<ProviderSet, ProviderConfigError> {
        ProviderSet::load(self.provider_file.as_deref(), &self.access_providers)
    }

    /// The selection options these flags imply.
    pub fn select_options(&self) -> SelectOptions {
        SelectOptions {
            allow_insecure_skip_tls_verify: self.allow_insecure_skip_tls_verify,
            allow_plain_http: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        access: AccessFlags,
    }

    #[test]
    fn parses_repeated_provider_flags() {
        let cli = Cli::try_parse_from([
            "x",
            "--clusterprofile-access-provider",
            "google='/usr/bin/gke-gcloud-auth-plugin --flag1 value1'",
            "--clusterprofile-access-provider",
            "aws=aws eks get-token --cluster-name c",
            "--allow-insecure-skip-tls-verify",
        ])
        .unwrap();
        let set = cli.access.provider_set().unwrap();
        assert_eq!(set.providers().len(), 2);
        assert_eq!(
            set.get("aws").unwrap().exec.args,
            vec!["eks", "get-token", "--cluster-name", "c"]
        );
        assert!(cli.access.select_options().allow_insecure_skip_tls_verify);
    }
}
