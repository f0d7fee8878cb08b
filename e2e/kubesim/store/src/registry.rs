//! The resource registry: built-in kinds and the group/version/plurals CRDs serve.

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
}
