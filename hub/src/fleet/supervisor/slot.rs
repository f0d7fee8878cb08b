//! What the supervisor knows about one spoke, and the pure decisions taken from it. The
//! supervisor's loop keeps one [`Slot`] per spoke name; each event asks the slot what to do
//! next ([`Action`]) and the loop applies it (spawns, stops, publishes). Nothing here does
//! I/O or needs a runtime, so every transition is unit-tested on its own.
//!
//! A spoke runs at most one engagement or one removal job at a time ([`Task`]): an
//! engagement starts only after the removal in flight was made quiet, and a removal only
//! after the engagement was stopped. Older tasks that have not ended yet are reached only
//! through the chain ([`Tail`]) and the loop's fencing tokens.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_spoke::reconciler::CancellationToken;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::fleet::profile_finalizer::{has_profile_finalizer, to_utc};
use crate::fleet::removal_job::Trigger;
use crate::fleet::spoke_task::StopSignal;
use crate::fleet::state::Phase;
use crate::inventory::{Decision, SpokeSpec};
use crate::shard::Ownership;

/// A running engagement task.
pub(super) struct Running {
    pub spec: SpokeSpec,
    /// The uid of the profile it engages.
    pub uid: Option<String>,
    pub stop: Arc<StopSignal>,
    /// Tells the task the profile was seen without kleym's finalizer.
    pub recheck: Arc<Notify>,
}

/// A removal job (running, or finished while its profile is still listed).
pub(super) struct Removing {
    /// The uid of the profile it removes.
    pub uid: Option<String>,
    pub stop: CancellationToken,
    pub quiet: Arc<AtomicBool>,
    /// How it ended, once it ran to its end.
    pub outcome: Arc<OnceLock<String>>,
    /// Its task's sequence number (how its end is recognised).
    pub seq: u64,
    pub finished: bool,
}

/// The spoke's current task, as far as decisions go.
#[derive(Default)]
pub(super) enum Task {
    /// Neither engaged nor being removed.
    #[default]
    Idle,
    Engaged(Box<Running>),
    Removing(Removing),
}

/// The last task spawned for a spoke: the next one waits for it.
pub(super) struct Tail {
    /// Cancelled when it ended.
    pub done: CancellationToken,
    pub abort: AbortHandle,
    pub removal: bool,
}

/// One spoke as the supervisor knows it.
#[derive(Default)]
pub(super) struct Slot {
    /// Its profile while the inventory lists it.
    pub profile: Option<ClusterProfile>,
    pub task: Task,
    /// The spec of its last engagement: how removal reaches a spoke whose profile is now
    /// waiting, refused or gone.
    pub known: Option<SpokeSpec>,
    pub tail: Option<Tail>,
    /// Its ownership key in sharded mode (the listed profile's member id, else the spoke
    /// name), kept after the profile left the watch for its removal job.
    pub key: Option<String>,
}

/// What the loop does next for a spoke.
#[derive(Debug, PartialEq)]
pub(super) enum Action {
    /// Nothing to do.
    Nothing,
    /// Not the leader: stop the engagement and a removal still running; publish `Standby`.
    Standby,
    /// Sharded mode, not (yet) this replica's: stop the engagement and a removal still
    /// running at once, without any removal of the spoke's outputs; publish `Standby` with
    /// `reason`.
    Release { reason: String },
    /// Not (or no longer) engaged: stop the engagement, publish `phase` with `reason`.
    Park { phase: Phase, reason: String },
    /// Publish `phase` with `reason` (nothing runs).
    Publish { phase: Phase, reason: String },
    /// Engaged with this very spec, but the profile lacks kleym's finalizer: tell the task.
    Recheck,
    /// Engage with `spec`, after stopping the engagement and making a removal in flight quiet.
    Engage { spec: Box<SpokeSpec> },
    /// Stop the engagement and start a removal job for `profile`.
    StartRemoval {
        profile: Box<ClusterProfile>,
        trigger: Trigger,
    },
    /// Forget the spoke unless something still refers to it (a removal in flight keeps it).
    Forget,
    /// Stop the engagement and a removal job still running (its profile keeps kleym's
    /// finalizer for the next leader), then forget the spoke unless it is listed.
    StopAndForget,
}

