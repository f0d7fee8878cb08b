//! One binding's reconcile: dereference → compile → plan → apply → status.
//!
//! Writes happen only when the plan says the cluster differs from what the binding wants:
//! a resync, a restart or an event that changes nothing sends no request at all.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kleym_api::conditions::CONFLICT;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, OwnedClusterSpiffeId, SpireStats};
use kube::{Resource, ResourceExt};

use super::api_availability::ApiKind;
use super::apply;
use super::compile::{self, BindingDecision};
use super::context::Context;
use super::error::Error;
use super::events;
use super::finalizer;
use super::plan::{self, OutputAction};
use super::queue::ObjectKey;
use super::status::{self, StatusInputs};
use super::watches::binding_compile_inputs_differ;
use crate::compiler::conditions::ConditionOutcome;
use crate::compiler::{Reason, Refusal};
use crate::ownership::{self, Foreign, Owner};

/// `Ready=False` reason while writing the ClusterSPIFFEID fails (RBAC, apiserver errors).
pub const REASON_APPLY_FAILED: &str = "ClusterSPIFFEIDApplyFailed";
/// Reason of the Warning event when the binding's status recorded an object that is not
/// its output (only a write by someone else to the status subresource does that).
pub const REASON_UNTRUSTED_RECORD: &str = "UntrustedClusterSPIFFEIDRecord";

/// The binding as we last know it (cache, or our own newer write).
pub fn current_binding(ctx: &Context, key: &ObjectKey) -> Option<Arc<InferenceIdentityBinding>> {
    current_binding_named(ctx, &key.namespace, &key.name)
}

