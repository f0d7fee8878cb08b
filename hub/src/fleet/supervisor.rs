//! The fleet supervisor: one task per engaged spoke, started, replaced and stopped from
//! inventory events and leadership changes, and one removal job per spoke whose profile is
//! deleted or leaves the selection. Its loop owns the bookkeeping (no lock at all); all I/O
//! happens in the tasks. A spoke's tasks are chained (see `chain`): each starts after the
//! previous one ended.
//!
//! Fencing: every task of a spoke's chain that has not ended yet — the running engagement,
//! one still stopping gracefully, a removal job, also one made quiet by a newer engagement —
//! holds a halt token the loop keeps until the task ended; losing leadership cancels them
//! all at once (shutdown those of the removal jobs).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_spoke::reconciler::CancellationToken;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::{AbortHandle, Id, JoinError, JoinSet};

use super::chain::{Engagement, Previous, engagement};
use super::options::FleetOptions;
use super::profile_finalizer::{ProfileRef, has_profile_finalizer, to_utc};
use super::removal_job::{RemovalJob, Trigger, run_removal};
use super::spoke_task::{StopSignal, TaskShared};
use super::state::{FleetState, Phase};
use crate::access::ProviderSet;
use crate::credentials::CredentialCache;
use crate::inventory::watch::spoke_name;
use crate::inventory::{Decision, InventoryEvent, InventoryOptions, SpokeSpec, evaluate};

/// An engagement task.
struct Running {
    spec: SpokeSpec,
    uid: Option<String>,
    stop: Arc<StopSignal>,
    /// Tells the task the profile was seen without kleym's finalizer.
    recheck: Arc<Notify>,
}

/// A removal job (running, or finished while its profile is still listed).
struct Removing {
    uid: Option<String>,
    stop: CancellationToken,
    quiet: Arc<AtomicBool>,
    /// How it ended, once it ran to its end.
    outcome: Arc<OnceLock<String>>,
    seq: u64,
    finished: bool,
}

/// A task of a spoke's chain that has not ended yet.
struct Live {
    name: String,
    seq: u64,
    /// Stops it at once (see the module's "Fencing").
    halt: CancellationToken,
    removal: bool,
}