/// Whether this replica may act on a spoke now: the leader Lease in leader mode, the
/// spoke's ownership in sharded mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// Act: engage, re-engage, remove.
    Active,
    /// Leader mode, not the leader: stand by.
    Standby,
    /// Sharded mode, another replica owns the spoke: release it (stop, no removal).
    NotOwned,
    /// Sharded mode, owned under a view not every replica has announced yet: keep a spoke
    /// already held, take none.
    Settling,
}

impl From<bool> for Gate {
    /// Leader mode: `leading` or not.
    fn from(leading: bool) -> Self {
        if leading { Gate::Active } else { Gate::Standby }
    }
}

impl Gate {
    /// The gate of a spoke of ownership `key`: leader mode (`ownership` is
    /// [`Ownership::All`]) follows `leading`; sharded mode follows the ownership alone.
    pub fn of(leading: bool, ownership: &Ownership, key: &str) -> Gate {
        if !ownership.is_sharded() {
            return leading.into();
        }
        if !ownership.owns(key) {
            Gate::NotOwned
        } else if ownership.is_ready() {
            Gate::Active
        } else {
            Gate::Settling
        }
    }
}

/// Why a released spoke does not run here.
pub(super) const NOT_OWNED: &str = "another hub replica owns this spoke (sharded mode)";
/// Why an owned spoke waits.
pub(super) const SETTLING: &str = "this hub replica owns this spoke from the new shard view on; waiting for every replica to announce it";

impl Slot {
    /// The engagement, if the spoke is engaged.
    pub fn running(&self) -> Option<&Running> {
        match &self.task {
            Task::Engaged(r) => Some(r),
            _ => None,
        }
    }

    /// The removal job, if one runs or ran to its end for the listed profile.
    pub fn removing(&self) -> Option<&Removing> {
        match &self.task {
            Task::Removing(r) => Some(r),
            _ => None,
        }
    }

    /// This replica runs something for the spoke (an engagement, or a removal job not
    /// finished): it holds the spoke's single-writer right.
    pub fn held(&self) -> bool {
        match &self.task {
            Task::Idle => false,
            Task::Engaged(_) => true,
            Task::Removing(r) => !r.finished,
        }
    }

    /// Nothing refers to the spoke any more: no listed profile, no engagement, no removal
    /// in flight.
    pub fn unused(&self) -> bool {
        self.profile.is_none()
            && match &self.task {
                Task::Idle => true,
                Task::Engaged(_) => false,
                Task::Removing(r) => r.finished,
            }
    }

    /// The listed profile changed, or leadership did: what its spoke needs now. `eval`
    /// decides whether the profile can be engaged (called only when that matters).
    pub fn on_profile_changed(
        &self,
        gate: impl Into<Gate>,
        eval: impl FnOnce(&ClusterProfile) -> Decision,
    ) -> Action {
        let Some(cp) = &self.profile else {
            return Action::Nothing;
        };
        match gate.into() {
            Gate::Active => {}
            Gate::Standby => return Action::Standby,
            Gate::NotOwned => {
                return Action::Release {
                    reason: NOT_OWNED.into(),
                };
            }
            // Held under the last settled view and still owned: no other replica can take
            // it, so it is handled as usual (re-engaged, removed).
            Gate::Settling if self.held() => {}
            Gate::Settling => {
                return Action::Release {
                    reason: SETTLING.into(),
                };
            }
        }
        if let Some(since) = cp.metadata.deletion_timestamp.as_ref().map(to_utc) {
            return self.deleting(cp, since);
        }
        let spec = match eval(cp) {
            Decision::Engage(spec) => spec,
            Decision::Waiting { reason } => {
                return Action::Park {
                    phase: Phase::Waiting,
                    reason,
                };
            }
            Decision::Refused { reason } => {
                return Action::Park {
                    phase: Phase::Refused,
                    reason,
                };
            }
        };
        match self.running() {
            // Same effective configuration (e.g. a status heartbeat): nothing to do, unless
            // kleym's finalizer went missing (removed by hand, or released by a removal
            // racing this engagement): the task reads the profile and puts it back.
            Some(r) if r.spec == *spec && r.uid == cp.metadata.uid => {
                if has_profile_finalizer(cp) {
                    Action::Nothing
                } else {
                    Action::Recheck
                }
            }
            _ => Action::Engage { spec },
        }
    }