/// [`current_binding`] by namespace and name.
fn current_binding_named(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Option<Arc<InferenceIdentityBinding>> {
    let cached = ctx.caches.bindings.get(namespace, name);
    ctx.binding_overlay.resolve(namespace, name, cached)
}

/// The ClusterSPIFFEID `name` as we last know it.
pub fn current_cluster_spiffe_id(ctx: &Context, name: &str) -> Option<Arc<ClusterSPIFFEID>> {
    let cached = ctx.caches.cluster_spiffe_ids.get("", name);
    ctx.csid_overlay.resolve("", name, cached)
}

/// Reconciles the binding `key`.
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<(), Error> {
    let Some(binding) = current_binding(ctx, key) else {
        release_claims(ctx, key);
        return Ok(());
    };
    if finalizer::is_deleting(&binding) {
        return cleanup(ctx, key, &binding).await;
    }
    let served = ctx.served();
    let evaluation = compile::evaluate_namespace_shared(ctx, &key.namespace, &served)?;
    let Some(verdict) = evaluation.verdict(&key.name) else {
        return Ok(()); // vanished between the index read and now
    };
    enqueue_changed_peers(ctx, key, evaluation.findings());
    apply_verdict(ctx, key, &binding, verdict).await
}

async fn apply_verdict(
    ctx: &Context,
    key: &ObjectKey,
    binding: &Arc<InferenceIdentityBinding>,
    verdict: BindingDecision,
) -> Result<(), Error> {
    let mut binding = binding.clone();
    // Objects read from the API always have a namespace, name and UID; without them no
    // object can be proven to be this binding's, so nothing is written.
    let Some(owner) = Owner::of(&binding) else {
        return Ok(());
    };
    // The recorded output is only compared with the new one (status writes) and reported
    // when it names another object: it is never used to find, adopt or delete an object
    // (status is writable by the binding's tenant, see `crate::ownership`).
    let recorded = binding
        .status
        .as_ref()
        .and_then(|s| s.cluster_spiffe_id.clone());
    // Owned: its parts move into the plan and the status instead of being cloned.
    let BindingDecision {
        output: mut desired,
        mut refusal,
        computed_spiffe_ids,
        rendered_selectors,
        conflict_peers,
        warnings,
    } = verdict;
    let csid_served = ctx.served().serves(ApiKind::ClusterSpiffeIds);
    // The only object this binding can own: the name the compiler gives it (`desired.name`
    // is the same name).
    let output_name = owner.object_name();

    if desired.is_some() {
        claim_name(ctx, &output_name, key);
    }
    if !csid_served {
        if desired.is_some() {
            refusal = Some(Refusal::new(
                Reason::ClusterSPIFFEIDCRDMissing,
                format!(
                    "the ClusterSPIFFEID CRD ({}) is not served by this cluster; install SPIRE Controller Manager",
                    ApiKind::ClusterSpiffeIds.crd_name()
                ),
            ));
        }
        desired = None;
    } else if !ctx.caches.cluster_spiffe_ids.is_ready() {
        return Err(Error::CacheNotReady("clusterspiffeids"));
    }

    let mut owned: Option<OwnedClusterSpiffeId> = None;
    let mut apply_error: Option<Error> = None;
    let mut pending: Option<String> = None;
    if csid_served {
        let existing = current_cluster_spiffe_id(ctx, &output_name);
        let plan = plan::plan_output(
            desired.as_ref(),
            existing.as_deref(),
            &owner,
            &ctx.config.field_manager,
        );
        owned = plan.owned_after.clone();
        if let Some(gone) = &plan.delete {
            apply::delete_cluster_spiffe_id(ctx, &gone.name, &gone.uid).await?;
            ctx.csid_overlay.record_deleted(&gone.uid);
            ctx.csid_overlay.forget("", &gone.name);
        }
        match (plan.action, &desired) {
            (OutputAction::Foreign(foreign), Some(_)) => {
                refusal = Some(name_taken(&foreign));
                owned = None;
            }
            (OutputAction::Apply { uid }, Some(d)) => {
                if !finalizer::has_finalizer(&binding) {
                    let updated =
                        apply::set_finalizers(ctx, &binding, finalizer::with_finalizer(&binding))
                            .await?;
                    binding = record_binding_write(ctx, key, updated);
                }
                let obj = plan::apply_object(d, &owner, uid.as_deref());
                match apply::apply_cluster_spiffe_id(ctx, &obj, uid.is_some()).await {
                    Ok(applied) => {
                        owned = Some(OwnedClusterSpiffeId {
                            name: applied.name_any(),
                            uid: applied.uid().unwrap_or_default(),
                        });
                        ctx.csid_overlay.record(applied);
                    }
                    // Creating without force conflicted: someone else's object holds the name.
                    Err(e) if uid.is_none() && e.status_code() == Some(409) => {
                        refusal = Some(name_taken(&Foreign {
                            object: d.name.clone(),
                            why: "it appeared while kleym was creating it (the apply conflicted)"
                                .into(),
                        }));
                        owned = None;
                    }
                    Err(e) => {
                        pending = Some(format!("could not write ClusterSPIFFEID {}: {e}", d.name));
                        owned = plan.owned_after;
                        apply_error = Some(e);
                    }
                }
            }
            _ => {}
        }
    }
    let ignored_record = recorded.filter(|r| r.name != output_name);

    let spire_stats = owned
        .as_ref()
        .and_then(|o| current_cluster_spiffe_id(ctx, &o.name))
        .and_then(|o| o.status.as_ref().and_then(|s| s.stats))
        .map(|s| SpireStats {
            pods_selected: s.pods_selected,
            entries_to_set: s.entries_to_set,
            entries_masked: s.entries_masked,
            pod_entry_render_failures: s.pod_entry_render_failures,
        });
    let outcome = match (refusal, pending) {
        (Some(r), _) => ConditionOutcome::Refused(r),
        (None, Some(message)) => ConditionOutcome::Pending {
            reason: REASON_APPLY_FAILED.into(),
            message,
        },
        (None, None) => ConditionOutcome::Ready {
            message: owned
                .as_ref()
                .map(|o| {
                    format!(
                        "ClusterSPIFFEID {} registers {}",
                        o.name,
                        compile::spiffe_id_summary(&computed_spiffe_ids)
                    )
                })
                .unwrap_or_default(),
        },
    };
    let inputs = StatusInputs {
        generation: binding.metadata.generation,
        outcome,
        computed_spiffe_ids,
        rendered_selectors,
        owned: owned.clone(),
        conflict_peers,
        warnings,
        spire_stats,
    };
    let now = Time(
        k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()),
    );
    // Status read back (audit, see `crate::ownership`): only compared with the status we
    // want (is a write needed), carries condition transition times over, and decides
    // whether a verdict event is due. A forged status can at most cause one more write of
    // this binding's own status or change an event about this binding: no object is
    // chosen from it.
    let previous = binding.status.as_ref();
    let desired_status = status::build_status(&inputs, previous, &now);
    let transition = events::transition(status::recorded_refusal(previous), inputs.refusal());
    if status::status_differs(&desired_status, previous) {
        tracing::debug!(
            binding = %key,
            previous = ?previous,
            desired = ?desired_status,
            "status differs; applying"
        );
        let updated = apply::apply_status(ctx, &binding, &desired_status).await?;
        binding = record_binding_write(ctx, key, updated);
    }
    // Output withdrawn for good: the finalizer has nothing left to protect.
    if owned.is_none() && apply_error.is_none() && finalizer::has_finalizer(&binding) {
        let updated =
            apply::set_finalizers(ctx, &binding, finalizer::without_finalizer(&binding)).await?;
        record_binding_write(ctx, key, updated);
    } else if owned.is_some() && !finalizer::has_finalizer(&binding) {
        // Output up to date but the finalizer is gone (the hub's Orphan removal took it off
        // before the spoke was engaged again, or someone removed it): without it, deleting
        // the binding would orphan its ClusterSPIFFEID.
        let updated =
            apply::set_finalizers(ctx, &binding, finalizer::with_finalizer(&binding)).await?;
        record_binding_write(ctx, key, updated);
    }
    ctx.metrics
        .observe_outcome(key, inputs.holding_condition(), inputs.holding_reason());
    if transition != events::Transition::None {
        ctx.events
            .publish(&binding.object_ref(&()), &transition)
            .await;
    }
    if let Some(r) = ignored_record {
        // Only a write to the status subresource by someone else puts another object's
        // name there: kleym never records any name but `output_name`.
        let note = format!(
            "status.clusterSPIFFEID named ClusterSPIFFEID {} (UID {}), which is not this binding's output ({output_name}); kleym never trusts its status as proof of ownership: the record was ignored and replaced, and that object was not touched",
            r.name, r.uid
        );
        tracing::warn!(binding = %key, recorded = %r.name, "{note}");
        ctx.events
            .warn(&binding.object_ref(&()), REASON_UNTRUSTED_RECORD, &note)
            .await;
    }
    match apply_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn name_taken(foreign: &Foreign) -> Refusal {
    Refusal::new(
        Reason::ForeignObjectHoldsName,
        format!(
            "ClusterSPIFFEID {} already exists and is not proven to be this binding's output ({}); kleym never modifies or deletes it: remove or rename it",
            foreign.object, foreign.why
        ),
    )
}

/// Deletion: remove our output (UID precondition), then our finalizer.
async fn cleanup(
    ctx: &Context,
    key: &ObjectKey,
    binding: &Arc<InferenceIdentityBinding>,
) -> Result<(), Error> {
    if !finalizer::has_finalizer(binding) {
        return Ok(());
    }
    // The object to delete is found by the name the compiler gives this binding and
    // proven by `ownership::verify`, never taken from the status (which the binding's
    // tenant can write, e.g. just before deleting the binding).
    if ctx.served().serves(ApiKind::ClusterSpiffeIds)
        && let Some(owner) = Owner::of(binding)
    {
        if !ctx.caches.cluster_spiffe_ids.is_ready() {
            return Err(Error::CacheNotReady("clusterspiffeids"));
        }
        let name = owner.object_name();
        if let Some(obj) = current_cluster_spiffe_id(ctx, &name) {
            match ownership::verify(&obj, &ctx.config.field_manager, &owner) {
                Ok(_) => {
                    let uid = obj.uid().unwrap_or_default();
                    apply::delete_cluster_spiffe_id(ctx, &name, &uid).await?;
                    ctx.csid_overlay.record_deleted(&uid);
                    ctx.csid_overlay.forget("", &name);
                }
                Err(foreign) => {
                    let note = format!("{foreign}; it was left untouched");
                    tracing::warn!(binding = %key, "{note}");
                    ctx.events
                        .warn(
                            &binding.object_ref(&()),
                            Reason::ForeignObjectHoldsName.as_str(),
                            &note,
                        )
                        .await;
                }
            }
        }
    }
    match apply::set_finalizers(ctx, binding, finalizer::without_finalizer(binding)).await {
        Ok(updated) => {
            record_binding_write(ctx, key, updated);
        }
        // Already gone: a previous pass removed the finalizer.
        Err(e) if e.status_code() == Some(404) => {}
        Err(e) => return Err(e),
    }
    release_claims(ctx, key);
    ctx.metrics.forget(key);
    // Peers that collided with this binding may be free now.
    let evaluation = compile::evaluate_namespace_shared(ctx, &key.namespace, &ctx.served())?;
    enqueue_changed_peers(ctx, key, evaluation.findings());
    Ok(())
}

/// Remembers a binding our write returned (read-your-writes). When that changes what the
/// namespace evaluation reads of the binding (a spec changed concurrently), the cached
/// evaluation of its namespace is stale. Returns the recorded binding (shared with the
/// overlay, without the metadata the caches drop).
pub(crate) fn record_binding_write(
    ctx: &Context,
    key: &ObjectKey,
    updated: InferenceIdentityBinding,
) -> Arc<InferenceIdentityBinding> {
    let before = current_binding(ctx, key);
    let recorded = ctx.binding_overlay.record(updated);
    let after = current_binding(ctx, key);
    if binding_compile_inputs_differ(before.as_deref(), after.as_deref()) {
        ctx.namespace_cache.invalidate(&key.namespace);
    }
    recorded
}

fn claim_name(ctx: &Context, name: &str, key: &ObjectKey) {
    let mut claims = ctx.name_claims.lock().unwrap_or_else(|p| p.into_inner());
    claims.retain(|n, k| k != key || n == name);
    claims.insert(name.to_string(), key.clone());
}

fn release_claims(ctx: &Context, key: &ObjectKey) {
    ctx.name_claims
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, k| k != key);
}

