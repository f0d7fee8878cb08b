//! The bundled plugins' client for the *hub* cluster: `--kubeconfig` when given, else the
//! in-cluster ServiceAccount, else the usual kubeconfig inference.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::PluginError;

/// A hub client and the namespace it defaults to. Proxies follow
/// [`crate::credentials::proxy`]: the hub's own cluster and loopback are never proxied, even
/// when a profile's `additional-envs` or the hub's environment set `HTTPS_PROXY`.
pub async fn hub_client(kubeconfig: Option<&Path>) -> Result<kube::Client, PluginError> {
    let (mut config, explicit_proxy) = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| PluginError::HubClient(format!("{}: {e}", path.display())))?;
            let proxy = crate::credentials::proxy::kubeconfig_proxy_url(&kc, None);
            let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| PluginError::HubClient(e.to_string()))?;
            (config, proxy)
        }
        None => match kube::Config::incluster() {
            Ok(c) => (c, None),
            Err(_) => (
                kube::Config::infer()
                    .await
                    .map_err(|e| PluginError::HubClient(e.to_string()))?,
                crate::credentials::proxy::default_kubeconfig_proxy(None),
            ),
        },
    };
    crate::credentials::proxy::apply_to_config(&mut config, explicit_proxy.as_deref())
        .map_err(|e| PluginError::HubClient(format!("proxy URL: {e}")))?;
    kube::Client::try_from(config).map_err(|e| PluginError::HubClient(e.to_string()))
}
