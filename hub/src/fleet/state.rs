//! The fleet's published per-spoke state, shared between the supervisor (writer) and the
//! status/report code and HTTP API (readers).
//!
//! Readers call [`FleetState::spokes`] / [`FleetState::get`] for a consistent copy of one
//! spoke's state, and [`FleetState::subscribe`] to be woken when anything changed (the value
//! is a change counter; compare or just re-read). Writers never hold an entry across I/O.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use kleym_api::hub_status::DuplicateOf;
use kleym_spoke::reconciler::context::Context;
use kleym_spoke::reconciler::snapshot::BindingSnapshot;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::watch;

/// The fleet's one error taxonomy (also the report's), re-exported where the fleet's
/// failures are published.
pub use kleym_api::ErrorCategory;

use super::admission_probe::AdmissionPolicyCheck;
use super::spoke_metrics::SpokeMetricsMap;

/// Where a spoke is in its life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Phase {
    /// Known, about to be engaged.
    Pending,
    /// Waiting for a sync slot (the fleet-wide limit of spokes syncing at once).
    Queued,
    /// Getting credentials and checking the API server.
    Connecting,
    /// Reconciler started; caches are syncing.
    Syncing,
    /// Reconciler running with synced caches.
    Engaged,
    /// Engaged, but the last health probe failed (the reconciler keeps retrying on its own).
    Degraded,
    /// The last attempt failed; retrying after a jittered, growing delay.
    BackingOff,
    /// The profile is valid but its engage condition is not `True`.
    Waiting,
    /// The profile is unusable (see `reason`).
    Refused,
    /// This hub replica is not the leader; nothing is engaged.
    Standby,
    /// The profile was deleted or left the selection; applying the removal policy (progress,
    /// retries and a give-up are in `reason` and `last_error`).
    Removing,
    /// Another profile of the same member cluster (`inventory-member-id`) is engaged; this
    /// one is not (see `duplicate_of`).
    Duplicate,
}

impl Phase {
    /// Every phase, in life-cycle order (metrics export one series per phase).
    pub const ALL: [Phase; 12] = [
        Phase::Pending,
        Phase::Queued,
        Phase::Connecting,
        Phase::Syncing,
        Phase::Engaged,
        Phase::Degraded,
        Phase::BackingOff,
        Phase::Waiting,
        Phase::Refused,
        Phase::Standby,
        Phase::Removing,
        Phase::Duplicate,
    ];

    /// The phase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Queued => "Queued",
            Phase::Connecting => "Connecting",
            Phase::Syncing => "Syncing",
            Phase::Engaged => "Engaged",
            Phase::Degraded => "Degraded",
            Phase::BackingOff => "BackingOff",
            Phase::Waiting => "Waiting",
            Phase::Refused => "Refused",
            Phase::Standby => "Standby",
            Phase::Removing => "Removing",
            Phase::Duplicate => "Duplicate",
        }
    }
}

/// A categorised spoke failure. `message` never contains credential values.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SpokeError {
    /// Category.
    pub category: ErrorCategory,
    /// Human-readable detail.
    pub message: String,
    /// When it happened.
    pub at: DateTime<Utc>,
}

/// The published state of one spoke. Cloned out of [`FleetState`] on read.
#[derive(Clone, Debug, PartialEq)]
pub struct SpokeState {
    /// Spoke name `<namespace>/<name>` (the ClusterProfile).
    pub name: String,
    /// Life-cycle phase.
    pub phase: Phase,
    /// Why the spoke is `Waiting`, `Refused` (the refusal reason names the field or rule) or
    /// `Removing` (the removal's progress).
    pub reason: Option<String>,
    /// Last failure (kept after recovery until the next success clears it).
    pub last_error: Option<SpokeError>,
    /// Failures since the last successful sync.
    pub consecutive_failures: u32,
    /// When the spoke task retries after its last failure (in the past while that attempt
    /// runs). Kept, like `last_error`, until an attempt succeeds.
    pub next_retry: Option<DateTime<Utc>>,
    /// Last time the reconciler was synced and idle.
    pub last_sync: Option<DateTime<Utc>>,
    /// The spoke API server's `gitVersion`.
    pub version: Option<String>,
    /// Trust domain the spoke compiles with.
    pub trust_domain: Option<String>,
    /// SPIRE class the spoke compiles with.
    pub spire_class_name: Option<String>,
    /// Access provider in use.
    pub provider: Option<String>,
    /// How many times a reconciler was started for a new effective configuration
    /// (retries after failures are not counted).
    pub engagements: u64,
    /// Per-binding results, as the spoke's reconciler last saw them.
    pub bindings: Arc<Vec<Arc<BindingSnapshot>>>,
    /// The engaged profile of the same member cluster, while this one is
    /// [`Phase::Duplicate`].
    pub duplicate_of: Option<DuplicateOf>,
    /// Whether the spoke enforces kleym's admission policy, as last checked (`None`: not
    /// checked yet). Kept while the spoke is unreachable, like `bindings`.
    pub admission_policy: Option<AdmissionPolicyCheck>,
}

