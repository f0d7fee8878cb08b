//! CRD `openAPIV3Schema` handling for kubesim, as kube-apiserver does it: structural
//! validation (types, required, enum, pattern, formats, min/max, items, nullable …),
//! defaulting, pruning of unknown fields, and `x-kubernetes-validations` CEL rules
//! (including `oldSelf` transition rules).
//!
//! Interface (other kubesim crates rely on it; keep it stable):
//! - [`CompiledSchema::new`] compiles a schema once per CRD version (CEL parsed up front).
//! - [`CompiledSchema::apply_defaults`], [`CompiledSchema::prune`], [`CompiledSchema::validate`].
//! - [`FieldError`] renders like kube-apiserver's `field.Error` (`spec.x: Required value`).
//! - [`invalid_message`] and [`causes`] build the `Invalid` status from field errors.
//! - [`structural_errors`] lists why kube-apiserver would refuse a CRD version's schema.
//!
//! See `README.md` beside this crate for what is supported and how it differs from
//! kube-apiserver.

#![warn(missing_docs)]

mod cel_format;
mod cel_lib;
mod cel_rules;
mod cel_semver;
pub mod cel_types;
mod defaults;
mod errors;
pub mod expr;
mod formats;
mod go_regex;
mod go_url;
mod node;
mod prune;
mod structural;
mod validate;

use std::sync::Arc;

use serde_json::Value;

pub use errors::{causes, invalid_message};
use node::Node;
pub use structural::structural_errors;

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
    /// `Too long` (strings over `maxLength`)
    TooLong,
    /// `Too many` (lists over `maxItems`, objects over `maxProperties`)
    TooMany,
    /// `Invalid value` for a value of the wrong type or format (`FieldValueTypeInvalid`)
    TypeInvalid,
    /// `Duplicate value`
    Duplicate,
    /// `Forbidden`
    Forbidden,
    /// CEL evaluation could not be done (kube-apiserver reports `Invalid value` / internal error).
    InternalError,
}

/// One validation failure at a field path such as `spec.targetPorts[0].number`. As in
/// kube-apiserver, OpenAPI errors name map entries `spec.labels.app` while CEL and
/// list-type errors name them `spec.labels[app]`; errors about no field have path `<nil>`.
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
    root: Arc<Node>,
}

/// The error kube-apiserver appends instead of running CEL rules when the schema checks
/// already found a type, required, enum or size error.
const CEL_SKIPPED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

impl CompiledSchema {
    /// Compile `openAPIV3Schema`. CEL rules are parsed here. A schema kube-apiserver would
    /// reject (unknown type, bad pattern, malformed rule entry) is an error; a rule that
    /// cel-rust cannot parse or that calls a function kubesim lacks is kept and listed by
    /// [`CompiledSchema::unevaluable_rules`] (and fails validation as an internal error;
    /// kubesim-store refuses such CRDs at registration).
    pub fn new(open_api_v3_schema: &Value) -> Result<Self, SchemaError> {
        let root = Node::compile(open_api_v3_schema, "")?;
        Ok(Self {
            schema: open_api_v3_schema.clone(),
            root: Arc::new(root),
        })
    }

    /// The raw schema.
    pub fn raw(&self) -> &Value {
        &self.schema
    }

    /// Apply `default`s in place (as kube-apiserver does on create, update and read).
    pub fn apply_defaults(&self, obj: &mut Value) {
        defaults::apply(&self.root, obj);
    }

    /// Drop fields unknown to the schema unless `x-kubernetes-preserve-unknown-fields`.
    /// `apiVersion`, `kind` and `metadata` at the root are always kept. Also drops `null`
    /// in non-nullable fields that have no default, as kube-apiserver does.
    pub fn prune(&self, obj: &mut Value) {
        prune::prune(Some(&self.root), obj, true);
    }

    /// Fields `prune` would drop (for `fieldValidation=Strict|Warn`), as paths
    /// (`spec.foo`, `spec.items[0].bar`).
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        let mut out = Vec::new();
        prune::unknown(Some(&self.root), obj, true, false, "", &mut out);
        out
    }

    /// Validate `obj` (already defaulted and pruned); `old` is the stored object on
    /// update, used by CEL transition rules (`oldSelf`) and for ratcheting (unchanged
    /// values are not re-validated). Errors come in kube-apiserver's order: OpenAPI
    /// schema, list-type uniqueness, then CEL rules (skipped, with kube-apiserver's
    /// notice, when a blocking schema error exists).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate::validate(&self.root, obj, old, "", &mut errs);
        validate::list_types(&self.root, obj, old, "", &mut errs);
        for e in &mut errs {
            if e.path.is_empty() {
                e.path = "<nil>".to_string();
            }
        }
        let blocking = errs.iter().any(|e| {
            matches!(
                e.kind,
                FieldErrorKind::NotSupported
                    | FieldErrorKind::Required
                    | FieldErrorKind::TooLong
                    | FieldErrorKind::TooMany
                    | FieldErrorKind::TypeInvalid
            )
        });
        if self.root.has_rules {
            if blocking {
                errs.push(FieldError::invalid("<nil>", &Value::Null, CEL_SKIPPED));
            } else {
                cel_rules::validate(&self.root, obj, old, "", true, false, &mut errs);
            }
        }
        errs
    }

    /// CEL rules this implementation cannot evaluate (documented, never silently passed:
    /// `validate` reports them as errors).
    pub fn unevaluable_rules(&self) -> Vec<String> {
        let mut rules = Vec::new();
        self.root.collect_rules(&mut rules);
        rules
            .into_iter()
            .filter(|r| r.unsupported.is_some())
            .map(|r| r.rule.clone())
            .collect()
    }

    /// `(rule, why)` for every CEL rule this implementation cannot evaluate: what a CRD
    /// registration refuses with (kubesim will not serve a CRD whose rules it would have
    /// to skip or fail on every write).
    pub fn unevaluable_rule_reasons(&self) -> Vec<(String, String)> {
        let mut rules = Vec::new();
        self.root.collect_rules(&mut rules);
        rules
            .into_iter()
            .filter_map(|r| Some((r.rule.clone(), r.unsupported.clone()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn compiled_schema_can_be_shared_across_threads() {
        assert_send_sync::<CompiledSchema>();
        let schema = CompiledSchema::new(&serde_json::json!({
            "type": "object",
            "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [{"rule": "has(self.a)", "message": "a is required"}],
                "properties": {"a": {"type": "string"}}}}
        }))
        .unwrap();
        let schema = Arc::new(schema);
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let schema = schema.clone();
                std::thread::spawn(move || {
                    let obj = if i % 2 == 0 {
                        serde_json::json!({"spec": {"a": "x"}})
                    } else {
                        serde_json::json!({"spec": {}})
                    };
                    schema.validate(&obj, None).len()
                })
            })
            .collect();
        let counts: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(counts, vec![0, 1, 0, 1]);
    }
}