/// Enqueues the namespace peers whose namespace-wide findings (conflict, peers, warnings)
/// in `verdicts` differ from what their status records: collisions appear on, and resolve
/// for, every member, and warnings that name peers stay current.
pub fn enqueue_changed_peers<'a>(
    ctx: &Context,
    key: &ObjectKey,
    verdicts: impl IntoIterator<Item = (&'a String, &'a BindingDecision)>,
) {
    // Every peer of the namespace is read: one cache lock for all of them (the same
    // resolution as `current_binding_named`: cache, then our newer writes).
    let changed: Vec<&String> = ctx
        .caches
        .bindings
        .read_namespace(&key.namespace, |cached| {
            verdicts
                .into_iter()
                .filter(|(name, _)| **name != key.name)
                .filter(|(name, v)| {
                    let cached = cached.and_then(|c| c.get(name.as_str())).cloned();
                    ctx.binding_overlay
                        .resolve(&key.namespace, name, cached)
                        .is_some_and(|peer| conflict_view_differs(&peer, v))
                })
                .map(|(name, _)| name)
                .collect()
        });
    for name in changed {
        ctx.queue
            .enqueue(ObjectKey::new(key.namespace.clone(), name.clone()));
    }
}

/// Do the peer's recorded namespace-wide findings differ from the verdict's? (Peers and
/// warnings compare as sets.) Status read back (audit, see `crate::ownership`): the answer
/// only decides whether the peer, a binding of the same namespace, is enqueued; its
/// reconcile derives everything again from specs and the ownership proof.
pub fn conflict_view_differs(peer: &InferenceIdentityBinding, v: &BindingDecision) -> bool {
    let status = peer.status.as_ref();
    let recorded_conflict = status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONFLICT && c.status == "True")
    });
    let new_conflict = v
        .refusal
        .as_ref()
        .is_some_and(|r| r.kind().condition_type() == CONFLICT);
    let recorded_peers = status.map_or(&[][..], |s| s.conflict_peers.as_slice());
    let recorded_warnings = status.map_or(&[][..], |s| s.warnings.as_slice());
    recorded_conflict != new_conflict
        || !same_set(recorded_peers, &v.conflict_peers, |a, b| a.name == b.name)
        || !same_set(recorded_warnings, &v.warnings, |a, b| a == b)
}

