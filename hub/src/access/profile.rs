//! The slice of a ClusterProfile that access selection reads.
//!
//! This is a plain view struct so selection stays a pure function that can be tested without
//! the API types; [`AccessProfile::from_profile_json`] builds it from a ClusterProfile object
//! in its JSON form (what any typed ClusterProfile serializes to).

use kleym_api::external::clusterprofile::{AccessProvider, ClusterProfile};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One `status.accessProviders[]` (or deprecated `status.credentialProviders[]`) entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileProvider {
    /// Provider name.
    pub name: String,
    /// The v1 kubeconfig `Cluster` object (keys `server`, `certificate-authority-data`, …,
    /// `extensions`), kept as JSON so unknown fields and extension payloads survive as values.
    #[serde(default)]
    pub cluster: serde_json::Value,
}

/// What provider selection needs to know about one ClusterProfile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccessProfile {
    /// Profile namespace.
    pub namespace: String,
    /// Profile name.
    pub name: String,
    /// `status.accessProviders`.
    #[serde(default)]
    pub access_providers: Vec<ProfileProvider>,
    /// `status.credentialProviders` (deprecated; `accessProviders` wins on a name clash).
    #[serde(default)]
    pub credential_providers: Vec<ProfileProvider>,
}

/// A ClusterProfile JSON object could not be read.
#[derive(Debug, Error)]
#[error("cluster profile: {0}")]
pub struct ProfileJsonError(String);

impl AccessProfile {
    /// The spoke name `<namespace>/<name>`.
    pub fn spoke_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Builds the view from the typed ClusterProfile (`kleym_api`). A provider without a
    /// `cluster` gets `null`, which selection refuses with a clear reason.
    pub fn from_cluster_profile(cp: &ClusterProfile) -> Self {
        let convert = |list: Option<&Vec<AccessProvider>>| -> Vec<ProfileProvider> {
            list.map(|l| {
                l.iter()
                    .map(|p| ProfileProvider {
                        name: p.name.clone(),
                        // Serializing a plain data struct cannot fail; fall back to null anyway.
                        cluster: p
                            .cluster
                            .as_ref()
                            .and_then(|c| serde_json::to_value(c).ok())
                            .unwrap_or(serde_json::Value::Null),
                    })
                    .collect()
            })
            .unwrap_or_default()
        };
        let status = cp.status.as_ref();
        Self {
            namespace: cp.namespace().unwrap_or_else(|| "default".into()),
            name: cp.name_any(),
            access_providers: convert(status.and_then(|s| s.access_providers.as_ref())),
            credential_providers: convert(status.and_then(|s| s.credential_providers.as_ref())),
        }
    }

    /// Builds the view from a ClusterProfile in JSON form (`metadata`, `status.accessProviders`,
    /// `status.credentialProviders`).
    pub fn from_profile_json(obj: &serde_json::Value) -> Result<Self, ProfileJsonError> {
        let meta = obj
            .get("metadata")
            .ok_or_else(|| ProfileJsonError("missing metadata".into()))?;
        let name = meta
            .get("name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ProfileJsonError("missing metadata.name".into()))?;
        let namespace = meta
            .get("namespace")
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let list = |key: &str| -> Result<Vec<ProfileProvider>, ProfileJsonError> {
            match obj.get("status").and_then(|s| s.get(key)) {
                None | Some(serde_json::Value::Null) => Ok(Vec::new()),
                Some(v) => serde_json::from_value(v.clone())
                    .map_err(|e| ProfileJsonError(format!("status.{key}: {e}"))),
            }
        };
        Ok(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            access_providers: list("accessProviders")?,
            credential_providers: list("credentialProviders")?,
        })
    }
}

impl From<&ClusterProfile> for AccessProfile {
    fn from(cp: &ClusterProfile) -> Self {
        Self::from_cluster_profile(cp)
    }
}