    /// The listed profile has a `deletionTimestamp`: its removal job starts once per profile.
    fn deleting(&self, cp: &ClusterProfile, since: chrono::DateTime<chrono::Utc>) -> Action {
        if let Some(r) = self.removing()
            && r.uid == cp.metadata.uid
        {
            if !r.finished {
                return Action::Nothing;
            }
            // Its removal ran to its end; other finalizers keep the profile. Published
            // again: leading again after a standby, the state still says `Standby`.
            let outcome = r.outcome.get().map_or("removal finished", String::as_str);
            return Action::Publish {
                phase: Phase::Removing,
                reason: format!("{outcome}; waiting for the ClusterProfile to go"),
            };
        }
        // An engagement always left its spec in `known`.
        if !has_profile_finalizer(cp) && self.known.is_none() {
            return Action::Park {
                phase: Phase::Removing,
                reason: "ClusterProfile deleted; kleym never engaged this spoke".into(),
            };
        }
        Action::StartRemoval {
            profile: Box::new(cp.clone()),
            trigger: Trigger::Deleting { since },
        }
    }

    /// The profile left the watch (deleted, or no longer selected): takes it out of the slot
    /// and says what follows.
    pub fn on_profile_deleted(&mut self, gate: impl Into<Gate>) -> Action {
        let last = self.profile.take();
        let acting = match gate.into() {
            Gate::Active => true,
            Gate::Settling => self.held(),
            Gate::Standby | Gate::NotOwned => false,
        };
        if !acting {
            // Its owner (or the next leader) removes it.
            return Action::StopAndForget;
        }
        if let Some(r) = self.removing()
            && last.as_ref().is_none_or(|cp| cp.metadata.uid == r.uid)
        {
            // Its removal job ends the story (forgotten when it finished).
            return Action::Forget;
        }
        match last {
            // An engagement always left its spec in `known`.
            Some(cp) if has_profile_finalizer(&cp) || self.known.is_some() => {
                let trigger = match cp.metadata.deletion_timestamp.as_ref() {
                    Some(t) => Trigger::Deleting { since: to_utc(t) },
                    None => Trigger::Departed,
                };
                Action::StartRemoval {
                    profile: Box::new(cp),
                    trigger,
                }
            }
            // kleym never wrote to this spoke (and never engaged it: an engagement always
            // runs for a listed profile).
            _ => Action::Forget,
        }
    }

    /// This replica lost leadership: what the spoke needs (after every task was halted).
    pub fn on_leadership_lost(&self) -> Action {
        if self.profile.is_some() {
            Action::Standby
        } else if self.removing().is_some() {
            // A standby never writes: removal jobs of profiles no longer listed stop too.
            Action::StopAndForget
        } else {
            Action::Nothing
        }
    }

    /// Sharded mode: the spoke's gate changed (a new view, or readiness). Listed profiles
    /// are decided as on any change; a removal job of a profile no longer listed stops
    /// when the spoke is no longer this replica's.
    pub fn on_ownership_changed(
        &self,
        gate: Gate,
        eval: impl FnOnce(&ClusterProfile) -> Decision,
    ) -> Action {
        if self.profile.is_some() {
            return self.on_profile_changed(gate, eval);
        }
        match gate {
            Gate::NotOwned | Gate::Standby if self.held() => Action::StopAndForget,
            _ => Action::Nothing,
        }
    }

