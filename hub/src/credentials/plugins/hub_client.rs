//! The bundled plugins' client for the *hub* cluster: `--kubeconfig` when given, else the
//! in-cluster ServiceAccount, else the usual kubeconfig inference.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::PluginError;

/// A hub client and the namespace it defaults to.
pub async fn hub_client(kubeconfig: Option<&Path>) -> Result<kube::Client, PluginError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| PluginError::HubClient(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| PluginError::HubClient(e.to_string()))?
        }
        None => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::infer()
                .await
                .map_err(|e| PluginError::HubClient(e.to_string()))?,
        },
    };
    kube::Client::try_from(config).map_err(|e| PluginError::HubClient(e.to_string()))
}
