//! SIG-Multicluster `ClusterProfile` (`multicluster.x-k8s.io`, namespaced): the hub's
//! cluster inventory.
//!
//! **Two API versions, one type.** cluster-inventory-api v0.2.0 serves `v1alpha1` (the
//! storage version) and `v1alpha2`; the schemas differ only in what v1alpha2 leaves out
//! (`status.credentialProviders`) and validates more strictly, and the API server converts
//! between them by rewriting `apiVersion`. So [`ClusterProfile`] (typed as v1alpha1, the
//! version every cluster serves) holds a profile read through either; a profile read through
//! a version picked at run time arrives as a [`VersionedClusterProfile`] and becomes a
//! [`ClusterProfile`] with [`ClusterProfile::from_versioned`], which drops what that version
//! does not define.
//!
//! **Decoding is tolerant.** A list or watch decodes every object of a response, so one
//! profile that the typed fields cannot hold (a `certificate-authority-data` that is valid
//! for the API server's base64 check but not for a strict decoder, a timestamp without a
//! zone, an object stored before a schema change) would otherwise fail the whole list — for
//! every profile, forever. Instead, [`ClusterProfileSpec`] and [`ClusterProfileStatus`] never
//! fail to decode from any JSON: what does not fit is left out and recorded, with its path
//! from the object root and the decoder's message, in their `decode_issues`. Consumers decide
//! what such a profile means (the hub refuses it, naming the field).

use std::fmt;

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Kind name.
pub const KIND: &str = "ClusterProfile";
/// Group.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// Condition type telling whether the cluster's control plane is healthy.
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";
/// Plural resource name.
pub const PLURAL: &str = "clusterprofiles";
/// Label marking ClusterProfiles that describe the same member cluster (several cluster
/// managers, or several inventory namespaces, listing one cluster): same member, same value.
pub const INVENTORY_MEMBER_ID_LABEL: &str = "multicluster.x-k8s.io/inventory-member-id";

/// A ClusterProfile API version kleym can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterProfileVersion {
    /// `v1alpha1`: the storage version of cluster-inventory-api v0.2.0; carries the deprecated
    /// `status.credentialProviders` beside `status.accessProviders`.
    V1alpha1,
    /// `v1alpha2`: `accessProviders` only, stricter validation.
    V1alpha2,
}

impl ClusterProfileVersion {
    /// Every version, oldest first.
    pub const ALL: [Self; 2] = [Self::V1alpha1, Self::V1alpha2];

    /// The version as the API names it (`v1alpha2`).
    pub fn version(self) -> &'static str {
        match self {
            Self::V1alpha1 => "v1alpha1",
            Self::V1alpha2 => "v1alpha2",
        }
    }

    /// The `apiVersion` of objects in this version (`multicluster.x-k8s.io/v1alpha2`).
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1alpha1 => "multicluster.x-k8s.io/v1alpha1",
            Self::V1alpha2 => "multicluster.x-k8s.io/v1alpha2",
        }
    }

    /// Parses `v1alpha1` / `v1alpha2`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.version() == s)
    }

    /// Whether this version defines `status.credentialProviders` (only v1alpha1 does; a
    /// consumer reading v1alpha2 uses `accessProviders` alone, as upstream's access library
    /// does).
    pub fn has_credential_providers(self) -> bool {
        self == Self::V1alpha1
    }

    /// The resource in this version, for [`kube::Api::all_with`] and friends.
    pub fn api_resource(self) -> kube::core::ApiResource {
        kube::core::ApiResource {
            group: GROUP.to_string(),
            version: self.version().to_string(),
            api_version: self.api_version().to_string(),
            kind: KIND.to_string(),
            plural: PLURAL.to_string(),
        }
    }
}

impl fmt::Display for ClusterProfileVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_version())
    }
}

/// A ClusterProfile read through a version chosen at run time (decoding is as tolerant as
/// [`ClusterProfile`]'s).
pub type VersionedClusterProfile = kube::core::Object<ClusterProfileSpec, ClusterProfileStatus>;

