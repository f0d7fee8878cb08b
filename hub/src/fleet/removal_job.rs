//! The removal job: what the leader does for a spoke whose ClusterProfile was deleted or left
//! the selection — apply the removal policy to the spoke (passes retried with jittered
//! backoff until done or until the deadline), then remove kleym's finalizer from the
//! profile so it can go.
//!
//! - Profile being deleted (`deletionTimestamp`): `--removal-policy`, deadline =
//!   `deletionTimestamp + --removal-timeout-seconds`.
//! - Profile gone from the watch without a `deletionTimestamp` seen: one GET tells why. Still
//!   there → it left `--clusterprofile-selector`: `Orphan` whatever the policy (a label change
//!   never deletes identities). Being deleted → as above. Really gone (404, or the name holds
//!   another object: kleym's finalizer was forced off) → the policy, best effort.
//! - Unusable access (refused profile, no earlier engagement): logged; the profile's
//!   finalizer is removed all the same (nothing kleym can do about the spoke).
//!
//! Stopped (leadership lost, shutdown) the job leaves the profile's finalizer in place: the
//! next leader finds the profile (deleting) in its initial list and runs the job again.
//! Quiet (the profile came back into the selection while the job ran) the job finishes its
//! pass but leaves the finalizer too: the newer engagement, chained after it, relies on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kleym_spoke::reconciler::CancellationToken;

use super::chain::Previous;
use super::errors::EngageError;
use super::profile_finalizer::{Lookup, ProfileRef, Released, look_up, release};
use super::removal::{PassBounds, RemovalPolicy, RemovalReport, removal_events, removal_pass};
use super::spoke_task::TaskShared;
use super::state::{ErrorCategory, Phase, SpokeError};
use crate::credentials::build_spoke_client;
use crate::inventory::SpokeSpec;

/// How many left-over bindings a log line or published reason names.
const NAMED: usize = 5;

/// Why the job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The profile has a `deletionTimestamp`.
    Deleting {
        /// Its `deletionTimestamp`.
        since: DateTime<Utc>,
    },
    /// The profile left the watch (watch delete or resync) without a `deletionTimestamp`.
    Departed,
}

/// What the job does, decided from the trigger (and for [`Trigger::Departed`] a GET).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The policy applied to the spoke.
    pub policy: RemovalPolicy,
    /// Remove kleym's finalizer from the profile afterwards.
    pub release: bool,
    /// Retry failed passes until then.
    pub deadline: DateTime<Utc>,
    /// For logs and the published reason.
    pub why: &'static str,
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The plan for a profile with a `deletionTimestamp`.
pub(crate) fn plan_deleting(
    since: DateTime<Utc>,
    policy: RemovalPolicy,
    timeout: Duration,
) -> Plan {
    Plan {
        policy,
        release: true,
        deadline: after(since, timeout),
        why: "ClusterProfile deleted",
    }
}

/// The plan for a profile that left the watch, from what a GET found.
pub(crate) fn plan_departed(
    found: &Lookup,
    policy: RemovalPolicy,
    now: DateTime<Utc>,
    timeout: Duration,
) -> Plan {
    match found {
        Lookup::Gone => Plan {
            policy,
            release: false,
            deadline: after(now, timeout),
            why: "ClusterProfile deleted without kleym's finalizer (best effort)",
        },
        Lookup::Present {
            deleting_since: Some(since),
            has_finalizer,
        } => Plan {
            release: *has_finalizer,
            ..plan_deleting(*since, policy, timeout)
        },
        Lookup::Present {
            deleting_since: None,
            has_finalizer,
        } => Plan {
            policy: RemovalPolicy::Orphan,
            release: *has_finalizer,
            deadline: after(now, timeout),
            why: "ClusterProfile no longer selected by --clusterprofile-selector (Orphan: identities are never deleted because of a label change)",
        },
    }
}

