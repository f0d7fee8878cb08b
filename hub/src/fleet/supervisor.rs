//! The fleet supervisor: one task per engaged spoke, started, replaced and stopped from
//! inventory events and leadership changes. Its loop owns the bookkeeping (no lock at all);
//! all I/O happens in the spoke tasks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_spoke::reconciler::CancellationToken;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::options::FleetOptions;
use super::spoke_task::{StopSignal, TaskShared, run_spoke};
use super::state::{FleetState, Phase};
use crate::access::ProviderSet;
use crate::credentials::CredentialCache;
use crate::inventory::watch::spoke_name;
use crate::inventory::{Decision, InventoryEvent, SpokeSpec, evaluate};

struct Running {
    spec: SpokeSpec,
    stop: Arc<StopSignal>,
    handle: JoinHandle<()>,
}

/// Engages the spokes of an inventory. Build with [`Supervisor::new`], drive with
/// [`Supervisor::run`]; observe through [`Supervisor::state`].
pub struct Supervisor {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
}

impl Supervisor {
    /// A supervisor publishing into `state`, using `cache` for spoke credentials.
    pub fn new(
        opts: FleetOptions,
        providers: Arc<ProviderSet>,
        cache: Arc<CredentialCache>,
        state: FleetState,
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
        }
    }

    /// The published fleet state.
    pub fn state(&self) -> FleetState {
        self.shared.state.clone()
    }

    /// Runs until `shutdown` fires or `events` ends: engages spokes while `leader` is true,
    /// stops them all (without removal) when it turns false. On return every spoke task has
    /// stopped (bounded by the request timeout).
    pub async fn run(
        self,
        events: impl Stream<Item = InventoryEvent>,
        mut leader: watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        let mut events = std::pin::pin!(events);
        let mut lp = Loop {
            shared: self.shared,
            providers: self.providers,
            profiles: BTreeMap::new(),
            running: HashMap::new(),
            removals: JoinSet::new(),
            leading: *leader.borrow_and_update(),
        };
        lp.shared.state.set_leader(lp.leading);
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
                Some(_) = lp.removals.join_next(), if !lp.removals.is_empty() => {}
            }
        }
        lp.shutdown().await;
    }
}

struct Loop {
    shared: TaskShared,
    providers: Arc<ProviderSet>,
    profiles: BTreeMap<String, ClusterProfile>,
    running: HashMap<String, Running>,
    removals: JoinSet<()>,
    leading: bool,
}

