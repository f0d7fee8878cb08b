//! The fleet supervisor: one task per engaged spoke, started, replaced and stopped from
//! inventory events and leadership changes, and one removal job per spoke whose profile is
//! deleted or leaves the selection. Its loop keeps one [`Slot`](slot::Slot) per spoke (no
//! lock at all): each event asks the slot what to do ([`Action`](slot::Action), decided
//! without I/O), and the loop applies it; all I/O happens in the tasks. A spoke's tasks are
//! chained (see `chain`): each starts after the previous one ended.
//!
//! Fencing: every task of a spoke's chain that has not ended yet — the running engagement,
//! one still stopping gracefully, a removal job, also one made quiet by a newer engagement —
//! holds a halt token the loop keeps until the task ended; losing leadership cancels them
//! all at once (shutdown those of the removal jobs).
//!
//! Sharded mode ([`Supervisor::with_shards`]): whether a spoke may run here follows its
//! ownership instead of leadership ([`Gate`](slot::Gate)). A spoke another replica owns
//! is released (its tasks halted, no removal of its outputs); once no task of a spoke the
//! current view gives to another replica is left, the loop tells membership it released
//! for that view, which announces it in this replica's Lease. Newly owned spokes are taken
//! only once every replica announced the view.

mod slot;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_spoke::reconciler::CancellationToken;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::{Id, JoinError, JoinSet};

use self::slot::{Action, Gate, Removing, Running, Slot, Tail, Task};
use super::chain::{Engagement, Previous, engagement};
use super::options::FleetOptions;
use super::profile_finalizer::{ProfileRef, to_utc};
use super::removal_job::{RemovalJob, Trigger, run_removal};
use super::spoke_task::{StopSignal, TaskShared};
use super::state::{FleetState, Phase};
use crate::access::ProviderSet;
use crate::credentials::CredentialCache;
use crate::inventory::audiences::{AudienceIndex, clash_reason};
use crate::inventory::members::{Candidate, MemberIndex, Readiness, Role};
use crate::inventory::watch::spoke_name;
use crate::inventory::{Decision, InventoryEvent, InventoryOptions, SpokeSpec, evaluate};
use crate::shard::{Ownership, ShardMetrics, ownership_key};

/// A task of a spoke's chain that has not ended yet.
struct Live {
    name: String,
    seq: u64,
    /// Stops it at once (see the module's "Fencing").
    halt: CancellationToken,
    removal: bool,
}

/// The supervisor's side of sharded mode: the ownership membership publishes, and where
/// the supervisor says for which view it has released every spoke it does not own.
pub struct ShardLink {
    /// What this replica owns.
    pub ownership: watch::Receiver<Ownership>,
    /// Receives the hash of the view this replica has released for.
    pub released: watch::Sender<Option<String>>,
    /// Hand-over metrics.
    pub metrics: ShardMetrics,
}

/// Engages the spokes of an inventory. Build with [`Supervisor::new`], drive with
/// [`Supervisor::run`]; observe through [`Supervisor::state`].
pub struct Supervisor {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
    hub: kube::Client,
    shards: Option<ShardLink>,
}

impl Supervisor {
    /// A supervisor publishing into `state`, using `cache` for spoke credentials and `hub`
    /// (the hub cluster) for kleym's finalizer on ClusterProfiles.
    pub fn new(
        opts: FleetOptions,
        providers: Arc<ProviderSet>,
        cache: Arc<CredentialCache>,
        state: FleetState,
        hub: kube::Client,
    ) -> Self {
        let slots = opts.max_concurrent_syncs.max(1);
        Self {
            shared: TaskShared {
                opts: Arc::new(opts),
                state,
                cache,
                sync_slots: Arc::new(Semaphore::new(slots)),
            },
            providers,
            hub,
            shards: None,
        }
    }

    /// Sharded mode: engage only the spokes `link` says this replica owns (leadership then
    /// only says whether this replica does the singleton work).
    pub fn with_shards(mut self, link: ShardLink) -> Self {
        self.shared.state.set_sharded(true);
        self.shards = Some(link);
        self
    }

    /// The published fleet state.
    pub fn state(&self) -> FleetState {
        self.shared.state.clone()
    }

