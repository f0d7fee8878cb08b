//! One binding's reconcile, as its steps: compile (dereference and compile the namespace,
//! pure) → plan (pure) → apply (the ClusterSPIFFEID writes) → status → finalizer. Each
//! step is a function with a typed result in its own module; events and metrics are
//! recorded here, around the steps.
//!
//! Writes happen only when the plan says the cluster differs from what the binding wants:
//! a resync, a restart or an event that changes nothing sends no request at all.

use std::sync::Arc;

use kleym_api::InferenceIdentityBinding;
use kleym_api::conditions::CONFLICT;
use kube::Resource;

use super::api_availability::ApiKind;
use super::apply::{self, Applied};
use super::compile;
use super::config::SpokeConfig;
use super::context::Context;
use super::error::Error;
use super::evaluation::{BindingDecision, NamespaceEvaluation};
use super::events::Transition;
use super::finalizer::{self, OutputRelease};
use super::plan::{self, BindingPlan};
use super::queue::{ObjectKey, WorkQueue};
use super::state::SpokeState;
use super::status::{self, StatusDecision};
use crate::compiler::{ClusterConfig, Reason};
use crate::ownership::Owner;

/// Reason of the Warning event when the binding's status recorded an object that is not
/// its output (only a write by someone else to the status subresource does that).
pub const REASON_UNTRUSTED_RECORD: &str = "UntrustedClusterSPIFFEIDRecord";

/// Reconciles the binding `key`.
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<(), Error> {
    let (state, fx) = (&ctx.state, &ctx.effects);
    let field_manager = ctx.config.field_manager.as_str();
    let Some(binding) = state.current_binding(key) else {
        state.release_claims(key);
        return finalizer::sweep_orphans(state, fx, field_manager, key).await;
    };
    if finalizer::is_deleting(&binding) {
        return cleanup(ctx, key, &binding).await;
    }
    let Some(verdict) = compile_binding(ctx, key)? else {
        return Ok(()); // vanished between the index read and now
    };
    // Objects read from the API always have a namespace, name and UID; without them no
    // object can be proven to be this binding's, so nothing is written.
    let Some(owner) = Owner::of(&binding) else {
        return Ok(());
    };
    let mut plan = plan_from_caches(state, &ctx.config, key, &binding, &owner, verdict)?;
    let compiled = Arc::clone(&binding);
    let binding = finalizer::protect_output(state, fx, field_manager, key, binding, &plan).await?;
    if changed_under(&compiled, &binding) {
        // The finalizer write returned a binding edited since it was compiled: nothing more
        // is written from a stale verdict (the status would claim the new generation).
        ctx.queue.enqueue(key.clone());
        return Ok(());
    }
    let applied = apply::apply_output(state, fx, field_manager, &plan).await?;
    let ignored_record = plan.ignored_record.take();
    let spire_stats = status::spire_stats(state, applied.owned.as_ref());
    let decision = status::decide(&binding, plan, &applied, spire_stats, &status::now());
    let binding =
        status::write_if_changed(state, fx, field_manager, key, binding, &decision.desired).await?;
    finalizer::settle(state, fx, field_manager, key, &binding, &applied).await?;
    record_outcome(ctx, key, &binding, &decision, ignored_record, &owner).await;
    if changed_under(&compiled, &binding) {
        ctx.queue.enqueue(key.clone());
    }
    into_result(applied)
}

/// Was the binding edited, replaced or deleted since `compiled`, the version this
/// reconcile decided on, going by `now`, the version its last write returned?
///
/// A write's response is the object as the API server holds it after the write, so it can
/// carry an edit that landed while the reconcile ran. The edit's own watch event normally
/// queues the binding again, but after a broken watch the relist shows only the newest
/// version, the one our write returned, and the watch handler takes that for the echo of
/// our own write, which needs no reconcile ([`super::watches::on_binding`]). The reconcile
/// that wrote it must then queue the binding itself, or the edit is never reconciled: the
/// chaos soak found a binding whose status stayed at generation 1 for generation 2 (seed
/// 1106).
pub fn changed_under(compiled: &InferenceIdentityBinding, now: &InferenceIdentityBinding) -> bool {
    let (a, b) = (&compiled.metadata, &now.metadata);
    a.generation != b.generation
        || a.uid != b.uid
        || a.deletion_timestamp.is_some() != b.deletion_timestamp.is_some()
}

