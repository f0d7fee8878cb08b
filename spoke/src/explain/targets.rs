//! Which pool a binding targets, resolved as the compiler resolves it: the binding names an
//! InferenceObjective (either group, `llm-d.ai` preferred) or a legacy InferenceModel, and
//! that object's `poolRef` names the pool. A binding "targets a pod's pool" when that pool's
//! selector selects the pod. Pure: the caller lists the namespace's objectives, models and
//! pools; the resolution itself is the compiler's ([`crate::compiler::resolve`]), so the
//! answer and the binding's refusal never disagree about the rules.

use std::collections::BTreeMap;

use kleym_api::external::pool;
use kleym_api::{InferenceIdentityBinding, TargetKind};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::compiler::input::{BindingInput, Lookup, PoolView, TargetView};
use crate::compiler::resolve;

/// The targets and pools of one namespace, as listed. `None` means the resource is not
/// served by the cluster (its CRD is absent), which the compiler refuses differently from
/// an absent object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceTargets {
    /// InferenceObjectives of `llm-d.ai`.
    pub llmd_objectives: Option<Vec<TargetView>>,
    /// InferenceObjectives of `inference.networking.x-k8s.io`.
    pub gaie_objectives: Option<Vec<TargetView>>,
    /// Legacy InferenceModels.
    pub models: Option<Vec<TargetView>>,
    /// InferencePools of `inference.networking.k8s.io` (v1).
    pub pools_v1: Option<Vec<PoolView>>,
    /// InferencePools of `inference.networking.x-k8s.io` (v1alpha2).
    pub pools_legacy: Option<Vec<PoolView>>,
}

fn lookup<T: Clone>(items: Option<&Vec<T>>, name: &str, name_of: impl Fn(&T) -> &str) -> Lookup<T> {
    match items {
        None => Lookup::CrdNotServed,
        Some(items) => items
            .iter()
            .find(|o| name_of(o) == name)
            .map_or(Lookup::NotFound, |o| Lookup::Found(o.clone())),
    }
}

impl NamespaceTargets {
    /// The compiler's input for `binding`: its target and pool looked up in these lists, as
    /// the reconciler looks them up in its caches.
    pub fn input_for(&self, binding: &InferenceIdentityBinding) -> BindingInput {
        let want = &binding.spec.target_ref;
        let target = match want.kind {
            TargetKind::InferenceObjective => resolve::prefer_objective(
                lookup(self.llmd_objectives.as_ref(), &want.name, |t| &t.name),
                lookup(self.gaie_objectives.as_ref(), &want.name, |t| &t.name),
            ),
            TargetKind::InferenceModel => lookup(self.models.as_ref(), &want.name, |t| &t.name),
        };
        let ns = binding.namespace().unwrap_or_default();
        let pool = match target.found().map(|t| resolve::pool_key(&ns, t)) {
            Some(Ok(key)) if key.group == pool::GROUP_V1 => {
                lookup(self.pools_v1.as_ref(), &key.name, |p| &p.name)
            }
            Some(Ok(key)) if key.group == pool::GROUP_LEGACY => {
                lookup(self.pools_legacy.as_ref(), &key.name, |p| &p.name)
            }
            _ => Lookup::NotFound,
        };
        BindingInput {
            namespace: ns,
            name: binding.name_any(),
            spec: binding.spec.clone(),
            target,
            pool,
        }
    }
}

/// Where each binding's target and pool are looked up: the namespace's lists
/// ([`NamespaceTargets`], what the local command reads) or lookups already made per binding
/// ([`LookedUp`], what the hub's caches of a spoke answer).
pub trait TargetsOf {
    /// The compiler's input for `binding`.
    fn input_for(&self, binding: &InferenceIdentityBinding) -> BindingInput;
}

impl TargetsOf for NamespaceTargets {
    fn input_for(&self, binding: &InferenceIdentityBinding) -> BindingInput {
        NamespaceTargets::input_for(self, binding)
    }
}

/// Each binding's target and pool, looked up already (by binding name), as the spoke
/// reconciler's caches answer them. A binding not in the map has neither.
#[derive(Debug, Clone, Default)]
pub struct LookedUp(pub BTreeMap<String, (Lookup<TargetView>, Lookup<PoolView>)>);

impl TargetsOf for LookedUp {
    fn input_for(&self, binding: &InferenceIdentityBinding) -> BindingInput {
        let (target, pool) = self
            .0
            .get(&binding.name_any())
            .cloned()
            .unwrap_or((Lookup::NotFound, Lookup::NotFound));
        BindingInput {
            namespace: binding.namespace().unwrap_or_default(),
            name: binding.name_any(),
            spec: binding.spec.clone(),
            target,
            pool,
        }
    }
}

/// The pool a binding targets, or why it targets none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "resolved"
)]
pub enum PoolResolution {
    /// Target and pool found.
    #[serde(rename = "true")]
    Found {
        /// The target, `Kind namespace/name (group)`.
        target: String,
        /// Pool name.
        name: String,
        /// Pool API group.
        group: String,
        /// The pool's pod selector.
        match_labels: BTreeMap<String, String>,
    },
    /// The compiler refuses the reference (the same reason the binding is refused with).
    #[serde(rename = "false")]
    Refused {
        /// The refusal reason.
        reason: String,
        /// Its message.
        message: String,
    },
}

