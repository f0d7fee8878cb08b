//! The resource registry: built-in kinds and the group/version/plurals CRDs serve.

use serde_json::Value;

/// A subresource other than `status` that discovery lists (e.g. `serviceaccounts/token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubresourceInfo {
    /// Subresource name (`token`).
    pub name: String,
    /// Group of the subresource's kind (`authentication.k8s.io`).
    pub group: String,
    /// Version of the subresource's kind (`v1`).
    pub version: String,
    /// Kind (`TokenRequest`).
    pub kind: String,
    /// Verbs (`create`).
    pub verbs: Vec<String>,
}

/// One served resource (a group/version/plural), as discovery lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group (`""` for core).
    pub group: String,
    /// Version (`v1`, `v1alpha1` …).
    pub version: String,
    /// Plural resource name (`pods`).
    pub plural: String,
    /// Singular name (`pod`).
    pub singular: String,
    /// Kind (`Pod`).
    pub kind: String,
    /// `ListKind` (`PodList`).
    pub list_kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Verbs for discovery.
    pub verbs: Vec<String>,
    /// Short names (`po`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource.
    pub has_status: bool,
    /// Whether this version is the storage version (CRDs) / preferred.
    pub storage: bool,
    /// Other subresources discovery lists (`serviceaccounts/token`); their logic is the HTTP
    /// layer's.
    pub subresources: Vec<SubresourceInfo>,
    /// Create-only virtual resources (`tokenreviews`, `subjectaccessreviews` …): the store
    /// keeps nothing for them; the HTTP layer answers them.
    pub virtual_only: bool,
    /// CRD `additionalPrinterColumns` of this version (raw), for Table output.
    pub printer_columns: Vec<Value>,
    /// `true` for resources served from a CustomResourceDefinition.
    pub custom: bool,
}

impl ResourceInfo {
    /// `group/version`, or `version` for the core group (the `apiVersion` of objects).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, or `plural` for the core group, as kube-apiserver names a resource in
    /// messages (`pods`, `clusterspiffeids.spire.spiffe.io`).
    pub fn resource_group(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}