/// The compile step: the binding's verdict from its namespace's evaluation (`None` when the
/// binding is no longer live). Peers whose namespace-wide findings changed are enqueued.
fn compile_binding(ctx: &Context, key: &ObjectKey) -> Result<Option<BindingDecision>, Error> {
    let served = ctx.state.served();
    let evaluation = compile::evaluate_namespace_shared(
        &ctx.state,
        &cluster_config(&ctx.config),
        &key.namespace,
        &served,
    )?;
    let Some(verdict) = evaluation.verdict(&key.name) else {
        return Ok(None);
    };
    nudge_peers(&ctx.state, &ctx.queue, key, &evaluation);
    Ok(Some(verdict))
}

/// The plan step: reads the binding's output as last known and decides (pure, see
/// [`plan::plan_binding`]) what to write.
fn plan_from_caches(
    state: &SpokeState,
    config: &SpokeConfig,
    key: &ObjectKey,
    binding: &InferenceIdentityBinding,
    owner: &Owner,
    verdict: BindingDecision,
) -> Result<BindingPlan, Error> {
    let output_name = owner.object_name();
    if verdict.output.is_some() {
        state.claim_name(&output_name, key);
    }
    let served = state.served().serves(ApiKind::ClusterSpiffeIds);
    if served && !state.caches.cluster_spiffe_ids.is_ready() {
        return Err(Error::CacheNotReady("clusterspiffeids"));
    }
    let existing = served
        .then(|| state.current_cluster_spiffe_id(&output_name))
        .flatten();
    // The recorded output is only compared with the new one (status writes) and reported
    // when it names another object: it is never used to find, adopt or delete an object
    // (status is writable by the binding's tenant, see `crate::ownership`).
    let recorded = binding
        .status
        .as_ref()
        .and_then(|s| s.cluster_spiffe_id.clone());
    Ok(plan::plan_binding(
        verdict,
        owner,
        served,
        existing.as_deref(),
        recorded,
        &config.field_manager,
    ))
}

/// Metrics and events of a finished reconcile.
async fn record_outcome(
    ctx: &Context,
    key: &ObjectKey,
    binding: &InferenceIdentityBinding,
    decision: &StatusDecision,
    ignored_record: Option<kleym_api::OwnedClusterSpiffeId>,
    owner: &Owner,
) {
    let fx = &ctx.effects;
    let inputs = &decision.inputs;
    fx.metrics
        .observe_outcome(key, inputs.holding_condition(), inputs.holding_reason());
    if decision.transition != Transition::None {
        fx.events
            .publish(&binding.object_ref(&()), &decision.transition)
            .await;
    }
    if let Some(r) = ignored_record {
        // Only a write to the status subresource by someone else puts another object's
        // name there: kleym never records any name but the output name.
        let output_name = owner.object_name();
        let note = format!(
            "status.clusterSPIFFEID named ClusterSPIFFEID {} (UID {}), which is not this binding's output ({output_name}); kleym never trusts its status as proof of ownership: the record was ignored and replaced, and that object was not touched",
            r.name, r.uid
        );
        tracing::warn!(binding = %key, recorded = %r.name, "{note}");
        fx.events
            .warn(&binding.object_ref(&()), REASON_UNTRUSTED_RECORD, &note)
            .await;
    }
}

/// A failed ClusterSPIFFEID write fails the reconcile (retried with backoff) once the status
/// says so.
fn into_result(applied: Applied) -> Result<(), Error> {
    match applied.failure {
        Some(failure) => Err(failure.error),
        None => Ok(()),
    }
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
    let (state, fx) = (&ctx.state, &ctx.effects);
    let field_manager = ctx.config.field_manager.as_str();
    let served = state.served().serves(ApiKind::ClusterSpiffeIds);
    let released = finalizer::delete_output(state, fx, field_manager, binding, served).await?;
    if let OutputRelease::Foreign(foreign) = released {
        let note = format!("{foreign}; it was left untouched");
        tracing::warn!(binding = %key, "{note}");
        fx.events
            .warn(
                &binding.object_ref(&()),
                Reason::ForeignObjectHoldsName.as_str(),
                &note,
            )
            .await;
    }
    finalizer::remove(state, fx, field_manager, key, binding).await?;
    state.release_claims(key);
    fx.metrics.forget(key);
    // Peers that collided with this binding may be free now.
    let evaluation = compile::evaluate_namespace_shared(
        state,
        &cluster_config(&ctx.config),
        &key.namespace,
        &state.served(),
    )?;
    nudge_peers(state, &ctx.queue, key, &evaluation);
    Ok(())
}