/// Engages the spokes of an inventory. Build with [`Supervisor::new`], drive with
/// [`Supervisor::run`]; observe through [`Supervisor::state`].
pub struct Supervisor {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
    hub: kube::Client,
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
        }
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
        let mut lp = Loop::new(self, *leader.borrow_and_update());
        loop {
            tokio::select! {
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

/// The last task spawned for a spoke.
struct Tail {
    done: CancellationToken,
    abort: AbortHandle,
    removal: bool,
}

struct Loop {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
    hub: kube::Client,
    profiles: BTreeMap<String, ClusterProfile>,
    running: HashMap<String, Running>,
    removing: HashMap<String, Removing>,
    /// The spec of each spoke's last engagement: how removal reaches a spoke whose profile
    /// is now waiting, refused or gone.
    known: HashMap<String, SpokeSpec>,
    tails: HashMap<String, Tail>,
    /// Every engagement and removal task.
    tasks: JoinSet<()>,
    /// The tasks of `tasks` not joined yet, by task id.
    live: HashMap<Id, Live>,
    seq: u64,
    leading: bool,
}

impl Loop {
    fn new(sup: Supervisor, leading: bool) -> Self {
        sup.shared.state.set_leader(leading);
        Self {
            shared: sup.shared,
            providers: sup.providers,
            hub: sup.hub,
            profiles: BTreeMap::new(),
            running: HashMap::new(),
            removing: HashMap::new(),
            known: HashMap::new(),
            tails: HashMap::new(),
            tasks: JoinSet::new(),
            live: HashMap::new(),
            seq: 0,
            leading,
        }
    }

    fn on_event(&mut self, ev: InventoryEvent) {
        match ev {
            InventoryEvent::Upsert(cp) => {
                let name = spoke_name(&cp);
                self.profiles.insert(name.clone(), *cp);
                self.reconcile(&name);
            }
            InventoryEvent::Deleted(name) => self.deleted(&name),
            InventoryEvent::Resynced(names) => {
                let gone: Vec<String> = self
                    .profiles
                    .keys()
                    .filter(|k| !names.contains(*k))
                    .cloned()
                    .collect();
                for name in gone {
                    self.deleted(&name);
                }
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
        if !leading {
            // Fencing: every task still running stops at once, also an engagement already
            // stopping gracefully and a removal job made quiet by a newer engagement (neither
            // is in `running` or `removing` any more).
            for t in self.live.values() {
                t.halt.cancel();
            }
            // Removal jobs of profiles no longer listed are stopped too (a standby never
            // writes); jobs of listed ones stop in `standby` below.
            let names: Vec<String> = self.removing.keys().cloned().collect();
            for name in names {
                self.stop_removal(&name);
                self.forget_if_unused(&name);
            }
        }
        let names: Vec<String> = self.profiles.keys().cloned().collect();
        for name in names {
            self.reconcile(&name);
        }
    }

    /// Takes the spoke's previous task for a new one to wait for.
    fn previous(&mut self, name: &str) -> Option<Previous> {
        let t = self.tails.remove(name)?;
        let limit = (!t.removal).then(|| self.shared.opts.request_timeout.saturating_mul(2));
        Some(Previous {
            done: t.done,
            abort: t.abort,
            limit,
        })
    }

    /// Stops the spoke's engagement (no removal); it ends in the background.
    fn stop_running(&mut self, name: &str) -> Option<Running> {
        let r = self.running.remove(name)?;
        r.stop.stop();
        Some(r)
    }

    /// Stops the spoke's removal job if it is still running; its profile keeps kleym's
    /// finalizer for the next leader.
    fn stop_removal(&mut self, name: &str) {
        if self.removing.get(name).is_some_and(|r| !r.finished)
            && let Some(r) = self.removing.remove(name)
        {
            r.stop.cancel();
        }
    }

    fn reconcile(&mut self, name: &str) {
        let Some(cp) = self.profiles.get(name) else {
            return;
        };
        if !self.leading {
            self.standby(name);
            return;
        }
        if let Some(since) = cp.metadata.deletion_timestamp.as_ref().map(to_utc) {
            self.deleting(name, since);
            return;
        }
        let uid = cp.metadata.uid.clone();
        let decision = evaluate(cp, &self.providers, &self.shared.opts.inventory);
        let state = self.shared.state.clone();
        let spec = match decision {
            Decision::Engage(spec) => *spec,
            Decision::Waiting { reason } => {
                tracing::info!(spoke = %name, %reason, "spoke not engaged: waiting");
                self.stop_running(name);
                state.update(name, |s| {
                    s.phase = Phase::Waiting;
                    s.reason = Some(reason);
                });
                return;
            }
            Decision::Refused { reason } => {
                tracing::warn!(spoke = %name, %reason, "cluster profile refused");
                self.stop_running(name);
                state.update(name, |s| {
                    s.phase = Phase::Refused;
                    s.reason = Some(reason);
                });
                return;
            }
        };
        if let Some(r) = self.running.get(name)
            && r.spec == spec
            && r.uid == uid
        {
            // Same effective configuration (e.g. a status heartbeat): nothing to do, unless
            // kleym's finalizer went missing (removed by hand, or released by a removal
            // racing this engagement): the task reads the profile and puts it back.
            if !has_profile_finalizer(cp) {
                tracing::info!(spoke = %name, "engaged spoke's ClusterProfile seen without kleym's finalizer; checking");
                r.recheck.notify_one();
            }
            return;
        }
        let profile = ProfileRef::of(cp);
        let seen = cp.clone();
        let reengage = self.stop_running(name).is_some();
        // A removal still in flight (the profile came back into the selection) finishes
        // first, quiet: the state is the new engagement's from now on, and so is the
        // profile's finalizer (the job leaves it). It still halts with its chain.
        if let Some(r) = self.removing.remove(name) {
            r.quiet.store(true, Ordering::Release);
        }
        state.update(name, |s| {
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
        let stop = Arc::new(StopSignal::default());
        let recheck = Arc::new(Notify::new());
        let done = CancellationToken::new();
        let e = Engagement {
            spec: spec.clone(),
            profile,
            seen: Some(seen),
            stop: stop.clone(),
            recheck: recheck.clone(),
            previous: self.previous(name),
            done: done.clone(),
        };
        let (shared, hub) = (self.shared.clone(), self.hub.clone());
        let halt = stop.halt.clone();
        self.spawn_tail(name, done, halt, false, engagement(shared, hub, e));
        self.known.insert(name.to_string(), spec.clone());
        self.running.insert(
            name.to_string(),
            Running {
                spec,
                uid,
                stop,
                recheck,
            },
        );
    }

    /// The profile has a `deletionTimestamp`: start its removal job (once per profile).
    fn deleting(&mut self, name: &str, since: chrono::DateTime<chrono::Utc>) {
        let Some(cp) = self.profiles.get(name).cloned() else {
            return;
        };
        if let Some(r) = self.removing.get(name)
            && r.uid == cp.metadata.uid
        {
            if r.finished {
                // Its removal ran to its end; other finalizers keep the profile. Published
                // again: leading again after a standby, the state still says `Standby`.
                let outcome = r.outcome.get().map_or("removal finished", String::as_str);
                let reason = format!("{outcome}; waiting for the ClusterProfile to go");
                self.shared.state.update(name, |s| {
                    s.phase = Phase::Removing;
                    s.reason = Some(reason);
                });
            }
            return;
        }
        let engaged = self.stop_running(name);
        if engaged.is_none() && !has_profile_finalizer(&cp) && !self.known.contains_key(name) {
            // kleym never engaged this spoke: nothing of ours to remove.
            self.shared.state.update(name, |s| {
                s.phase = Phase::Removing;
                s.reason = Some("ClusterProfile deleted; kleym never engaged this spoke".into());
            });
            return;
        }
        self.start_removal(
            name,
            &cp,
            engaged.map(|r| r.spec),
            Trigger::Deleting { since },
        );
    }

    /// The profile left the watch (deleted, or no longer selected).
    fn deleted(&mut self, name: &str) {
        let last = self.profiles.remove(name);
        if !self.leading {
            self.stop_running(name);
            self.forget_if_unused(name);
            return;
        }
        if let Some(r) = self.removing.get(name)
            && last.as_ref().is_none_or(|cp| cp.metadata.uid == r.uid)
        {
            // Its removal job ends the story (forgotten when it finished).
            self.forget_if_unused(name);
            return;
        }
        let engaged = self.stop_running(name);
        match last {
            Some(cp)
                if engaged.is_some()
                    || has_profile_finalizer(&cp)
                    || self.known.contains_key(name) =>
            {
                tracing::info!(spoke = %name, "cluster profile left the inventory");
                let trigger = match cp.metadata.deletion_timestamp.as_ref() {
                    Some(t) => Trigger::Deleting { since: to_utc(t) },
                    None => Trigger::Departed,
                };
                self.start_removal(name, &cp, engaged.map(|r| r.spec), trigger);
            }
            // kleym never wrote to this spoke.
            _ => self.forget_if_unused(name),
        }
    }

    /// Spawns the removal job of `name` after its previous task. `engaged` is the spec of
    /// the engagement just stopped, if any.
    fn start_removal(
        &mut self,
        name: &str,
        cp: &ClusterProfile,
        engaged: Option<SpokeSpec>,
        trigger: Trigger,
    ) {
        let access = match engaged.or_else(|| self.known.get(name).cloned()) {
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
        self.removing.insert(
            name.to_string(),
            Removing {
                uid,
                stop,
                quiet,
                outcome,
                seq,
                finished: false,
            },
        );
    }

    /// Spawns a spoke's engagement or removal task as the new tail of its chain; returns its
    /// sequence number (which [`Self::task_ended`] receives when it ends). `halt` stops
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
        self.live.insert(
            abort.id(),
            Live {
                name: name.to_string(),
                seq,
                halt,
                removal,
            },
        );
        self.tails.insert(
            name.to_string(),
            Tail {
                done,
                abort,
                removal,
            },
        );
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
        if panicked {
            tracing::error!(spoke = %t.name, removal = t.removal, "spoke task panicked");
        }
        self.task_ended(&t.name, t.seq);
    }

    fn task_ended(&mut self, name: &str, seq: u64) {
        if let Some(r) = self.removing.get_mut(name)
            && r.seq == seq
        {
            r.finished = true;
        }
        self.forget_if_unused(name);
    }

    /// Forgets a spoke (published state, credentials, remembered spec) once nothing refers
    /// to it: no listed profile, no engagement, no removal in flight. Runs in this loop, so
    /// it never races a newer engagement of the same name.
    fn forget_if_unused(&mut self, name: &str) {
        if self.profiles.contains_key(name)
            || self.running.contains_key(name)
            || self.removing.get(name).is_some_and(|r| !r.finished)
        {
            return;
        }
        self.removing.remove(name);
        self.known.remove(name);
        if self.tails.get(name).is_some_and(|t| t.done.is_cancelled()) {
            self.tails.remove(name);
        }
        self.shared.cache.remove(name);
        self.shared.state.remove(name);
    }

    fn standby(&mut self, name: &str) {
        self.stop_running(name);
        self.stop_removal(name);
        self.shared.state.update(name, |s| {
            s.phase = Phase::Standby;
            s.reason = Some("this hub replica is not the leader".into());
        });
    }

    /// Stops every task for shutdown: engagements gracefully, removal jobs (also quiet
    /// ones) at once.
    fn stop_all(&mut self) {
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in names {
            self.stop_running(&name);
        }
        let names: Vec<String> = self.removing.keys().cloned().collect();
        for name in names {
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
    use serde_json::{Value, json};
    use std::sync::Mutex;

    /// A hub cluster holding one ClusterProfile's metadata: answers metadata GETs and
    /// resourceVersion-guarded merge patches, and records every request.
    #[derive(Clone)]
    struct FakeHub {
        meta: Arc<Mutex<Option<Value>>>,
        requests: Arc<Mutex<Vec<(String, Value)>>>,
    }

    impl FakeHub {
        fn new(meta: Value) -> Self {
            Self {
                meta: Arc::new(Mutex::new(Some(meta))),
                requests: Arc::default(),
            }
        }

        fn patches(&self) -> Vec<Value> {
            self.requests
                .lock()
                .unwrap()
                .iter()
                .filter(|(m, _)| m == "PATCH")
                .map(|(_, b)| b.clone())
                .collect()
        }

        fn finalizers(&self) -> Value {
            self.meta.lock().unwrap().as_ref().unwrap()["finalizers"].clone()
        }

        fn client(&self) -> kube::Client {
            let me = self.clone();
            let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let me = me.clone();
                async move { Ok::<_, std::convert::Infallible>(me.handle(req).await) }
            });
            kube::Client::new(svc, "default")
        }

        async fn handle(
            &self,
            req: http::Request<kube::client::Body>,
        ) -> http::Response<kube::client::Body> {
            use http_body_util::BodyExt;
            let method = req.method().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            self.requests
                .lock()
                .unwrap()
                .push((method.clone(), body.clone()));
            let mut meta = self.meta.lock().unwrap();
            let status = |code: u16| {
                http::Response::builder()
                    .status(code)
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "code": code, "reason": "", "message": "fake"}))
                        .unwrap(),
                    ))
                    .unwrap()
            };
            let Some(m) = meta.as_mut() else {
                return status(404);
            };
            if method == "PATCH" {
                if body["metadata"]["resourceVersion"] != m["resourceVersion"] {
                    return status(409);
                }
                m["finalizers"] = body["metadata"]["finalizers"].clone();
                let rv: u64 = m["resourceVersion"].as_str().unwrap().parse().unwrap();
                m["resourceVersion"] = json!((rv + 1).to_string());
            }
            let out = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": m});
            http::Response::new(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
        }
    }

    fn meta(finalizers: &[&str], deleted: Option<&str>) -> Value {
        let mut m = json!({"name": "c1", "namespace": "fleet", "uid": "u1",
            "resourceVersion": "1", "finalizers": finalizers});
        if let Some(t) = deleted {
            m["deletionTimestamp"] = json!(t);
        }
        m
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
    fn start(hub: &FakeHub, opts: FleetOptions, leading: bool) -> Running {
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
        let hub = FakeHub::new(meta(&["other.io/keep"], None));
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        let mut m = meta(&["other.io/keep"], None);
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
            hub.finalizers(),
            json!(["other.io/keep", PROFILE_FINALIZER])
        );
        assert_eq!(hub.patches().len(), 1);
        // A heartbeat: same spec, no new engagement.
        m["finalizers"] = hub.finalizers();
        m["resourceVersion"] = json!("2");
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
        assert_eq!(hub.patches().len(), 1);
        // Losing the lease: standby.
        r.leader.send(false).unwrap();
        wait(&state, "standby", |s| {
            !s.is_leader() && s.get("fleet/c1").is_some_and(|x| x.phase == Phase::Standby)
        })
        .await;
        assert_eq!(state.get("fleet/c1").unwrap().engagements, 2);
        // Deleted while on standby: forgotten, and nothing written.
        let before = hub.requests.lock().unwrap().len();
        r.events
            .send(InventoryEvent::Deleted("fleet/c1".into()))
            .unwrap();
        wait(&state, "forgotten", |s| s.get("fleet/c1").is_none()).await;
        r.stop().await;
        assert_eq!(
            hub.requests.lock().unwrap().len(),
            before,
            "a standby never writes"
        );
    }

    #[tokio::test]
    async fn a_deleted_profile_is_released_by_the_leader_only_even_when_removal_gives_up() {
        // Deleted long ago (the hub was down past the removal timeout): one bounded attempt,
        // which fails (the plugin fails), then the give-up is published and the profile is
        // released.
        let deleted = meta(
            &[PROFILE_FINALIZER, "other.io/keep"],
            Some("2020-01-01T00:00:00Z"),
        );
        let hub = FakeHub::new(deleted.clone());
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
        assert!(
            hub.requests.lock().unwrap().is_empty(),
            "a standby never writes"
        );

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
        wait(&state, "released", |_| {
            hub.finalizers() == json!(["other.io/keep"])
        })
        .await;
        assert_eq!(hub.patches().len(), 1);
        r.stop().await;
    }

    #[tokio::test]
    async fn a_deleted_profile_with_unusable_access_is_released_without_touching_the_spoke() {
        let deleted = meta(&[PROFILE_FINALIZER], Some("2026-01-01T00:00:00Z"));
        let hub = FakeHub::new(deleted.clone());
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
        wait(&state, "released", |_| hub.finalizers() == json!([])).await;
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
    fn test_loop(hub: &FakeHub, opts: FleetOptions, leading: bool) -> Loop {
        let providers = Arc::new(ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap());
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let sup = Supervisor::new(opts, providers, cache, FleetState::new(), hub.client());
        Loop::new(sup, leading)
    }

    /// Engaged, left the selection (a removal job starts), selected again (the job goes
    /// quiet, a new engagement waits for it): the first engagement is still stopping, the
    /// job is in neither `running` nor `removing`.
    fn engaged_departed_and_back(lp: &mut Loop) {
        let m = meta(&[PROFILE_FINALIZER], None);
        lp.on_event(profile_with(
            m.clone(),
            "2026-01-01T00:00:00Z",
            "a.example",
            "p",
        ));
        lp.on_event(InventoryEvent::Deleted("fleet/c1".into()));
        lp.on_event(profile_with(m, "2026-01-01T00:00:00Z", "a.example", "p"));
        assert_eq!(lp.live.len(), 3);
        assert_eq!(lp.running.len(), 1);
        assert!(lp.removing.is_empty());
    }

    #[tokio::test]
    async fn losing_leadership_halts_every_task_also_quiet_removals_and_stopping_engagements() {
        let hub = FakeHub::new(meta(&[PROFILE_FINALIZER], None));
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        engaged_departed_and_back(&mut lp);
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
        assert_eq!(*hub.requests.lock().unwrap(), Vec::new());
        assert_eq!(
            lp.shared.state.get("fleet/c1").unwrap().phase,
            Phase::Standby
        );
    }

    #[tokio::test]
    async fn shutdown_stops_quiet_removal_jobs_at_once_and_engagements_gracefully() {
        let hub = FakeHub::new(meta(&[PROFILE_FINALIZER], None));
        let mut lp = test_loop(&hub, FleetOptions::default(), true);
        engaged_departed_and_back(&mut lp);
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
        assert!(lp.running.is_empty());
        join_all(&mut lp).await;
        assert_eq!(*hub.requests.lock().unwrap(), Vec::new());
    }

    #[tokio::test]
    async fn a_profile_selected_again_during_its_removal_keeps_kleyms_finalizer() {
        let hub = FakeHub::new(meta(&[PROFILE_FINALIZER], None));
        // The job gives up (the plugin fails) a couple of seconds after it started.
        let opts = FleetOptions {
            request_timeout: Duration::from_secs(1),
            removal_timeout: Duration::from_secs(2),
            ..FleetOptions::default()
        };
        let r = start(&hub, opts, true);
        let state = r.state.clone();
        let m = meta(&[PROFILE_FINALIZER], None);
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
        let looked_up = hub.requests.lock().unwrap().iter().any(|(m, _)| m == "GET");
        assert!(looked_up, "the job ran");
        assert_eq!(hub.finalizers(), json!([PROFILE_FINALIZER]));
        assert_eq!(
            hub.patches(),
            Vec::<Value>::new(),
            "the quiet job left the finalizer to the new engagement"
        );
        r.stop().await;
    }

    #[tokio::test]
    async fn a_reengagement_reads_the_profile_again_after_its_predecessor() {
        let hub = FakeHub::new(meta(&[PROFILE_FINALIZER], None));
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        let m = meta(&[PROFILE_FINALIZER], None);
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
        {
            let mut meta = hub.meta.lock().unwrap();
            let m = meta.as_mut().unwrap();
            m["finalizers"] = json!([]);
            m["resourceVersion"] = json!("2");
        }
        r.events
            .send(profile_with(m, "2026-01-01T00:00:00Z", "b.example", "p"))
            .unwrap();
        wait(&state, "re-engaged", |s| {
            s.get("fleet/c1")
                .is_some_and(|x| x.engagements == 2 && x.phase == Phase::BackingOff)
        })
        .await;
        assert_eq!(hub.finalizers(), json!([PROFILE_FINALIZER]));
        assert_eq!(hub.patches().len(), 1);
        r.stop().await;
    }

    #[tokio::test]
    async fn an_engaged_profile_seen_without_kleyms_finalizer_gets_it_back() {
        let hub = FakeHub::new(meta(&[PROFILE_FINALIZER], None));
        let r = start(&hub, FleetOptions::default(), true);
        let state = r.state.clone();
        r.events
            .send(profile_with(
                meta(&[PROFILE_FINALIZER], None),
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
        assert!(hub.patches().is_empty());
        // Someone removes it; the watch forwards the change (same spec).
        let mut m = meta(&["other.io/keep"], None);
        m["resourceVersion"] = json!("2");
        *hub.meta.lock().unwrap() = Some(m.clone());
        r.events
            .send(profile_with(m, "2026-01-01T00:00:00Z", "a.example", "p"))
            .unwrap();
        wait(&state, "finalizer back", |_| {
            hub.finalizers() == json!(["other.io/keep", PROFILE_FINALIZER])
        })
        .await;
        let st = state.get("fleet/c1").unwrap();
        assert_eq!(st.engagements, 1, "no re-engagement");
        r.stop().await;
    }

    #[tokio::test]
    async fn a_finished_removal_is_published_again_when_leading_again() {
        let deleted = meta(
            &[PROFILE_FINALIZER, "other.io/keep"],
            Some("2020-01-01T00:00:00Z"),
        );
        let hub = FakeHub::new(deleted.clone());
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
        assert!(lp.removing["fleet/c1"].finished);
        assert_eq!(hub.finalizers(), json!(["other.io/keep"]));
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
        assert_eq!(hub.patches().len(), 1);
    }

    #[tokio::test]
    async fn a_task_that_panics_still_ends_its_spoke() {
        let hub = FakeHub::new(meta(&[], None));
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
        lp.removing.insert(
            "fleet/c1".into(),
            Removing {
                uid: None,
                stop,
                quiet: Arc::default(),
                outcome: Arc::default(),
                seq,
                finished: false,
            },
        );
        join_all(&mut lp).await;
        assert!(lp.live.is_empty());
        assert!(lp.removing.is_empty());
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
