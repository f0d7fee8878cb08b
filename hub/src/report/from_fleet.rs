//! Conversion from the fleet supervisor's published state ([`crate::fleet::state`]) to the
//! analysis inputs.

use chrono::{DateTime, Utc};

use kleym_api::ErrorCategory;

use super::input::{Health, SpokeObservation};
use crate::fleet::state::{Phase, SpokeState};

/// Why a syncing spoke is not ready yet (shown in its `Ready` condition).
pub const SYNCING_MESSAGE: &str = "the spoke's reconciler is doing its initial cache sync";

impl From<&SpokeState> for SpokeObservation {
    fn from(s: &SpokeState) -> Self {
        let shown = health_of(s);
        SpokeObservation {
            cluster: s.name.clone(),
            trust_domain: s.trust_domain.clone(),
            credentials: shown.credentials,
            reachable: shown.reachable,
            synced: shown.synced,
            error_message: shown.message,
            consecutive_failures: shown.failures,
            next_retry: shown.next_retry,
            spoke_version: s.version.clone(),
            last_sync: s.last_sync,
            // The spoke's snapshot itself: the analysis reads it, nothing copies it.
            bindings: s.bindings.clone(),
            duplicate_of: s.duplicate_of.clone(),
            admission_policy: s.admission_policy.clone(),
        }
    }
}

/// Every spoke of `state` as an observation, sorted by name.
pub fn observations(state: &crate::fleet::state::FleetState) -> Vec<SpokeObservation> {
    state.spokes().iter().map(SpokeObservation::from).collect()
}

impl super::full::FullReport {
    /// The full report of the fleet as the supervisor currently publishes it (the body of
    /// `GET /v1/report`).
    pub fn from_fleet(
        state: &crate::fleet::state::FleetState,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        Self::build(&observations(state), now)
    }
}

/// What a spoke's status shows: the three health aspects, the message, and while a failure
/// is shown, the failure count and the next retry.
struct Shown {
    credentials: Health,
    reachable: Health,
    synced: Health,
    message: Option<String>,
    failures: u32,
    next_retry: Option<DateTime<Utc>>,
}

impl Shown {
    fn new(aspects: (Health, Health, Health), message: Option<String>) -> Self {
        let (credentials, reachable, synced) = aspects;
        Shown {
            credentials,
            reachable,
            synced,
            message,
            failures: 0,
            next_retry: None,
        }
    }
}

/// The health aspects and the message to show, from the phase and last error.
fn health_of(s: &SpokeState) -> Shown {
    use Health::{Failed, Ok as Up, Unknown};
    // A spoke task retrying after a failure goes through the attempt's phases again
    // (Connecting, Queued, Syncing), which say nothing new about it: the last failure stays
    // shown until an attempt succeeds (engaging clears it). Otherwise a spoke failing slowly
    // (a hung plugin, a blackholed server) would show "not observed yet" most of the time.
    let retrying = s.consecutive_failures > 0 && s.last_error.is_some();
    match s.phase {
        Phase::Engaged => Shown::new((Up, Up, Up), None),
        Phase::Degraded | Phase::BackingOff => failure(s),
        Phase::Pending | Phase::Connecting | Phase::Queued | Phase::Syncing if retrying => {
            failure(s)
        }
        // Not Ready until the initial sync completed: the bindings are not known yet (or are
        // the previous engagement's), so no "all bindings ready" may be derived from them.
        Phase::Syncing => Shown::new((Up, Up, Unknown), Some(SYNCING_MESSAGE.to_string())),
        Phase::Refused => Shown::new(
            (Failed(ErrorCategory::ProfileRefused), Unknown, Unknown),
            s.reason
                .clone()
                .or_else(|| s.last_error.as_ref().map(|e| e.message.clone())),
        ),
        Phase::Pending
        | Phase::Queued
        | Phase::Connecting
        | Phase::Waiting
        | Phase::Standby
        | Phase::Removing
        | Phase::Duplicate => Shown::new((Unknown, Unknown, Unknown), s.reason.clone()),
    }
}