    /// The task numbered `seq` ended (returned, panicked or was aborted).
    pub fn on_task_ended(&mut self, seq: u64) -> Action {
        if let Task::Removing(r) = &mut self.task
            && r.seq == seq
        {
            r.finished = true;
        }
        Action::Forget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ProviderSet;
    use crate::fleet::PROFILE_FINALIZER;
    use crate::inventory::{InventoryOptions, evaluate};
    use serde_json::json;

    fn profile(finalizers: &[&str], deleted: Option<&str>, uid: &str, td: &str) -> ClusterProfile {
        let mut meta = json!({"name": "c1", "namespace": "fleet", "uid": uid,
            "resourceVersion": "1", "finalizers": finalizers});
        if let Some(t) = deleted {
            meta["deletionTimestamp"] = json!(t);
        }
        serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": meta,
            "spec": {"clusterManager": {"name": "t"}},
            "status": {
                "accessProviders": [{"name": "p", "cluster": {"server": "https://127.0.0.1:1"}}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "R",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "properties": [{"name": "kleym.io/trust-domain", "value": td}]
            }
        }))
        .unwrap()
    }

    fn engaged_profile() -> ClusterProfile {
        profile(&[PROFILE_FINALIZER], None, "u1", "a.example")
    }

    fn eval(cp: &ClusterProfile) -> Decision {
        let providers = ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap();
        evaluate(cp, &providers, &InventoryOptions::default())
    }

    fn spec_of(cp: &ClusterProfile) -> SpokeSpec {
        match eval(cp) {
            Decision::Engage(s) => *s,
            d => panic!("not engaged: {d:?}"),
        }
    }

    fn running(spec: SpokeSpec, uid: &str) -> Task {
        Task::Engaged(Box::new(Running {
            spec,
            uid: Some(uid.into()),
            stop: Arc::default(),
            recheck: Arc::default(),
        }))
    }

    fn removing(uid: &str, seq: u64, finished: bool) -> Task {
        Task::Removing(Removing {
            uid: Some(uid.into()),
            stop: CancellationToken::new(),
            quiet: Arc::default(),
            outcome: Arc::default(),
            seq,
            finished,
        })
    }

    /// A slot engaged with `cp` as it is listed now.
    fn engaged(cp: ClusterProfile) -> Slot {
        let spec = spec_of(&cp);
        Slot {
            profile: Some(cp),
            task: running(spec.clone(), "u1"),
            known: Some(spec),
            tail: None,
            key: None,
        }
    }

    fn never(_: &ClusterProfile) -> Decision {
        panic!("not evaluated")
    }

    #[test]
    fn a_new_profile_is_engaged() {
        let cp = engaged_profile();
        let spec = spec_of(&cp);
        let slot = Slot {
            profile: Some(cp),
            ..Slot::default()
        };
        assert_eq!(
            slot.on_profile_changed(true, eval),
            Action::Engage {
                spec: Box::new(spec)
            }
        );
    }

    #[test]
    fn a_heartbeat_changes_nothing_but_a_missing_finalizer_is_rechecked() {
        let mut slot = engaged(engaged_profile());
        assert_eq!(slot.on_profile_changed(true, eval), Action::Nothing);
        slot.profile = Some(profile(&["other.io/keep"], None, "u1", "a.example"));
        assert_eq!(slot.on_profile_changed(true, eval), Action::Recheck);
    }

    #[test]
    fn a_new_spec_or_a_recreated_profile_re_engages() {
        let mut slot = engaged(engaged_profile());
        let changed = profile(&[PROFILE_FINALIZER], None, "u1", "b.example");
        slot.profile = Some(changed.clone());
        assert_eq!(
            slot.on_profile_changed(true, eval),
            Action::Engage {
                spec: Box::new(spec_of(&changed))
            }
        );
        let recreated = profile(&[], None, "u2", "a.example");
        slot.profile = Some(recreated.clone());
        assert_eq!(
            slot.on_profile_changed(true, eval),
            Action::Engage {
                spec: Box::new(spec_of(&recreated))
            }
        );
    }

    #[test]
    fn a_waiting_or_refused_profile_parks_its_spoke() {
        let slot = engaged(engaged_profile());
        let waiting = |_: &ClusterProfile| Decision::Waiting {
            reason: "later".into(),
        };
        assert_eq!(
            slot.on_profile_changed(true, waiting),
            Action::Park {
                phase: Phase::Waiting,
                reason: "later".into()
            }
        );
        let refused = |_: &ClusterProfile| Decision::Refused {
            reason: "bad".into(),
        };
        assert_eq!(
            slot.on_profile_changed(true, refused),
            Action::Park {
                phase: Phase::Refused,
                reason: "bad".into()
            }
        );
    }

    #[test]
    fn a_standby_decides_nothing_else() {
        let slot = engaged(profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u1",
            "a.example",
        ));
        assert_eq!(slot.on_profile_changed(false, never), Action::Standby);
        assert_eq!(
            Slot::default().on_profile_changed(true, never),
            Action::Nothing
        );
    }

    #[test]
    fn a_deleting_profile_starts_one_removal() {
        let cp = profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u1",
            "a.example",
        );
        let since = to_utc(cp.metadata.deletion_timestamp.as_ref().unwrap());
        let mut slot = engaged(cp.clone());
        assert_eq!(
            slot.on_profile_changed(true, never),
            Action::StartRemoval {
                profile: Box::new(cp.clone()),
                trigger: Trigger::Deleting { since }
            }
        );
        // Once started, later updates of the same profile do nothing...
        slot.task = removing("u1", 1, false);
        assert_eq!(slot.on_profile_changed(true, never), Action::Nothing);
        // ... and once it finished, its outcome is published again.
        slot.task = removing("u1", 1, true);
        let Action::Publish { phase, reason } = slot.on_profile_changed(true, never) else {
            panic!("not published");
        };
        assert_eq!(phase, Phase::Removing);
        assert_eq!(
            reason,
            "removal finished; waiting for the ClusterProfile to go"
        );
        // A new profile of the same name being deleted gets its own job.
        let other = profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u2",
            "a.example",
        );
        slot.profile = Some(other.clone());
        assert_eq!(
            slot.on_profile_changed(true, never),
            Action::StartRemoval {
                profile: Box::new(other),
                trigger: Trigger::Deleting { since }
            }
        );
    }

    #[test]
    fn a_finished_removal_publishes_its_outcome() {
        let cp = profile(&[], Some("2026-01-01T00:00:00Z"), "u1", "a.example");
        let task = removing("u1", 1, true);
        if let Task::Removing(r) = &task {
            r.outcome.set("gave up".into()).unwrap();
        }
        let slot = Slot {
            profile: Some(cp),
            task,
            ..Slot::default()
        };
        assert_eq!(
            slot.on_profile_changed(true, never),
            Action::Publish {
                phase: Phase::Removing,
                reason: "gave up; waiting for the ClusterProfile to go".into()
            }
        );
    }

    #[test]
    fn a_deleting_profile_kleym_never_engaged_is_left_alone() {
        let cp = profile(&["other.io/keep"], Some("2026-01-01T00:00:00Z"), "u1", "a");
        let mut slot = Slot {
            profile: Some(cp.clone()),
            ..Slot::default()
        };
        assert_eq!(
            slot.on_profile_changed(true, never),
            Action::Park {
                phase: Phase::Removing,
                reason: "ClusterProfile deleted; kleym never engaged this spoke".into()
            }
        );
        // Engaged earlier in this process (now waiting): removed all the same.
        slot.known = Some(spec_of(&engaged_profile()));
        assert!(matches!(
            slot.on_profile_changed(true, never),
            Action::StartRemoval { .. }
        ));
        // Engaged by an earlier process (its finalizer is there): removed too.
        let fin = profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u1",
            "a",
        );
        let slot = Slot {
            profile: Some(fin),
            ..Slot::default()
        };
        assert!(matches!(
            slot.on_profile_changed(true, never),
            Action::StartRemoval { .. }
        ));
    }

    #[test]
    fn a_departed_profile_is_removed_when_kleym_engaged_it() {
        let cp = engaged_profile();
        let mut slot = engaged(cp.clone());
        assert_eq!(
            slot.on_profile_deleted(true),
            Action::StartRemoval {
                profile: Box::new(cp),
                trigger: Trigger::Departed
            }
        );
        assert!(slot.profile.is_none());
        // Seen being deleted last: the deletion is the trigger.
        let deleting = profile(&[], Some("2026-01-01T00:00:00Z"), "u1", "a.example");
        let since = to_utc(deleting.metadata.deletion_timestamp.as_ref().unwrap());
        let mut slot = Slot {
            profile: Some(deleting.clone()),
            known: Some(spec_of(&engaged_profile())),
            ..Slot::default()
        };
        assert_eq!(
            slot.on_profile_deleted(true),
            Action::StartRemoval {
                profile: Box::new(deleting),
                trigger: Trigger::Deleting { since }
            }
        );
    }

    #[test]
    fn a_departed_profile_kleym_never_engaged_is_forgotten() {
        let mut slot = Slot {
            profile: Some(profile(&[], None, "u1", "a.example")),
            ..Slot::default()
        };
        assert_eq!(slot.on_profile_deleted(true), Action::Forget);
        assert!(slot.unused());
        // Not listed at all (a resync naming nothing new).
        assert_eq!(Slot::default().on_profile_deleted(true), Action::Forget);
    }

    #[test]
    fn a_departed_profile_under_removal_is_left_to_its_job() {
        let cp = profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u1",
            "a",
        );
        let mut slot = Slot {
            profile: Some(cp),
            task: removing("u1", 1, false),
            known: Some(spec_of(&engaged_profile())),
            tail: None,
            key: None,
        };
        assert_eq!(slot.on_profile_deleted(true), Action::Forget);
        assert!(!slot.unused(), "kept until its removal finished");
        assert_eq!(slot.on_task_ended(2), Action::Forget);
        assert!(!slot.unused(), "another task of the chain ended");
        assert_eq!(slot.on_task_ended(1), Action::Forget);
        assert!(slot.unused());
        // The name now holds another profile: that one gets its own job.
        let other = profile(&[PROFILE_FINALIZER], None, "u2", "a");
        let mut slot = Slot {
            profile: Some(other),
            task: removing("u1", 1, false),
            known: None,
            tail: None,
            key: None,
        };
        assert!(matches!(
            slot.on_profile_deleted(true),
            Action::StartRemoval { .. }
        ));
    }

    #[test]
    fn a_standby_forgets_a_departed_profile_without_removal() {
        let mut slot = engaged(engaged_profile());
        assert_eq!(slot.on_profile_deleted(false), Action::StopAndForget);
    }

    #[test]
    fn losing_leadership_stands_listed_spokes_by_and_stops_other_removals() {
        assert_eq!(
            engaged(engaged_profile()).on_leadership_lost(),
            Action::Standby
        );
        let unlisted = Slot {
            task: removing("u1", 1, false),
            ..Slot::default()
        };
        assert_eq!(unlisted.on_leadership_lost(), Action::StopAndForget);
        assert_eq!(Slot::default().on_leadership_lost(), Action::Nothing);
    }

    #[test]
    fn a_spoke_is_unused_only_without_profile_engagement_or_removal_in_flight() {
        let mut slot = engaged(engaged_profile());
        assert!(!slot.unused());
        slot.profile = None;
        assert!(!slot.unused(), "engaged");
        slot.task = removing("u1", 1, false);
        assert!(!slot.unused(), "removal in flight");
        slot.task = removing("u1", 1, true);
        assert!(slot.unused());
    }

    /// Sharded mode, the gate of a spoke as the ownership says: not owned, owned under a
    /// view still settling, owned and settled; leader mode follows leadership alone.
    #[test]
    fn the_gate_follows_ownership_in_sharded_mode_and_leadership_otherwise() {
        use crate::shard::view::{Shard, View};
        use crate::shard::{Member, Ownership};
        let view = View::new([Member::new("a", 10), Member::new("b", 10)]);
        let mine = (0..100)
            .map(|i| format!("fleet/c{i}"))
            .find(|k| view.owner(k) == Some("a"))
            .unwrap();
        let theirs = (0..100)
            .map(|i| format!("fleet/c{i}"))
            .find(|k| view.owner(k) == Some("b"))
            .unwrap();
        let shard = |ready| {
            Ownership::Shard(Shard {
                me: "a".into(),
                view: Some(view.clone()),
                ready,
            })
        };
        // Leadership does not matter in sharded mode.
        for leading in [false, true] {
            assert_eq!(Gate::of(leading, &shard(true), &theirs), Gate::NotOwned);
            assert_eq!(Gate::of(leading, &shard(false), &theirs), Gate::NotOwned);
            assert_eq!(Gate::of(leading, &shard(false), &mine), Gate::Settling);
            assert_eq!(Gate::of(leading, &shard(true), &mine), Gate::Active);
            assert_eq!(
                Gate::of(leading, &Ownership::none("a"), &mine),
                Gate::NotOwned
            );
        }
        assert_eq!(Gate::of(true, &Ownership::All, &theirs), Gate::Active);
        assert_eq!(Gate::of(false, &Ownership::All, &mine), Gate::Standby);
    }

    /// A spoke another replica owns is released: its engagement and removal stop, and no
    /// removal of its outputs starts, also for a profile being deleted or gone.
    #[test]
    fn a_spoke_not_owned_is_released_without_removal() {
        let release = Action::Release {
            reason: NOT_OWNED.into(),
        };
        assert_eq!(
            engaged(engaged_profile()).on_profile_changed(Gate::NotOwned, never),
            release
        );
        let deleting = profile(
            &[PROFILE_FINALIZER],
            Some("2026-01-01T00:00:00Z"),
            "u1",
            "a.example",
        );
        assert_eq!(
            engaged(deleting.clone()).on_profile_changed(Gate::NotOwned, never),
            release
        );
        // Gone from the watch: its owner removes it, this replica only stops.
        let mut slot = engaged(deleting);
        assert_eq!(
            slot.on_profile_deleted(Gate::NotOwned),
            Action::StopAndForget
        );
        // A removal job of a profile no longer listed stops when the spoke moves away...
        let unlisted = Slot {
            task: removing("u1", 1, false),
            ..Slot::default()
        };
        assert_eq!(
            unlisted.on_ownership_changed(Gate::NotOwned, never),
            Action::StopAndForget
        );
        // ... and keeps running while it is still this replica's.
        assert_eq!(
            unlisted.on_ownership_changed(Gate::Settling, never),
            Action::Nothing
        );
        assert_eq!(
            unlisted.on_ownership_changed(Gate::Active, never),
            Action::Nothing
        );
    }

    /// Under a view not every replica announced, a spoke newly owned is not taken, but one
    /// already held is handled as usual (no other replica can take it).
    #[test]
    fn a_settling_view_keeps_held_spokes_and_takes_none() {
        let cp = engaged_profile();
        let fresh = Slot {
            profile: Some(cp.clone()),
            ..Slot::default()
        };
        assert_eq!(
            fresh.on_profile_changed(Gate::Settling, never),
            Action::Release {
                reason: SETTLING.into()
            }
        );
        // Once settled: engaged.
        assert!(matches!(
            fresh.on_profile_changed(Gate::Active, eval),
            Action::Engage { .. }
        ));
        // Held: a new spec re-engages, a heartbeat changes nothing.
        let mut held = engaged(cp);
        assert_eq!(
            held.on_profile_changed(Gate::Settling, eval),
            Action::Nothing
        );
        let changed = profile(&[PROFILE_FINALIZER], None, "u1", "b.example");
        held.profile = Some(changed.clone());
        assert_eq!(
            held.on_profile_changed(Gate::Settling, eval),
            Action::Engage {
                spec: Box::new(spec_of(&changed))
            }
        );
        // Held and departing: this replica removes it; not held: left alone.
        assert!(matches!(
            held.on_profile_deleted(Gate::Settling),
            Action::StartRemoval { .. }
        ));
        let mut fresh = fresh;
        assert_eq!(
            fresh.on_profile_deleted(Gate::Settling),
            Action::StopAndForget
        );
    }
}
