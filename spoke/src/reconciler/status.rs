//! The binding status the reconciler wants, built deterministically (conditions by the
//! compiler's [`build_conditions`]) so that comparing it with the cached status decides
//! whether a status write is needed at all.
//!
//! `lastTransitionTime` is carried over from the current status whenever a condition's
//! status did not change, so an unchanged outcome produces a byte-identical status and
//! therefore no write.
//!
//! The reconcile's status step: [`decide`] (pure) builds the status and the event its
//! change is worth from the plan and what the apply step did; [`write_if_changed`] writes
//! it only when it differs from the binding's.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kleym_api::conditions::READY;
use kleym_api::{
    ComputedSpiffeId, ConflictPeer, IdentityWarning, InferenceIdentityBinding,
    InferenceIdentityBindingStatus, OwnedClusterSpiffeId, SpireStats,
};

use super::apply::{self, Applied};
use super::effects::Effects;
use super::error::Error;
use super::evaluation::spiffe_id_summary;
use super::events::{self, Transition};
use super::plan::BindingPlan;
use super::queue::ObjectKey;
use super::state::SpokeState;
use crate::compiler::conditions::{ConditionOutcome, REASON_RECONCILED, build_conditions};

/// `Ready=False` reason while writing the ClusterSPIFFEID fails (RBAC, apiserver errors).
pub const REASON_APPLY_FAILED: &str = "ClusterSPIFFEIDApplyFailed";

/// Everything the status describes.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusInputs {
    /// `metadata.generation` of the binding.
    pub generation: Option<i64>,
    /// What the conditions say.
    pub outcome: ConditionOutcome,
    /// Computed SPIFFE IDs.
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// Rendered selectors.
    pub rendered_selectors: Vec<String>,
    /// The owned ClusterSPIFFEID, if any.
    pub owned: Option<OwnedClusterSpiffeId>,
    /// Conflict peers.
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings.
    pub warnings: Vec<IdentityWarning>,
    /// SPIRE stats read back from the owned ClusterSPIFFEID.
    pub spire_stats: Option<SpireStats>,
}

impl StatusInputs {
    /// The condition type that holds: `Ready` (also when pending) or the refusal's.
    pub fn holding_condition(&self) -> &'static str {
        match &self.outcome {
            ConditionOutcome::Refused(r) => r.kind().condition_type(),
            _ => READY,
        }
    }

    /// The reason of the holding condition.
    pub fn holding_reason(&self) -> &str {
        match &self.outcome {
            ConditionOutcome::Ready { .. } => REASON_RECONCILED,
            ConditionOutcome::Pending { reason, .. } => reason,
            ConditionOutcome::Refused(r) => r.reason.as_str(),
        }
    }

    /// `(condition, reason, message)` of the refusal, if refused.
    pub fn refusal(&self) -> Option<(&'static str, &'static str, &str)> {
        match &self.outcome {
            ConditionOutcome::Refused(r) => Some((
                r.kind().condition_type(),
                r.reason.as_str(),
                r.message.as_str(),
            )),
            _ => None,
        }
    }
}

/// Builds the desired status; `previous` supplies unchanged transition times, `now` new ones.
pub fn build_status(
    inputs: &StatusInputs,
    previous: Option<&InferenceIdentityBindingStatus>,
    now: &Time,
) -> InferenceIdentityBindingStatus {
    let previous_conditions = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let conditions = build_conditions(&inputs.outcome, inputs.generation, previous_conditions, now);
    let mut peers = inputs.conflict_peers.clone();
    peers.sort();
    peers.dedup();
    let mut warnings = inputs.warnings.clone();
    warnings.sort();
    warnings.dedup();
    InferenceIdentityBindingStatus {
        conditions,
        computed_spiffe_ids: inputs.computed_spiffe_ids.clone(),
        rendered_selectors: inputs.rendered_selectors.clone(),
        cluster_spiffe_id: inputs.owned.clone(),
        conflict_peers: peers,
        warnings,
        spire_stats: inputs.spire_stats,
        observed_generation: inputs.generation,
    }
}

/// True when writing `desired` would change the stored status.
pub fn status_differs(
    desired: &InferenceIdentityBindingStatus,
    current: Option<&InferenceIdentityBindingStatus>,
) -> bool {
    match current {
        None => true,
        Some(cur) => !same_status(cur, desired),
    }
}

