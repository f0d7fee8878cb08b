//! Resolution: binding → target (objective or legacy model) → pool, all in the binding's
//! namespace, with only the groups and kinds kleym supports.

use kleym_api::TargetKind;
use kleym_api::external::{model, objective, pool};

use super::input::{BindingInput, Lookup, PoolView, TargetView};
use super::refusal::{Reason, Refusal};

/// The pool a target refers to: what the reconciler must look up.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// `inference.networking.k8s.io` (v1) or `inference.networking.x-k8s.io` (v1alpha2).
    pub group: String,
    /// The binding's namespace.
    pub namespace: String,
    /// Pool name.
    pub name: String,
}

/// Choose between the two InferenceObjective groups: `llm-d.ai` is preferred when it holds
/// the object; the CRD counts as not served only when neither group is served.
pub fn prefer_objective(llmd: Lookup<TargetView>, gaie: Lookup<TargetView>) -> Lookup<TargetView> {
    match (llmd, gaie) {
        (Lookup::Found(t), _) | (_, Lookup::Found(t)) => Lookup::Found(t),
        (Lookup::CrdNotServed, Lookup::CrdNotServed) => Lookup::CrdNotServed,
        _ => Lookup::NotFound,
    }
}

/// Groups an object of `kind` may be read from.
pub fn target_groups(kind: TargetKind) -> &'static [&'static str] {
    match kind {
        TargetKind::InferenceObjective => &[objective::GROUP_LLMD, objective::GROUP_GAIE],
        TargetKind::InferenceModel => &[model::GROUP],
    }
}

/// Pool groups kleym reads.
pub const POOL_GROUPS: [&str; 2] = [pool::GROUP_V1, pool::GROUP_LEGACY];

fn target_desc(t: &TargetView) -> String {
    format!("{} {}/{} ({})", t.kind, t.namespace, t.name, t.group)
}

/// Validate a target's `poolRef` and return the pool to look up.
pub fn pool_key(binding_namespace: &str, target: &TargetView) -> Result<PoolKey, Refusal> {
    let r = &target.pool_ref;
    if r.kind != pool::KIND {
        return Err(Refusal::new(
            Reason::UnsupportedRef,
            format!(
                "{} spec.poolRef.kind {:?} is not supported (only {})",
                target_desc(target),
                r.kind,
                pool::KIND
            ),
        ));
    }
    if !POOL_GROUPS.contains(&r.group.as_str()) {
        return Err(Refusal::new(
            Reason::UnsupportedRef,
            format!(
                "{} spec.poolRef.group {:?} is not supported (only {})",
                target_desc(target),
                r.group,
                POOL_GROUPS.join(", ")
            ),
        ));
    }
    if let Some(ns) = r.namespace.as_deref()
        && ns != binding_namespace
    {
        return Err(Refusal::new(
            Reason::CrossNamespaceRef,
            format!(
                "{} spec.poolRef.namespace {ns:?} differs from the binding's namespace {binding_namespace:?}; pools must be in the same namespace",
                target_desc(target)
            ),
        ));
    }
    Ok(PoolKey {
        group: r.group.clone(),
        namespace: binding_namespace.to_string(),
        name: r.name.clone(),
    })
}

/// A binding's resolved target and pool.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    /// The target.
    pub target: &'a TargetView,
    /// The pool.
    pub pool: &'a PoolView,
}

/// Resolve the target and pool of `input`, refusing with `InvalidRef` reasons.
pub fn resolve(input: &BindingInput) -> Result<Resolved<'_>, Refusal> {
    let ns = input.namespace.as_str();
    let want = &input.spec.target_ref;
    let binding = format!("binding {ns}/{}", input.name);
    let target = match &input.target {
        Lookup::Found(t) => t,
        Lookup::NotFound => {
            return Err(Refusal::new(
                Reason::TargetNotFound,
                format!(
                    "{binding}: spec.targetRef names {} {ns}/{}, which does not exist",
                    want.kind, want.name
                ),
            ));
        }
        Lookup::CrdNotServed => {
            return Err(Refusal::new(
                Reason::TargetCRDNotServed,
                format!(
                    "{binding}: spec.targetRef.kind {} is not served by this cluster (groups {})",
                    want.kind,
                    target_groups(want.kind).join(", ")
                ),
            ));
        }
    };
    if target.kind != want.kind || target.name != want.name {
        return Err(Refusal::new(
            Reason::UnsupportedRef,
            format!(
                "{binding}: spec.targetRef names {} {}, but {} was supplied",
                want.kind,
                want.name,
                target_desc(target)
            ),
        ));
    }
    if !target_groups(target.kind).contains(&target.group.as_str()) {
        return Err(Refusal::new(
            Reason::UnsupportedRef,
            format!(
                "{binding}: {} is in an unsupported group (supported: {})",
                target_desc(target),
                target_groups(target.kind).join(", ")
            ),
        ));
    }
    if target.namespace != ns {
        return Err(Refusal::new(
            Reason::CrossNamespaceRef,
            format!(
                "{binding}: spec.targetRef resolves to {}, outside the binding's namespace",
                target_desc(target)
            ),
        ));
    }
    let key = pool_key(ns, target)?;
    let pool = match &input.pool {
        Lookup::Found(p) => p,
        Lookup::NotFound => {
            return Err(Refusal::new(
                Reason::PoolNotFound,
                format!(
                    "{}: spec.poolRef names InferencePool {ns}/{} ({}), which does not exist",
                    target_desc(target),
                    key.name,
                    key.group
                ),
            ));
        }
        Lookup::CrdNotServed => {
            return Err(Refusal::new(
                Reason::PoolCRDNotServed,
                format!(
                    "{}: spec.poolRef.group {} does not serve InferencePool in this cluster",
                    target_desc(target),
                    key.group
                ),
            ));
        }
    };
    if pool.namespace != ns {
        return Err(Refusal::new(
            Reason::CrossNamespaceRef,
            format!(
                "{}: spec.poolRef resolves to InferencePool {}/{}, outside the binding's namespace",
                target_desc(target),
                pool.namespace,
                pool.name
            ),
        ));
    }
    if pool.group != key.group || pool.name != key.name {
        return Err(Refusal::new(
            Reason::UnsupportedRef,
            format!(
                "{}: spec.poolRef names InferencePool {} ({}), but {} ({}) was supplied",
                target_desc(target),
                key.name,
                key.group,
                pool.name,
                pool.group
            ),
        ));
    }
    Ok(Resolved { target, pool })
}