impl ClusterProfile {
    /// The profile `obj`, read through `version`, as a [`ClusterProfile`]: what `version`
    /// does not define is dropped (an API server prunes it; this makes sure).
    pub fn from_versioned(obj: VersionedClusterProfile, version: ClusterProfileVersion) -> Self {
        let mut status = obj.status;
        if !version.has_credential_providers()
            && let Some(s) = status.as_mut()
        {
            s.credential_providers = None;
        }
        Self {
            metadata: obj.metadata,
            spec: obj.spec,
            status,
        }
    }

    /// The `inventory-member-id` label, when set and non-empty.
    pub fn inventory_member_id(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(INVENTORY_MEMBER_ID_LABEL)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Spec of a ClusterProfile.
///
/// Decoding never fails (see the module documentation): a spec that does not decode becomes
/// the default spec with [`ClusterProfileSpec::decode_issues`] set.
#[derive(CustomResource, Serialize, Debug, Clone, PartialEq, Default)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    namespaced,
    status = "ClusterProfileStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileSpec {
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// The cluster manager that owns this profile.
    pub cluster_manager: ClusterManager,
    /// What of the received spec did not decode (then the other fields are defaults). Empty
    /// for a spec built in code; never serialized.
    #[serde(skip)]
    pub decode_issues: Vec<DecodeIssue>,
}

/// The cluster manager of a profile.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterManager {
    /// Manager name.
    pub name: String,
}

/// Status of a ClusterProfile.
///
/// Decoding never fails (see the module documentation): each top-level field that does not
/// decode is left `None` and reported in [`ClusterProfileStatus::decode_issues`].
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// How to reach the cluster, per access provider (KEP-4322, formerly KEP-5339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_providers: Option<Vec<AccessProvider>>,
    /// Deprecated predecessor of `accessProviders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_providers: Option<Vec<AccessProvider>>,
    /// Conditions (e.g. `ControlPlaneHealthy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Named properties (e.g. `kleym.io/trust-domain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Vec<Property>>,
    /// Version information.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ClusterVersion>,
    /// The fields of the received status that did not decode (each left `None` above). Empty
    /// for a status built in code; never serialized.
    #[serde(skip)]
    pub decode_issues: Vec<DecodeIssue>,
}

/// One access provider entry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AccessProvider {
    /// Provider name, matched against the controller's provider configuration.
    pub name: String,
    /// Connection details (a kubeconfig `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
}

/// A kubeconfig `cluster` stanza (note the kebab-case JSON keys).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// API server URL.
    pub server: String,
    /// Path to a CA file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    /// PEM CA bundle (base64 in JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<ByteString>,
    /// Disable response compression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_compression: Option<bool>,
    /// Named extensions (e.g. `client.authentication.k8s.io/exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<NamedExtension>>,
    /// Skip TLS verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
    /// Proxy URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    /// TLS server name override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

/// A named kubeconfig extension; the payload is arbitrary JSON.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NamedExtension {
    /// Extension name.
    pub name: String,
    /// Extension payload.
    pub extension: serde_json::Value,
}

/// A named property of the cluster.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Property {
    /// Property name (1–253 characters).
    pub name: String,
    /// Property value (1–1024 characters).
    pub value: String,
    /// When the value was last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<Time>,
}

/// Version information of the cluster.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterVersion {
    /// Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
}

/// A part of a received ClusterProfile that did not decode into the typed fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeIssue {
    /// JSON path from the object root, e.g.
    /// `status.accessProviders[0].cluster.certificate-authority-data`.
    pub path: String,
    /// What the decoder said.
    pub message: String,
}

impl fmt::Display for DecodeIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Decodes `value` (found at `path`) as `T`; on failure the issue names the exact field.
fn decode_at<T: serde::de::DeserializeOwned>(value: &Value, path: &str) -> Result<T, DecodeIssue> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let path = match inner.as_str() {
            "." => path.to_string(),
            p if p.starts_with('[') => format!("{path}{p}"),
            p => format!("{path}.{p}"),
        };
        DecodeIssue {
            path,
            message: e.into_inner().to_string(),
        }
    })
}

impl<'de> Deserialize<'de> for ClusterProfileSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `Option` so that a missing `spec` arrives here as `None` instead of failing the
        // whole object.
        let raw = Option::<Value>::deserialize(deserializer)?;
        Ok(Self::from_json(raw.as_ref()))
    }
}