/// Field-by-field equality, conditions compared by type regardless of stored order. Runs
/// on every reconcile: compares in place instead of cloning both statuses to sort them.
fn same_status(a: &InferenceIdentityBindingStatus, b: &InferenceIdentityBindingStatus) -> bool {
    // Exhaustive: a new status field fails to compile here until it is compared.
    let InferenceIdentityBindingStatus {
        conditions,
        computed_spiffe_ids,
        rendered_selectors,
        cluster_spiffe_id,
        conflict_peers,
        warnings,
        spire_stats,
        observed_generation,
    } = a;
    *observed_generation == b.observed_generation
        && *computed_spiffe_ids == b.computed_spiffe_ids
        && *rendered_selectors == b.rendered_selectors
        && *cluster_spiffe_id == b.cluster_spiffe_id
        && *conflict_peers == b.conflict_peers
        && *warnings == b.warnings
        && *spire_stats == b.spire_stats
        && same_conditions(conditions, &b.conditions)
}

/// Equal as lists sorted (stably) by type.
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a == b {
        return true; // the usual case: both built in the same order
    }
    by_type(a) == by_type(b)
}

fn by_type(cs: &[Condition]) -> Vec<&Condition> {
    let mut refs: Vec<&Condition> = cs.iter().collect();
    refs.sort_by(|x, y| x.type_.cmp(&y.type_));
    refs
}

/// The refusal currently recorded in a status (`Conflict`, … that is True), if any.
pub fn recorded_refusal(
    status: Option<&InferenceIdentityBindingStatus>,
) -> Option<(String, String)> {
    status?
        .conditions
        .iter()
        .find(|c| c.type_ != READY && c.status == "True")
        .map(|c| (c.type_.clone(), c.reason.clone()))
}

/// The status a binding should carry, and the event its change is worth.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusDecision {
    /// What the status describes (also read by the metrics).
    pub inputs: StatusInputs,
    /// The status to have.
    pub desired: InferenceIdentityBindingStatus,
    /// The verdict's transition from the recorded status.
    pub transition: Transition,
}

/// The status step's pure half: the status `binding` should carry after `applied`, with
/// SPIRE's `spire_stats` of the owned object.
pub fn decide(
    binding: &InferenceIdentityBinding,
    plan: BindingPlan,
    applied: &Applied,
    spire_stats: Option<SpireStats>,
    now: &Time,
) -> StatusDecision {
    let refusal = applied.refusal.clone().or(plan.refusal);
    let pending = applied.failure.as_ref().map(|f| f.message.clone());
    let outcome = match (refusal, pending) {
        (Some(r), _) => ConditionOutcome::Refused(r),
        (None, Some(message)) => ConditionOutcome::Pending {
            reason: REASON_APPLY_FAILED.into(),
            message,
        },
        (None, None) => ConditionOutcome::Ready {
            message: applied
                .owned
                .as_ref()
                .map(|o| {
                    format!(
                        "ClusterSPIFFEID {} registers {}",
                        o.name,
                        spiffe_id_summary(&plan.computed_spiffe_ids)
                    )
                })
                .unwrap_or_default(),
        },
    };
    let inputs = StatusInputs {
        generation: binding.metadata.generation,
        outcome,
        computed_spiffe_ids: plan.computed_spiffe_ids,
        rendered_selectors: plan.rendered_selectors,
        owned: applied.owned.clone(),
        conflict_peers: plan.conflict_peers,
        warnings: plan.warnings,
        spire_stats,
    };
    // Status read back (audit, see `crate::ownership`): only compared with the status we
    // want (is a write needed), carries condition transition times over, and decides
    // whether a verdict event is due. A forged status can at most cause one more write of
    // this binding's own status or change an event about this binding: no object is
    // chosen from it.
    let previous = binding.status.as_ref();
    let desired = build_status(&inputs, previous, now);
    let transition = events::transition(recorded_refusal(previous), inputs.refusal());
    StatusDecision {
        inputs,
        desired,
        transition,
    }
}

/// SPIRE's statistics on the owned ClusterSPIFFEID, as last known.
pub fn spire_stats(state: &SpokeState, owned: Option<&OwnedClusterSpiffeId>) -> Option<SpireStats> {
    owned
        .and_then(|o| state.current_cluster_spiffe_id(&o.name))
        .and_then(|o| o.stats())
        .map(|s| SpireStats {
            pods_selected: s.pods_selected,
            entries_to_set: s.entries_to_set,
            entries_masked: s.entries_masked,
            pod_entry_render_failures: s.pod_entry_render_failures,
        })
}

/// The current time, to the second (condition transition times).
pub fn now() -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()),
    )
}

