//! Patching for kubesim, as kube-apiserver does it: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902), strategic merge patch for built-in kinds (documented subset), and server-side
//! apply with `metadata.managedFields` (field ownership, conflicts, `force`, removal of fields
//! a manager stopped applying).
//!
//! Interface (other kubesim crates rely on it; keep it stable):
//! [`TypeInfo`] says how lists and maps merge; [`merge_patch`], [`json_patch`],
//! [`strategic_merge_patch`]; [`server_side_apply`]; [`record_update`] for non-apply writes.
//! The semantics and the supported subset are documented in this crate's `README.md`.

#![warn(missing_docs)]

mod fieldpath;
mod last_applied;
mod managed;
mod smp;
mod ssa;
mod typed;
mod types;

use serde_json::Value;

/// How lists and maps of one kind merge, from an OpenAPI schema's `x-kubernetes-list-type`,
/// `x-kubernetes-list-map-keys`, `x-kubernetes-map-type` (and for built-ins the
/// `x-kubernetes-patch-merge-key`/`-strategy` they carry upstream).
///
/// Whatever the schema says, the root `metadata` is typed as `ObjectMeta` (labels and
/// annotations granular maps, `finalizers` a set, `ownerReferences` a map-list keyed by `uid`).
#[derive(Debug, Clone, Default)]
pub struct TypeInfo {
    schema: Option<Value>,
    /// Undeclared keys of objects are struct fields (built-in Go types), not map keys.
    structs: bool,
    status_subresource: bool,
}

impl TypeInfo {
    /// Type information from an OpenAPI v3 schema of the whole object (a CRD version's
    /// `openAPIV3Schema`).
    pub fn from_schema(schema: &Value) -> Self {
        Self {
            schema: Some(schema.clone()),
            ..Self::default()
        }
    }

    /// No schema: lists are atomic, maps are granular (what kube-apiserver does for
    /// unstructured fields).
    pub fn deduced() -> Self {
        Self::default()
    }

    /// Type information of a built-in kind (`apiVersion` such as `apps/v1`, `kind` such as
    /// `Deployment`): the upstream patch metadata (merge keys, list types) of the fields listed
    /// in the README, other fields typed as structs with atomic lists. Kinds that upstream
    /// serves with a `status` subresource (Pod, Deployment, …) have it set.
    pub fn builtin(api_version: &str, kind: &str) -> Self {
        Self {
            schema: Some(types::builtin_schema(api_version, kind)),
            structs: true,
            status_subresource: types::builtin_has_status(types::group_of(api_version), kind),
        }
    }

    /// Declare whether the kind serves a `status` subresource. When it does, writes to the
    /// main resource neither set nor own `status`, and writes to `status` own only `status`
    /// (kube-apiserver's reset fields). Default: `false` (except [`TypeInfo::builtin`]).
    pub fn with_status_subresource(mut self, yes: bool) -> Self {
        self.status_subresource = yes;
        self
    }

    /// Whether the kind serves a `status` subresource.
    pub fn has_status_subresource(&self) -> bool {
        self.status_subresource
    }

    /// The schema, if any.
    pub fn schema(&self) -> Option<&Value> {
        self.schema.as_ref()
    }

    pub(crate) fn root_ty(&self) -> types::Ty<'_> {
        types::Ty::root(self.schema.as_ref(), self.structs)
    }
}

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document is malformed (400 in kube-apiserver).
    #[error("{0}")]
    BadRequest(String),
    /// The patch is well-formed but cannot be applied, e.g. a failed JSON patch `test` (422).
    #[error("{0}")]
    Invalid(String),
}

/// Server-side apply could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Other managers own fields this apply changes; kube-apiserver answers 409 with
    /// `Apply failed with N conflict(s): conflict with "mgr" using v1: .spec.x`.
    #[error("{message}")]
    Conflict {
        /// The full message.
        message: String,
        /// `(manager, field path)` per conflict.
        conflicts: Vec<(String, String)>,
    },
    /// The applied configuration is malformed (400/422).
    #[error("{0}")]
    Invalid(String),
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(live: &Value, patch: &Value) -> Value {
    let mut out = live.clone();
    json_patch::merge(&mut out, patch);
    out
}

/// RFC 6902 JSON patch. A malformed document is [`PatchError::BadRequest`]; an operation that
/// cannot be applied (including a failed `test`) is [`PatchError::Invalid`] naming the
/// operation's index, op and path.
pub fn json_patch(live: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::BadRequest(format!("invalid JSON patch: {e}")))?;
    let mut out = live.clone();
    json_patch::patch(&mut out, &ops).map_err(|e| {
        let op = patch
            .get(e.operation)
            .and_then(|o| o.get("op"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        PatchError::Invalid(format!(
            "JSON patch operation {} ({op} {}) failed: {}",
            e.operation, e.path, e.kind
        ))
    })?;
    Ok(out)
}

/// Strategic merge patch for built-in kinds; `api_version`/`kind` pick the patch metadata
/// ([`TypeInfo::builtin`]). Directives `$patch` (`replace`/`delete`/`merge`), `$retainKeys`,
/// `$deleteFromPrimitiveList/<f>` and `$setElementOrder/<f>` are honoured; lists without a
/// merge strategy are replaced and maps merge, as in a JSON merge patch.
pub fn strategic_merge_patch(
    live: &Value,
    patch: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Value, PatchError> {
    let ti = TypeInfo::builtin(api_version, kind);
    smp::patch_object(live, patch, ti.root_ty())
}

/// Parameters of one server-side apply.
#[derive(Debug, Clone)]
pub struct ApplyRequest<'a> {
    /// The field manager (`?fieldManager=`), required for apply.
    pub manager: &'a str,
    /// `?force=true`: take ownership of conflicting fields.
    pub force: bool,
    /// `None` for the main resource, `Some("status")` for the status subresource. Whether the
    /// kind has a status subresource at all is [`TypeInfo::with_status_subresource`].
    pub subresource: Option<&'a str>,
    /// RFC 3339 timestamp for the managedFields entry.
    pub now: &'a str,
}

/// Server-side apply `applied` onto `live` (`None` when creating). Returns the merged object
/// with updated `metadata.managedFields`. Fields the manager applied before and omits now are
/// removed if no other manager owns them.
///
/// An apply that changes neither the object nor any field set returns a clone of `live`
/// (managedFields byte-identical, no `time` bump), so the caller can skip the write by
/// comparing. `null` values in `applied` are dropped (they set and own nothing).
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    type_info: &TypeInfo,
    req: &ApplyRequest<'_>,
) -> Result<Value, ApplyError> {
    ssa::apply(live, applied, type_info, req)
}

/// Record a non-apply write (create/update/patch) by `manager` in `new`'s managedFields
/// (operation `Update`), taking ownership of the fields it changed relative to `old` and
/// removing them (and the fields it removed) from every other manager. Updates never
/// conflict. If nothing changed, `new` gets `old`'s managedFields unchanged. A `new` whose
/// managedFields differ from `old`'s is taken as the writer's own managedFields (as upstream);
/// an existing object without managedFields stays untracked on update (upstream
/// `skipNonAppliedManager`).
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    type_info: &TypeInfo,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    ssa::update(old, new, type_info, manager, subresource, now)
}