    /// Runs until `shutdown` fires or `events` ends: engages spokes and runs removals while
    /// `leader` is true, stops them all (without removal) when it turns false. On return
    /// every task has stopped (bounded by the request timeout).
    pub async fn run(
        self,
        events: impl Stream<Item = InventoryEvent>,
        mut leader: watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        let mut events = std::pin::pin!(events);
        let mut ownership = self.shards.as_ref().map(|l| l.ownership.clone());
        let mut lp = Loop::new(self, *leader.borrow_and_update());
        if let Some(rx) = ownership.as_mut() {
            lp.on_ownership(rx.borrow_and_update().clone());
        }
        loop {
            let ownership_changed = async {
                match ownership.as_mut() {
                    Some(rx) => rx.changed().await.map(|()| rx.borrow_and_update().clone()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                o = ownership_changed => match o {
                    Ok(o) => lp.on_ownership(o),
                    // Membership ended: this replica owns nothing any more.
                    Err(_) => {
                        let me = match &lp.ownership {
                            Ownership::Shard(s) => s.me.clone(),
                            Ownership::All => String::new(),
                        };
                        lp.on_ownership(Ownership::none(me));
                        ownership = None;
                    }
                },
                _ = shutdown.cancelled() => break,
                ev = events.next() => match ev {
                    Some(ev) => lp.on_event(ev),
                    None => break,
                },
                changed = leader.changed() => {
                    let now = if changed.is_ok() { *leader.borrow_and_update() } else { false };
                    lp.on_leadership(now);
                    if changed.is_err() {
                        break;
                    }
                },
                Some(done) = lp.tasks.join_next_with_id(), if !lp.tasks.is_empty() => {
                    lp.joined(done);
                }
            }
        }
        lp.shutdown().await;
    }
}

/// The supervisor's loop state: asks each spoke's [`Slot`] what to do and does it.
struct Loop {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
    hub: kube::Client,
    /// Every spoke the loop knows (listed, engaged, being removed, or with a task of its
    /// chain not ended yet).
    ///
    /// Boxed: a `Slot` is a kilobyte (its profile and spec), and B-tree nodes hold their
    /// values inline, half empty after splits; boxes cost one exact allocation per spoke.
    slots: BTreeMap<String, Box<Slot>>,
    /// Listed profiles by member cluster (`inventory-member-id`): which one is engaged.
    members: MemberIndex,
    /// The audience each profile would be engaged with: profiles sharing one are refused.
    audiences: AudienceIndex,
    /// The inventory's first full listing arrived. Until then profiles with a member id are
    /// only recorded: acting on the first of a member's profiles to arrive would engage it
    /// and then hand over to an older one listed after it.
    listed: bool,
    /// Every engagement and removal task.
    tasks: JoinSet<()>,
    /// The tasks of `tasks` not joined yet, by task id.
    live: HashMap<Id, Live>,
    /// How many of `live` each spoke has: releasing a spoke that runs nothing (every
    /// spoke another replica owns, at each view change and each event of its profile)
    /// then costs no scan of `live`.
    live_per_spoke: HashMap<String, usize>,
    seq: u64,
    leading: bool,
    /// Which spokes this replica may run ([`Ownership::All`] in leader mode).
    ownership: Ownership,
    /// Sharded mode's link to membership.
    shard: Option<ShardSide>,
}

/// What the loop keeps of [`ShardLink`], and the hand-over in progress.
struct ShardSide {
    released: watch::Sender<Option<String>>,
    metrics: ShardMetrics,
    /// When the current view was first seen, until the spokes gained under it were taken.
    view_since: Option<tokio::time::Instant>,
    /// The tasks the announcement of the current view waits for (see `confirm_release`).
    waiting: HashSet<Id>,
}

impl Loop {
    fn new(sup: Supervisor, leading: bool) -> Self {
        sup.shared.state.set_leader(leading);
        let shard = sup.shards.map(|l| ShardSide {
            released: l.released,
            metrics: l.metrics,
            view_since: None,
            waiting: HashSet::new(),
        });
        let ownership = match &shard {
            Some(_) => Ownership::none(String::new()),
            None => Ownership::All,
        };
        Self {
            ownership,
            shard,
            shared: sup.shared,
            providers: sup.providers,
            hub: sup.hub,
            slots: BTreeMap::new(),
            members: MemberIndex::default(),
            audiences: AudienceIndex::default(),
            listed: false,
            tasks: JoinSet::new(),
            live: HashMap::new(),
            live_per_spoke: HashMap::new(),
            seq: 0,
            leading,
        }
    }

    fn on_event(&mut self, ev: InventoryEvent) {
        match ev {
            InventoryEvent::Upsert(cp) => {
                let name = spoke_name(&cp);
                let changed = self.members.upsert(&name, self.candidate(&cp));
                let wait_for_listing = !self.listed && cp.inventory_member_id().is_some();
                let key = ownership_key(&name, cp.inventory_member_id());
                let slot = self.slots.entry(name.clone()).or_default();
                slot.profile = Some(*cp);
                slot.key = Some(key);
                if wait_for_listing {
                    return;
                }
                self.reconcile(&name);
                self.reconcile_members(&name, changed);
            }
            InventoryEvent::Deleted(name) => self.deleted(&name),
            InventoryEvent::Resynced(names) => {
                if !self.listed {
                    self.listed = true;
                    // The profiles held back until every profile of their member was known.
                    let held: Vec<String> = self
                        .slots
                        .iter()
                        .filter(|(_, s)| {
                            s.profile
                                .as_ref()
                                .is_some_and(|cp| cp.inventory_member_id().is_some())
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    for name in held {
                        self.reconcile(&name);
                    }
                }
                let gone: Vec<String> = self
                    .slots
                    .iter()
                    .filter(|(k, s)| s.profile.is_some() && !names.contains(*k))
                    .map(|(k, _)| k.clone())
                    .collect();
                for name in gone {
                    self.deleted(&name);
                }
                self.refresh_owned();
            }
        }
    }

    fn on_leadership(&mut self, leading: bool) {
        if leading == self.leading {
            return;
        }
        self.leading = leading;
        self.shared.state.set_leader(leading);
        tracing::info!(leading, "leadership changed");
        if self.shard.is_some() {
            // Sharded mode: leadership is the singleton work's; spokes follow ownership.
            return;
        }
        let names: Vec<String> = self.slots.keys().cloned().collect();
        if !leading {
            // Fencing: every task still running stops at once, also an engagement already
            // stopping gracefully and a removal job made quiet by a newer engagement (neither
            // is any slot's task any more).
            for t in self.live.values() {
                t.halt.cancel();
            }
            for name in names {
                let action = match self.slots.get(&name) {
                    Some(slot) => slot.on_leadership_lost(),
                    None => continue,
                };
                self.apply(&name, action);
            }
            return;
        }
        for name in names {
            self.reconcile(&name);
        }
    }

    /// The spoke's listed profile changed, or leadership did.
    fn reconcile(&mut self, name: &str) {
        let Some(slot) = self.slots.get(name) else {
            return;
        };
        let deleting = slot
            .profile
            .as_ref()
            .is_some_and(|cp| cp.metadata.deletion_timestamp.is_some());
        let role = self.members.role(name);
        let decision = slot
            .profile
            .as_ref()
            .filter(|_| !deleting)
            .map(|cp| evaluate(cp, &self.providers, &self.shared.opts.inventory));
        // The audience it would be engaged with, whether or not this replica leads: every
        // replica refuses the same profiles.
        let claim = match (&role, &decision) {
            (Role::Engage, Some(Decision::Engage(spec))) => Some(spec.access.audience.as_str()),
            _ => None,
        };
        let peers = self.audiences.set(name, claim);
        let gate = self.gate(name);
        if matches!(gate, Gate::Active | Gate::Settling)
            && !deleting
            && let Role::Duplicate { member_id, of } = role
        {
            self.park_duplicate(name, member_id, of);
        } else {
            self.clear_duplicate(name);
            let clash = self
                .audiences
                .clash(name)
                .map(|(audience, others)| clash_reason(name, audience, &others));
            let Some(slot) = self.slots.get(name) else {
                return;
            };
            let (providers, opts) = (&self.providers, &self.shared.opts.inventory);
            let action = slot.on_profile_changed(gate, |cp| match (decision, clash) {
                (Some(Decision::Engage(_)), Some(reason)) => Decision::Refused { reason },
                (Some(d), _) => d,
                (None, _) => evaluate(cp, providers, opts),
            });
            self.apply(name, action);
        }
        // Profiles that shared, or now share, its audience are decided again (their own
        // claims are unchanged, so this ends there).
        for other in peers {
            self.reconcile(&other);
        }
    }

    /// Another engaged spoke without a member id that reaches the same server URL with the
    /// same CA as `spec` (when `name` has no member id either): likely the same cluster,
    /// listed by two profiles that do not say so.
    fn same_server(&self, name: &str, spec: &SpokeSpec) -> Option<String> {
        let unlabelled = |s: &Slot| {
            s.profile
                .as_ref()
                .is_none_or(|cp| cp.inventory_member_id().is_none())
        };
        if !self.slots.get(name).is_none_or(|s| unlabelled(s)) {
            return None;
        }
        let (server, ca) = (
            &spec.access.cluster.server,
            &spec.access.cluster.certificate_authority_pem,
        );
        // Runs for every engagement over every slot: the cheap test that rules out almost
        // every slot (another server) comes first, and the slot at hand is read, not
        // looked up again (a lookup per slot made engaging a fleet quadratic in lookups).
        self.slots
            .iter()
            .find(|(n, s)| {
                s.running().is_some_and(|r| {
                    r.spec.access.cluster.server == *server
                        && r.spec.access.cluster.certificate_authority_pem == *ca
                }) && n.as_str() != name
                    && unlabelled(s)
            })
            .map(|(n, _)| n.clone())
    }

    /// What the member index needs of a listed profile: its member id, how usable it is
    /// (the same decision its slot acts on) and its age.
    fn candidate(&self, cp: &ClusterProfile) -> Candidate {
        let readiness = if cp.metadata.deletion_timestamp.is_some() {
            Readiness::Deleting
        } else {
            match evaluate(cp, &self.providers, &self.shared.opts.inventory) {
                Decision::Engage(_) => Readiness::Engageable,
                Decision::Waiting { .. } => Readiness::Waiting,
                Decision::Refused { .. } => Readiness::Refused,
            }
        };
        Candidate {
            member_id: cp.inventory_member_id().map(str::to_string),
            readiness,
            created: cp.metadata.creation_timestamp.as_ref().map(to_utc),
        }
    }

    /// The other profiles whose role in their member changed with `name`'s change.
    fn reconcile_members(&mut self, name: &str, changed: Vec<(String, Role)>) {
        for (other, _) in changed {
            if other != name {
                self.reconcile(&other);
            }
        }
    }

    /// Another profile of the same member cluster is engaged: this one is not (its
    /// engagement, if any, stops without removal: the cluster stays in the fleet).
    fn park_duplicate(&mut self, name: &str, member_id: String, of: String) {
        let reason = format!(
            "the same member cluster (inventory-member-id {member_id:?}) is engaged through \
             ClusterProfile {of}"
        );
        let already =
            self.shared.state.get(name).is_some_and(|s| {
                s.phase == Phase::Duplicate && s.reason.as_deref() == Some(&reason)
            });
        if self.stop_running(name) || !already {
            tracing::info!(spoke = %name, duplicate_of = %of, member_id = %member_id, "cluster profile is a duplicate: not engaged");
        }
        let duplicate_of = kleym_api::hub_status::DuplicateOf {
            cluster_profile: of,
            member_id,
        };
        self.shared.state.update(name, |s| {
            s.phase = Phase::Duplicate;
            s.reason = Some(reason);
            s.duplicate_of = Some(duplicate_of);
            // Its bindings are the engaged profile's to report.
            s.bindings = Arc::default();
        });
    }

    /// The profile is no longer a duplicate: forget what said it was.
    fn clear_duplicate(&self, name: &str) {
        if self
            .shared
            .state
            .get(name)
            .is_some_and(|s| s.duplicate_of.is_some())
        {
            self.shared.state.update(name, |s| s.duplicate_of = None);
        }
    }

    /// The profile left the watch (deleted, or no longer selected).
    fn deleted(&mut self, name: &str) {
        // Asked before the profile leaves the index: a member cluster handed over to another
        // profile stays in the fleet, so its removal must not touch it.
        let successor = self.members.successor(name);
        let changed = self.members.remove(name);
        let peers = self.audiences.set(name, None);
        let gate = self.gate(name);
        let action = match self.slots.get_mut(name) {
            Some(slot) => slot.on_profile_deleted(gate),
            // Forgotten already; its published state goes all the same.
            None => Action::Forget,
        };
        match action {
            Action::StartRemoval { profile, trigger } => {
                tracing::info!(spoke = %name, "cluster profile left the inventory");
                self.stop_running(name);
                self.start_removal(name, &profile, trigger, successor);
            }
            action => self.apply(name, action),
        }
        self.reconcile_members(name, changed);
        for other in peers {
            self.reconcile(&other);
        }
    }

    /// Does what the spoke's slot decided.
    fn apply(&mut self, name: &str, action: Action) {
        match action {
            Action::Nothing => {}
            Action::Standby => {
                self.stop_running(name);
                self.stop_removal(name);
                self.publish(
                    name,
                    Phase::Standby,
                    "this hub replica is not the leader".into(),
                );
            }
            Action::Release { reason } => {
                // At once, like a deposed leader: the next owner may start as soon as
                // this replica announces the view, which waits for these tasks to end.
                if self.live_per_spoke.contains_key(name) {
                    for t in self.live.values().filter(|t| t.name == name) {
                        t.halt.cancel();
                    }
                }
                let held = self.slots.get(name).is_some_and(|s| s.held());
                self.stop_running(name);
                self.stop_removal(name);
                if held {
                    tracing::info!(spoke = %name, %reason, "spoke released");
                    if let Some(sh) = &self.shard {
                        sh.metrics.handed_over(false, 1);
                    }
                }
                self.publish(name, Phase::Standby, reason);
            }
            Action::Park { phase, reason } => {
                match phase {
                    Phase::Waiting => {
                        tracing::info!(spoke = %name, %reason, "spoke not engaged: waiting")
                    }
                    Phase::Refused => {
                        tracing::warn!(spoke = %name, %reason, "cluster profile refused")
                    }
                    _ => {}
                }
                self.stop_running(name);
                self.publish(name, phase, reason);
            }
            Action::Publish { phase, reason } => self.publish(name, phase, reason),
            Action::Recheck => {
                if let Some(r) = self.slots.get(name).and_then(|s| s.running()) {
                    tracing::info!(spoke = %name, "engaged spoke's ClusterProfile seen without kleym's finalizer; checking");
                    r.recheck.notify_one();
                }
            }
            Action::Engage { spec } => self.engage(name, *spec),
            Action::StartRemoval { profile, trigger } => {
                if self.slots.get(name).is_none_or(|s| s.profile.is_none()) {
                    tracing::info!(spoke = %name, "cluster profile left the inventory");
                }
                self.stop_running(name);
                let successor = self.members.successor(name);
                self.start_removal(name, &profile, trigger, successor);
            }
            Action::Forget => self.forget_if_unused(name),
            Action::StopAndForget => {
                self.stop_running(name);
                self.stop_removal(name);
                self.forget_if_unused(name);
            }
        }
    }

    fn publish(&self, name: &str, phase: Phase, reason: String) {
        self.shared.state.update(name, |s| {
            s.phase = phase;
            s.reason = Some(reason);
        });
    }

    /// Takes the spoke's previous task for a new one to wait for.
    fn previous(&mut self, name: &str) -> Option<Previous> {
        let t = self.slots.get_mut(name)?.tail.take()?;
        let limit = (!t.removal).then(|| self.shared.opts.request_timeout.saturating_mul(2));
        Some(Previous {
            done: t.done,
            abort: t.abort,
            limit,
        })
    }

    /// Stops the spoke's engagement (no removal); it ends in the background.
    fn stop_running(&mut self, name: &str) -> bool {
        let Some(slot) = self.slots.get_mut(name) else {
            return false;
        };
        if !matches!(slot.task, Task::Engaged(_)) {
            return false;
        }
        if let Task::Engaged(r) = std::mem::take(&mut slot.task) {
            r.stop.stop();
        }
        true
    }

    /// Stops the spoke's removal job if it is still running; its profile keeps kleym's
    /// finalizer for the next leader.
    fn stop_removal(&mut self, name: &str) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        if slot.removing().is_some_and(|r| !r.finished)
            && let Task::Removing(r) = std::mem::take(&mut slot.task)
        {
            r.stop.cancel();
        }
    }

    /// Starts an engagement with `spec`, after the spoke's previous task.
    fn engage(&mut self, name: &str, spec: SpokeSpec) {
        let Some(cp) = self.slots.get(name).and_then(|s| s.profile.clone()) else {
            return;
        };
        let uid = cp.metadata.uid.clone();
        let reengage = self.stop_running(name);
        // A removal still in flight (the profile came back into the selection) finishes
        // first, quiet: the state is the new engagement's from now on, and so is the
        // profile's finalizer (the job leaves it). It still halts with its chain.
        if let Some(slot) = self.slots.get_mut(name)
            && let Some(r) = slot.removing()
        {
            r.quiet.store(true, Ordering::Release);
            slot.task = Task::Idle;
        }
        self.shared.state.update(name, |s| {
            s.phase = Phase::Pending;
            s.reason = None;
            // A new effective configuration (or profile) starts its own retry count: the
            // failures so far were the previous configuration's.
            s.last_error = None;
            s.consecutive_failures = 0;
            s.next_retry = None;
            s.engagements += 1;
            s.trust_domain = Some(spec.settings.trust_domain.clone());
            s.spire_class_name = spec.settings.spire_class_name.clone();
            s.provider = Some(spec.access.provider.clone());
        });
        tracing::info!(spoke = %name, provider = %spec.access.provider, reengage, "engaging spoke");
        if let Some(other) = self.same_server(name, &spec) {
            tracing::warn!(
                spoke = %name,
                other = %other,
                server = %spec.access.cluster.server,
                "two engaged ClusterProfiles reach the same server URL with the same CA: likely \
                 one cluster listed twice; label both with the same \
                 multicluster.x-k8s.io/inventory-member-id so it is engaged once"
            );
        }
        let stop = Arc::new(StopSignal::default());
        let recheck = Arc::new(Notify::new());
        let done = CancellationToken::new();
        let e = Box::new(Engagement {
            spec: spec.clone(),
            profile: ProfileRef::of(&cp),
            seen: Some(cp),
            stop: stop.clone(),
            recheck: recheck.clone(),
            previous: self.previous(name),
            done: done.clone(),
        });
        let (shared, hub) = (self.shared.clone(), self.hub.clone());
        let halt = stop.halt.clone();
        self.spawn_tail(name, done, halt, false, engagement(shared, hub, e));
        let slot = self.slots.entry(name.to_string()).or_default();
        slot.known = Some(spec.clone());
        slot.task = Task::Engaged(Box::new(Running {
            spec,
            uid,
            stop,
            recheck,
        }));
    }

    /// Spawns the removal job of `name` after its previous task. The spec of its last
    /// engagement (the one just stopped, if any) tells how to reach the spoke; without one,
    /// the profile's own access.
    fn start_removal(
        &mut self,
        name: &str,
        cp: &ClusterProfile,
        trigger: Trigger,
        hand_over: Option<String>,
    ) {
        let known = self.slots.get(name).and_then(|s| s.known.clone());
        let access = match known {
            Some(spec) => Ok(spec),
            None => own_access(cp, &self.providers, &self.shared.opts.inventory),
        };
        tracing::info!(spoke = %name, policy = ?self.shared.opts.removal_policy, ?trigger, "starting removal");
        let stop = CancellationToken::new();
        let quiet = Arc::new(AtomicBool::new(false));
        let outcome = Arc::new(OnceLock::new());
        let done = CancellationToken::new();
        let job = RemovalJob {
            name: name.to_string(),
            profile: ProfileRef::of(cp),
            access,
            trigger,
            stop: stop.clone(),
            quiet: quiet.clone(),
            outcome: outcome.clone(),
            previous: self.previous(name),
            done: done.clone(),
            hand_over,
        };
        let uid = cp.metadata.uid.clone();
        let (shared, hub) = (self.shared.clone(), self.hub.clone());
        let seq = self.spawn_tail(
            name,
            done,
            stop.clone(),
            true,
            run_removal(shared, hub, job),
        );
        self.slots.entry(name.to_string()).or_default().task = Task::Removing(Removing {
            uid,
            stop,
            quiet,
            outcome,
            seq,
            finished: false,
        });
    }

    /// Spawns a spoke's engagement or removal task as the new tail of its chain; returns its
    /// sequence number (which [`Slot::on_task_ended`] receives when it ends). `halt` stops
    /// the task at once.
    fn spawn_tail(
        &mut self,
        name: &str,
        done: CancellationToken,
        halt: CancellationToken,
        removal: bool,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        let abort = self.tasks.spawn(task);
        *self.live_per_spoke.entry(name.to_string()).or_default() += 1;
        self.live.insert(
            abort.id(),
            Live {
                name: name.to_string(),
                seq,
                halt,
                removal,
            },
        );
        self.slots.entry(name.to_string()).or_default().tail = Some(Tail {
            done,
            abort,
            removal,
        });
        seq
    }

    /// A task of `tasks` ended: returned, panicked, or aborted (a stuck predecessor by its
    /// successor; shutdown).
    fn joined(&mut self, r: Result<(Id, ()), JoinError>) {
        let (id, panicked) = match r {
            Ok((id, ())) => (id, false),
            Err(e) => (e.id(), e.is_panic()),
        };
        let Some(t) = self.live.remove(&id) else {
            return;
        };
        if let Some(n) = self.live_per_spoke.get_mut(&t.name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.live_per_spoke.remove(&t.name);
            }
        }
        if panicked {
            tracing::error!(spoke = %t.name, removal = t.removal, "spoke task panicked");
        }
        let action = match self.slots.get_mut(&t.name) {
            Some(slot) => slot.on_task_ended(t.seq),
            None => Action::Forget,
        };
        self.apply(&t.name, action);
        self.confirm_release(Some(id));
    }

    /// A spoke's ownership key (its listed profile's member id, else its name).
    fn key(&self, name: &str) -> String {
        self.slots
            .get(name)
            .and_then(|s| s.key.clone())
            .unwrap_or_else(|| name.to_string())
    }

    /// Whether this replica may act on the spoke now.
    fn gate(&self, name: &str) -> Gate {
        Gate::of(self.leading, &self.ownership, &self.key(name))
    }

    /// Sharded mode: membership published a new ownership (a new view, readiness, or
    /// nothing at all after this replica lost its Lease). Every spoke is decided again:
    /// those another replica owns now are released at once, those newly owned are taken
    /// once the view is ready.
    fn on_ownership(&mut self, ownership: Ownership) {
        if self.shard.is_none() || ownership == self.ownership {
            return;
        }
        let new_view = ownership.view_hash() != self.ownership.view_hash();
        self.ownership = ownership;
        if let Some(sh) = self.shard.as_mut()
            && (new_view || sh.view_since.is_none())
        {
            sh.view_since = Some(tokio::time::Instant::now());
        }
        let names: Vec<String> = self.slots.keys().cloned().collect();
        let mut gained = 0u64;
        for name in &names {
            let held = self.slots.get(name).is_some_and(|s| s.held());
            let listed = self.slots.get(name).is_some_and(|s| s.profile.is_some());
            if listed {
                self.reconcile(name);
            } else {
                let gate = self.gate(name);
                let action = match self.slots.get(name) {
                    Some(slot) => slot.on_ownership_changed(gate, |_| Decision::Waiting {
                        reason: String::new(),
                    }),
                    None => continue,
                };
                self.apply(name, action);
            }
            if !held && self.slots.get(name).is_some_and(|s| s.held()) {
                gained += 1;
            }
        }
        let owned = self.refresh_owned();
        let ready = self.ownership.is_ready();
        if let Some(sh) = self.shard.as_mut() {
            sh.metrics.handed_over(true, gained);
            if ready && let Some(since) = sh.view_since.take() {
                sh.metrics.takeover.observe(since.elapsed().as_secs_f64());
            }
        }
        tracing::info!(
            view = ?self.ownership.view_hash(),
            ready,
            owned,
            gained,
            "shard ownership changed"
        );
        self.confirm_release(None);
    }

    /// Sharded mode: counts the listed spokes this replica owns under its view (the
    /// `kleym_hub_shard_spokes_owned` gauge) and returns the count.
    fn refresh_owned(&self) -> usize {
        let Some(sh) = &self.shard else {
            return 0;
        };
        let owned = self
            .slots
            .iter()
            .filter(|(n, s)| s.profile.is_some() && self.ownership.owns(&self.key(n)))
            .count();
        sh.metrics
            .owned
            .set(i64::try_from(owned).unwrap_or(i64::MAX));
        owned
    }

    /// Sharded mode: once no task of a spoke the current view gives to another replica is
    /// left, tell membership (which then announces the view in this replica's Lease).
    /// `ended`: the task that just ended. The live tasks are scanned only when nothing is
    /// known to be waited for (once per view, and when the tasks waited for have ended), so
    /// a large hand-over costs one scan, not one per task.
    fn confirm_release(&mut self, ended: Option<Id>) {
        let Some(hash) = self.ownership.view_hash() else {
            return;
        };
        let Some(sh) = self.shard.as_mut() else {
            return;
        };
        if sh.released.borrow().as_deref() == Some(hash.as_str()) {
            return;
        }
        if let Some(id) = ended {
            sh.waiting.remove(&id);
            if !sh.waiting.is_empty() {
                return;
            }
        }
        // The spoke's key now (a profile whose member id changed is released under its
        // new key, so its old one must not hold the announcement back).
        let waiting: HashSet<Id> = self
            .live
            .iter()
            .filter(|(_, t)| !self.ownership.owns(&self.key(&t.name)))
            .map(|(id, _)| *id)
            .collect();
        let Some(sh) = self.shard.as_mut() else {
            return;
        };
        if waiting.is_empty() {
            tracing::debug!(view = %hash, "released every spoke not owned under the view");
            sh.released.send_replace(Some(hash));
        }
        sh.waiting = waiting;
    }

    /// Forgets a spoke (published state, credentials, remembered spec) once nothing refers
    /// to it: no listed profile, no engagement, no removal in flight. Runs in this loop, so
    /// it never races a newer engagement of the same name. A task of its chain still
    /// running stays its tail, for a newer task to wait for.
    fn forget_if_unused(&mut self, name: &str) {
        if let Some(slot) = self.slots.get_mut(name) {
            if !slot.unused() {
                return;
            }
            slot.task = Task::Idle;
            slot.known = None;
            if slot.tail.as_ref().is_none_or(|t| t.done.is_cancelled()) {
                self.slots.remove(name);
            }
        }
        self.shared.cache.remove(name);
        self.shared.state.remove(name);
    }

    /// Stops every task for shutdown: engagements gracefully, removal jobs (also quiet
    /// ones) at once.
    fn stop_all(&mut self) {
        let names: Vec<String> = self.slots.keys().cloned().collect();
        for name in names {
            self.stop_running(&name);
            self.stop_removal(&name);
        }
        for t in self.live.values().filter(|t| t.removal) {
            t.halt.cancel();
        }
    }

    async fn shutdown(mut self) {
        self.stop_all();
        let limit = self.shared.opts.request_timeout.saturating_mul(2) + Duration::from_secs(1);
        let _ = tokio::time::timeout(limit, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
    }
}

/// The profile's own access (its engage condition ignored: a waiting spoke can still be
/// reachable), for removing a spoke kleym did not engage in this process.
fn own_access(
    cp: &ClusterProfile,
    providers: &ProviderSet,
    opts: &InventoryOptions,
) -> Result<SpokeSpec, String> {
    let opts = InventoryOptions {
        engage_condition: None,
        ..opts.clone()
    };
    match evaluate(cp, providers, &opts) {
        Decision::Engage(spec) => Ok(*spec),
        Decision::Waiting { reason } | Decision::Refused { reason } => Err(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{CacheOptions, CredentialMetrics};
    use crate::fleet::{ErrorCategory, FleetOptions, PROFILE_FINALIZER};
    use k8s_openapi::api::core::v1::Namespace;
    use kleym_api::external::clusterprofile::INVENTORY_MEMBER_ID_LABEL;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kubesim::{ClusterHandle, Kubesim, KubesimOptions, LoggedRequest, parse_crds};
    use serde_json::{Value, json};

    /// The hub cluster: kubesim with the upstream ClusterProfile CRD, holding the profile
    /// `fleet/c1`.
    struct Hub {
        _sim: Kubesim,
        cluster: ClusterHandle,
        profiles: Api<ClusterProfile>,
    }

    impl Hub {
        /// `fleet/c1` carrying `finalizers`; deleted (so with a `deletionTimestamp`, kept by
        /// its finalizers) when `deleting`. The request log starts empty.
        async fn new(finalizers: &[&str], deleting: bool) -> Self {
            let file = "multicluster.x-k8s.io_clusterprofiles.yaml";
            let crds = parse_crds(file, upstream_crds::upstream_yaml(file)).unwrap();
            let sim = Kubesim::start(
                &["hub"],
                KubesimOptions {
                    crds,
                    ..KubesimOptions::default()
                },
            )
            .await
            .unwrap();
            let cluster = sim.cluster("hub").unwrap();
            let client = cluster.in_process_client();
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": "fleet"}})).unwrap();
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
            let profiles = Api::<ClusterProfile>::namespaced(client, "fleet");
            let cp: ClusterProfile = serde_json::from_value(json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1",
                "kind": "ClusterProfile",
                "metadata": {"name": "c1", "namespace": "fleet", "finalizers": finalizers},
                "spec": {"clusterManager": {"name": "t"}},
            }))
            .unwrap();
            profiles.create(&PostParams::default(), &cp).await.unwrap();
            if deleting {
                profiles
                    .delete("c1", &DeleteParams::default())
                    .await
                    .unwrap();
            }
            cluster.requests().clear();
            Self {
                _sim: sim,
                cluster,
                profiles,
            }
        }

        /// The client the supervisor uses (in process: no socket, no TLS).
        fn client(&self) -> kube::Client {
            self.cluster.in_process_client()
        }

        /// The requests the hub answered since [`Hub::new`] (or the last
        /// [`Hub::set_finalizers`]).
        fn requests(&self) -> Vec<LoggedRequest> {
            self.cluster.requests().entries()
        }

        fn patches(&self) -> usize {
            self.cluster.requests().with_method("PATCH").len()
        }

        /// The profile's metadata as the hub has it now; `None` once it is gone.
        async fn meta(&self) -> Option<Value> {
            let cp = self.profiles.get_opt("c1").await.unwrap()?;
            Some(serde_json::to_value(cp.metadata).unwrap())
        }

        /// The profile's metadata for the events a watch would deliver; this read is not
        /// logged (assertions count the supervisor's requests only).
        async fn watched(&self) -> Value {
            let m = self.meta().await.unwrap();
            self.cluster.requests().clear();
            m
        }

        /// As [`Hub::watched`], deleted long ago (past any removal deadline).
        async fn watched_deleted_long_ago(&self) -> Value {
            let mut m = self.watched().await;
            m["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
            m
        }

        /// The profile's finalizers; `Null` once it is gone.
        async fn finalizers(&self) -> Value {
            match self.meta().await {
                Some(m) => m.get("finalizers").cloned().unwrap_or(json!([])),
                None => Value::Null,
            }
        }

        /// Replaces the profile's finalizers as a user would, then empties the request
        /// log (later assertions count the supervisor's requests only).
        async fn set_finalizers(&self, finalizers: &[&str]) -> Value {
            let patch = json!({"metadata": {"finalizers": finalizers}});
            self.profiles
                .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            self.cluster.requests().clear();
            self.meta().await.unwrap()
        }
    }

    /// Waits until `f` holds (for conditions read from the hub).
    async fn eventually(what: &str, f: impl AsyncFn() -> bool) {
        for _ in 0..400 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}");
    }

    fn profile_with(meta: Value, heartbeat: &str, td: &str, provider: &str) -> InventoryEvent {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": meta,
            "spec": {"clusterManager": {"name": "t"}},
            "status": {
                "accessProviders": [{"name": provider, "cluster": {"server": "https://127.0.0.1:1"}}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "R",
                    "message": "", "lastTransitionTime": heartbeat}],
                "properties": [{"name": "kleym.io/trust-domain", "value": td}]
            }
        }))
        .unwrap();
        InventoryEvent::Upsert(Box::new(cp))
    }

    async fn wait(state: &FleetState, what: &str, f: impl Fn(&FleetState) -> bool) {
        for _ in 0..400 {
            if f(state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}: {:?}", state.spokes());
    }

    struct Running {
        state: FleetState,
        events: tokio::sync::mpsc::UnboundedSender<InventoryEvent>,
        leader: watch::Sender<bool>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        async fn stop(self) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(30), self.task)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// A supervisor whose only provider `p` always fails (credentials error).
    fn start(hub: &Hub, opts: FleetOptions, leading: bool) -> Running {
        let providers = Arc::new(ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap());
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let state = FleetState::new();
        let sup = Supervisor::new(opts, providers, cache, state.clone(), hub.client());
        let (events, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let (leader, leader_rx) = watch::channel(leading);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sup.run(tokio_stream_from(events_rx), leader_rx, shutdown.clone()));
        Running {
            state,
            events,
            leader,
            shutdown,
            task,
        }
    }

    #[tokio::test]
    async fn engages_once_per_spec_stands_by_without_lease_and_forgets_deleted() {
        let hub = Hub::new(&["other.io/keep"], false).await;
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        let m = hub.watched().await;
        r.events
            .send(profile_with(
                m.clone(),
                "2026-01-01T00:00:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        wait(&state, "backing off", |s| {
            s.get("fleet/c1").is_some_and(|x| {
                x.phase == Phase::BackingOff
                    && x.last_error
                        .as_ref()
                        .is_some_and(|e| e.category == ErrorCategory::Credentials)
            })
        })
        .await;
        // Before anything could be written to the spoke, kleym's finalizer was added to the
        // profile, next to the other controller's.
        assert_eq!(
            hub.finalizers().await,
            json!(["other.io/keep", PROFILE_FINALIZER])
        );
        assert_eq!(hub.patches(), 1);
        // A heartbeat: same spec, no new engagement.
        let m = hub.meta().await.unwrap();
        r.events
            .send(profile_with(
                m.clone(),
                "2026-01-01T00:01:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        // A real change: re-engaged (the profile already carries the finalizer: no write).
        r.events
            .send(profile_with(
                m.clone(),
                "2026-01-01T00:02:00Z",
                "b.example",
                "p",
            ))
            .unwrap();
        wait(&state, "re-engaged", |s| {
            s.get("fleet/c1").is_some_and(|x| {
                x.engagements == 2
                    && x.trust_domain.as_deref() == Some("b.example")
                    && x.phase == Phase::BackingOff
            })
        })
        .await;
        assert_eq!(hub.patches(), 1);
        // Losing the lease: standby.
        r.leader.send(false).unwrap();
        wait(&state, "standby", |s| {
            !s.is_leader() && s.get("fleet/c1").is_some_and(|x| x.phase == Phase::Standby)
        })
        .await;
        assert_eq!(state.get("fleet/c1").unwrap().engagements, 2);
        // Deleted while on standby: forgotten, and nothing written.
        let before = hub.requests().len();
        r.events
            .send(InventoryEvent::Deleted("fleet/c1".into()))
            .unwrap();
        wait(&state, "forgotten", |s| s.get("fleet/c1").is_none()).await;
        r.stop().await;
        assert_eq!(hub.requests().len(), before, "a standby never writes");
    }

    #[tokio::test]
    async fn a_deleted_profile_is_released_by_the_leader_only_even_when_removal_gives_up() {
        // Deleted long ago (the hub was down past the removal timeout): one bounded attempt,
        // which fails (the plugin fails), then the give-up is published and the profile is
        // released.
        let hub = Hub::new(&[PROFILE_FINALIZER, "other.io/keep"], true).await;
        let deleted = hub.watched_deleted_long_ago().await;
        let opts = FleetOptions {
            request_timeout: Duration::from_millis(500),
            removal_timeout: Duration::from_secs(1),
            ..FleetOptions::default()
        };
        let r = start(&hub, opts, false);
        let state = r.state.clone();
        r.events
            .send(profile_with(
                deleted,
                "2026-01-01T00:00:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        wait(&state, "standby", |s| {
            s.get("fleet/c1").is_some_and(|x| x.phase == Phase::Standby)
        })
        .await;
        assert_eq!(hub.requests(), [], "a standby never writes");

        r.leader.send(true).unwrap();
        wait(&state, "gave up", |s| {
            s.get("fleet/c1").is_some_and(|x| {
                x.phase == Phase::Removing
                    && x.reason.as_deref().is_some_and(|r| r.contains("gave up"))
                    && x.last_error
                        .as_ref()
                        .is_some_and(|e| e.category == ErrorCategory::Credentials)
            })
        })
        .await;
        eventually("released", async || {
            hub.finalizers().await == json!(["other.io/keep"])
        })
        .await;
        assert_eq!(hub.patches(), 1);
        r.stop().await;
    }

    #[tokio::test]
    async fn a_deleted_profile_with_unusable_access_is_released_without_touching_the_spoke() {
        let hub = Hub::new(&[PROFILE_FINALIZER], true).await;
        let deleted = hub.watched().await;
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        // Provider `nope` is not configured in this hub: the profile is refused.
        r.events
            .send(profile_with(
                deleted,
                "2026-01-01T00:00:00Z",
                "a.example",
                "nope",
            ))
            .unwrap();
        // Released: its last finalizer gone, the hub deletes it.
        eventually("released", async || hub.meta().await.is_none()).await;
        let s = state.get("fleet/c1").unwrap();
        assert_eq!(s.phase, Phase::Removing);
        assert!(
            s.reason
                .as_deref()
                .is_some_and(|r| r.contains("access unusable")),
            "{s:?}"
        );
        r.stop().await;
    }

    /// Waits until every task of the loop ended, feeding each end to the loop.
    async fn join_all(lp: &mut Loop) {
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(r) = lp.tasks.join_next_with_id().await {
                lp.joined(r);
            }
        })
        .await
        .expect("the tasks ended");
    }

    /// A supervisor loop driven by the test itself (no task runs until the test awaits).
    fn test_loop(hub: &Hub, opts: FleetOptions, leading: bool) -> Loop {
        let providers = Arc::new(ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap());
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let sup = Supervisor::new(opts, providers, cache, FleetState::new(), hub.client());
        Loop::new(sup, leading)
    }

    /// A sharded loop (this replica is `a`) and the receiver of its release announcements.
    fn sharded_loop(hub: &Hub) -> (Loop, watch::Receiver<Option<String>>) {
        let providers = Arc::new(ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap());
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let (_own_tx, own_rx) = watch::channel(Ownership::none("a"));
        let (rel_tx, rel_rx) = watch::channel(None);
        let sup = Supervisor::new(
            FleetOptions::default(),
            providers,
            cache,
            FleetState::new(),
            hub.client(),
        )
        .with_shards(ShardLink {
            ownership: own_rx,
            released: rel_tx,
            metrics: ShardMetrics::default(),
        });
        (Loop::new(sup, false), rel_rx)
    }

    /// Ownership of `a` under a view of `members`, ready or not.
    fn owned_by(members: &[&str], ready: bool) -> Ownership {
        use crate::shard::view::{Shard, View};
        Ownership::Shard(Shard {
            me: "a".into(),
            view: Some(View::new(
                members.iter().map(|m| crate::shard::Member::new(*m, 10)),
            )),
            ready,
        })
    }

    /// Sharded mode: a spoke is taken only once the view is ready; when another replica
    /// owns it, its engagement is halted, no removal runs, and the view is announced only
    /// after the task ended.
    #[tokio::test]
    async fn a_released_spoke_is_announced_only_after_its_task_ended() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let (mut lp, released) = sharded_loop(&hub);
        lp.on_event(profile_with(
            hub.watched().await,
            "2026-01-01T00:00:00Z",
            "a.example",
            "p",
        ));
        // Alone but not settled: nothing is taken; the view is announced at once.
        lp.on_ownership(owned_by(&["a"], false));
        assert!(lp.slots["fleet/c1"].running().is_none());
        assert_eq!(
            lp.shared.state.get("fleet/c1").unwrap().phase,
            Phase::Standby
        );
        let alone = owned_by(&["a"], false).view_hash();
        assert_eq!(*released.borrow(), alone);
        lp.on_ownership(owned_by(&["a"], true));
        assert!(lp.slots["fleet/c1"].running().is_some(), "taken once ready");
        // A replica `b` that wins `fleet/c1` joins (found by name: the hash is stable).
        let b = (0..1000)
            .map(|i| format!("b{i}"))
            .find(|b| owned_by(&["a", b], false).owner_of("fleet/c1") == Some(b.as_str()))
            .unwrap();
        let joint = owned_by(&["a", &b], false);
        lp.on_ownership(joint.clone());
        assert!(lp.slots["fleet/c1"].running().is_none());
        assert!(
            lp.live.values().all(|t| t.halt.is_cancelled()),
            "halted at once"
        );
        assert_eq!(
            *released.borrow(),
            alone,
            "announced while its task still ran"
        );
        hub.cluster.requests().clear();
        join_all(&mut lp).await;
        assert_eq!(*released.borrow(), joint.view_hash());
        assert_eq!(
            lp.shared.state.get("fleet/c1").unwrap().phase,
            Phase::Standby
        );
        // Released, not removed: nothing reached the hub (no finalizer released).
        assert_eq!(hub.patches(), 0);
    }

    /// A profile `fleet/<name>` offering provider `p` with `audience` in its exec extension.
    fn with_audience(name: &str, audience: &str) -> InventoryEvent {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": "fleet", "uid": format!("uid-{name}")},
            "spec": {"clusterManager": {"name": "t"}},
            "status": {
                "accessProviders": [{"name": "p", "cluster": {"server": "https://127.0.0.1:1",
                    "extensions": [{"name": "client.authentication.k8s.io/exec",
                                    "extension": {"audience": audience}}]}}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "R",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "properties": [{"name": "kleym.io/trust-domain", "value": "a.example"}]
            }
        }))
        .unwrap();
        InventoryEvent::Upsert(Box::new(cp))
    }

    #[tokio::test]
    async fn profiles_sharing_an_audience_are_refused_until_one_changes() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        // A provider entry that lets profiles choose their audience.
        let doc = r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"/bin/false"},"profileSourcedAudiencePolicy":"Allow"}]}"#;
        let providers = crate::access::provider_config::parse_provider_document(doc).unwrap();
        let providers = Arc::new(ProviderSet::new(providers).unwrap());
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let sup = Supervisor::new(
            FleetOptions::default(),
            providers,
            cache,
            FleetState::new(),
            hub.client(),
        );
        let mut lp = Loop::new(sup, true);
        let phase = |lp: &Loop, n: &str| lp.shared.state.get(n).map(|s| (s.phase, s.reason));
        let refused_naming_both = |lp: &Loop, n: &str| {
            let (p, reason) = phase(lp, n).unwrap();
            let reason = reason.unwrap_or_default();
            p == Phase::Refused
                && reason.contains("fleet/a")
                && reason.contains("fleet/b")
                && reason.contains("\"x\"")
        };
        lp.on_event(with_audience("a", "x"));
        assert_eq!(phase(&lp, "fleet/a").unwrap().0, Phase::Pending);
        // b claims a's audience: both refused, whichever arrived first.
        lp.on_event(with_audience("b", "x"));
        assert!(
            refused_naming_both(&lp, "fleet/a"),
            "{:?}",
            phase(&lp, "fleet/a")
        );
        assert!(
            refused_naming_both(&lp, "fleet/b"),
            "{:?}",
            phase(&lp, "fleet/b")
        );
        assert!(lp.slots["fleet/a"].running().is_none());
        // b chooses another audience: both engaged.
        lp.on_event(with_audience("b", "y"));
        assert_eq!(phase(&lp, "fleet/a").unwrap().0, Phase::Pending);
        assert_eq!(phase(&lp, "fleet/b").unwrap().0, Phase::Pending);
        // Back to a's, then b leaves the inventory: a is engaged again.
        lp.on_event(with_audience("b", "x"));
        assert!(refused_naming_both(&lp, "fleet/a"));
        lp.on_event(InventoryEvent::Deleted("fleet/b".into()));
        assert_eq!(phase(&lp, "fleet/a").unwrap().0, Phase::Pending);
        lp.stop_all();
        join_all(&mut lp).await;
    }

    /// Engaged, left the selection (a removal job starts), selected again (the job goes
    /// quiet, a new engagement waits for it): the first engagement is still stopping, the
    /// job is in neither `running` nor `removing`.
    fn engaged_departed_and_back(lp: &mut Loop, m: Value) {
        lp.on_event(profile_with(
            m.clone(),
            "2026-01-01T00:00:00Z",
            "a.example",
            "p",
        ));
        lp.on_event(InventoryEvent::Deleted("fleet/c1".into()));
        lp.on_event(profile_with(m, "2026-01-01T00:00:00Z", "a.example", "p"));
        assert_eq!(lp.live.len(), 3);
        let slot = &lp.slots["fleet/c1"];
        assert!(slot.running().is_some());
        assert!(slot.removing().is_none());
    }

    #[tokio::test]
    async fn losing_leadership_halts_every_task_also_quiet_removals_and_stopping_engagements() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        engaged_departed_and_back(&mut lp, hub.watched().await);
        hub.cluster.requests().clear();
        lp.on_leadership(false);
        let halted: Vec<(u64, bool)> = lp
            .live
            .values()
            .map(|t| (t.seq, t.halt.is_cancelled()))
            .collect();
        assert!(halted.iter().all(|(_, h)| *h), "{halted:?}");
        // None of them ran before the step-down; once halted, none reaches the hub (the
        // quiet job would read the profile, apply Orphan until its deadline (600 s), then
        // release the profile the next leader relies on).
        join_all(&mut lp).await;
        assert!(lp.live.is_empty());
        assert!(lp.live_per_spoke.is_empty(), "{:?}", lp.live_per_spoke);
        assert_eq!(hub.requests(), []);
        assert_eq!(
            lp.shared.state.get("fleet/c1").unwrap().phase,
            Phase::Standby
        );
    }

    #[tokio::test]
    async fn unlabelled_profiles_reaching_one_server_with_one_ca_are_flagged() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        let m = hub.watched().await;
        lp.on_event(profile_with(
            m.clone(),
            "2026-01-01T00:00:00Z",
            "a.example",
            "p",
        ));
        let spec = lp.slots["fleet/c1"].running().map(|r| r.spec.clone());
        let spec = spec.expect("c1 engaged");
        // A second profile with the same access: likely one cluster listed twice.
        assert_eq!(
            lp.same_server("fleet/c2", &spec).as_deref(),
            Some("fleet/c1")
        );
        // Never the spoke itself.
        assert_eq!(lp.same_server("fleet/c1", &spec), None);
        // Another server, or the same server behind another CA: other clusters.
        let mut other = spec.clone();
        other.access.cluster.server = "https://127.0.0.1:2".into();
        assert_eq!(lp.same_server("fleet/c2", &other), None);
        let mut other_ca = spec.clone();
        other_ca.access.cluster.certificate_authority_pem = Some(b"another CA".to_vec().into());
        assert_eq!(lp.same_server("fleet/c2", &other_ca), None);
        // Labelled with a member id: the member index decides, no guess is needed.
        let mut m2 = m.clone();
        m2["name"] = json!("c2");
        m2["uid"] = json!("uid-c2");
        m2["labels"] = json!({INVENTORY_MEMBER_ID_LABEL: "member-a"});
        lp.on_event(profile_with(m2, "2026-01-01T00:00:00Z", "a.example", "p"));
        assert_eq!(lp.same_server("fleet/c2", &spec), None);
        lp.stop_all();
        join_all(&mut lp).await;
    }

    #[tokio::test]
    async fn shutdown_stops_quiet_removal_jobs_at_once_and_engagements_gracefully() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        engaged_departed_and_back(&mut lp, hub.watched().await);
        hub.cluster.requests().clear();
        lp.stop_all();
        let mut kinds: Vec<(u64, bool, bool)> = lp
            .live
            .values()
            .map(|t| (t.seq, t.removal, t.halt.is_cancelled()))
            .collect();
        kinds.sort();
        // Engagement, removal, engagement: only the removal job is halted.
        assert_eq!(
            kinds,
            [(1, false, false), (2, true, true), (3, false, false)]
        );
        assert!(lp.slots.values().all(|s| s.running().is_none()));
        join_all(&mut lp).await;
        assert_eq!(hub.requests(), []);
    }

    #[tokio::test]
    async fn a_profile_selected_again_during_its_removal_keeps_kleyms_finalizer() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        // The job gives up (the plugin fails) a couple of seconds after it started.
        let opts = FleetOptions {
            request_timeout: Duration::from_secs(1),
            removal_timeout: Duration::from_secs(2),
            ..FleetOptions::default()
        };
        let r = start(&hub, opts, true);
        let state = r.state.clone();
        let m = hub.watched().await;
        r.events
            .send(profile_with(
                m.clone(),
                "2026-01-01T00:00:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        r.events
            .send(InventoryEvent::Deleted("fleet/c1".into()))
            .unwrap();
        r.events
            .send(profile_with(m, "2026-01-01T00:00:00Z", "a.example", "p"))
            .unwrap();
        // The second engagement runs after the job ended.
        wait(&state, "engaged again", |s| {
            s.get("fleet/c1")
                .is_some_and(|x| x.engagements == 2 && x.phase == Phase::BackingOff)
        })
        .await;
        let looked_up = hub.requests().iter().any(|r| r.method == "GET");
        assert!(looked_up, "the job ran");
        assert_eq!(
            hub.patches(),
            0,
            "the quiet job left the finalizer to the new engagement"
        );
        assert_eq!(hub.finalizers().await, json!([PROFILE_FINALIZER]));
        r.stop().await;
    }

    #[tokio::test]
    async fn a_reengagement_reads_the_profile_again_after_its_predecessor() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        let m = hub.watched().await;
        r.events
            .send(profile_with(
                m.clone(),
                "2026-01-01T00:00:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        wait(&state, "backing off", |s| {
            s.get("fleet/c1")
                .is_some_and(|x| x.phase == Phase::BackingOff)
        })
        .await;
        // The finalizer goes; the watch has not told yet when the spec changes.
        assert_eq!(hub.patches(), 0);
        hub.set_finalizers(&[]).await;
        r.events
            .send(profile_with(m, "2026-01-01T00:00:00Z", "b.example", "p"))
            .unwrap();
        wait(&state, "re-engaged", |s| {
            s.get("fleet/c1")
                .is_some_and(|x| x.engagements == 2 && x.phase == Phase::BackingOff)
        })
        .await;
        assert_eq!(hub.finalizers().await, json!([PROFILE_FINALIZER]));
        assert_eq!(hub.patches(), 1);
        r.stop().await;
    }

    #[tokio::test]
    async fn an_engaged_profile_seen_without_kleyms_finalizer_gets_it_back() {
        let hub = Hub::new(&[PROFILE_FINALIZER], false).await;
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        r.events
            .send(profile_with(
                hub.watched().await,
                "2026-01-01T00:00:00Z",
                "a.example",
                "p",
            ))
            .unwrap();
        wait(&state, "backing off", |s| {
            s.get("fleet/c1")
                .is_some_and(|x| x.phase == Phase::BackingOff)
        })
        .await;
        assert_eq!(hub.patches(), 0);
        // Someone removes it; the watch forwards the change (same spec).
        let m = hub.set_finalizers(&["other.io/keep"]).await;
        r.events
            .send(profile_with(m, "2026-01-01T00:00:00Z", "a.example", "p"))
            .unwrap();
        eventually("finalizer back", async || {
            hub.finalizers().await == json!(["other.io/keep", PROFILE_FINALIZER])
        })
        .await;
        let st = state.get("fleet/c1").unwrap();
        assert_eq!(st.engagements, 1, "no re-engagement");
        r.stop().await;
    }

    #[tokio::test]
    async fn a_finished_removal_is_published_again_when_leading_again() {
        let hub = Hub::new(&[PROFILE_FINALIZER, "other.io/keep"], true).await;
        let deleted = hub.watched_deleted_long_ago().await;
        let opts = FleetOptions {
            request_timeout: Duration::from_millis(500),
            removal_timeout: Duration::from_secs(1),
            ..FleetOptions::default()
        };
        let mut lp = test_loop(&hub, opts, true);
        lp.on_event(profile_with(
            deleted,
            "2026-01-01T00:00:00Z",
            "a.example",
            "p",
        ));
        join_all(&mut lp).await;
        assert!(lp.slots["fleet/c1"].removing().unwrap().finished);
        assert_eq!(hub.finalizers().await, json!(["other.io/keep"]));
        lp.on_leadership(false);
        assert_eq!(
            lp.shared.state.get("fleet/c1").unwrap().phase,
            Phase::Standby
        );
        lp.on_leadership(true);
        let s = lp.shared.state.get("fleet/c1").unwrap();
        assert_eq!(s.phase, Phase::Removing, "{s:?}");
        let reason = s.reason.unwrap_or_default();
        assert!(
            reason.contains("gave up") && reason.contains("waiting for the ClusterProfile to go"),
            "{reason}"
        );
        // Nothing ran again.
        assert!(lp.live.is_empty());
        assert!(lp.live_per_spoke.is_empty(), "{:?}", lp.live_per_spoke);
        assert_eq!(hub.patches(), 1);
    }

    #[tokio::test]
    async fn a_task_that_panics_still_ends_its_spoke() {
        let hub = Hub::new(&[], false).await;
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        // A removal job of a profile no longer listed, which panics.
        lp.shared
            .state
            .update("fleet/c1", |s| s.phase = Phase::Removing);
        let stop = CancellationToken::new();
        let seq = lp.spawn_tail(
            "fleet/c1",
            CancellationToken::new(),
            stop.clone(),
            true,
            async { panic!("a bug") },
        );
        lp.slots.get_mut("fleet/c1").unwrap().task = Task::Removing(Removing {
            uid: None,
            stop,
            quiet: Arc::default(),
            outcome: Arc::default(),
            seq,
            finished: false,
        });
        join_all(&mut lp).await;
        assert!(lp.live.is_empty());
        assert!(lp.live_per_spoke.is_empty(), "{:?}", lp.live_per_spoke);
        // Only the tail is left (its `done` here is no task's), for a next task to wait for.
        let slot = &lp.slots["fleet/c1"];
        assert!(slot.unused() && matches!(slot.task, Task::Idle) && slot.known.is_none());
        assert!(
            lp.shared.state.get("fleet/c1").is_none(),
            "the spoke is forgotten"
        );
    }

    fn tokio_stream_from(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<InventoryEvent>,
    ) -> impl Stream<Item = InventoryEvent> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