/// One removal job.
pub(crate) struct RemovalJob {
    /// The spoke name (`<namespace>/<name>`).
    pub name: String,
    /// The profile.
    pub profile: ProfileRef,
    /// How to reach the spoke, or why that is impossible.
    pub access: Result<SpokeSpec, String>,
    /// Why the job runs.
    pub trigger: Trigger,
    /// Stops the job at once (leadership lost, shutdown): the profile keeps its finalizer.
    pub stop: CancellationToken,
    /// Set when a newer engagement of the spoke exists: the job finishes its pass but no
    /// longer publishes (the state is the new engagement's) nor releases the profile (the
    /// new engagement relies on its finalizer).
    pub quiet: Arc<AtomicBool>,
    /// How the job ended (set once, when it ran to its end): what the supervisor
    /// republishes when it finds the profile still listed later (e.g. leading again).
    pub outcome: Arc<OnceLock<String>>,
    /// The spoke's previous task.
    pub previous: Option<Previous>,
    /// Cancelled when the job ended.
    pub done: CancellationToken,
    /// Another profile of the same member cluster (`inventory-member-id`) that the cluster
    /// is handed over to: the cluster stays in the fleet, so the removal policy is not
    /// applied (its identities stay, engaged through that profile); only kleym's finalizer
    /// is released.
    pub hand_over: Option<String>,
}

struct Job<'a> {
    shared: &'a TaskShared,
    name: &'a str,
    stop: &'a CancellationToken,
    quiet: &'a AtomicBool,
}

