//! Upstream kinds kleym reads or writes, modelled field-for-field from the CRDs in
//! `e2e/crds/upstream/`. kleym never installs these CRDs, so the types carry no schema
//! (`schema = "disabled"`); optional upstream fields are `Option`s so that objects
//! round-trip through serde unchanged.

pub mod clusterprofile;
pub mod model;
pub mod objective;
pub mod pool;
pub mod spiffeid;

use serde::{Deserialize, Serialize};

/// `poolRef` of an InferenceObjective or InferenceModel: a pool in the same namespace.
///
/// `group` and `kind` are defaulted by the apiserver; the defaults differ per kind (see
/// `pool_group()` on each spec), so unset values are kept as `None` here.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolObjectReference {
    /// API group of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the pool (`InferencePool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the pool.
    pub name: String,
}

impl PoolObjectReference {
    /// The effective group, with `default` applied when unset.
    pub fn group_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.group.as_deref().unwrap_or(default)
    }

    /// The effective kind (`InferencePool` when unset).
    pub fn kind_or_default(&self) -> &str {
        self.kind.as_deref().unwrap_or(pool::KIND)
    }
}
