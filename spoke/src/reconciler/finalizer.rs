//! The `kleym.io/cleanup` finalizer. A binding carries it exactly while it may own a
//! ClusterSPIFFEID, so that deleting the binding cannot orphan the cluster-scoped output
//! (which cannot have a namespaced owner reference). Bindings that never produced output
//! (refused from the start) never get it and cost no extra write.

use std::sync::Arc;

use kleym_api::InferenceIdentityBinding;

use kube::ResourceExt;
use kube::api::Api;

use super::api_availability::ApiKind;
use super::apply::{self, Applied};
use super::effects::Effects;
use super::error::Error;
use super::plan::BindingPlan;
use super::queue::ObjectKey;
use super::state::SpokeState;
use crate::ownership::{self, Foreign, Owner};

/// Finalizer kleym puts on bindings that own a ClusterSPIFFEID.
pub const FINALIZER: &str = "kleym.io/cleanup";

/// Does the binding carry our finalizer?
pub fn has_finalizer(b: &InferenceIdentityBinding) -> bool {
    b.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// The binding's finalizers plus ours.
pub fn with_finalizer(b: &InferenceIdentityBinding) -> Vec<String> {
    let mut f = b.metadata.finalizers.clone().unwrap_or_default();
    if !f.iter().any(|x| x == FINALIZER) {
        f.push(FINALIZER.to_string());
    }
    f
}

/// The binding's finalizers without ours.
pub fn without_finalizer(b: &InferenceIdentityBinding) -> Vec<String> {
    b.metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x != FINALIZER)
        .collect()
}

/// Is the binding being deleted?
pub fn is_deleting(b: &InferenceIdentityBinding) -> bool {
    b.metadata.deletion_timestamp.is_some()
}

/// What the finalizer step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerChange {
    /// Nothing to change.
    None,
    /// Added: the binding owns output again.
    Added,
    /// Removed: the output is withdrawn for good.
    Removed,
}

/// Adds our finalizer before the plan writes output, so that deleting the binding can never
/// orphan an object it created. Returns the binding as it is now.
pub async fn protect_output(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
    binding: Arc<InferenceIdentityBinding>,
    plan: &BindingPlan,
) -> Result<Arc<InferenceIdentityBinding>, Error> {
    if plan.write.is_none() || has_finalizer(&binding) {
        return Ok(binding);
    }
    apply::write_finalizers(
        state,
        fx,
        field_manager,
        key,
        &binding,
        with_finalizer(&binding),
    )
    .await
}

/// The finalizer step, after the status: the binding carries the finalizer exactly while it
/// owns output.
pub async fn settle(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
    binding: &InferenceIdentityBinding,
    applied: &Applied,
) -> Result<FinalizerChange, Error> {
    let owns = applied.owned.is_some();
    let (change, finalizers) = if !owns && applied.failure.is_none() && has_finalizer(binding) {
        // Output withdrawn for good: the finalizer has nothing left to protect.
        (FinalizerChange::Removed, without_finalizer(binding))
    } else if owns && !has_finalizer(binding) {
        // Output up to date but the finalizer is gone (the hub's Orphan removal took it off
        // before the spoke was engaged again, or someone removed it): without it, deleting
        // the binding would orphan its ClusterSPIFFEID.
        (FinalizerChange::Added, with_finalizer(binding))
    } else {
        return Ok(FinalizerChange::None);
    };
    apply::write_finalizers(state, fx, field_manager, key, binding, finalizers).await?;
    Ok(change)
}

/// What [`delete_output`] found at the binding's output name.
#[derive(Debug)]
pub enum OutputRelease {
    /// Nothing to delete (no object, or ClusterSPIFFEIDs are not served).
    Nothing,
    /// Our object, deleted.
    Deleted,
    /// An object not proven to be ours: left untouched.
    Foreign(Foreign),
}

/// First half of a binding's deletion: deletes its output (UID precondition). The object
/// is found by the name the compiler gives this binding and proven by
/// [`ownership::verify`], never taken from the status (which the binding's tenant can
/// write, e.g. just before deleting the binding).
pub async fn delete_output(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    binding: &InferenceIdentityBinding,
    cluster_spiffe_ids_served: bool,
) -> Result<OutputRelease, Error> {
    if !cluster_spiffe_ids_served {
        return Ok(OutputRelease::Nothing);
    }
    let Some(owner) = Owner::of(binding) else {
        return Ok(OutputRelease::Nothing);
    };
    if !state.caches.cluster_spiffe_ids.is_ready() {
        return Err(Error::CacheNotReady("clusterspiffeids"));
    }
    let name = owner.object_name();
    let Some(obj) = state.current_cluster_spiffe_id(&name) else {
        return Ok(OutputRelease::Nothing);
    };
    match ownership::verify(obj.as_ref(), field_manager, &owner) {
        Ok(_) => {
            let uid = obj.uid().unwrap_or_default();
            apply::delete_cluster_spiffe_id(fx, &name, &uid).await?;
            state.record_cluster_spiffe_id_deleted(&name, &uid);
            Ok(OutputRelease::Deleted)
        }
        Err(foreign) => Ok(OutputRelease::Foreign(foreign)),
    }
}