impl Job<'_> {
    fn publish(&self, f: impl FnOnce(&mut super::state::SpokeState)) {
        if !self.is_quiet() && !self.stop.is_cancelled() {
            self.shared.state.update(self.name, f);
        }
    }

    fn is_quiet(&self) -> bool {
        self.quiet.load(Ordering::Acquire)
    }

    fn removing(&self, reason: String, error: Option<SpokeError>) {
        self.publish(|s| {
            s.phase = Phase::Removing;
            s.reason = Some(reason);
            if let Some(e) = error {
                s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                s.last_error = Some(e);
            }
        });
    }

    /// Sleeps `delay` unless stopped first (`false`).
    async fn sleep(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

fn spoke_error(category: ErrorCategory, message: String) -> SpokeError {
    SpokeError {
        category,
        message,
        at: Utc::now(),
    }
}

/// How applying the policy ended.
enum Applied {
    Done(RemovalReport),
    GaveUp { left: String },
    Skipped { reason: String },
    Stopped,
}

/// Runs a removal job to its end (or until stopped).
pub(crate) async fn run_removal(shared: TaskShared, hub: kube::Client, job: RemovalJob) {
    let _done = job.done.clone().drop_guard();
    if let Some(p) = &job.previous {
        p.wait().await;
    }
    let j = Job {
        shared: &shared,
        name: &job.name,
        stop: &job.stop,
        quiet: &job.quiet,
    };
    let opts = shared.opts.clone();
    let policy = opts.removal_policy;
    let started = Utc::now();
    let plan = match job.trigger {
        Trigger::Deleting { since } => plan_deleting(since, policy, opts.removal_timeout),
        Trigger::Departed => {
            j.removing(
                "ClusterProfile left the inventory; checking whether it was deleted".into(),
                None,
            );
            let mut failures: u32 = 0;
            loop {
                let found = tokio::select! {
                    biased;
                    _ = job.stop.cancelled() => return,
                    r = look_up(&hub, opts.profile_version.for_writes(), &job.profile, opts.request_timeout) => r,
                };
                match found {
                    Ok(found) => {
                        break plan_departed(&found, policy, Utc::now(), opts.removal_timeout);
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let delay = opts.backoff.delay(failures);
                        tracing::warn!(spoke = %job.name, error = %e, retry_in = ?delay, "reading a ClusterProfile that left the inventory failed");
                        j.removing(
                            "ClusterProfile left the inventory; reading it failed, retrying".into(),
                            Some(e.to_spoke_error()),
                        );
                        if !j.sleep(delay).await {
                            return;
                        }
                    }
                }
            }
        }
    };
    tracing::info!(spoke = %job.name, policy = ?plan.policy, why = plan.why, deadline = %plan.deadline, "removing spoke");
    if job.stop.is_cancelled() {
        return;
    }
    let applied = match (&job.hand_over, &job.access) {
        (Some(to), _) => {
            tracing::info!(
                spoke = %job.name,
                successor = %to,
                "member cluster handed over to another ClusterProfile: removal policy not applied"
            );
            let why = format!(
                "{}; the member cluster stays in the fleet through ClusterProfile {to}: \
                 removal policy not applied",
                plan.why
            );
            j.removing(why.clone(), None);
            Applied::Skipped { reason: why }
        }
        (None, Err(reason)) => {
            tracing::warn!(
                spoke = %job.name,
                policy = ?plan.policy,
                %reason,
                "spoke access unusable: removal policy not applied; its bindings keep kleym.io/cleanup"
            );
            let why = format!(
                "{}; access unusable ({reason}): removal policy not applied",
                plan.why
            );
            j.removing(
                why.clone(),
                Some(spoke_error(ErrorCategory::Other, reason.clone())),
            );
            Applied::Skipped { reason: why }
        }
        (None, Ok(spec)) => apply_until_deadline(&j, spec, &plan, started).await,
    };
    let label = match (&applied, &job.hand_over) {
        (_, Some(_)) => "handed_over",
        (Applied::Done(_), None) => "done",
        (Applied::GaveUp { .. }, None) => "gave_up",
        (Applied::Skipped { .. } | Applied::Stopped, None) => "skipped",
    };
    let outcome = match &applied {
        Applied::Stopped => return,
        Applied::Done(report) => {
            tracing::info!(
                spoke = %job.name,
                policy = ?plan.policy,
                finalizers_removed = report.finalizers_removed,
                cluster_spiffe_ids_deleted = report.cluster_spiffe_ids_deleted,
                foreign_kept = report.foreign_kept,
                "spoke removed"
            );
            format!("{}: removal policy {:?} done", plan.why, plan.policy)
        }
        Applied::GaveUp { left } => {
            tracing::warn!(
                spoke = %job.name,
                policy = ?plan.policy,
                timeout_seconds = opts.removal_timeout.as_secs(),
                %left,
                "removal gave up at its deadline; what is left keeps kleym.io/cleanup"
            );
            format!(
                "{}: removal policy {:?} gave up at its deadline: {left}",
                plan.why, plan.policy
            )
        }
        Applied::Skipped { reason } => reason.clone(),
    };
    if plan.release {
        if j.is_quiet() {
            tracing::info!(spoke = %job.name, profile = %job.profile, "the profile is selected again: kleym.io/spoke-removal stays for its new engagement");
        } else if !release_until_done(&j, &hub, &job.profile).await {
            return;
        }
    }
    j.removing(outcome.clone(), None);
    let _ = job.outcome.set(outcome);
    shared
        .state
        .removals()
        .get_or_create(&super::state::RemovalLabels {
            outcome: label.to_string(),
        })
        .inc();
}

/// Passes until one leaves nothing, or the deadline passed (at least one full attempt, even
/// when the deadline passed before the job started: e.g. the hub was down).
async fn apply_until_deadline(
    j: &Job<'_>,
    spec: &SpokeSpec,
    plan: &Plan,
    started: DateTime<Utc>,
) -> Applied {
    let opts = &j.shared.opts;
    let floor = after(started, opts.request_timeout.saturating_mul(2));
    let deadline = plan.deadline.max(floor);
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let left_time = (deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        let until = Instant::now() + left_time;
        j.removing(
            format!(
                "{}: applying removal policy {:?} (attempt {attempt}, until {deadline})",
                plan.why, plan.policy
            ),
            None,
        );
        let limit = left_time.min(opts.request_timeout);
        let creds = j.shared.cache.for_access(&spec.access);
        let attempt_result = tokio::select! {
            biased;
            _ = j.stop.cancelled() => return Applied::Stopped,
            r = async {
                let client = match tokio::time::timeout(limit, build_spoke_client(creds, &opts.client)).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        let e = EngageError::Client(e);
                        return Err((e.to_string(), e.category()));
                    }
                    Err(_) => {
                        return Err((
                            format!("getting a credential and building the client timed out after {}s", limit.as_secs()),
                            ErrorCategory::Credentials,
                        ));
                    }
                };
                let bounds = PassBounds { request_timeout: opts.request_timeout, deadline: Some(until) };
                let events = removal_events(&client.client, opts.event_instance.clone(), opts.publish_events);
                match removal_pass(&client.client, plan.policy, bounds, &events).await {
                    Ok(report) if report.is_complete() => Ok(report),
                    Ok(report) => {
                        let category = report.left.first().map_or(ErrorCategory::Other, |l| l.category);
                        Err((
                            format!("{} binding(s) left: {}", report.left.len(), report.left_summary(NAMED)),
                            category,
                        ))
                    }
                    Err(e) => Err((e.to_string(), e.category())),
                }
            } => r,
        };
        let (message, category) = match attempt_result {
            Ok(report) => return Applied::Done(report),
            Err(x) => x,
        };
        if Utc::now() >= deadline {
            j.removing(
                format!(
                    "{}: removal policy {:?} gave up at its deadline ({deadline}): {message}",
                    plan.why, plan.policy
                ),
                Some(spoke_error(category, message.clone())),
            );
            return Applied::GaveUp { left: message };
        }
        let delay = opts
            .backoff
            .delay(attempt)
            .min((deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO));
        tracing::warn!(
            spoke = %j.name,
            policy = ?plan.policy,
            attempt,
            category = category.as_str(),
            error = %message,
            retry_in = ?delay,
            "removal attempt failed"
        );
        j.removing(
            format!(
                "{}: removal policy {:?} attempt {attempt} failed, retrying until {deadline}",
                plan.why, plan.policy
            ),
            Some(spoke_error(category, message)),
        );
        if !j.sleep(delay).await {
            return Applied::Stopped;
        }
    }
}