/// What the compiler needs of the configuration.
pub fn cluster_config(config: &SpokeConfig) -> ClusterConfig {
    ClusterConfig {
        trust_domain: config.trust_domain.clone(),
        class_name: config.class_name.clone(),
        svid: Arc::clone(&config.svid_policy),
    }
}

/// [`enqueue_changed_peers`] for the peers of `evaluation` not compared with it since their
/// status last changed: all of them on the evaluation's first use, then only those a write
/// touched since, or that were left to their retry (compared again next time, as before).
/// A burst of reconciles in one namespace so compares each status once per change instead
/// of every peer on every reconcile.
pub fn nudge_peers(
    state: &SpokeState,
    queue: &WorkQueue,
    key: &ObjectKey,
    evaluation: &NamespaceEvaluation,
) {
    let to_check = evaluation.take_peers_to_check();
    if to_check.is_empty() {
        return;
    }
    for name in enqueue_changed_peers(state, queue, key, to_check) {
        evaluation.check_again(name);
    }
}

/// Enqueues the namespace peers whose namespace-wide findings (conflict, peers, warnings)
/// in `verdicts` differ from what their status records: collisions appear on, and resolve
/// for, every member, and warnings that name peers stay current. A peer waiting out its
/// error backoff is left to its retry ([`SpokeState::backing_off`]); those are returned.
pub fn enqueue_changed_peers<'a>(
    state: &SpokeState,
    queue: &WorkQueue,
    key: &ObjectKey,
    verdicts: impl IntoIterator<Item = (&'a String, &'a BindingDecision)>,
) -> Vec<&'a String> {
    // Every peer of the namespace is read: one cache lock for all of them (the same
    // resolution as `SpokeState::current_binding_named`: cache, then our newer writes).
    let changed: Vec<&String> = state
        .caches
        .bindings
        .read_namespace(&key.namespace, |cached| {
            verdicts
                .into_iter()
                .filter(|(name, _)| **name != key.name)
                .filter(|(name, v)| {
                    let cached = cached.and_then(|c| c.get(name.as_str())).cloned();
                    state
                        .binding_overlay
                        .resolve(&key.namespace, name, cached)
                        .is_some_and(|peer| conflict_view_differs(&peer, v))
                })
                .map(|(name, _)| name)
                .collect()
        });
    let mut left_to_retry = Vec::new();
    for name in changed {
        let peer = ObjectKey::new(key.namespace.clone(), name.clone());
        if state.backing_off(&peer) {
            left_to_retry.push(name);
        } else {
            queue.enqueue(peer);
        }
    }
    left_to_retry
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
    use crate::compiler::Refusal;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
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
    fn a_binding_changed_under_a_reconcile_only_by_its_spec_incarnation_or_deletion() {
        let compiled = {
            let mut b = peer(false, &[], &[]);
            b.metadata.uid = Some("uid-1".into());
            b.metadata.generation = Some(1);
            b.metadata.resource_version = Some("10".into());
            b
        };
        // What our own writes change: status, finalizers, resourceVersion.
        let mut ours = compiled.clone();
        ours.metadata.resource_version = Some("12".into());
        ours.metadata.finalizers = Some(vec!["kleym.io/cleanup".into()]);
        ours.status = peer(true, &["a"], &[]).status;
        assert!(!changed_under(&compiled, &ours));
        // What someone else's write changes under us.
        let mut edited = ours.clone();
        edited.metadata.generation = Some(2);
        assert!(changed_under(&compiled, &edited));
        let mut replaced = ours.clone();
        replaced.metadata.uid = Some("uid-2".into());
        assert!(changed_under(&compiled, &replaced));
        let mut deleting = ours;
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(changed_under(&compiled, &deleting));
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