/// Deletes the ClusterSPIFFEIDs proven to be `key`'s output when the binding `key` no
/// longer exists: a binding deleted while nothing reconciled this cluster and its finalizer
/// was off (the hub's Orphan removal takes it off; the cluster left the fleet and came back)
/// leaves its output behind, and nothing else would ever delete it. The CSID watch enqueues
/// the proven owner of every ClusterSPIFFEID, so the initial listing of a new engagement
/// sweeps them all.
///
/// Proof, not labels: only objects whose ownership proof (field manager and annotations a
/// tenant cannot write) names `key` are deleted, with the object's UID as precondition; and
/// only after a live read says the binding is gone (a cache that lags behind the
/// ClusterSPIFFEID watch must not cost a live binding its identity).
pub async fn sweep_orphans(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
) -> Result<(), Error> {
    if !state.served().serves(ApiKind::ClusterSpiffeIds)
        || !state.caches.cluster_spiffe_ids.is_ready()
        || !state.caches.bindings.is_ready()
    {
        return Ok(());
    }
    let orphans: Vec<(String, String)> = state
        .caches
        .cluster_spiffe_ids
        .list()
        .into_iter()
        .filter(|obj| {
            ownership::proven_owner(obj.as_ref(), field_manager)
                .is_ok_and(|o| o.namespace == key.namespace && o.name == key.name)
        })
        .filter_map(|obj| Some((obj.name_any(), obj.uid()?)))
        .collect();
    if orphans.is_empty() {
        return Ok(());
    }
    let bindings: Api<InferenceIdentityBinding> =
        Api::namespaced(fx.client.clone(), &key.namespace);
    match bindings.get_opt(&key.name).await {
        Ok(None) => {}
        // Live after all: its own reconcile (its watch event is on the way) owns the output.
        Ok(Some(_)) => return Ok(()),
        Err(e) => {
            return Err(Error::kube(
                format!("get InferenceIdentityBinding {key}"),
                e,
            ));
        }
    }
    for (name, uid) in orphans {
        tracing::info!(
            binding = %key,
            clusterspiffeid = %name,
            "deleting an orphaned ClusterSPIFFEID: its binding no longer exists"
        );
        apply::delete_cluster_spiffe_id(fx, &name, &uid).await?;
        state.record_cluster_spiffe_id_deleted(&name, &uid);
    }
    Ok(())
}

/// Second half of a binding's deletion: removes our finalizer, letting the deletion
/// complete.
pub async fn remove(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
    binding: &InferenceIdentityBinding,
) -> Result<(), Error> {
    match apply::write_finalizers(
        state,
        fx,
        field_manager,
        key,
        binding,
        without_finalizer(binding),
    )
    .await
    {
        Ok(_) => Ok(()),
        // Already gone: a previous pass removed the finalizer.
        Err(e) if e.status_code() == Some(404) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::{InferenceIdentityBindingSpec, TargetRef};

    fn binding(finalizers: &[&str]) -> InferenceIdentityBinding {
        let spec: InferenceIdentityBindingSpec = serde_json::from_value(serde_json::json!({
            "targetRef": {"name": "o"},
            "workloadSelectorTemplates": ["k8s:ns:a"],
            "mode": "PoolOnly"
        }))
        .unwrap();
        let _ = TargetRef {
            kind: Default::default(),
            name: "o".into(),
        };
        let mut b = InferenceIdentityBinding::new("b", spec);
        b.metadata.finalizers = Some(finalizers.iter().map(|s| s.to_string()).collect());
        b
    }

    #[test]
    fn adding_is_idempotent_and_keeps_others() {
        let b = binding(&["other"]);
        assert!(!has_finalizer(&b));
        assert_eq!(with_finalizer(&b), vec!["other", FINALIZER]);
        let b2 = binding(&["other", FINALIZER]);
        assert!(has_finalizer(&b2));
        assert_eq!(with_finalizer(&b2), vec!["other", FINALIZER]);
        assert_eq!(without_finalizer(&b2), vec!["other"]);
    }
}
