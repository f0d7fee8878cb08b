//! `ClusterIdentityStatus` content of one spoke: conditions, binding counts, the list of
//! non-ready bindings.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kleym_api::hub_status::{
    BindingCounts, ClusterIdentityStatusStatus, NonReadyBinding, condition_types, reasons,
};

use kleym_api::conditions;
use kleym_spoke::compiler::Reason;

use super::bound::{Caps, shorten};
use super::input::{AdmissionPolicyCheck, BindingSnapshot, Health, SpokeObservation};

/// The status of one spoke. `non_ready_cap` bounds the listed non-ready bindings (`None`:
/// list all, as the HTTP API does). Conditions carry `now` as `lastTransitionTime`; the
/// status writer keeps the previous time of a condition whose status did not change.
pub fn cluster_status(
    spoke: &SpokeObservation,
    now: DateTime<Utc>,
    caps: Option<&Caps>,
) -> ClusterIdentityStatusStatus {
    let counts = binding_counts(&spoke.bindings);
    let mut non_ready: Vec<NonReadyBinding> = spoke
        .bindings
        .iter()
        .filter(|b| !b.ready)
        .map(|b| NonReadyBinding {
            namespace: b.namespace.clone(),
            name: b.name.clone(),
            reason: b.reason.clone().unwrap_or_else(|| "Unknown".to_string()),
            message: b
                .message
                .as_deref()
                .map(|m| match caps {
                    Some(c) => shorten(m, c.message_len),
                    None => m.to_string(),
                })
                .unwrap_or_default(),
        })
        .collect();
    non_ready.sort();
    let mut truncated = false;
    if let Some(c) = caps
        && non_ready.len() > c.non_ready_bindings
    {
        non_ready.truncate(c.non_ready_bindings);
        truncated = true;
    }
    ClusterIdentityStatusStatus {
        conditions: conditions(spoke, &counts, now),
        trust_domain: spoke.trust_domain.clone(),
        spoke_version: spoke.spoke_version.clone(),
        last_successful_sync: spoke.last_sync.map(super::k8s_time),
        bindings: counts,
        non_ready_bindings: non_ready,
        non_ready_bindings_truncated: truncated,
        consecutive_failures: (spoke.consecutive_failures > 0)
            .then_some(i64::from(spoke.consecutive_failures)),
        next_retry_time: spoke.next_retry.map(super::k8s_time),
        duplicate_of: spoke.duplicate_of.clone(),
    }
}

/// Counts of bindings by state.
pub fn binding_counts(bindings: &[Arc<BindingSnapshot>]) -> BindingCounts {
    let mut c = BindingCounts::default();
    for b in bindings {
        c.total += 1;
        if !b.warnings.is_empty() {
            c.with_warnings += 1;
        }
        if b.ready {
            c.ready += 1;
            continue;
        }
        c.not_ready += 1;
        match b.reason.as_deref().and_then(refusal_condition) {
            Some(conditions::CONFLICT) => c.conflict += 1,
            Some(conditions::INVALID_REF) => c.invalid_ref += 1,
            Some(conditions::UNSAFE_SELECTOR) => c.unsafe_selector += 1,
            Some(conditions::RENDER_FAILURE) => c.render_failure += 1,
            _ => c.other += 1,
        }
    }
    c
}

/// The refusal condition a binding's `Ready` reason belongs to. A refused binding's `Ready`
/// carries the refusal's own reason (`TargetNotFound` is an `InvalidRef`,
/// `EmptyPoolSelector` an `UnsafeSelector`), so the reason is looked up among the spoke's
/// refusal reasons; a condition type as the reason counts as itself. Any other reason (an
/// API error while applying, not reconciled yet) is no refusal, whatever else the status
/// holds.
fn refusal_condition(reason: &str) -> Option<&'static str> {
    if let Some(r) = Reason::ALL.iter().find(|r| r.as_str() == reason) {
        return Some(r.kind().condition_type());
    }
    [
        conditions::CONFLICT,
        conditions::INVALID_REF,
        conditions::UNSAFE_SELECTOR,
        conditions::RENDER_FAILURE,
    ]
    .into_iter()
    .find(|t| *t == reason)
}

fn condition(type_: &str, status: &str, reason: &str, message: String, now: Time) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: now,
        observed_generation: None,
    }
}

fn health_condition(
    type_: &str,
    health: Health,
    ok_message: &str,
    error: Option<&str>,
    now: &Time,
) -> Condition {
    match health {
        Health::Ok => condition(
            type_,
            "True",
            reasons::OK,
            ok_message.to_string(),
            now.clone(),
        ),
        Health::Unknown => condition(
            type_,
            "Unknown",
            reasons::PENDING,
            "not observed yet".to_string(),
            now.clone(),
        ),
        Health::Failed(cat) => condition(
            type_,
            "False",
            cat.reason(),
            error.unwrap_or(cat.reason()).to_string(),
            now.clone(),
        ),
    }
}

