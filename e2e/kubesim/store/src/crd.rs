//! CustomResourceDefinition validation, the resources a CRD serves, and the status the
//! apiextensions controllers would set.

use crate::ResourceInfo;
use crate::meta::{Cause, is_dns_subdomain};
use kubesim_apply::TypeInfo;
use kubesim_schema::CompiledSchema;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One served (or stored) version of a CRD.
#[derive(Debug, Clone)]
pub struct CrdVersion {
    /// Version name.
    pub name: String,
    /// `served`.
    pub served: bool,
    /// `storage`.
    pub storage: bool,
    /// Compiled `schema.openAPIV3Schema`.
    pub schema: Arc<CompiledSchema>,
    /// Raw `openAPIV3Schema`.
    pub raw_schema: Value,
    /// Merge semantics for server-side apply, from the schema.
    pub type_info: Arc<TypeInfo>,
    /// `subresources.status` present.
    pub has_status: bool,
    /// `additionalPrinterColumns`.
    pub printer_columns: Vec<Value>,
    /// `selectableFields[].jsonPath` without the leading dot.
    pub selectable_fields: Vec<String>,
}

/// A validated CRD.
#[derive(Debug, Clone)]
pub struct CrdDef {
    /// `metadata.name` (`<plural>.<group>`).
    pub name: String,
    /// `spec.group`.
    pub group: String,
    /// `spec.names.plural`.
    pub plural: String,
    /// `spec.names.singular` (defaulted to lower-case kind).
    pub singular: String,
    /// `spec.names.kind`.
    pub kind: String,
    /// `spec.names.listKind` (defaulted to `<kind>List`).
    pub list_kind: String,
    /// `spec.names.shortNames`.
    pub short_names: Vec<String>,
    /// `spec.names.categories`.
    pub categories: Vec<String>,
    /// `spec.scope == Namespaced`.
    pub namespaced: bool,
    /// Versions by name.
    pub versions: BTreeMap<String, CrdVersion>,
    /// The storage version's name.
    pub storage_version: String,
}

impl CrdDef {
    /// `<plural>.<group>`: the storage key of its objects.
    pub fn type_key(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The ResourceInfo of each served version.
    pub fn resources(&self) -> Vec<ResourceInfo> {
        self.versions
            .values()
            .filter(|v| v.served)
            .map(|v| ResourceInfo {
                group: self.group.clone(),
                version: v.name.clone(),
                plural: self.plural.clone(),
                singular: self.singular.clone(),
                kind: self.kind.clone(),
                list_kind: self.list_kind.clone(),
                namespaced: self.namespaced,
                verbs: [
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "create",
                    "update",
                    "watch",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                short_names: self.short_names.clone(),
                categories: self.categories.clone(),
                has_status: v.has_status,
                storage: v.storage,
                subresources: Vec::new(),
                virtual_only: false,
                printer_columns: v.printer_columns.clone(),
                custom: true,
            })
            .collect()
    }
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn cause(reason: &'static str, field: &str, detail: String) -> Cause {
    Cause {
        reason: reason.to_string(),
        field: field.to_string(),
        detail,
    }
}

/// Validate a CRD object as kube-apiserver's `ValidateCustomResourceDefinition` does (the
/// parts kubesim relies on) and compile its schemas.
pub fn parse_crd(obj: &Value) -> Result<CrdDef, Vec<Cause>> {
    compiled::parse_cached(obj)
}

/// A process-wide memo of valid CRDs: compiling schemas (regexes, CEL) is the bulk of
/// installing a CRD, and a fleet of simulated clusters installs the same CRDs in every
/// cluster (and parses each one again when it is established or updated).
mod compiled {
    use super::{Cause, CrdDef};
    use serde_json::Value;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};

    /// More distinct CRDs than this and the memo starts over (tests that generate CRDs
    /// must not grow it without bound).
    const CAPACITY: usize = 256;

    fn memo() -> &'static Mutex<HashMap<String, CrdDef>> {
        static MEMO: OnceLock<Mutex<HashMap<String, CrdDef>>> = OnceLock::new();
        MEMO.get_or_init(|| Mutex::new(HashMap::new()))
    }

    /// What [`super::parse_crd`] reads: `metadata.name` and `spec`, nothing else. Any
    /// change to either (a schema update) is another key, so it is compiled afresh.
    fn key(obj: &Value) -> String {
        let name = crate::meta::meta_str(obj, "name").unwrap_or_default();
        let spec = obj.get("spec").map(Value::to_string).unwrap_or_default();
        format!("{name}\n{spec}")
    }

    pub(super) fn parse_cached(obj: &Value) -> Result<CrdDef, Vec<Cause>> {
        let key = key(obj);
        if let Some(def) = memo()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(def.clone());
        }
        // Invalid CRDs are not kept: their errors are cheap to find again.
        let def = super::compile_crd(obj)?;
        let mut memo = memo().lock().unwrap_or_else(PoisonError::into_inner);
        if memo.len() >= CAPACITY {
            memo.clear();
        }
        memo.insert(key, def.clone());
        Ok(def)
    }
}