impl SpokeState {
    /// A fresh state for `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            phase: Phase::Pending,
            reason: None,
            last_error: None,
            consecutive_failures: 0,
            next_retry: None,
            last_sync: None,
            version: None,
            trust_domain: None,
            spire_class_name: None,
            provider: None,
            engagements: 0,
            bindings: Arc::new(Vec::new()),
            duplicate_of: None,
            admission_policy: None,
        }
    }
}

#[derive(Debug)]
struct Inner {
    spokes: DashMap<String, SpokeState>,
    changed: watch::Sender<u64>,
    leading: AtomicBool,
    /// Sharded mode: each replica runs, and reports, the spokes it owns.
    sharded: AtomicBool,
    spoke_metrics: SpokeMetricsMap,
    /// Seconds from the start of an engagement attempt to `Engaged` (client, preflight,
    /// initial cache sync): the `kleym_hub_spoke_engage_duration_seconds` histogram. Kept
    /// here because every spoke task holds the state, not the registry.
    engage_duration: prometheus_client::metrics::histogram::Histogram,
    /// Removal jobs that ran to their end, by outcome: `kleym_hub_spoke_removals_total`.
    removals: Family<RemovalLabels, Counter>,
    /// The client of each spoke engaged by this replica, while it is engaged: what the hub
    /// API's explain routes read the spoke with. Kept apart from [`SpokeState`], which is
    /// published and compared.
    reach: DashMap<String, SpokeClientHandle>,
    /// The UID of every listed profile, by spoke name, as the inventory watch last saw it:
    /// what the status loop puts in each status's owner reference, so that it need not
    /// list every profile of the fleet again for them.
    profile_uids: DashMap<String, String>,
}

/// A spoke's client and its running reconciler, as [`FleetState`] keeps them
/// (`kube::Client` has no `Debug`).
#[derive(Clone)]
struct SpokeClientHandle(kube::Client, Arc<Context>);

impl std::fmt::Debug for SpokeClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kube::Client")
    }
}

/// `outcome` label of `kleym_hub_spoke_removals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemovalLabels {
    /// `done`, `gave_up`, `skipped` (access unusable) or `handed_over` (another profile of
    /// the same member cluster engages it).
    pub outcome: String,
}

/// Shared, cheaply clonable fleet state.
#[derive(Clone, Debug)]
pub struct FleetState {
    inner: Arc<Inner>,
}

