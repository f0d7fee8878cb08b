//! [`Cluster`]: one simulated cluster's API machinery.

use crate::watch::WatchStream;
use crate::{
    ApiError, DeleteOptions, ListOptions, PatchType, ResourceInfo, Subresource, WatchOptions,
    WriteOptions, WriteResult,
};
use serde_json::Value;
use std::sync::Arc;

/// One simulated cluster: registry, objects, resourceVersions, watch history and verbs.
///
/// `Send + Sync`; share it as `Arc<Cluster>`. All methods are synchronous and never block on
/// I/O; locks are std locks held only for the duration of one call (never across `.await`).
#[derive(Debug)]
pub struct Cluster {
    name: String,
}

impl Cluster {
    /// A cluster with the built-in resources registered and the namespaces `default`,
    /// `kube-system`, `kube-public`, `kube-node-lease` (each with its `default`
    /// ServiceAccount). Default RBAC is not preloaded; callers `create()` what they need.
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
        })
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every served resource (built-ins, virtual resources and served CRD versions), for
    /// discovery.
    pub fn resources(&self) -> Vec<ResourceInfo> {
        Vec::new()
    }

    /// The served resource at `group`/`version`/`plural`, if any.
    pub fn resolve(&self, _group: &str, _version: &str, _plural: &str) -> Option<ResourceInfo> {
        None
    }

    /// The `openAPIV3Schema` of a served CRD version (for `/openapi/v3`); `None` for
    /// built-ins and unknown kinds.
    pub fn openapi_v3_schema(&self, _group: &str, _version: &str, _kind: &str) -> Option<Value> {
        None
    }

    /// `get`.
    pub fn get(
        &self,
        res: &ResourceInfo,
        _ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        Err(ApiError::not_found(&res.resource_group(), name))
    }

    /// `list`: a `<Kind>List` with `metadata.resourceVersion` (current cluster RV) and
    /// `metadata.continue` when paginated.
    pub fn list(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _opts: &ListOptions,
    ) -> Result<Value, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `watch`. Errors that kube-apiserver returns before streaming (bad selector) are
    /// `Err`; an expired resourceVersion yields a stream with one `ERROR` event (410).
    pub fn watch(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _opts: &WatchOptions,
    ) -> Result<WatchStream, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `create` (`POST`). `ns` is the namespace from the URL for namespaced resources.
    pub fn create(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _obj: Value,
        _opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `update` (`PUT`) of the main resource or `/status`.
    pub fn update(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _name: &str,
        _obj: Value,
        _sub: Subresource,
        _opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `patch` (`PATCH`) of the main resource or `/status`; `PatchType::Apply` is
    /// server-side apply and creates a missing object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _name: &str,
        _pt: PatchType,
        _body: &Value,
        _sub: Subresource,
        _opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `delete`: returns the deleted object (or, with finalizers, the object with its
    /// `deletionTimestamp` set).
    pub fn delete(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _name: &str,
        _opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// `deletecollection`: returns a `<Kind>List` of the deleted objects.
    pub fn delete_collection(
        &self,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _list_opts: &ListOptions,
        _opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        Err(ApiError::new(501, "NotImplemented", "not implemented"))
    }

    /// The latest resourceVersion handed out in this cluster.
    pub fn current_resource_version(&self) -> u64 {
        0
    }

    /// Keep at most `n` events of watch history per resource type (default
    /// [`crate::DEFAULT_HISTORY_LIMIT`]); older history is dropped at once.
    pub fn set_history_limit(&self, _n: usize) {}

    /// Drop all watch history: the next watch from any earlier resourceVersion gets 410.
    pub fn expire_history(&self) {}

    /// End every open watch stream (fault injection: dropped watches).
    pub fn close_watches(&self) {}

    /// Number of stored objects (all resource types).
    pub fn object_count(&self) -> usize {
        0
    }
}