/// [`parse_crd`] without the memo.
fn compile_crd(obj: &Value) -> Result<CrdDef, Vec<Cause>> {
    let mut errs = Vec::new();
    let name = crate::meta::meta_str(obj, "name")
        .unwrap_or_default()
        .to_string();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if group.is_empty() {
        errs.push(cause(
            "FieldValueRequired",
            "spec.group",
            "Required value".into(),
        ));
    } else if !is_dns_subdomain(group) || !group.contains('.') {
        errs.push(cause(
            "FieldValueInvalid",
            "spec.group",
            format!("Invalid value: \"{group}\": should be a domain with at least one dot"),
        ));
    }
    let names = spec.get("names").cloned().unwrap_or(Value::Null);
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if plural.is_empty() {
        errs.push(cause(
            "FieldValueRequired",
            "spec.names.plural",
            "Required value".into(),
        ));
    } else {
        // `ValidateCustomResourceDefinitionNames`: a DNS-1035 label, messages joined by ",".
        let plural_errs = crate::meta::dns1035_label_errors(plural);
        if !plural_errs.is_empty() {
            errs.push(cause(
                "FieldValueInvalid",
                "spec.names.plural",
                format!("Invalid value: \"{plural}\": {}", plural_errs.join(",")),
            ));
        }
    }
    if kind.is_empty() {
        errs.push(cause(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value".into(),
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errs.push(cause(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let scope = spec
        .get("scope")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        if scope.is_empty() {
            errs.push(cause(
                "FieldValueRequired",
                "spec.scope",
                "Required value".into(),
            ));
        } else {
            errs.push(cause(
                "FieldValueNotSupported",
                "spec.scope",
                format!(
                    "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
                ),
            ));
        }
    }
    let mut versions = BTreeMap::new();
    let mut storage_version = String::new();
    let raw_versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if raw_versions.is_empty() {
        errs.push(cause(
            "FieldValueInvalid",
            "spec.versions",
            "Invalid value: \"null\": must have exactly one version marked as storage version"
                .into(),
        ));
    }
    let mut storage_count = 0;
    for (i, v) in raw_versions.iter().enumerate() {
        let vname = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if vname.is_empty() {
            errs.push(cause(
                "FieldValueRequired",
                &format!("spec.versions[{i}].name"),
                "Required value".into(),
            ));
            continue;
        }
        let served = v.get("served").and_then(Value::as_bool).unwrap_or(false);
        let storage = v.get("storage").and_then(Value::as_bool).unwrap_or(false);
        if storage {
            storage_count += 1;
            storage_version = vname.to_string();
        }
        let raw_schema = v
            .get("schema")
            .and_then(|s| s.get("openAPIV3Schema"))
            .cloned();
        let Some(raw_schema) = raw_schema else {
            errs.push(cause(
                "FieldValueRequired",
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "Required value: schemas are required".into(),
            ));
            continue;
        };
        // Refuse schemas kube-apiserver refuses (non-structural, `$ref`, invalid defaults …).
        let schema_path = format!("spec.versions[{i}].schema.openAPIV3Schema");
        let structural = kubesim_schema::structural_errors(&raw_schema, &schema_path);
        if !structural.is_empty() {
            errs.extend(structural.into_iter().map(|e| Cause {
                reason: e.kind.reason().to_string(),
                field: e.path,
                detail: e.detail,
            }));
            continue;
        }
        let schema = match CompiledSchema::new(&raw_schema) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                errs.push(cause(
                    "FieldValueInvalid",
                    &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    format!("Invalid value: \"\": {e}"),
                ));
                continue;
            }
        };
        // kube-apiserver would evaluate every rule; kubesim refuses a CRD with a rule it
        // cannot evaluate rather than skip the rule or fail every write of its objects.
        let unevaluable = schema.unevaluable_rule_reasons();
        if !unevaluable.is_empty() {
            errs.extend(unevaluable.into_iter().map(|(rule, why)| {
                cause(
                    "FieldValueInvalid",
                    &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    format!("Invalid value: {rule:?}: {why}"),
                )
            }));
            continue;
        }
        let has_status = v
            .get("subresources")
            .and_then(|s| s.get("status"))
            .is_some_and(|s| !s.is_null());
        let printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let selectable_fields = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect()
            })
            .unwrap_or_default();
        if versions.contains_key(vname) {
            errs.push(cause(
                "FieldValueDuplicate",
                &format!("spec.versions[{i}].name"),
                format!("Duplicate value: \"{vname}\""),
            ));
        }
        versions.insert(
            vname.to_string(),
            CrdVersion {
                name: vname.to_string(),
                served,
                storage,
                schema,
                type_info: Arc::new(
                    TypeInfo::from_schema(&raw_schema).with_status_subresource(has_status),
                ),
                raw_schema,
                has_status,
                printer_columns,
                selectable_fields,
            },
        );
    }
    if !raw_versions.is_empty() && storage_count != 1 {
        errs.push(cause(
            "FieldValueInvalid",
            "spec.versions",
            format!(
                "Invalid value: {}: must have exactly one version marked as storage version",
                Value::Array(raw_versions.clone())
            ),
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let list_kind = names
        .get("listKind")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{kind}List"));
    Ok(CrdDef {
        name,
        group: group.to_string(),
        plural: plural.to_string(),
        singular,
        kind: kind.to_string(),
        list_kind,
        short_names: str_list(names.get("shortNames")),
        categories: str_list(names.get("categories")),
        namespaced: scope == "Namespaced",
        versions,
        storage_version,
    })
}

/// The status the apiextensions controllers set once names are accepted and the CRD is
/// established: conditions, `acceptedNames`, `storedVersions` (union with earlier ones).
pub fn established_status(def: &CrdDef, old_status: Option<&Value>, now: &str) -> Value {
    let mut stored = str_list(old_status.and_then(|s| s.get("storedVersions")));
    if !stored.contains(&def.storage_version) {
        stored.push(def.storage_version.clone());
    }
    let keep_time = |ty: &str| -> String {
        old_status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
            })
            .and_then(|c| c.get("lastTransitionTime"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| now.to_string())
    };
    let mut accepted = json!({
        "plural": def.plural,
        "singular": def.singular,
        "kind": def.kind,
        "listKind": def.list_kind,
    });
    if !def.short_names.is_empty() {
        accepted["shortNames"] = json!(def.short_names);
    }
    if !def.categories.is_empty() {
        accepted["categories"] = json!(def.categories);
    }
    json!({
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": keep_time("NamesAccepted"),
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": keep_time("Established"),
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": accepted,
        "storedVersions": stored,
    })
}