impl Loop {
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
        let names: Vec<String> = self.profiles.keys().cloned().collect();
        for name in names {
            self.reconcile(&name);
        }
    }

    /// Stops a running task without removal and hands back its handle.
    fn stop(&mut self, name: &str) -> Option<JoinHandle<()>> {
        let r = self.running.remove(name)?;
        r.stop.stop(None);
        Some(r.handle)
    }

    fn reconcile(&mut self, name: &str) {
        let Some(cp) = self.profiles.get(name) else {
            return;
        };
        let decision = evaluate(cp, &self.providers, &self.shared.opts.inventory);
        let state = self.shared.state.clone();
        let spec = match decision {
            Decision::Engage(spec) => *spec,
            Decision::Waiting { reason } | Decision::Refused { reason } if !self.leading => {
                let _ = reason;
                self.standby(name);
                return;
            }
            Decision::Waiting { reason } => {
                tracing::info!(spoke = %name, %reason, "spoke not engaged: waiting");
                self.detach(name);
                state.update(name, |s| {
                    s.phase = Phase::Waiting;
                    s.reason = Some(reason);
                });
                return;
            }
            Decision::Refused { reason } => {
                tracing::warn!(spoke = %name, %reason, "cluster profile refused");
                self.detach(name);
                state.update(name, |s| {
                    s.phase = Phase::Refused;
                    s.reason = Some(reason);
                });
                return;
            }
        };
        if !self.leading {
            self.standby(name);
            return;
        }
        if self.running.get(name).is_some_and(|r| r.spec == spec) {
            // Same effective configuration (e.g. a status heartbeat): nothing to do.
            return;
        }
        let previous = self.stop(name);
        let reengage = previous.is_some();
        state.update(name, |s| {
            s.phase = Phase::Pending;
            s.reason = None;
            s.engagements += 1;
            s.trust_domain = Some(spec.settings.trust_domain.clone());
            s.spire_class_name = spec.settings.spire_class_name.clone();
            s.provider = Some(spec.access.provider.clone());
        });
        tracing::info!(spoke = %name, provider = %spec.access.provider, reengage, "engaging spoke");
        let stop = Arc::new(StopSignal::default());
        let handle = tokio::spawn(run_spoke(
            self.shared.clone(),
            spec.clone(),
            stop.clone(),
            previous,
        ));
        self.running
            .insert(name.to_string(), Running { spec, stop, handle });
    }

    /// Stops the spoke's task (if any) and lets it finish in the background.
    fn detach(&mut self, name: &str) {
        if let Some(h) = self.stop(name) {
            let limit = self.shared.opts.request_timeout.saturating_mul(2);
            self.removals.spawn(async move {
                let _ = tokio::time::timeout(limit, h).await;
            });
        }
    }

    fn standby(&mut self, name: &str) {
        self.detach(name);
        self.shared.state.update(name, |s| {
            s.phase = Phase::Standby;
            s.reason = Some("this hub replica is not the leader".into());
        });
    }

    fn deleted(&mut self, name: &str) {
        self.profiles.remove(name);
        match self.running.remove(name) {
            Some(r) if self.leading => {
                tracing::info!(spoke = %name, policy = ?self.shared.opts.removal_policy, "cluster profile deleted");
                r.stop.stop(Some(self.shared.opts.removal_policy));
                // The task applies the policy and forgets the spoke's state when done.
                self.removals.spawn(async move {
                    let _ = r.handle.await;
                });
            }
            Some(r) => {
                r.stop.stop(None);
                self.shared.state.remove(name);
            }
            None => {
                self.shared.cache.remove(name);
                self.shared.state.remove(name);
            }
        }
    }

    async fn shutdown(mut self) {
        let names: Vec<String> = self.running.keys().cloned().collect();
        let mut handles = Vec::new();
        for name in names {
            if let Some(h) = self.stop(&name) {
                handles.push(h);
            }
        }
        let limit = self.shared.opts.request_timeout.saturating_mul(2) + Duration::from_secs(1);
        let _ = tokio::time::timeout(limit, async {
            for h in handles {
                let _ = h.await;
            }
            while self.removals.join_next().await.is_some() {}
        })
        .await;
        self.removals.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{CacheOptions, CredentialMetrics};
    use crate::fleet::{ErrorCategory, FleetOptions};
    use crate::inventory::InventoryOptions;
    use serde_json::json;

    fn profile(heartbeat: &str, td: &str) -> InventoryEvent {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "t"}},
            "status": {
                "accessProviders": [{"name": "p", "cluster": {"server": "https://127.0.0.1:1"}}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "R",
                    "message": "", "lastTransitionTime": heartbeat}],
                "properties": [{"name": "kleym.io/trust-domain", "value": td}]
            }
        }))
        .unwrap();
        InventoryEvent::Upsert(Box::new(cp))
    }

    async fn wait(state: &FleetState, what: &str, f: impl Fn(&FleetState) -> bool) {
        for _ in 0..200 {
            if f(state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}: {:?}", state.spokes());
    }

    #[tokio::test]
    async fn engages_once_per_spec_stands_by_without_lease_and_forgets_deleted() {
        // The plugin always fails: the spoke backs off with a credentials error.
        let providers = Arc::new(ProviderSet::load(None, &["p=/bin/false".to_string()]).unwrap());
        let opts = FleetOptions {
            inventory: InventoryOptions::default(),
            ..FleetOptions::default()
        };
        let cache = Arc::new(CredentialCache::new(
            CacheOptions::default(),
            CredentialMetrics::default(),
        ));
        let state = FleetState::new();
        let sup = Supervisor::new(opts, providers, cache, state.clone());
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let (leader_tx, leader_rx) = watch::channel(true);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sup.run(tokio_stream_from(events_rx), leader_rx, shutdown.clone()));

        events_tx
            .send(profile("2026-01-01T00:00:00Z", "a.example"))
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
        // A heartbeat: same spec, no new engagement.
        events_tx
            .send(profile("2026-01-01T00:01:00Z", "a.example"))
            .unwrap();
        // A real change: re-engaged.
        events_tx
            .send(profile("2026-01-01T00:02:00Z", "b.example"))
            .unwrap();
        wait(&state, "re-engaged", |s| {
            s.get("fleet/c1").is_some_and(|x| {
                x.engagements == 2 && x.trust_domain.as_deref() == Some("b.example")
            })
        })
        .await;
        // Losing the lease: standby.
        leader_tx.send(false).unwrap();
        wait(&state, "standby", |s| {
            !s.is_leader() && s.get("fleet/c1").is_some_and(|x| x.phase == Phase::Standby)
        })
        .await;
        assert_eq!(state.get("fleet/c1").unwrap().engagements, 2);
        // Deleted: forgotten.
        events_tx
            .send(InventoryEvent::Deleted("fleet/c1".into()))
            .unwrap();
        wait(&state, "forgotten", |s| s.get("fleet/c1").is_none()).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }

    fn tokio_stream_from(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<InventoryEvent>,
    ) -> impl Stream<Item = InventoryEvent> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