/// The last failure of a spoke that is backing off, retrying or degraded.
fn failure(s: &SpokeState) -> Shown {
    use Health::{Failed, Ok as Up, Unknown};
    let Some(e) = s.last_error.as_ref() else {
        return Shown::new((Unknown, Unknown, Unknown), None);
    };
    // Which aspect a failure shows on: the steps before it worked, the ones after it are
    // not known (the category itself, and so the condition reason, is passed on as is).
    let failed = Failed(e.category);
    let aspects = match e.category {
        ErrorCategory::Credentials | ErrorCategory::ProfileRefused => (failed, Unknown, Unknown),
        ErrorCategory::Unauthorized => (failed, Up, Unknown),
        ErrorCategory::Unreachable | ErrorCategory::Tls => (Up, failed, Unknown),
        ErrorCategory::Forbidden
        | ErrorCategory::CrdMissing
        | ErrorCategory::ServerError
        | ErrorCategory::SyncTimeout
        | ErrorCategory::Other => (Up, Up, failed),
    };
    Shown {
        failures: s.consecutive_failures,
        next_retry: s.next_retry,
        ..Shown::new(aspects, Some(e.message.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::Utc;
    use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};
    use kleym_spoke::reconciler::snapshot::BindingSnapshot;

    use super::*;
    use crate::fleet::state::SpokeError;

    fn snapshot() -> BindingSnapshot {
        BindingSnapshot {
            namespace: "team-a".into(),
            name: "chat".into(),
            mode: IdentityMode::PerObjective,
            spiffe_ids: vec!["spiffe://td/ns/team-a/objective/chat".into()],
            service_account: Some("vllm".into()),
            container_discriminator: Some("k8s:container-name:vllm".into()),
            pool_selector: vec![
                ("app".into(), "vllm".into()),
                ("example.com/tier".into(), "gpu".into()),
            ],
            ready: false,
            reason: Some("IdentityCollision".into()),
            message: Some("collides".into()),
            conflict_peers: vec![ConflictPeer {
                name: "summarize".into(),
                reason: "IdentityCollision".into(),
            }],
            warnings: vec![IdentityWarning {
                reason: "OverlappingDefaultIdentity".into(),
                message: "set fallback: true on x".into(),
            }],
        }
    }

    /// The observation reads the spoke's snapshot itself: a copy of every binding of the
    /// fleet on each status pass and `/metrics` scrape was 5 MB at 100 × 100.
    #[test]
    fn an_observation_shares_the_spokes_snapshot_without_copying_it() {
        let mut s = SpokeState::new("fleet/east");
        s.phase = Phase::Engaged;
        s.bindings = Arc::new(vec![Arc::new(snapshot())]);
        let o = SpokeObservation::from(&s);
        assert!(Arc::ptr_eq(&o.bindings, &s.bindings));
        assert_eq!(
            o.bindings[0].warnings[0].reason,
            "OverlappingDefaultIdentity"
        );
        assert_eq!(o.bindings[0].mode, IdentityMode::PerObjective);
    }

    /// The `Ready` condition's status, reason and message, and the total binding count, of
    /// the status built from `s`.
    fn ready_of(s: &SpokeState) -> (String, String, String, i64) {
        let status = super::super::cluster_status(&SpokeObservation::from(s), Utc::now(), None);
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == kleym_api::hub_status::condition_types::READY)
            .unwrap();
        (
            ready.status.clone(),
            ready.reason.clone(),
            ready.message.clone(),
            status.bindings.total,
        )
    }

    #[test]
    fn only_an_engaged_spoke_is_ready_and_a_syncing_one_says_so() {
        let mut ready = snapshot();
        ready.ready = true;
        ready.reason = Some("Ready".into());
        ready.conflict_peers.clear();
        for phase in Phase::ALL {
            // A new spoke (nothing observed yet) and one re-syncing with earlier bindings.
            for bindings in [
                vec![],
                vec![Arc::new(ready.clone()), Arc::new(ready.clone())],
            ] {
                let mut s = SpokeState::new("fleet/east");
                s.phase = phase;
                s.bindings = Arc::new(bindings);
                let (status, reason, message, total) = ready_of(&s);
                if phase == Phase::Engaged {
                    assert_eq!(status, "True", "{phase:?}: {message}");
                    assert_eq!(message, format!("all {total} bindings are ready"));
                } else {
                    assert_ne!(status, "True", "{phase:?} with {total} bindings: {message}");
                }
                if phase == Phase::Syncing {
                    assert_eq!((status.as_str(), reason.as_str()), ("Unknown", "Pending"));
                    assert!(message.contains(SYNCING_MESSAGE), "{message}");
                }
            }
        }
    }

    /// A spoke retrying after failures keeps showing the last one in every phase of the
    /// retry (before the fix, Connecting, Queued and Syncing showed "not observed yet"), with
    /// the failure count and the next retry; engaging clears all of it.
    #[test]
    fn a_retrying_spoke_shows_its_last_failure_until_it_is_engaged() {
        let retry_at = Utc::now() + chrono::Duration::seconds(30);
        for (category, reason) in [
            (ErrorCategory::Credentials, "CredentialPluginFailed"),
            (ErrorCategory::Unauthorized, "Unauthorized"),
            (ErrorCategory::Unreachable, "Unreachable"),
            (ErrorCategory::Forbidden, "Forbidden"),
        ] {
            let mut s = SpokeState::new("fleet/east");
            s.last_error = Some(SpokeError {
                category,
                message: "exec: executable p failed with exit code 1".into(),
                at: Utc::now(),
            });
            s.consecutive_failures = 3;
            s.next_retry = Some(retry_at);
            for phase in [
                Phase::BackingOff,
                Phase::Connecting,
                Phase::Queued,
                Phase::Syncing,
            ] {
                s.phase = phase;
                let status =
                    super::super::cluster_status(&SpokeObservation::from(&s), Utc::now(), None);
                let (st, r, message, _) = ready_of(&s);
                assert_eq!((st.as_str(), r.as_str()), ("False", reason), "{phase:?}");
                assert!(message.contains("exit code 1"), "{phase:?}: {message}");
                assert_eq!(status.consecutive_failures, Some(3), "{phase:?}");
                assert_eq!(
                    status.next_retry_time,
                    Some(crate::report::k8s_time(retry_at)),
                    "{phase:?}"
                );
            }
        }
        // A spoke that never failed shows neither, whatever its phase.
        let mut fresh = SpokeState::new("fleet/west");
        for phase in Phase::ALL {
            fresh.phase = phase;
            let status =
                super::super::cluster_status(&SpokeObservation::from(&fresh), Utc::now(), None);
            assert_eq!(status.consecutive_failures, None, "{phase:?}");
            assert_eq!(status.next_retry_time, None, "{phase:?}");
        }
    }

    #[test]
    fn spoke_phases_map_to_health() {
        let mut s = SpokeState::new("fleet/east");
        s.bindings = Arc::new(vec![Arc::new(snapshot())]);
        s.phase = Phase::Engaged;
        let o = SpokeObservation::from(&s);
        assert!(o.healthy());
        assert_eq!(o.bindings.len(), 1);

        s.phase = Phase::BackingOff;
        for (cat, want) in [
            (
                ErrorCategory::Credentials,
                (
                    Health::Failed(ErrorCategory::Credentials),
                    Health::Unknown,
                    Health::Unknown,
                ),
            ),
            (
                ErrorCategory::Unreachable,
                (
                    Health::Ok,
                    Health::Failed(ErrorCategory::Unreachable),
                    Health::Unknown,
                ),
            ),
            (
                ErrorCategory::Tls,
                (
                    Health::Ok,
                    Health::Failed(ErrorCategory::Tls),
                    Health::Unknown,
                ),
            ),
            (
                ErrorCategory::Forbidden,
                (
                    Health::Ok,
                    Health::Ok,
                    Health::Failed(ErrorCategory::Forbidden),
                ),
            ),
            (
                ErrorCategory::CrdMissing,
                (
                    Health::Ok,
                    Health::Ok,
                    Health::Failed(ErrorCategory::CrdMissing),
                ),
            ),
        ] {
            s.last_error = Some(SpokeError {
                category: cat,
                message: "boom".into(),
                at: Utc::now(),
            });
            let o = SpokeObservation::from(&s);
            assert_eq!((o.credentials, o.reachable, o.synced), want, "{cat:?}");
            assert_eq!(o.error_message.as_deref(), Some("boom"));
        }
        s.phase = Phase::Refused;
        s.reason = Some("no access provider matches".into());
        let o = SpokeObservation::from(&s);
        assert_eq!(o.credentials, Health::Failed(ErrorCategory::ProfileRefused));
        assert_eq!(
            o.error_message.as_deref(),
            Some("no access provider matches")
        );
    }
}