/// Set equality under `eq`, without allocating: both lists are short (peers are capped
/// per finding), and this runs for every peer on every reconcile.
fn same_set<A, B>(a: &[A], b: &[B], eq: impl Fn(&A, &B) -> bool) -> bool {
    a.iter().all(|x| b.iter().any(|y| eq(x, y))) && b.iter().all(|y| a.iter().any(|x| eq(x, y)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kleym_api::{ConflictPeer, IdentityWarning, InferenceIdentityBindingStatus};

    fn peer(conflict: bool, peers: &[&str], warnings: &[&str]) -> InferenceIdentityBinding {
        let spec = serde_json::from_value(serde_json::json!({
            "targetRef": {"name": "chat"},
            "mode": "PoolOnly",
            "workloadSelectorTemplates": ["k8s:ns:a", "k8s:sa:s"]
        }))
        .unwrap();
        let mut b = InferenceIdentityBinding::new("p", spec);
        b.status = Some(InferenceIdentityBindingStatus {
            conditions: vec![Condition {
                type_: CONFLICT.into(),
                status: if conflict { "True" } else { "False" }.into(),
                reason: "x".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()),
            }],
            conflict_peers: peers
                .iter()
                .map(|p| ConflictPeer {
                    name: p.to_string(),
                    reason: "IdentityCollision".into(),
                })
                .collect(),
            warnings: warnings
                .iter()
                .map(|w| IdentityWarning {
                    reason: w.to_string(),
                    message: "m".into(),
                })
                .collect(),
            ..Default::default()
        });
        b
    }

    fn verdict(conflict: bool, peers: &[&str], warnings: &[&str]) -> BindingDecision {
        BindingDecision {
            output: None,
            refusal: conflict.then(|| Refusal::new(Reason::IdentityCollision, "m")),
            computed_spiffe_ids: Vec::new(),
            rendered_selectors: Vec::new(),
            conflict_peers: peers
                .iter()
                .map(|p| ConflictPeer {
                    name: p.to_string(),
                    reason: "IdentityCollision".into(),
                })
                .collect(),
            warnings: warnings
                .iter()
                .map(|w| IdentityWarning {
                    reason: w.to_string(),
                    message: "m".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn peer_is_enqueued_only_when_its_namespace_findings_changed() {
        // Unchanged: no enqueue.
        assert!(!conflict_view_differs(
            &peer(true, &["a"], &[]),
            &verdict(true, &["a"], &[])
        ));
        assert!(!conflict_view_differs(
            &peer(false, &[], &["W"]),
            &verdict(false, &[], &["W"])
        ));
        // Collision appears, resolves, or changes members.
        assert!(conflict_view_differs(
            &peer(false, &[], &[]),
            &verdict(true, &["a"], &[])
        ));
        assert!(conflict_view_differs(
            &peer(true, &["a"], &[]),
            &verdict(false, &[], &[])
        ));
        assert!(conflict_view_differs(
            &peer(true, &["a"], &[]),
            &verdict(true, &["a", "b"], &[])
        ));
        // A warning naming peers changed.
        assert!(conflict_view_differs(
            &peer(false, &[], &["W"]),
            &verdict(false, &[], &[])
        ));
    }
}