impl Default for FleetState {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetState {
    /// An empty fleet.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                spokes: DashMap::new(),
                changed: watch::channel(0).0,
                leading: AtomicBool::new(false),
                sharded: AtomicBool::new(false),
                spoke_metrics: SpokeMetricsMap::default(),
                // 50 ms .. ~7 min: a cold engagement of a large spoke can take minutes.
                engage_duration: prometheus_client::metrics::histogram::Histogram::new(
                    prometheus_client::metrics::histogram::exponential_buckets(0.05, 2.0, 14),
                ),
                removals: Family::default(),
                reach: DashMap::new(),
                profile_uids: DashMap::new(),
            }),
        }
    }

    /// Every spoke's state, sorted by name.
    pub fn spokes(&self) -> Vec<SpokeState> {
        self.spokes_where(|_| true)
    }

    /// The spokes [`FleetState::may_report`] lets this replica answer for, sorted by name:
    /// in sharded mode only those are copied (the others are most of the fleet).
    pub fn reported_spokes(&self) -> Vec<SpokeState> {
        self.spokes_where(|s| self.answers_for(s))
    }

    fn spokes_where(&self, keep: impl Fn(&SpokeState) -> bool) -> Vec<SpokeState> {
        let mut out: Vec<SpokeState> = self
            .inner
            .spokes
            .iter()
            .filter(|e| keep(e.value()))
            .map(|e| e.value().clone())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// How many spokes are in each phase (no spoke's state is copied: the gauges follow
    /// every change of a fleet of thousands).
    pub fn phase_counts(&self) -> std::collections::HashMap<Phase, usize> {
        let mut counts = std::collections::HashMap::new();
        for e in self.inner.spokes.iter() {
            *counts.entry(e.value().phase).or_insert(0) += 1;
        }
        counts
    }

    /// One spoke's state.
    pub fn get(&self, name: &str) -> Option<SpokeState> {
        self.inner.spokes.get(name).map(|e| e.value().clone())
    }

    /// Number of known spokes.
    pub fn len(&self) -> usize {
        self.inner.spokes.len()
    }

    /// No spoke known.
    pub fn is_empty(&self) -> bool {
        self.inner.spokes.is_empty()
    }

    /// A receiver woken on every change (the value is a change counter).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// The current change counter. Read it *before* reading the state: a value built from
    /// what was read then may be kept until the counter moves (a change that lands while
    /// building bumps the counter after it, so it is never missed).
    pub fn change_counter(&self) -> u64 {
        *self.inner.changed.borrow()
    }

    /// Whether this replica currently leads (engages spokes and writes).
    pub fn is_leader(&self) -> bool {
        self.inner.leading.load(Ordering::Acquire)
    }

    /// The live spoke reconcilers' metrics (each spoke task lists its own while it runs).
    pub fn spoke_metrics(&self) -> &SpokeMetricsMap {
        &self.inner.spoke_metrics
    }

    /// The engage-latency histogram (observed by spoke tasks when a spoke becomes
    /// `Engaged`; registered by [`FleetMetrics::register_engage`](super::FleetMetrics)).
    pub fn engage_duration(&self) -> &prometheus_client::metrics::histogram::Histogram {
        &self.inner.engage_duration
    }

    /// Removal jobs ended, by outcome (counted by the jobs; registered by
    /// [`FleetMetrics::register_engage`](super::FleetMetrics)).
    pub fn removals(&self) -> &Family<RemovalLabels, Counter> {
        &self.inner.removals
    }

    /// Removal jobs that ended with `outcome` so far.
    pub fn removals_ended(&self, outcome: &str) -> u64 {
        self.inner
            .removals
            .get_or_create(&RemovalLabels {
                outcome: outcome.to_string(),
            })
            .get()
    }

    /// Whether the supervisor runs in sharded mode (then spokes this replica does not own
    /// are published as `Standby`, and only the others are its to report).
    pub fn is_sharded(&self) -> bool {
        self.inner.sharded.load(Ordering::Acquire)
    }

    /// Records sharded mode (supervisor only).
    pub fn set_sharded(&self, sharded: bool) {
        self.inner.sharded.store(sharded, Ordering::Release);
    }

    /// Whether this replica may write the spoke's `ClusterIdentityStatus` now: in leader
    /// mode while leading; in sharded mode while it handles the spoke (published, and not
    /// `Standby`: a spoke another replica owns, or one not taken yet, is `Standby` here).
    pub fn may_report(&self, name: &str) -> bool {
        if !self.is_sharded() {
            return self.is_leader();
        }
        self.inner
            .spokes
            .get(name)
            .is_some_and(|s| self.answers_for(s.value()))
    }

    /// [`FleetState::may_report`] for a spoke whose state is at hand.
    fn answers_for(&self, s: &SpokeState) -> bool {
        if self.is_sharded() {
            s.phase != Phase::Standby
        } else {
            self.is_leader()
        }
    }

    /// Records leadership (supervisor only).
    pub fn set_leader(&self, leading: bool) {
        if self.inner.leading.swap(leading, Ordering::AcqRel) != leading {
            self.notify();
        }
    }

    /// Changes one spoke's state (creating it) and notifies subscribers when it changed.
    /// `f` runs under the entry's lock: it must not block.
    pub fn update(&self, name: &str, f: impl FnOnce(&mut SpokeState)) {
        let changed = {
            let mut created = false;
            let mut entry = self
                .inner
                .spokes
                .entry(name.to_string())
                .or_insert_with(|| {
                    created = true;
                    SpokeState::new(name)
                });
            let before = entry.value().clone();
            f(entry.value_mut());
            created || *entry.value() != before
        };
        if changed {
            self.notify();
        }
    }

    /// The client of spoke `name` and the context of its running reconciler (whose caches
    /// the explain routes read), while this replica engages it.
    pub fn spoke_client(&self, name: &str) -> Option<(kube::Client, Arc<Context>)> {
        self.inner
            .reach
            .get(name)
            .map(|c| (c.value().0.clone(), Arc::clone(&c.value().1)))
    }

    /// Lists `client` and the reconciler `context` as spoke `name`'s until the returned
    /// guard is dropped (the spoke task holds it while the spoke is engaged, and drops it
    /// when it stops or is aborted).
    pub fn reach_spoke(
        &self,
        name: &str,
        client: kube::Client,
        context: Arc<Context>,
    ) -> ReachGuard {
        self.inner
            .reach
            .insert(name.to_string(), SpokeClientHandle(client, context));
        ReachGuard {
            state: self.clone(),
            name: name.to_string(),
        }
    }

    /// Records the UID of the listed profile of spoke `name` (the inventory's view of it).
    pub fn note_profile_uid(&self, name: &str, uid: &str) {
        self.inner
            .profile_uids
            .insert(name.to_string(), uid.to_string());
    }

    /// Forgets the UID of spoke `name`'s profile (it left the inventory).
    pub fn forget_profile_uid(&self, name: &str) {
        self.inner.profile_uids.remove(name);
    }

    /// Keeps the profile UIDs of the spokes `listed` alone (after a full list).
    pub fn retain_profile_uids(&self, listed: impl Fn(&str) -> bool) {
        self.inner.profile_uids.retain(|name, _| listed(name));
    }

    /// The UID of spoke `name`'s profile as the inventory last saw it.
    pub fn profile_uid(&self, name: &str) -> Option<String> {
        self.inner.profile_uids.get(name).map(|u| u.value().clone())
    }

    /// Forgets a spoke (profile deleted and removal done).
    pub fn remove(&self, name: &str) {
        if self.inner.spokes.remove(name).is_some() {
            self.notify();
        }
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// Keeps a spoke's client listed in [`FleetState::spoke_client`] while it lives.
#[derive(Debug)]
pub struct ReachGuard {
    state: FleetState,
    name: String,
}

impl Drop for ReachGuard {
    fn drop(&mut self) {
        self.state.inner.reach.remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The profile UIDs follow the inventory: recorded, replaced by a recreated profile's,
    /// forgotten when the profile leaves, and cut to the listed ones after a full list.
    #[test]
    fn profile_uids_follow_the_inventory() {
        let state = FleetState::new();
        assert_eq!(state.profile_uid("fleet/a"), None);
        state.note_profile_uid("fleet/a", "uid-1");
        state.note_profile_uid("fleet/b", "uid-2");
        state.note_profile_uid("fleet/a", "uid-3");
        assert_eq!(state.profile_uid("fleet/a").as_deref(), Some("uid-3"));
        state.forget_profile_uid("fleet/a");
        assert_eq!(state.profile_uid("fleet/a"), None);
        state.note_profile_uid("fleet/c", "uid-4");
        state.retain_profile_uids(|name| name == "fleet/c");
        assert_eq!(state.profile_uid("fleet/b"), None);
        assert_eq!(state.profile_uid("fleet/c").as_deref(), Some("uid-4"));
    }

    /// The spokes a replica answers for are exactly those `may_report` allows, sorted.
    #[test]
    fn reported_spokes_are_those_the_replica_may_report() {
        let s = FleetState::new();
        for (name, phase) in [
            ("fleet/c", Phase::Engaged),
            ("fleet/a", Phase::Standby),
            ("fleet/b", Phase::Refused),
            ("fleet/d", Phase::Standby),
        ] {
            s.update(name, |st| st.phase = phase);
        }
        let names = |v: Vec<SpokeState>| v.into_iter().map(|x| x.name).collect::<Vec<_>>();
        // Leader mode: every spoke while leading, none otherwise.
        assert!(s.reported_spokes().is_empty());
        s.set_leader(true);
        assert_eq!(names(s.reported_spokes()).len(), 4);
        // Sharded mode: leadership does not matter, ownership (not Standby) does.
        s.set_sharded(true);
        for leading in [true, false] {
            s.set_leader(leading);
            let reported = names(s.reported_spokes());
            assert_eq!(reported, ["fleet/b", "fleet/c"]);
            for n in ["fleet/a", "fleet/b", "fleet/c", "fleet/d"] {
                assert_eq!(reported.iter().any(|r| r == n), s.may_report(n), "{n}");
            }
        }
    }

    #[tokio::test]
    async fn updates_notify_only_on_change() {
        let s = FleetState::new();
        let mut rx = s.subscribe();
        let v0 = s.change_counter();
        s.update("ns/a", |st| st.phase = Phase::Engaged);
        assert!(rx.has_changed().unwrap());
        assert_ne!(s.change_counter(), v0);
        rx.borrow_and_update();
        let v1 = s.change_counter();
        s.update("ns/a", |st| st.phase = Phase::Engaged);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(s.change_counter(), v1, "no change, same version");
        assert_eq!(s.get("ns/a").unwrap().phase, Phase::Engaged);
        s.update("ns/0", |_| {});
        assert_eq!(
            s.spokes()
                .iter()
                .map(|x| x.name.as_str())
                .collect::<Vec<_>>(),
            ["ns/0", "ns/a"]
        );
        s.remove("ns/a");
        assert!(rx.has_changed().unwrap());
        assert_eq!(s.len(), 1);
    }
}
