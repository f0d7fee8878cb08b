//! `kleym-demo credential …`: the bundled credential plugins run from the demo's own binary,
//! so `cargo run --bin kleym-demo` works before the `kleym` binary is built. It is the same
//! library code as `kleym credential token-request|secret-reader` (`kleym_hub::credentials::
//! plugins`), and the demo prefers the real `kleym` binary when it sits next to it.

use std::io::Write as _;
use std::path::PathBuf;

use kleym_hub::credentials::plugins::exec_info::exec_info_from_env;
use kleym_hub::credentials::plugins::hub_client::hub_client;
use kleym_hub::credentials::plugins::secret_reader::{SecretReaderOptions, secret_reader};
use kleym_hub::credentials::plugins::token_request::{TokenRequestOptions, token_request};

/// The plugins (a subset of `kleym credential`'s flags).
#[derive(Debug, clap::Subcommand)]
pub enum Plugin {
    /// Token from a hub Secret named after `spec.cluster.config.clusterName`.
    SecretReader {
        /// Namespace of the Secrets in the hub.
        #[arg(long)]
        namespace: String,
        /// Kubeconfig of the hub.
        #[arg(long)]
        kubeconfig: PathBuf,
    },
    /// Short-lived token for a hub ServiceAccount via the TokenRequest API.
    TokenRequest {
        /// The hub ServiceAccount, as `namespace/name`.
        #[arg(long)]
        service_account: String,
        /// Kubeconfig of the hub.
        #[arg(long)]
        kubeconfig: PathBuf,
    },
}

/// Runs `plugin` and prints its ExecCredential; errors never contain the token.
pub fn run(plugin: &Plugin) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let credential = rt.block_on(async {
        let info = exec_info_from_env().map_err(|e| e.to_string())?;
        match plugin {
            Plugin::SecretReader {
                namespace,
                kubeconfig,
            } => {
                let hub = hub_client(Some(kubeconfig))
                    .await
                    .map_err(|e| e.to_string())?;
                let opts = SecretReaderOptions {
                    namespace: namespace.clone(),
                    ..SecretReaderOptions::default()
                };
                secret_reader(hub, &info, &opts)
                    .await
                    .map_err(|e| e.to_string())
            }
            Plugin::TokenRequest {
                service_account,
                kubeconfig,
            } => {
                let hub = hub_client(Some(kubeconfig))
                    .await
                    .map_err(|e| e.to_string())?;
                let opts = TokenRequestOptions {
                    service_account: service_account.clone(),
                    audience: None,
                    expiration_seconds: 3600,
                };
                token_request(hub, &info, &opts)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    })?;
    writeln!(std::io::stdout().lock(), "{credential}").map_err(|e| e.to_string())
}