/// Resolve `input`'s target and pool with the compiler's rules.
pub fn resolve_pool(input: &BindingInput) -> PoolResolution {
    match resolve::resolve(input) {
        Ok(r) => PoolResolution::Found {
            target: format!(
                "{} {}/{} ({})",
                r.target.kind, r.target.namespace, r.target.name, r.target.group
            ),
            name: r.pool.name.clone(),
            group: r.pool.group.clone(),
            match_labels: r
                .pool
                .match_labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
        Err(refusal) => PoolResolution::Refused {
            reason: refusal.reason.to_string(),
            message: refusal.message,
        },
    }
}

impl PoolResolution {
    /// Whether the resolved pool selects a pod with labels `pod_labels`. A pool without
    /// labels selects nothing (kleym refuses to compile an identity for every pod of a
    /// namespace); an unresolved target selects nothing.
    pub fn selects(&self, pod_labels: &BTreeMap<String, String>) -> bool {
        match self {
            PoolResolution::Found { match_labels, .. } => {
                !match_labels.is_empty()
                    && match_labels
                        .iter()
                        .all(|(k, v)| pod_labels.get(k) == Some(v))
            }
            PoolResolution::Refused { .. } => false,
        }
    }

    /// The pool's labels a pod with `pod_labels` lacks, as `key=value (the pod has ...)`.
    pub fn missing_labels(&self, pod_labels: &BTreeMap<String, String>) -> Vec<String> {
        let PoolResolution::Found { match_labels, .. } = self else {
            return Vec::new();
        };
        match_labels
            .iter()
            .filter(|(k, v)| pod_labels.get(*k) != Some(*v))
            .map(|(k, v)| match pod_labels.get(k) {
                Some(have) => format!("{k}={v} (the pod has {k}={have})"),
                None => format!("{k}={v} (the pod has no {k})"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::external::objective;
    use kleym_api::label_map::LabelMap;

    fn binding(kind: &str, target: &str) -> InferenceIdentityBinding {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
            "metadata": {"name": "b", "namespace": "team"},
            "spec": {"targetRef": {"kind": kind, "name": target}, "mode": "PoolOnly",
                     "workloadSelectorTemplates": ["k8s:sa:model"]}
        }))
        .expect("a valid binding")
    }

    fn objective(name: &str, group: &str, pool: &str) -> TargetView {
        TargetView {
            kind: TargetKind::InferenceObjective,
            group: group.into(),
            namespace: "team".into(),
            name: name.into(),
            pool_ref: crate::compiler::input::PoolRefView {
                group: pool::GROUP_V1.into(),
                kind: pool::KIND.into(),
                name: pool.into(),
                namespace: None,
            },
        }
    }

    fn pool_view(name: &str, labels: &[(&str, &str)]) -> PoolView {
        PoolView {
            group: pool::GROUP_V1.into(),
            namespace: "team".into(),
            name: name.into(),
            match_labels: labels.iter().copied().collect::<LabelMap>(),
        }
    }

    fn pod_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_objective_names_the_pool_and_the_pool_selects_the_pod() {
        let targets = NamespaceTargets {
            llmd_objectives: Some(vec![
                objective("chat", objective::GROUP_LLMD, "qwen"),
                objective("batch", objective::GROUP_LLMD, "llama"),
            ]),
            // The other group holds an objective of the same name naming another pool:
            // llm-d.ai is preferred, as the compiler prefers it.
            gaie_objectives: Some(vec![objective("chat", objective::GROUP_GAIE, "llama")]),
            models: None,
            pools_v1: Some(vec![
                pool_view("qwen", &[("app", "qwen")]),
                pool_view("llama", &[("app", "llama")]),
            ]),
            pools_legacy: None,
        };
        let qwen_pod = pod_labels(&[("app", "qwen"), ("pod-template-hash", "x")]);
        let chat = resolve_pool(&targets.input_for(&binding("InferenceObjective", "chat")));
        assert!(
            matches!(&chat, PoolResolution::Found { name, target, .. }
                if name == "qwen" && target == "InferenceObjective team/chat (llm-d.ai)"),
            "{chat:?}"
        );
        assert!(chat.selects(&qwen_pod));
        let batch = resolve_pool(&targets.input_for(&binding("InferenceObjective", "batch")));
        assert!(!batch.selects(&qwen_pod), "{batch:?}");
        assert_eq!(
            batch.missing_labels(&qwen_pod),
            vec!["app=llama (the pod has app=qwen)".to_string()]
        );
        // A missing objective and an unserved kind are the compiler's refusals.
        let missing = resolve_pool(&targets.input_for(&binding("InferenceObjective", "nope")));
        assert!(
            matches!(&missing, PoolResolution::Refused { reason, .. } if reason == "TargetNotFound"),
            "{missing:?}"
        );
        assert!(!missing.selects(&qwen_pod));
        let model = resolve_pool(&targets.input_for(&binding("InferenceModel", "chat")));
        assert!(
            matches!(&model, PoolResolution::Refused { reason, .. } if reason == "TargetCRDNotServed"),
            "{model:?}"
        );
        // A pool without labels selects no pod.
        let unlabelled = NamespaceTargets {
            pools_v1: Some(vec![pool_view("qwen", &[])]),
            ..targets
        };
        let chat = resolve_pool(&unlabelled.input_for(&binding("InferenceObjective", "chat")));
        assert!(matches!(chat, PoolResolution::Found { .. }));
        assert!(!chat.selects(&qwen_pod));
    }
}
