//! CRD `openAPIV3Schema` handling for kubesim, as kube-apiserver does it: structural
//! validation (types, required, enum, pattern, formats, min/max, items, nullable …),
//! defaulting, pruning of unknown fields, and `x-kubernetes-validations` CEL rules
//! (including `oldSelf` transition rules).
//!
//! Interface (other kubesim crates rely on it; keep it stable):
//! - [`CompiledSchema::new`] compiles a schema once per CRD version (CEL parsed up front).
//! - [`CompiledSchema::apply_defaults`], [`CompiledSchema::prune`], [`CompiledSchema::validate`].
//! - [`FieldError`] renders like kube-apiserver's `field.Error` (`spec.x: Required value`).

use serde_json::Value;

/// Why a schema could not be compiled (a CRD with such a schema is rejected).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The schema is not a structural schema kube-apiserver would accept.
    #[error("invalid schema at {path}: {message}")]
    Invalid {
        /// JSON path inside the schema.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The kind of a validation failure, mirroring `k8s.io/apimachinery/pkg/util/validation/field`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`
    Required,
    /// `Invalid value`
    Invalid,
    /// `Unsupported value` (enum)
    NotSupported,
    /// `Too long` / `Too many`
    TooLong,
    /// `Duplicate value`
    Duplicate,
    /// `Forbidden`
    Forbidden,
    /// CEL evaluation could not be done (kube-apiserver reports `Invalid value` / internal error).
    InternalError,
}

/// One validation failure at a field path such as `spec.podSelector.matchLabels[app]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path in kube-apiserver notation (`spec.items[0].name`).
    pub path: String,
    /// The failure class.
    pub kind: FieldErrorKind,
    /// Full detail, e.g. `Invalid value: "integer": spec.x in body must be of type string: "integer"`.
    pub detail: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.detail)
    }
}

/// A compiled `openAPIV3Schema` of one CRD version.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    schema: Value,
}

impl CompiledSchema {
    /// Compile `openAPIV3Schema`. CEL rules are parsed here; a rule that cannot be compiled
    /// is an error (kube-apiserver rejects such CRDs).
    pub fn new(open_api_v3_schema: &Value) -> Result<Self, SchemaError> {
        Ok(Self {
            schema: open_api_v3_schema.clone(),
        })
    }

    /// The raw schema.
    pub fn raw(&self) -> &Value {
        &self.schema
    }

    /// Apply `default`s in place (as kube-apiserver does on create, update and read).
    pub fn apply_defaults(&self, _obj: &mut Value) {}

    /// Drop fields unknown to the schema unless `x-kubernetes-preserve-unknown-fields`.
    /// `apiVersion`, `kind` and `metadata` at the root are always kept.
    pub fn prune(&self, _obj: &mut Value) {}

    /// Fields `prune` would drop (for `fieldValidation=Strict|Warn`), as paths.
    pub fn unknown_fields(&self, _obj: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Validate `obj` (already defaulted and pruned); `old` is the stored object on
    /// update, used by CEL transition rules (`oldSelf`).
    pub fn validate(&self, _obj: &Value, _old: Option<&Value>) -> Vec<FieldError> {
        Vec::new()
    }

    /// CEL rules this implementation cannot evaluate (documented, never silently passed:
    /// `validate` reports them as errors).
    pub fn unevaluable_rules(&self) -> Vec<String> {
        Vec::new()
    }
}