/// Removes kleym's finalizer from the profile, retrying (the hub cluster is expected to
/// come back) until done (`true`), stopped, or a newer engagement of the profile relies
/// on the finalizer (quiet).
async fn release_until_done(j: &Job<'_>, hub: &kube::Client, profile: &ProfileRef) -> bool {
    let opts = &j.shared.opts;
    let mut failures: u32 = 0;
    loop {
        if j.is_quiet() {
            return false;
        }
        let r = tokio::select! {
            biased;
            _ = j.stop.cancelled() => return false,
            r = release(hub, opts.profile_version.for_writes(), profile, opts.request_timeout) => r,
        };
        match r {
            Ok(Released::Removed) => {
                tracing::info!(spoke = %j.name, %profile, "removed kleym.io/spoke-removal from the ClusterProfile");
                return true;
            }
            Ok(Released::Absent | Released::Gone) => return true,
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = opts.backoff.delay(failures);
                tracing::warn!(spoke = %j.name, %profile, category = e.category().as_str(), error = %e, retry_in = ?delay, "removing kleym's finalizer from the ClusterProfile failed");
                j.removing(
                    "removing kleym.io/spoke-removal from the ClusterProfile failed; retrying"
                        .into(),
                    Some(e.to_spoke_error()),
                );
                if !j.sleep(delay).await {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    const TEN_MIN: Duration = Duration::from_secs(600);

    #[test]
    fn deletion_applies_the_policy_until_deletion_time_plus_timeout() {
        let p = plan_deleting(t("2026-01-01T00:00:00Z"), RemovalPolicy::Cleanup, TEN_MIN);
        assert_eq!(p.policy, RemovalPolicy::Cleanup);
        assert!(p.release);
        assert_eq!(p.deadline, t("2026-01-01T00:10:00Z"));
    }

    #[test]
    fn leaving_the_selection_is_always_orphan_and_releases_only_our_finalizer() {
        let now = t("2026-01-01T01:00:00Z");
        for has_finalizer in [true, false] {
            let p = plan_departed(
                &Lookup::Present {
                    deleting_since: None,
                    has_finalizer,
                },
                RemovalPolicy::Cleanup,
                now,
                TEN_MIN,
            );
            assert_eq!(p.policy, RemovalPolicy::Orphan);
            assert_eq!(p.release, has_finalizer);
            assert_eq!(p.deadline, t("2026-01-01T01:10:00Z"));
        }
    }

    #[test]
    fn a_departed_profile_being_deleted_gets_the_policy_from_its_deletion_time() {
        let p = plan_departed(
            &Lookup::Present {
                deleting_since: Some(t("2026-01-01T00:00:00Z")),
                has_finalizer: true,
            },
            RemovalPolicy::Cleanup,
            t("2026-01-01T01:00:00Z"),
            TEN_MIN,
        );
        assert_eq!(p.policy, RemovalPolicy::Cleanup);
        assert!(p.release);
        assert_eq!(p.deadline, t("2026-01-01T00:10:00Z"));
    }

    #[test]
    fn a_profile_really_gone_gets_the_policy_best_effort_without_a_finalizer_to_release() {
        let p = plan_departed(
            &Lookup::Gone,
            RemovalPolicy::Cleanup,
            t("2026-01-01T01:00:00Z"),
            TEN_MIN,
        );
        assert_eq!(p.policy, RemovalPolicy::Cleanup);
        assert!(!p.release);
        assert_eq!(p.deadline, t("2026-01-01T01:10:00Z"));
    }
}
