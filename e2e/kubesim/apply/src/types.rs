//! Navigation of the type information that drives merging: which lists are associative
//! (`x-kubernetes-list-type: map|set`), which maps are atomic, which keys are declared struct
//! fields, and the strategic-merge-patch metadata (`x-kubernetes-patch-merge-key`/`-strategy`).
//!
//! Types are read straight from an OpenAPI v3 schema (`serde_json::Value`). A missing schema
//! means "deduced", exactly like structured-merge-diff's `__untyped_deduced_`: maps are
//! granular, lists atomic, everything else a scalar.

use serde_json::Value;
use std::sync::LazyLock;

/// How the items of a list merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced as a whole and owned as one field.
    Atomic,
    /// Items are scalars merged by value (`v:` path elements).
    Set,
    /// Items are objects merged by these key fields (`k:` path elements).
    Map(Vec<String>),
}

/// A position in the type tree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ty<'a> {
    schema: Option<&'a Value>,
    /// Undeclared map keys count as struct fields (built-in kinds, whose Go types are structs
    /// even where our mini schema does not spell them out).
    structs: bool,
    /// The object root (or an embedded resource), where `metadata` always has the
    /// `ObjectMeta` type.
    root: bool,
}

impl<'a> Ty<'a> {
    /// The root type of an object.
    pub(crate) fn root(schema: Option<&'a Value>, structs: bool) -> Self {
        Self {
            schema,
            structs,
            root: true,
        }
    }

    fn child(&self, schema: Option<&'a Value>) -> Self {
        // An embedded resource (e.g. a template object) has its own ObjectMeta.
        let embedded = schema
            .and_then(|s| s.get("x-kubernetes-embedded-resource"))
            .is_some_and(|e| e == true);
        Self {
            schema,
            structs: self.structs,
            root: embedded,
        }
    }

    fn ext(&self, name: &str) -> Option<&'a Value> {
        self.schema.and_then(|s| s.get(name))
    }

    /// The type of map key `key`.
    pub(crate) fn field(&self, key: &str) -> Ty<'a> {
        if self.root && key == "metadata" {
            return Ty {
                schema: Some(&OBJECT_META),
                structs: true,
                root: false,
            };
        }
        let Some(schema) = self.schema else {
            return self.child(None);
        };
        if let Some(p) = schema.get("properties").and_then(|p| p.get(key)) {
            return self.child(Some(p));
        }
        match schema.get("additionalProperties") {
            Some(ap @ Value::Object(_)) => self.child(Some(ap)),
            _ => self.child(None),
        }
    }

    /// Whether `key` is a declared struct field (as opposed to a key of a map with
    /// `additionalProperties` or of a deduced map). Undeclared keys are members of field sets
    /// on their own (structured-merge-diff's `toFieldSet`).
    pub(crate) fn is_declared(&self, key: &str) -> bool {
        if self.root && key == "metadata" {
            return true;
        }
        let Some(schema) = self.schema else {
            return self.structs;
        };
        if schema.get("properties").and_then(|p| p.get(key)).is_some() {
            return true;
        }
        if schema
            .get("additionalProperties")
            .is_some_and(|ap| ap.is_object() || ap == true)
        {
            return false;
        }
        self.structs
    }

    /// The type of the list items.
    pub(crate) fn items(&self) -> Ty<'a> {
        self.child(self.ext("items").filter(|i| i.is_object()))
    }

    /// How this list merges.
    pub(crate) fn list_kind(&self) -> ListKind {
        match self.ext("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListKind::Set,
            Some("map") => {
                let keys: Vec<String> = self
                    .ext("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    ListKind::Atomic
                } else {
                    ListKind::Map(keys)
                }
            }
            _ => ListKind::Atomic,
        }
    }

    /// Whether keys not declared in `properties` are dropped here (a structural CRD schema
    /// without `additionalProperties` or `x-kubernetes-preserve-unknown-fields`).
    pub(crate) fn prunes_unknown(&self) -> bool {
        let Some(s) = self.schema else {
            return false;
        };
        !self.structs
            && s.get("properties").is_some_and(Value::is_object)
            && s.get("additionalProperties").is_none()
            && s.get("x-kubernetes-preserve-unknown-fields") != Some(&Value::Bool(true))
    }

    /// Whether this is the object root.
    pub(crate) fn is_root(&self) -> bool {
        self.root
    }

    /// Whether this map (or struct) is replaced as a whole (`x-kubernetes-map-type: atomic`).
    pub(crate) fn map_atomic(&self) -> bool {
        self.ext("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic")
    }

    /// The schema default of field `key` of this object type, used when an item of a
    /// map-list omits a key (e.g. `protocol: TCP` of container ports).
    pub(crate) fn field_default(&self, key: &str) -> Option<&'a Value> {
        self.schema
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get(key))
            .and_then(|k| k.get("default"))
    }

    /// Strategic merge patch: the patch strategies (`merge`, `retainKeys`, `replace`).
    pub(crate) fn patch_strategy(&self) -> &'a str {
        self.ext("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Strategic merge patch: whether lists here merge instead of being replaced.
    pub(crate) fn patch_merges(&self) -> bool {
        self.patch_strategy()
            .split(',')
            .any(|s| s.trim() == "merge")
    }

    /// Strategic merge patch: the merge key of a list of objects.
    pub(crate) fn patch_merge_key(&self) -> Option<&'a str> {
        self.ext("x-kubernetes-patch-merge-key")
            .and_then(Value::as_str)
    }
}