impl ClusterProfileSpec {
    /// Decodes a received spec (`None`: absent); never fails, see the module documentation.
    pub fn from_json(raw: Option<&Value>) -> Self {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Strict {
            #[serde(default)]
            display_name: Option<String>,
            cluster_manager: ClusterManager,
        }
        let Some(raw) = raw.filter(|v| !v.is_null()) else {
            return Self {
                decode_issues: vec![DecodeIssue {
                    path: "spec".into(),
                    message: "missing".into(),
                }],
                ..Self::default()
            };
        };
        match decode_at::<Strict>(raw, "spec") {
            Ok(s) => Self {
                display_name: s.display_name,
                cluster_manager: s.cluster_manager,
                decode_issues: Vec::new(),
            },
            Err(issue) => Self {
                decode_issues: vec![issue],
                ..Self::default()
            },
        }
    }
}

impl<'de> Deserialize<'de> for ClusterProfileStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        Ok(Self::from_json(&raw))
    }
}

impl ClusterProfileStatus {
    /// Decodes a received status field by field; never fails, see the module documentation.
    pub fn from_json(raw: &Value) -> Self {
        let mut out = Self::default();
        let Some(obj) = raw.as_object() else {
            out.decode_issues.push(DecodeIssue {
                path: "status".into(),
                message: format!("expected an object, found {}", json_kind(raw)),
            });
            return out;
        };
        let mut issues = Vec::new();
        let field = |key: &str| -> Option<&Value> { obj.get(key).filter(|v| !v.is_null()) };
        fn take<T: serde::de::DeserializeOwned>(
            v: Option<&Value>,
            key: &str,
            issues: &mut Vec<DecodeIssue>,
        ) -> Option<T> {
            match decode_at(v?, &format!("status.{key}")) {
                Ok(t) => Some(t),
                Err(issue) => {
                    issues.push(issue);
                    None
                }
            }
        }
        out.access_providers = take(field("accessProviders"), "accessProviders", &mut issues);
        out.credential_providers = take(
            field("credentialProviders"),
            "credentialProviders",
            &mut issues,
        );
        out.conditions = take(field("conditions"), "conditions", &mut issues);
        out.properties = take(field("properties"), "properties", &mut issues);
        out.version = take(field("version"), "version", &mut issues);
        out.decode_issues = issues;
        out
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(status: Value) -> ClusterProfile {
        serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "m"}},
            "status": status
        }))
        .expect("decoding a ClusterProfile never fails on its content")
    }

    #[test]
    fn undecodable_status_fields_are_recorded_with_their_path() {
        let cases = [
            (
                json!({"accessProviders": [{"name": "p", "cluster": {"server": "https://h"}},
                    {"name": "q", "cluster": {"server": "https://h",
                        "certificate-authority-data": "QR=="}}]}),
                "status.accessProviders[1].cluster.certificate-authority-data",
            ),
            (
                json!({"accessProviders": [{"name": "p", "cluster": {}}]}),
                "status.accessProviders[0].cluster",
            ),
            (
                json!({"accessProviders": [{"name": "p", "cluster": {"server": "https://h",
                    "insecure-skip-tls-verify": "yes"}}]}),
                "status.accessProviders[0].cluster.insecure-skip-tls-verify",
            ),
            (
                json!({"conditions": [{"type": "ControlPlaneHealthy", "status": "True",
                    "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00"}]}),
                "status.conditions[0].lastTransitionTime",
            ),
            (
                json!({"properties": [{"name": "a", "value": "b",
                    "lastObservedTime": "yesterday"}]}),
                "status.properties[0].lastObservedTime",
            ),
            (
                json!({"credentialProviders": {"x": 1}}),
                "status.credentialProviders",
            ),
            (json!(["not", "an", "object"]), "status"),
        ];
        for (status, path) in cases {
            let cp = decode(status.clone());
            let s = cp.status.unwrap_or_default();
            assert_eq!(
                s.decode_issues
                    .iter()
                    .map(|i| i.path.as_str())
                    .collect::<Vec<_>>(),
                vec![path],
                "{status}"
            );
        }
    }

    #[test]
    fn one_bad_field_leaves_the_others_decoded() {
        let cp = decode(json!({
            "accessProviders": [{"name": "p", "cluster": {"server": "https://h"}}],
            "properties": [{"name": "a", "value": "b", "lastObservedTime": "x"}]
        }));
        let s = cp.status.unwrap();
        assert!(s.properties.is_none());
        assert_eq!(s.access_providers.unwrap()[0].name, "p");
        assert_eq!(s.decode_issues.len(), 1);
        // A clean status has no issues and serializes without the bookkeeping field.
        let clean = decode(json!({"accessProviders": []}));
        let st = clean.status.as_ref().unwrap();
        assert!(st.decode_issues.is_empty());
        assert_eq!(
            serde_json::to_value(st).unwrap(),
            json!({"accessProviders": []})
        );
    }

    #[test]
    fn missing_or_bad_spec_is_recorded_not_fatal() {
        let base = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet"}});
        let cp: ClusterProfile = serde_json::from_value(base.clone()).unwrap();
        assert_eq!(cp.spec.decode_issues[0].path, "spec");
        let mut bad = base;
        bad["spec"] = json!({"clusterManager": {"name": 7}});
        let cp: ClusterProfile = serde_json::from_value(bad).unwrap();
        assert_eq!(cp.spec.decode_issues[0].path, "spec.clusterManager.name");
        let good: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": "c1"}, "spec": {"clusterManager": {"name": "m"}}}))
        .unwrap();
        assert!(good.spec.decode_issues.is_empty());
        assert_eq!(good.spec.cluster_manager.name, "m");
    }

    #[test]
    fn a_list_with_one_bad_profile_decodes_every_item() {
        // What a watcher's initial list does: one response, every item decoded.
        let list: kube::core::ObjectList<ClusterProfile> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"},
            "items": [
                {"metadata": {"name": "good"}, "spec": {"clusterManager": {"name": "m"}},
                 "status": {"accessProviders": [{"name": "p", "cluster": {"server": "https://h"}}]}},
                {"metadata": {"name": "bad"}, "spec": {"clusterManager": {"name": "m"}},
                 "status": {"accessProviders": [{"name": "p", "cluster": {"server": "https://h",
                    "certificate-authority-data": "QR=="}}]}}
            ]
        }))
        .unwrap();
        assert_eq!(list.items.len(), 2);
        assert!(
            list.items[0]
                .status
                .as_ref()
                .unwrap()
                .decode_issues
                .is_empty()
        );
        assert!(
            !list.items[1]
                .status
                .as_ref()
                .unwrap()
                .decode_issues
                .is_empty()
        );
    }

    #[test]
    fn a_profile_read_as_v1alpha2_keeps_no_credential_providers() {
        let raw = json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha2",
            "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet",
                "labels": {INVENTORY_MEMBER_ID_LABEL: "member-1"}},
            "spec": {"clusterManager": {"name": "m"}},
            "status": {
                "accessProviders": [{"name": "a", "cluster": {"server": "https://a"}}],
                "credentialProviders": [{"name": "c", "cluster": {"server": "https://c"}}]
            }
        });
        for version in ClusterProfileVersion::ALL {
            let obj: VersionedClusterProfile = serde_json::from_value(raw.clone()).unwrap();
            let cp = ClusterProfile::from_versioned(obj, version);
            let status = cp.status.as_ref().unwrap();
            assert_eq!(status.access_providers.as_ref().unwrap()[0].name, "a");
            assert_eq!(
                status.credential_providers.is_some(),
                version == ClusterProfileVersion::V1alpha1,
                "{version}"
            );
            assert_eq!(cp.inventory_member_id(), Some("member-1"));
            assert_eq!(cp.metadata.name.as_deref(), Some("c1"));
        }
    }

    #[test]
    fn an_empty_member_id_is_no_member_id() {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "metadata": {"name": "c1", "labels": {INVENTORY_MEMBER_ID_LABEL: ""}},
            "spec": {"clusterManager": {"name": "m"}}
        }))
        .unwrap();
        assert_eq!(cp.inventory_member_id(), None);
    }

    #[test]
    fn versions_parse_and_name_themselves() {
        for v in ClusterProfileVersion::ALL {
            assert_eq!(ClusterProfileVersion::parse(v.version()), Some(v));
            assert_eq!(v.api_resource().api_version, v.api_version());
            assert_eq!(v.to_string(), v.api_version());
        }
        assert_eq!(ClusterProfileVersion::parse("v1beta1"), None);
    }
}
