//! The full condition set of a binding status, built from a verdict.
//!
//! All five conditions are always present, each with `observedGeneration`. A condition's
//! `lastTransitionTime` changes only when its `status` changes, so an unchanged verdict
//! yields byte-identical conditions (and no status write).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kleym_api::conditions as types;

use super::refusal::Refusal;

/// `Ready=True` reason.
pub const REASON_RECONCILED: &str = "Reconciled";
/// `Conflict=False` reason.
pub const REASON_NO_CONFLICT: &str = "NoConflict";
/// `InvalidRef=False` reason.
pub const REASON_RESOLVED: &str = "Resolved";
/// `UnsafeSelector=False` reason.
pub const REASON_CONFINED: &str = "Confined";
/// `RenderFailure=False` reason.
pub const REASON_RENDERED: &str = "Rendered";

/// What the binding's conditions should say: the one outcome [`build_conditions`] turns
/// into the five conditions (the reconciler's status builder stores it as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionOutcome {
    /// The output is applied: `Ready=True`.
    Ready {
        /// Message for `Ready` (e.g. the ClusterSPIFFEID name).
        message: String,
    },
    /// Not refused but not ready yet (e.g. RBAC, apiserver error, waiting to apply):
    /// `Ready=False` with this reason, every other condition False.
    Pending {
        /// `Ready` reason.
        reason: String,
        /// `Ready` message.
        message: String,
    },
    /// Refused by the compiler, the collision analysis or the ownership check: the
    /// refusal's condition True, `Ready=False` with the same reason.
    Refused(Refusal),
}

fn false_reason(condition_type: &str) -> &'static str {
    match condition_type {
        types::CONFLICT => REASON_NO_CONFLICT,
        types::UNSAFE_SELECTOR => REASON_CONFINED,
        types::RENDER_FAILURE => REASON_RENDERED,
        _ => REASON_RESOLVED,
    }
}

/// Build all five conditions, in [`kleym_api::conditions::ALL`] order, keeping
/// `lastTransitionTime` from `previous` when a condition's status is unchanged.
pub fn build_conditions(
    outcome: &ConditionOutcome,
    observed_generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    types::ALL
        .iter()
        .map(|&ty| {
            let (status, reason, message) = match (outcome, ty) {
                (ConditionOutcome::Ready { message }, types::READY) => {
                    ("True", REASON_RECONCILED, message.as_str())
                }
                (ConditionOutcome::Pending { reason, message }, types::READY) => {
                    ("False", reason.as_str(), message.as_str())
                }
                (ConditionOutcome::Refused(r), types::READY) => {
                    ("False", r.reason.as_str(), r.message.as_str())
                }
                (ConditionOutcome::Refused(r), t) if r.kind().condition_type() == t => {
                    ("True", r.reason.as_str(), r.message.as_str())
                }
                (_, t) => ("False", false_reason(t), ""),
            };
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == ty && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: ty.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation,
                last_transition_time,
            }
        })
        .collect()
}