/// `ObjectMeta` as kube-apiserver types it: labels/annotations granular maps, finalizers a
/// set, ownerReferences a map-list keyed by uid.
static OBJECT_META: LazyLock<Value> = LazyLock::new(object_meta);

fn string_map() -> Value {
    serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}})
}

fn object_meta() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "generateName": {"type": "string"},
            "namespace": {"type": "string"},
            "uid": {"type": "string"},
            "resourceVersion": {"type": "string"},
            "generation": {"type": "integer"},
            "creationTimestamp": {"type": "string"},
            "deletionTimestamp": {"type": "string"},
            "deletionGracePeriodSeconds": {"type": "integer"},
            "labels": string_map(),
            "annotations": string_map(),
            "finalizers": {
                "type": "array",
                "items": {"type": "string"},
                "x-kubernetes-list-type": "set",
                "x-kubernetes-patch-strategy": "merge"
            },
            "ownerReferences": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "uid": {"type": "string"},
                        "controller": {"type": "boolean"},
                        "blockOwnerDeletion": {"type": "boolean"}
                    }
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["uid"],
                "x-kubernetes-patch-merge-key": "uid",
                "x-kubernetes-patch-strategy": "merge"
            },
            "managedFields": {"type": "array", "x-kubernetes-list-type": "atomic"}
        }
    })
}

/// A list merged by `keys` for server-side apply and by `merge_key` for strategic merge.
fn map_list(keys: &[&str], merge_key: &str, strategy: &str, item: Value) -> Value {
    serde_json::json!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": keys,
        "x-kubernetes-patch-merge-key": merge_key,
        "x-kubernetes-patch-strategy": strategy
    })
}

fn named_item() -> Value {
    serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}})
}

fn ports_item(port: &str) -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            port: {"type": "integer"},
            "protocol": {"type": "string", "default": "TCP"}
        }
    })
}

fn container() -> Value {
    let resources = serde_json::json!({
        "type": "object",
        "properties": {
            "limits": {"type": "object", "additionalProperties": {}},
            "requests": {"type": "object", "additionalProperties": {}},
            "claims": map_list(&["name"], "name", "", named_item())
        }
    });
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "image": {"type": "string"},
            "env": map_list(&["name"], "name", "merge", named_item()),
            "ports": map_list(
                &["containerPort", "protocol"], "containerPort", "merge", ports_item("containerPort")
            ),
            "volumeMounts": map_list(
                &["mountPath"], "mountPath", "merge",
                serde_json::json!({"type": "object", "properties": {"mountPath": {"type": "string"}}})
            ),
            "volumeDevices": map_list(
                &["devicePath"], "devicePath", "merge",
                serde_json::json!({"type": "object", "properties": {"devicePath": {"type": "string"}}})
            ),
            "resources": resources
        }
    })
}

