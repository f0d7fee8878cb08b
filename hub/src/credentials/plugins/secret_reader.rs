//! `kleym credential secret-reader`: the example plugin of KEP-4322 (formerly KEP-5339). Reads the token for the
//! spoke named by `spec.cluster.config.clusterName` from a Secret in the hub.
//!
//! `clusterName` comes from the profile's status, so it does not choose the Secret alone:
//! the Secret must carry the annotation [`PROFILES_ANNOTATION`], set by whoever creates it,
//! listing the ClusterProfile the hub runs the plugin for (`KLEYM_CLUSTER_PROFILE`). Otherwise
//! a profile's status writer could name any Secret of the namespace (another spoke's token,
//! any other credential kept there) and have it sent to a server of theirs.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::PluginError;
use super::exec_info::{ExecInfo, render_credential};

/// The annotation a Secret must carry to be read for a ClusterProfile: a comma-separated list
/// of the `namespace/name`s of the profiles it serves.
pub const PROFILES_ANNOTATION: &str = "kleym.io/cluster-profiles";

/// Placeholder replaced by the cluster name in [`SecretReaderOptions::name_pattern`].
pub const CLUSTER_NAME_PLACEHOLDER: &str = "{clusterName}";

/// Where the Secret lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretReaderOptions {
    /// Namespace of the Secrets (in the hub).
    pub namespace: String,
    /// Secret name, with `{clusterName}` substituted (default: just the cluster name).
    pub name_pattern: String,
    /// Data key holding the token.
    pub key: String,
}

impl Default for SecretReaderOptions {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            name_pattern: CLUSTER_NAME_PLACEHOLDER.into(),
            key: "token".into(),
        }
    }
}

/// `spec.cluster.config.clusterName`, validated as a DNS-1123 subdomain (a Secret name part).
pub fn cluster_name(info: &ExecInfo) -> Result<String, PluginError> {
    let config = info
        .config
        .as_ref()
        .ok_or_else(|| PluginError::ExecInfo("missing ExecCredential.Spec.Cluster.Config (set provideClusterInfo and the client.authentication.k8s.io/exec extension)".into()))?;
    let name = config
        .get("clusterName")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            PluginError::ExecInfo(
                "missing clusterName in ExecCredential.Spec.Cluster.Config".into(),
            )
        })?;
    let valid = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if !valid {
        return Err(PluginError::Input(format!(
            "clusterName {name:?} is not a valid DNS-1123 subdomain"
        )));
    }
    Ok(name.to_string())
}

/// The Secret name for `cluster`.
pub fn secret_name(pattern: &str, cluster: &str) -> String {
    pattern.replace(CLUSTER_NAME_PLACEHOLDER, cluster)
}

/// The token in `secret.data[key]` (surrounding whitespace trimmed).
pub fn token_from_secret(
    secret: &Secret,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, PluginError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.as_bytes().to_vec())
        })
        .ok_or_else(|| {
            PluginError::Input(format!("secret {namespace}/{name} missing {key:?} key"))
        })?;
    let token = String::from_utf8(bytes).map_err(|_| {
        PluginError::Input(format!(
            "secret {namespace}/{name} key {key:?} is not UTF-8"
        ))
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(PluginError::Input(format!(
            "secret {namespace}/{name} key {key:?} is empty"
        )));
    }
    Ok(token.to_string())
}

/// Checks that `secret` may be read for `info`'s ClusterProfile: its
/// [`PROFILES_ANNOTATION`] lists the profile the hub named (`KLEYM_CLUSTER_PROFILE`).
pub fn check_secret_serves_profile(
    secret: &Secret,
    info: &ExecInfo,
    namespace: &str,
    name: &str,
) -> Result<(), PluginError> {
    let profile = info.hub_profile.as_deref().ok_or_else(|| {
        PluginError::Input(format!(
            "no ClusterProfile: {} is not set (the kleym hub sets it on every run; outside the \
             hub set it to the namespace/name the Secret's {PROFILES_ANNOTATION} annotation lists)",
            crate::access::audience::PROFILE_ENV
        ))
    })?;
    let listed = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROFILES_ANNOTATION))
        .is_some_and(|v| v.split(',').any(|p| p.trim() == profile));
    if !listed {
        return Err(PluginError::Input(format!(
            "secret {namespace}/{name} is not for ClusterProfile {profile}: its annotation \
             {PROFILES_ANNOTATION} does not list it (whoever creates the Secret sets it)"
        )));
    }
    Ok(())
}

/// Runs the plugin against `hub`: returns the ExecCredential JSON to print.
pub async fn secret_reader(
    hub: kube::Client,
    info: &ExecInfo,
    opts: &SecretReaderOptions,
) -> Result<String, PluginError> {
    let cluster = cluster_name(info)?;
    let name = secret_name(&opts.name_pattern, &cluster);
    let secret = Api::<Secret>::namespaced(hub, &opts.namespace)
        .get(&name)
        .await
        .map_err(|source| PluginError::Api {
            what: format!("failed to get secret {}/{name}", opts.namespace),
            source,
        })?;
    check_secret_serves_profile(&secret, info, &opts.namespace, &name)?;
    let token = token_from_secret(&secret, &opts.namespace, &name, &opts.key)?;
    Ok(render_credential(info.api_version, &token, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ExecApiVersion;

    fn info(config: serde_json::Value) -> ExecInfo {
        ExecInfo {
            api_version: ExecApiVersion::V1,
            server: Some("https://s".into()),
            config: Some(config),
            hub_audience: None,
            hub_profile: Some("fleet/spoke-1".into()),
        }
    }

    #[test]
    fn the_secret_must_list_the_profile_the_hub_named() {
        let secret = |annotation: Option<&str>| -> Secret {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "spoke-1", "namespace": "kleym",
                             "annotations": annotation.map(|a| serde_json::json!({PROFILES_ANNOTATION: a}))},
                "data": {"token": "dG9r"},
            }))
            .unwrap()
        };
        let i = info(serde_json::json!({"clusterName": "spoke-1"}));
        assert!(
            check_secret_serves_profile(&secret(Some("fleet/spoke-1")), &i, "kleym", "spoke-1")
                .is_ok()
        );
        assert!(
            check_secret_serves_profile(
                &secret(Some("other/x, fleet/spoke-1")),
                &i,
                "kleym",
                "spoke-1"
            )
            .is_ok()
        );
        for refused in [
            None,
            Some("fleet/spoke-2"),
            Some("fleet/spoke-10"),
            Some(""),
        ] {
            let err = check_secret_serves_profile(&secret(refused), &i, "kleym", "spoke-1")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("fleet/spoke-1") && err.contains(PROFILES_ANNOTATION),
                "{err}"
            );
        }
        let unnamed = ExecInfo {
            hub_profile: None,
            ..i
        };
        assert!(
            check_secret_serves_profile(
                &secret(Some("fleet/spoke-1")),
                &unnamed,
                "kleym",
                "spoke-1"
            )
            .is_err()
        );
    }

    #[test]
    fn cluster_name_rules() {
        assert_eq!(
            cluster_name(&info(serde_json::json!({"clusterName": "spoke-1"}))).unwrap(),
            "spoke-1"
        );
        assert!(cluster_name(&info(serde_json::json!({}))).is_err());
        assert!(cluster_name(&info(serde_json::json!({"clusterName": "../etc"}))).is_err());
        assert!(
            cluster_name(&ExecInfo {
                config: None,
                ..info(serde_json::json!({}))
            })
            .is_err()
        );
        assert_eq!(
            secret_name("kleym-{clusterName}-token", "s1"),
            "kleym-s1-token"
        );
    }
}