/// Applies `status` to the binding when it differs from the one it carries, and returns
/// the binding as it is now.
pub async fn write_if_changed(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
    binding: Arc<InferenceIdentityBinding>,
    status: &InferenceIdentityBindingStatus,
) -> Result<Arc<InferenceIdentityBinding>, Error> {
    let previous = binding.status.as_ref();
    if !status_differs(status, previous) {
        return Ok(binding);
    }
    tracing::debug!(
        binding = %key,
        previous = ?previous,
        desired = ?status,
        "status differs; applying"
    );
    let base = binding.metadata.resource_version.clone();
    let updated = apply::apply_status(fx, field_manager, &binding, status, || {
        apply::newer_in_cache(
            &state.caches.bindings,
            &key.namespace,
            &key.name,
            base.as_deref(),
        )
    })
    .await?;
    Ok(apply::record_binding(state, key, updated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::{Reason, Refusal};
    use kleym_api::IdentityMode;
    use kleym_api::conditions;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn ready_inputs() -> StatusInputs {
        StatusInputs {
            generation: Some(3),
            outcome: ConditionOutcome::Ready {
                message: "ClusterSPIFFEID \"x\" is applied".into(),
            },
            computed_spiffe_ids: vec![ComputedSpiffeId {
                mode: IdentityMode::PerObjective,
                spiffe_id: "spiffe://td/ns/a/objective/o".into(),
            }],
            rendered_selectors: vec!["k8s:ns:a".into(), "k8s:sa:s".into()],
            owned: Some(OwnedClusterSpiffeId {
                name: "x".into(),
                uid: "u".into(),
            }),
            conflict_peers: Vec::new(),
            warnings: Vec::new(),
            spire_stats: None,
        }
    }

    fn collision() -> ConditionOutcome {
        ConditionOutcome::Refused(Refusal::new(Reason::IdentityCollision, "collides with b"))
    }

    #[test]
    fn all_five_conditions_with_observed_generation() {
        let s = build_status(&ready_inputs(), None, &t(10));
        assert_eq!(s.conditions.len(), 5);
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Reconciled")
        );
    }

    #[test]
    fn unchanged_outcome_needs_no_write_even_later() {
        let first = build_status(&ready_inputs(), None, &t(10));
        let again = build_status(&ready_inputs(), Some(&first), &t(99));
        assert!(!status_differs(&again, Some(&first)));
    }

    #[test]
    fn changed_outcome_needs_a_write_and_moves_only_changed_transition_times() {
        let first = build_status(&ready_inputs(), None, &t(10));
        let mut refused = ready_inputs();
        refused.outcome = collision();
        refused.owned = None;
        let second = build_status(&refused, Some(&first), &t(20));
        assert!(status_differs(&second, Some(&first)));
        let by = |ty: &str| {
            second
                .conditions
                .iter()
                .find(|c| c.type_ == ty)
                .unwrap()
                .clone()
        };
        assert_eq!(by(READY).status, "False");
        assert_eq!(by(READY).reason, "IdentityCollision");
        assert_eq!(by(READY).last_transition_time, t(20));
        assert_eq!(by(conditions::CONFLICT).status, "True");
        assert_eq!(by(conditions::INVALID_REF).last_transition_time, t(10));
        assert_eq!(
            recorded_refusal(Some(&second)),
            Some(("Conflict".to_string(), "IdentityCollision".to_string()))
        );
    }

    #[test]
    fn generation_bump_alone_needs_a_write() {
        let first = build_status(&ready_inputs(), None, &t(10));
        let mut next = ready_inputs();
        next.generation = Some(4);
        assert!(status_differs(
            &build_status(&next, Some(&first), &t(11)),
            Some(&first)
        ));
    }

    #[test]
    fn condition_order_does_not_matter_but_every_field_does() {
        let first = build_status(&ready_inputs(), None, &t(10));
        let mut reordered = first.clone();
        reordered.conditions.reverse();
        assert!(!status_differs(&reordered, Some(&first)));

        let mut changed_condition = reordered.clone();
        changed_condition.conditions[0].message = "other".into();
        assert!(status_differs(&changed_condition, Some(&first)));
        let mut fewer = first.clone();
        fewer.conditions.pop();
        assert!(status_differs(&fewer, Some(&first)));
        let mut selectors = first.clone();
        selectors
            .rendered_selectors
            .push("k8s:pod-label:a:b".into());
        assert!(status_differs(&selectors, Some(&first)));
        let mut stats = first.clone();
        stats.spire_stats = Some(SpireStats::default());
        assert!(status_differs(&stats, Some(&first)));
        let mut owner = first.clone();
        owner.cluster_spiffe_id = None;
        assert!(status_differs(&owner, Some(&first)));
    }

    #[test]
    fn missing_status_needs_a_write() {
        let s = build_status(&ready_inputs(), None, &t(1));
        assert!(status_differs(&s, None));
    }

    #[test]
    fn pending_is_not_ready_and_refuses_nothing() {
        let mut p = ready_inputs();
        p.outcome = ConditionOutcome::Pending {
            reason: "ClusterSPIFFEIDApplyFailed".into(),
            message: "forbidden".into(),
        };
        let s = build_status(&p, None, &t(1));
        assert_eq!(recorded_refusal(Some(&s)), None);
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "ClusterSPIFFEIDApplyFailed");
        assert_eq!(p.holding_condition(), READY);
    }
}