fn conditions(
    spoke: &SpokeObservation,
    counts: &BindingCounts,
    now: DateTime<Utc>,
) -> Vec<Condition> {
    let now = super::k8s_time(now);
    let err = spoke.error_message.as_deref();
    let creds = health_condition(
        condition_types::CREDENTIALS_AVAILABLE,
        spoke.credentials,
        "the access provider produced credentials",
        err,
        &now,
    );
    let reachable = health_condition(
        condition_types::REACHABLE,
        spoke.reachable,
        "the spoke's API server answers",
        err,
        &now,
    );
    let synced = health_condition(
        condition_types::SYNCED,
        spoke.synced,
        "the spoke's bindings are watched and reconciled",
        err,
        &now,
    );
    let ready = {
        let parts = [&creds, &reachable, &synced];
        if let Some(d) = &spoke.duplicate_of {
            // Not engaged through this profile: its cluster is, through the other one.
            condition(
                condition_types::READY,
                "False",
                reasons::DUPLICATE,
                format!(
                    "the same member cluster (inventory-member-id {:?}) is engaged through \
                     ClusterProfile {}; this profile is not engaged",
                    d.member_id, d.cluster_profile
                ),
                now.clone(),
            )
        } else if let Some(failed) = parts.iter().find(|c| c.status == "False") {
            condition(
                condition_types::READY,
                "False",
                &failed.reason,
                format!("{} is False: {}", failed.type_, failed.message),
                now.clone(),
            )
        } else if let Some(unknown) = parts.iter().find(|c| c.status == "Unknown") {
            condition(
                condition_types::READY,
                "Unknown",
                reasons::PENDING,
                match err {
                    // E.g. the profile's control plane is not healthy yet (Waiting).
                    Some(why) => format!("{} is not observed yet: {why}", unknown.type_),
                    None => format!("{} is not observed yet", unknown.type_),
                },
                now.clone(),
            )
        } else if counts.not_ready > 0 {
            condition(
                condition_types::READY,
                "False",
                reasons::BINDINGS_NOT_READY,
                format!(
                    "{} of {} bindings are not ready (see nonReadyBindings)",
                    counts.not_ready, counts.total
                ),
                now.clone(),
            )
        } else {
            condition(
                condition_types::READY,
                "True",
                reasons::OK,
                format!("all {} bindings are ready", counts.total),
                now.clone(),
            )
        }
    };
    let policy = admission_policy_condition(spoke, &now);
    vec![reachable, creds, synced, ready, policy]
}

/// The `AdmissionPolicy` condition: a warning, apart from `Ready` (a spoke without the
/// policy works; it is only less protected against a stolen hub credential).
fn admission_policy_condition(spoke: &SpokeObservation, now: &Time) -> Condition {
    let type_ = condition_types::ADMISSION_POLICY;
    match &spoke.admission_policy {
        None => condition(
            type_,
            "Unknown",
            reasons::PENDING,
            "not checked yet (the hub checks once the spoke is engaged)".to_string(),
            now.clone(),
        ),
        Some(AdmissionPolicyCheck::Installed { policy }) => condition(
            type_,
            "True",
            reasons::ADMISSION_POLICY_INSTALLED,
            format!(
                "the ValidatingAdmissionPolicy{} denied the hub's server-side dry run of a \
                 ClusterSPIFFEID kleym never writes (spec.admin set)",
                if policy.is_empty() {
                    String::new()
                } else {
                    format!(" {policy}")
                }
            ),
            now.clone(),
        ),
        Some(AdmissionPolicyCheck::Missing) => condition(
            type_,
            "False",
            reasons::ADMISSION_POLICY_MISSING,
            format!(
                "the spoke would accept from the hub's user a ClusterSPIFFEID kleym never \
                 writes (a server-side dry run with spec.admin set was allowed): install the \
                 ValidatingAdmissionPolicy and its binding that `kleym trust-config{}` prints \
                 for the hub's user (section 3 of its YAML, admission-policy.yaml with \
                 --output-dir)",
                spoke
                    .trust_domain
                    .as_deref()
                    .map(|td| format!(" --trust-domain {td}"))
                    .unwrap_or_default()
            ),
            now.clone(),
        ),
        Some(AdmissionPolicyCheck::Unknown { why }) => condition(
            type_,
            "Unknown",
            reasons::ADMISSION_POLICY_UNKNOWN,
            format!("cannot tell whether the spoke enforces kleym's admission policy: {why}"),
            now.clone(),
        ),
    }
}
