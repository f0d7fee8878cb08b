//! One simulated cluster's API machinery, independent of HTTP: the resource registry
//! (built-in kinds and CRDs), object storage with a cluster-wide monotonic resourceVersion,
//! watch history and fan-out, and the verbs with kube-apiserver's semantics.
//!
//! The HTTP layer (the `kubesim` crate) maps requests onto [`Cluster`] calls.
//!
//! # What it reproduces
//! - **Registry**: namespaces, pods, serviceaccounts (+ `token` subresource listed),
//!   secrets, configmaps, core and `events.k8s.io` events, leases, RBAC, CRDs, and the
//!   create-only virtual `tokenreviews` / `*subjectaccessreviews` (listed for discovery;
//!   every store verb on them is 405, the HTTP layer answers them).
//! - **CRDs**: validated (group, names, `metadata.name`, scope, exactly one storage
//!   version, schemas compiled by `kubesim-schema`; group, plural and scope immutable);
//!   every `served` version is registered; status gets `NamesAccepted`/`Established`,
//!   `acceptedNames`, `storedVersions` in a second write (as the controllers would).
//!   Objects are stored once under the storage version and served under any served
//!   version with `apiVersion` rewritten (conversion `None`). Deleting a CRD deletes its
//!   objects (without waiting for their finalizers) and ends its watches.
//! - **Events**: `events.k8s.io/v1` Events are stored as core/v1 Events (`regarding` ↔
//!   `involvedObject`, `note` ↔ `message`, `deprecated*` ↔ their core names,
//!   `reportingController` ↔ `reportingComponent`), so both APIs see the same objects.
//! - **Custom resources**: defaults → unknown fields per `fieldValidation` (`Strict`: 400
//!   `strict decoding error: unknown field "spec.x"` as kube-apiserver's decoder answers;
//!   `Warn`: warning) → prune → validate with `old` (CEL) → 422 `Invalid` with causes.
//! - **Metadata**: uid, creationTimestamp, cluster-wide monotonic resourceVersion,
//!   generation (custom resources and CRDs; bumped when anything outside metadata — and
//!   status, when it is a subresource — changes, and on deletion with finalizers),
//!   generateName (prefix cut to 58 characters before the 5-character suffix, as
//!   kube-apiserver's name generator does), name validation per resource with
//!   kube-apiserver's messages ([`kinds::name_rule`]: DNS-1123 subdomain of at most 253
//!   characters with no per-part limit for most kinds and every custom resource; DNS-1123
//!   label for namespaces; DNS-1035 label for services; path segment for RBAC; none for
//!   core/v1 events; `generateName` checked as a prefix too), label validation, immutable ConfigMaps/Secrets, managedFields via
//!   `kubesim-apply` (built-in merge keys; `status` reset fields when it is a
//!   subresource). A write whose
//!   result equals the stored object (ignoring managedFields timestamps) stores nothing,
//!   emits nothing and keeps the resourceVersion.
//! - **Deletion**: preconditions, finalizers (`deletionTimestamp`,
//!   `deletionGracePeriodSeconds: 0`; removal when the last finalizer goes), ownerReference
//!   garbage collection **synchronously inside the deleting call** (`Background`: dependents
//!   whose every owner is gone; `Foreground`: dependents first, then the owner; `Orphan`:
//!   ownerReferences removed; an object written with ownerReferences whose owners all do
//!   not exist in its namespace or at cluster scope — e.g. a UID from another cluster — is
//!   deleted right after the write), namespace termination (phase `Terminating`, content deleted,
//!   namespace removed once empty and without finalizers; creates into it are 403).
//! - **List/watch**: full label-selector syntax, field selectors (`metadata.name`,
//!   `metadata.namespace`, a per-kind subset, CRD `selectableFields`), `limit`/`continue`
//!   in namespace/name order, watch from a resourceVersion with 410 `Expired` beyond the
//!   kept history, selector transitions as ADDED/DELETED, bookmarks,
//!   `sendInitialEvents`, `timeoutSeconds`.
//!
//! # Scale
//! Objects are kept as compact JSON (about 1 KiB RSS per small object instead of ~7 KiB
//! as parsed `serde_json::Value`s), indexed per resource type in a `BTreeMap` by
//! (namespace, name). An event is fanned out only to the watchers of its type. Watch
//! history is bounded per cluster ([`DEFAULT_HISTORY_LIMIT`] events over all types).
//! One std `RwLock` per cluster, never held across `.await`. [`Cluster::write_counts`]
//! counts stored writes per type (for "no writes on resync" measurements).
//!
//! # Known differences from kube-apiserver
//! - list ignores `resourceVersion`/`resourceVersionMatch` (always the latest state, with
//!   the current resourceVersion); no `remainingItemCount`.
//! - built-in kinds are not schema-validated (no unknown-field detection, no pod-spec
//!   immutability); pods get only `status.phase: Pending` and are deleted at once (there
//!   is no kubelet); no `kube-root-ca.crt` ConfigMaps.
//! - `Foreground` deletion does not wait for dependents that have finalizers; continue
//!   tokens are not snapshots (stable order, nothing skipped or repeated if nothing changes).
//! - CRD name conflicts are not detected (`NamesAccepted` is always `True`); the
//!   `customresourcecleanup` finalizer is not added.
//! - custom-resource defaults are applied on write, not again on read.
//! - a watch from a resourceVersion newer than the current one starts from there instead
//!   of waiting.