fn pod_spec() -> Value {
    let containers = map_list(&["name"], "name", "merge", container());
    serde_json::json!({
        "type": "object",
        "properties": {
            "containers": containers.clone(),
            "initContainers": containers.clone(),
            "ephemeralContainers": containers,
            "volumes": map_list(&["name"], "name", "merge,retainKeys", named_item()),
            "imagePullSecrets": map_list(&["name"], "name", "merge", named_item()),
            "nodeSelector": {
                "type": "object", "additionalProperties": {"type": "string"},
                "x-kubernetes-map-type": "atomic"
            },
            "hostAliases": map_list(
                &["ip"], "ip", "merge",
                serde_json::json!({"type": "object", "properties": {"ip": {"type": "string"}}})
            )
        }
    })
}

fn template() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"metadata": object_meta(), "spec": pod_spec()}
    })
}

fn label_selector() -> Value {
    serde_json::json!({"type": "object", "x-kubernetes-map-type": "atomic"})
}

fn conditions_status() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "conditions": map_list(
                &["type"], "type", "merge",
                serde_json::json!({"type": "object", "properties": {"type": {"type": "string"}}})
            )
        }
    })
}

/// The spec of a built-in kind, where its merge behaviour matters to us.
fn builtin_spec(group: &str, kind: &str) -> Option<Value> {
    let workload = || {
        serde_json::json!({
            "type": "object",
            "properties": {
                "selector": label_selector(),
                "template": template(),
                "strategy": {"type": "object", "x-kubernetes-patch-strategy": "retainKeys"},
                "updateStrategy": {"type": "object", "x-kubernetes-patch-strategy": "retainKeys"}
            }
        })
    };
    match (group, kind) {
        ("", "Pod") => Some(pod_spec()),
        ("", "PodTemplate") => None,
        ("apps" | "extensions", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet")
        | ("batch", "Job") => Some(workload()),
        ("", "ReplicationController") => Some(serde_json::json!({
            "type": "object",
            "properties": {
                "selector": {"type": "object", "additionalProperties": {"type": "string"},
                             "x-kubernetes-map-type": "atomic"},
                "template": template()
            }
        })),
        ("batch", "CronJob") => Some(serde_json::json!({
            "type": "object",
            "properties": {
                "jobTemplate": {
                    "type": "object",
                    "properties": {"metadata": object_meta(), "spec": workload()}
                }
            }
        })),
        ("", "Service") => Some(serde_json::json!({
            "type": "object",
            "properties": {
                "ports": map_list(&["port", "protocol"], "port", "merge", ports_item("port")),
                "selector": {"type": "object", "additionalProperties": {"type": "string"},
                             "x-kubernetes-map-type": "atomic"}
            }
        })),
        _ => None,
    }
}

/// Whether a built-in kind serves a `status` subresource.
pub(crate) fn builtin_has_status(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        (
            "",
            "Pod"
                | "Service"
                | "Namespace"
                | "Node"
                | "PersistentVolume"
                | "PersistentVolumeClaim"
                | "ReplicationController"
                | "ResourceQuota"
        ) | (
            "apps" | "extensions",
            "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet"
        ) | ("batch", "Job" | "CronJob")
            | ("autoscaling", "HorizontalPodAutoscaler")
            | ("policy", "PodDisruptionBudget")
            | ("certificates.k8s.io", "CertificateSigningRequest")
    )
}

/// The group of an `apiVersion` (`""` for the core group).
pub(crate) fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The (mini) schema of a built-in kind: the patch metadata kube-apiserver carries for the
/// fields we merge, everything else deduced as structs.
pub(crate) fn builtin_schema(api_version: &str, kind: &str) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("metadata".into(), object_meta());
    if let Some(spec) = builtin_spec(group_of(api_version), kind) {
        props.insert("spec".into(), spec);
    }
    props.insert("status".into(), conditions_status());
    serde_json::json!({"type": "object", "properties": props})
}