#![warn(missing_docs)]

mod admission;
pub mod cluster;
mod convert;
pub mod crd;
mod delete;
pub mod error;
pub mod kinds;
pub mod meta;
pub mod registry;
pub mod selector;
mod state;
pub mod watch;
mod write;

pub use admission::RequestUser;
pub use cluster::Cluster;
pub use error::ApiError;
pub use registry::{ResourceInfo, SubresourceInfo};
pub use watch::WatchStream;

/// Default number of watch events kept per cluster, over all its resource types (see
/// [`Cluster::set_history_limit`]). A watch from a resourceVersion older than the oldest
/// kept event of its type gets 410 `Expired`.
pub const DEFAULT_HISTORY_LIMIT: usize = 10_000;

use serde_json::Value;

/// Which subresource a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// The main resource.
    Main,
    /// `/status`.
    Status,
}

/// Patch content types kube-apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply; body already parsed to JSON)
    Apply,
}

/// `?fieldValidation=` (kube-apiserver default: `Warn` for most clients; kubectl sends `Strict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and return warnings.
    #[default]
    Warn,
    /// Reject unknown or duplicate fields.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `?dryRun=All`: validate and return the result, store nothing.
    pub dry_run: bool,
    /// `?fieldManager=`; defaults per kube-apiserver from the user agent when empty.
    pub field_manager: String,
    /// `?force=true` (apply only).
    pub force: bool,
    /// `?fieldValidation=`.
    pub field_validation: FieldValidation,
    /// The requesting user, as validating admission policies see it (`request.userInfo`);
    /// `None` for in-process writes, which policies see as an empty user.
    pub user: Option<RequestUser>,
}

/// The result of a write: the stored (or dry-run) object and warnings for the `Warning` header.
#[derive(Debug, Clone)]
pub struct WriteResult {
    /// The object as stored.
    pub object: Value,
    /// `true` when a create happened (201 rather than 200).
    pub created: bool,
    /// Warnings (e.g. unknown fields under `fieldValidation=Warn`).
    pub warnings: Vec<String>,
    /// `object` as compact JSON, when the store has it already (it serialised the object
    /// to store it, and the served form is byte for byte the stored one): saves the
    /// HTTP layer serialising it again. `None` means "serialise `object`".
    pub json: Option<std::sync::Arc<str>>,
}

/// `?labelSelector=`, `?fieldSelector=`, `?limit=`, `?continue=`, `?resourceVersion=`.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// Full label selector syntax (`a=b,c!=d,e in (f,g),!h,i`).
    pub label_selector: Option<String>,
    /// `metadata.name=x,metadata.namespace!=y` (plus per-kind fields where supported).
    pub field_selector: Option<String>,
    /// Page size.
    pub limit: Option<usize>,
    /// Continue token from a previous page.
    pub continue_token: Option<String>,
    /// `resourceVersion` for list (`""`, `"0"` or an exact/not-older-than version).
    pub resource_version: Option<String>,
}

/// `?watch=true` options.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// Selectors as for list.
    pub label_selector: Option<String>,
    /// Selectors as for list.
    pub field_selector: Option<String>,
    /// Start after this resourceVersion (`None`/`"0"`: synthetic ADDED for current state).
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks=true`.
    pub allow_bookmarks: bool,
    /// `sendInitialEvents=true` (with `resourceVersionMatch=NotOlderThan`).
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<u64>,
}

/// One watch event as kube-apiserver streams it: `{"type": ..., "object": ...}`.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    pub event_type: &'static str,
    /// The object (a `Status` for `ERROR`).
    pub object: Value,
}

/// `DeleteOptions` body / query.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub precondition_resource_version: Option<String>,
    /// `propagationPolicy`: `Orphan`, `Background` (default) or `Foreground`.
    pub propagation_policy: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// The requesting user, as validating admission policies see it.
    pub user: Option<RequestUser>,
}
