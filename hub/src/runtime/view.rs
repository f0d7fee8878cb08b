//! The real hub's [`HubView`] (what the HTTP API serves) over the supervisor's
//! [`FleetState`], the inventory-synced flag and leader election, plus the scrape-time
//! metrics collector of per-spoke state and findings. The leader serves its own fleet
//! state; a follower (which runs no spokes) serves the leader's published status objects
//! ([`PublishedStatus`]), so every replica behind the Service answers `/v1/*`. A leaf of the hub's assembly: it
//! reads the fleet, inventory and leader state the start-up hands it and imports nothing of
//! [`crate::runtime`].
//!
//! The fleet-wide bodies (`/v1/report`, `/v1/clusters`) and the collector's series are built
//! at most once per change of the fleet state (its change counter): at 1000 spokes x 100
//! bindings a build costs a large fraction of a second, a kept one nothing.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::coordination::v1::Lease;
use kleym_api::hub_status::FindingKind;
use kleym_spoke::reconciler::CancellationToken;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{Value, json};

use crate::explain_source::HubCaches;
use crate::fleet::state::FleetState;
use crate::http::cached::Versioned;
use crate::http::view::{clusters_body, json_bytes};
use crate::http::{EncodeError, HubReadiness, HubView, LeaderState, SpokeReach};
use crate::inventory::{InventorySynced, InventoryVersion};
use crate::report::published::{PublishedSpoke, local_spokes};
use crate::report::{FullReport, SpokeObservation, cluster_status};
use crate::status::ObservationCache;

use super::published::PublishedStatus;

/// What this replica knows of the Lease holder.
#[derive(Debug, Clone, Default)]
pub struct LeaderInfo {
    inner: Arc<RwLock<LeaderInfoState>>,
}

#[derive(Debug, Default)]
struct LeaderInfoState {
    /// Election disabled: this replica always leads.
    always: bool,
    /// The Lease holder last read (`None`: not read yet, absent, or released).
    holder: Option<String>,
}

impl LeaderInfo {
    /// Leader election is disabled: leadership is known and this replica leads.
    pub fn always_leader() -> Self {
        let info = Self::default();
        info.write().always = true;
        info
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, LeaderInfoState> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, LeaderInfoState> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the holder read from the Lease.
    pub fn set_holder(&self, holder: Option<String>) {
        self.write().holder = holder.filter(|h| !h.is_empty());
    }

    /// The holder last read.
    pub fn holder(&self) -> Option<String> {
        self.read().holder.clone()
    }

    fn always(&self) -> bool {
        self.read().always
    }
}

/// Reads the Lease `namespace/name` every `period` until `shutdown`, recording its holder
/// into `info` (so a follower can name the leader and `/readyz` knows leadership).
pub async fn observe_lease(
    client: kube::Client,
    namespace: String,
    name: String,
    period: Duration,
    info: LeaderInfo,
    shutdown: CancellationToken,
) {
    let api: kube::Api<Lease> = kube::Api::namespaced(client, &namespace);
    loop {
        match api.get_opt(&name).await {
            Ok(lease) => {
                info.set_holder(lease.and_then(|l| l.spec).and_then(|s| s.holder_identity))
            }
            // Keep the last holder: a transient error does not make leadership unknown.
            Err(e) => tracing::debug!(error = %e, lease = %name, "reading the leader Lease failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// A JSON body kept until the fleet state changes.
type CachedBody = Versioned<Result<Bytes, EncodeError>>;

/// [`HubView`] over the running hub.
#[derive(Debug, Clone)]
pub struct FleetHubView {
    state: FleetState,
    inventory: InventorySynced,
    version: InventoryVersion,
    leader: LeaderInfo,
    report_body: Arc<CachedBody>,
    clusters_body: Arc<CachedBody>,
    /// What a follower serves (`None`: no leader election, this replica always leads).
    published: Option<PublishedStatus>,
    published_report: Arc<CachedBody>,
    published_clusters: Arc<CachedBody>,
    /// Sharded mode: every replica, the leader too, serves the published objects (each
    /// replica runs only its share of the spokes; the published statuses cover the fleet).
    sharded: bool,
    /// The report's input while leading in sharded mode (`None`: this replica's own state).
    observations: Option<ObservationCache>,
}

impl FleetHubView {
    /// A view of `state`, ready once `inventory` synced and `leader` is known.
    pub fn new(state: FleetState, inventory: InventorySynced, leader: LeaderInfo) -> Self {
        Self {
            state,
            inventory,
            version: InventoryVersion::default(),
            leader,
            report_body: Arc::default(),
            clusters_body: Arc::default(),
            published: None,
            published_report: Arc::default(),
            published_clusters: Arc::default(),
            sharded: false,
            observations: None,
        }
    }

    /// Sharded mode: `/v1/*` always answers from the published objects (set with
    /// [`Self::with_published`]), never from this replica's own share of the fleet, so no
    /// per-spoke question reaches a spoke this replica does not own and every replica
    /// answers for the whole fleet.
    pub fn sharded(mut self) -> Self {
        self.sharded = true;
        self
    }

    /// Builds `/v1/report` and `/v1/clusters` from the spokes' published observations while
    /// this replica leads (sharded mode: it engages only some spokes itself).
    pub fn with_report_from_observations(mut self, cache: ObservationCache) -> Self {
        self.observations = Some(cache);
        self
    }

    /// The spokes the report is built from: this replica's own, or as published.
    fn report_spokes(&self) -> Vec<PublishedSpoke> {
        let local = local_spokes(&self.state);
        match &self.observations {
            Some(cache) => cache.report_inputs(local),
            None => local,
        }
    }

    fn full_report(&self, now: chrono::DateTime<chrono::Utc>) -> FullReport {
        if self.observations.is_none() {
            return FullReport::from_fleet(&self.state, now);
        }
        let spokes: Vec<_> = self
            .report_spokes()
            .into_iter()
            .map(|s| s.observation)
            .collect();
        FullReport::build(&spokes, now)
    }

    /// Serves `published` on `/v1/*` while this replica follows.
    pub fn with_published(mut self, published: PublishedStatus) -> Self {
        self.published = Some(published);
        self
    }

    /// The published status to serve from: `Some` while this replica follows, and always
    /// in sharded mode.
    fn following(&self) -> Option<&PublishedStatus> {
        self.published
            .as_ref()
            .filter(|_| self.sharded || !self.leader().is_leader)
    }

    /// Reports `version` (the ClusterProfile version the inventory reads) in `/readyz`; a
    /// version that cannot be read makes the hub not ready.
    pub fn with_inventory_version(mut self, version: InventoryVersion) -> Self {
        self.version = version;
        self
    }

    /// `body` of the current fleet state, built once per state change.
    fn cached(
        &self,
        cache: &CachedBody,
        build: impl FnOnce() -> Result<Bytes, EncodeError>,
    ) -> Result<Bytes, EncodeError> {
        // The counter is read before the build reads the state (see `change_counter`).
        // Both counters only grow, so their sum moves whenever either does.
        let version = self.state.change_counter()
            + self
                .observations
                .as_ref()
                .map_or(0, ObservationCache::version);
        cache.get_or_build(version, build).as_ref().clone()
    }

    fn cluster_value(s: &PublishedSpoke, now: chrono::DateTime<chrono::Utc>) -> Value {
        let cluster = &s.observation.cluster;
        let (namespace, name) = cluster.split_once('/').unwrap_or(("", cluster.as_str()));
        json!({
            "cluster": cluster,
            "namespace": namespace,
            "name": name,
            "phase": s.phase,
            "consecutiveFailures": s.failures,
            "status": cluster_status(&s.observation, now, None),
        })
    }
}

impl HubView for FleetHubView {
    fn report(&self) -> Value {
        let report = match self.following() {
            Some(p) => match p.report() {
                Ok(r) => r,
                Err(e) => return json!({"error": e.to_string()}),
            },
            None => self.full_report(chrono::Utc::now()),
        };
        serde_json::to_value(report).unwrap_or_else(|e| json!({"error": e.to_string()}))
    }

    fn clusters(&self) -> Vec<Value> {
        if let Some(p) = self.following() {
            return p.clusters().unwrap_or_default();
        }
        let now = chrono::Utc::now();
        self.report_spokes()
            .iter()
            .map(|s| Self::cluster_value(s, now))
            .collect()
    }

    fn cluster(&self, namespace: &str, name: &str) -> Option<Value> {
        if let Some(p) = self.following() {
            return p.cluster(namespace, name).ok().flatten();
        }
        let cluster = format!("{namespace}/{name}");
        if self.observations.is_some() {
            return self
                .report_spokes()
                .iter()
                .find(|s| s.observation.cluster == cluster)
                .map(|s| Self::cluster_value(s, chrono::Utc::now()));
        }
        self.state
            .get(&cluster)
            .map(|s| Self::cluster_value(&PublishedSpoke::from(&s), chrono::Utc::now()))
    }

    fn ready(&self) -> HubReadiness {
        let l = self.leader();
        let (clusterprofile_version, inventory_error) = match self.version.outcome() {
            None => (None, None),
            Some(Ok(c)) => (
                Some(format!("{} ({})", c.version.api_version(), c.reason)),
                None,
            ),
            Some(Err(e)) => (None, Some(e.to_string())),
        };
        HubReadiness {
            inventory_synced: self.inventory.is_synced(),
            leadership_known: l.is_leader || l.leader_identity.is_some(),
            clusterprofile_version,
            inventory_error,
        }
    }

    /// Built once per fleet state change: `generatedAt` (and the status conditions' times)
    /// say when, i.e. the first request after the change.
    fn report_json(&self) -> Result<Bytes, EncodeError> {
        if let Some(p) = self.following() {
            return self
                .published_report
                .get_or_build(p.version(), || {
                    p.report()
                        .map_err(|e| EncodeError(e.to_string()))
                        .and_then(|r| json_bytes(&r))
                })
                .as_ref()
                .clone();
        }
        self.cached(&self.report_body, || {
            json_bytes(&self.full_report(chrono::Utc::now()))
        })
    }

    fn clusters_json(&self) -> Result<Bytes, EncodeError> {
        if let Some(p) = self.following() {
            return self
                .published_clusters
                .get_or_build(p.version(), || {
                    p.clusters()
                        .map_err(|e| EncodeError(e.to_string()))
                        .and_then(|items| clusters_body(&items))
                })
                .as_ref()
                .clone();
        }
        self.cached(&self.clusters_body, || clusters_body(&self.clusters()))
    }

    /// The spoke's caches and client while this replica engages it. The one ownership
    /// check is [`FleetState::spoke_client`]: only a replica that runs the spoke has its
    /// reconciler and client, so a follower (and, once the hub is sharded, a replica that
    /// does not own the cluster) never reaches it.
    fn spoke_reach(&self, namespace: &str, name: &str) -> SpokeReach {
        let key = format!("{namespace}/{name}");
        if let Some((client, context)) = self.state.spoke_client(&key) {
            return SpokeReach::Cached(HubCaches {
                client,
                context,
                cluster: key,
            });
        }
        if self.cluster(namespace, name).is_none() {
            return SpokeReach::Unknown;
        }
        if self.sharded {
            return SpokeReach::NotHere(format!(
                "this replica does not run cluster {key}'s spoke; the replica that owns it \
                 does (retry: the Service spreads requests over the replicas)"
            ));
        }
        match self.following() {
            // Name the leader when the Lease says who it is: the caller can ask it directly.
            Some(_) => SpokeReach::NotHere(match self.leader.holder() {
                Some(leader) => format!(
                    "this replica does not run cluster {key}'s spoke; the leader {leader} does"
                ),
                None => format!("this replica does not run cluster {key}'s spoke; the leader does"),
            }),
            None => SpokeReach::NotHere(format!(
                "cluster {key} is not engaged right now (see /v1/clusters/{key})"
            )),
        }
    }

    fn v1_unavailable(&self) -> Option<String> {
        let p = self.following()?;
        p.report().err().map(|e| e.to_string())
    }

    fn leader(&self) -> LeaderState {
        if self.leader.always() {
            return LeaderState {
                is_leader: true,
                leader_identity: None,
            };
        }
        LeaderState {
            is_leader: self.state.is_leader(),
            leader_identity: self.leader.holder(),
        }
    }
}

/// `cluster`, `phase` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpokePhaseLabels {
    cluster: String,
    phase: String,
}

/// `cluster` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

/// `cluster`, `state` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpokeStateLabels {
    cluster: String,
    state: String,
}

/// `kind` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Per-spoke and findings gauges computed from [`FleetState`] at scrape time (so a removed
/// spoke's series disappear with it):
/// `kleym_hub_spoke_phase{cluster,phase}` (1 for the current phase),
/// `kleym_hub_spoke_last_sync_timestamp_seconds{cluster}`,
/// `kleym_hub_spoke_consecutive_failures{cluster}`, `kleym_hub_spoke_bindings{cluster}`,
/// `kleym_hub_spoke_admission_policy{cluster,state}` (1 for the last check's result) and
/// `kleym_hub_findings{kind}` (every kind, zeros included). The series are rebuilt only
/// when the fleet state changed since the last scrape.
#[derive(Debug, Clone)]
pub struct FleetCollector {
    state: FleetState,
    series: Arc<Versioned<FleetSeries>>,
}

impl FleetCollector {
    /// A collector of `state`.
    pub fn new(state: FleetState) -> Self {
        Self {
            state,
            series: Arc::default(),
        }
    }
}

/// The collector's series at one fleet state.
#[derive(Default)]
struct FleetSeries {
    phase: Family<SpokePhaseLabels, Gauge>,
    last_sync: Family<ClusterLabels, Gauge>,
    failures: Family<ClusterLabels, Gauge>,
    bindings: Family<ClusterLabels, Gauge>,
    admission_policy: Family<SpokeStateLabels, Gauge>,
    findings: Family<KindLabels, Gauge>,
}

impl FleetSeries {
    fn of(state: &FleetState) -> Self {
        let series = Self::default();
        let spokes = state.spokes();
        for s in &spokes {
            let cluster = ClusterLabels {
                cluster: s.name.clone(),
            };
            series
                .phase
                .get_or_create(&SpokePhaseLabels {
                    cluster: s.name.clone(),
                    phase: s.phase.as_str().to_string(),
                })
                .set(1);
            if let Some(t) = s.last_sync {
                series.last_sync.get_or_create(&cluster).set(t.timestamp());
            }
            series
                .failures
                .get_or_create(&cluster)
                .set(i64::from(s.consecutive_failures));
            series
                .bindings
                .get_or_create(&cluster)
                .set(i64::try_from(s.bindings.len()).unwrap_or(i64::MAX));
            if let Some(check) = &s.admission_policy {
                series
                    .admission_policy
                    .get_or_create(&SpokeStateLabels {
                        cluster: s.name.clone(),
                        state: check.as_str().to_string(),
                    })
                    .set(1);
            }
        }
        let observations: Vec<SpokeObservation> =
            spokes.iter().map(SpokeObservation::from).collect();
        let findings = crate::report::analyze(&observations);
        for kind in FindingKind::ALL {
            let n = findings.iter().filter(|f| f.kind == kind).count();
            series
                .findings
                .get_or_create(&KindLabels {
                    kind: kind.as_str().to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        series
    }
}

fn encode_family<L>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    family: &Family<L, Gauge>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug,
{
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // The counter is read before the state (see `FleetState::change_counter`).
        let version = self.state.change_counter();
        let series = self
            .series
            .get_or_build(version, || FleetSeries::of(&self.state));
        encode_family(
            &mut encoder,
            "kleym_hub_spoke_phase",
            "1 for each spoke's current phase",
            &series.phase,
        )?;
        encode_family(
            &mut encoder,
            "kleym_hub_spoke_last_sync_timestamp_seconds",
            "Unix time of each spoke's last successful sync",
            &series.last_sync,
        )?;
        encode_family(
            &mut encoder,
            "kleym_hub_spoke_consecutive_failures",
            "Consecutive failed attempts of each spoke",
            &series.failures,
        )?;
        encode_family(
            &mut encoder,
            "kleym_hub_spoke_bindings",
            "InferenceIdentityBindings observed in each spoke",
            &series.bindings,
        )?;
        encode_family(
            &mut encoder,
            "kleym_hub_spoke_admission_policy",
            "1 for each spoke's last admission policy check result (installed, missing, unknown)",
            &series.admission_policy,
        )?;
        encode_family(
            &mut encoder,
            "kleym_hub_findings",
            "Current fleet report findings by kind",
            &series.findings,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::state::Phase;

    fn fleet() -> FleetState {
        let state = FleetState::new();
        state.update("fleet/a", |s| {
            s.phase = Phase::Engaged;
            s.last_sync = chrono::DateTime::from_timestamp(1_700_000_000, 0);
        });
        state.update("fleet/b", |s| {
            s.phase = Phase::BackingOff;
            s.consecutive_failures = 3;
        });
        state
    }

    #[test]
    fn ready_needs_inventory_and_known_leadership() {
        let state = fleet();
        let inventory = InventorySynced::default();
        let leader = LeaderInfo::default();
        let view = FleetHubView::new(state.clone(), inventory.clone(), leader.clone());
        assert_eq!(view.ready(), HubReadiness::default());
        assert!(!view.leader().is_leader);
        leader.set_holder(Some("other-replica".into()));
        let l = view.leader();
        assert!(!l.is_leader);
        assert_eq!(l.leader_identity.as_deref(), Some("other-replica"));
        assert!(view.ready().leadership_known);
        assert!(!view.ready().inventory_synced);
        leader.set_holder(None);
        state.set_leader(true);
        assert!(view.ready().leadership_known && view.leader().is_leader);
        let always = FleetHubView::new(state, inventory, LeaderInfo::always_leader());
        assert!(always.leader().is_leader);
    }

    #[tokio::test]
    async fn explain_reaches_only_spokes_this_replica_engages() {
        let state = fleet();
        let view = FleetHubView::new(
            state.clone(),
            InventorySynced::default(),
            LeaderInfo::always_leader(),
        );
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        assert!(matches!(
            view.spoke_reach("fleet", "nope"),
            SpokeReach::Unknown
        ));
        let not_here = |r: SpokeReach| match r {
            SpokeReach::NotHere(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(not_here(view.spoke_reach("fleet", "a")).contains("not engaged"));
        let context = Arc::new(kleym_spoke::reconciler::context::Context::new(
            client.clone(),
            kleym_spoke::reconciler::SpokeConfig::new("td"),
            Arc::new(kleym_spoke::reconciler::SpokeMetrics::default()),
        ));
        let guard = state.reach_spoke("fleet/a", client, context);
        assert!(matches!(
            view.spoke_reach("fleet", "a"),
            SpokeReach::Cached(HubCaches { ref cluster, .. }) if cluster == "fleet/a"
        ));
        assert!(matches!(
            view.spoke_reach("fleet", "b"),
            SpokeReach::NotHere(_)
        ));
        // The spoke task's attempt ended (or the task was aborted): the client goes with it.
        drop(guard);
        assert!(not_here(view.spoke_reach("fleet", "a")).contains("not engaged"));
    }

    #[test]
    fn clusters_and_report_come_from_the_fleet_state() {
        let view = FleetHubView::new(fleet(), InventorySynced::default(), LeaderInfo::default());
        let clusters = view.clusters();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[0]["cluster"], "fleet/a");
        assert_eq!(clusters[1]["phase"], "BackingOff");
        let b = view.cluster("fleet", "b").unwrap();
        assert_eq!(b["name"], "b");
        assert_eq!(b["consecutiveFailures"], 3);
        assert!(b["status"]["conditions"].is_array(), "{b}");
        assert!(view.cluster("fleet", "c").is_none());
        let report = view.report();
        assert_eq!(report["clusters"]["total"], 2, "{report}");
        assert_eq!(report["spokes"].as_array().unwrap().len(), 2);
    }

    fn body(b: Result<Bytes, EncodeError>) -> (Bytes, Value) {
        let b = b.unwrap();
        let v = serde_json::from_slice(&b).unwrap();
        (b, v)
    }

    /// Makes spoke `fleet/b` fail once more, with a TLS error.
    fn tls_failure(state: &FleetState) {
        state.update("fleet/b", |s| {
            s.consecutive_failures += 1;
            s.last_error = Some(crate::fleet::state::SpokeError {
                category: crate::fleet::state::ErrorCategory::Tls,
                message: "certificate expired".into(),
                at: chrono::Utc::now(),
            });
        });
    }

    #[test]
    fn report_body_is_kept_until_the_state_changes_and_rebuilt_on_the_next_request() {
        let state = fleet();
        let view = FleetHubView::new(
            state.clone(),
            InventorySynced::default(),
            LeaderInfo::default(),
        );
        let (first, before) = body(view.report_json());
        let (again, _) = body(view.report_json());
        // The very same buffer: nothing was rebuilt.
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert_eq!(before["clusters"], view.report()["clusters"]);
        tls_failure(&state);
        let (_, after) = body(view.report_json());
        let reason = |r: &Value| r["spokes"][1]["status"]["conditions"][0]["reason"].clone();
        assert_eq!(reason(&before), "Pending", "{before}");
        assert_eq!(reason(&after), "TLSFailure", "{after}");
    }

    #[test]
    fn clusters_body_is_kept_until_the_state_changes_and_rebuilt_on_the_next_request() {
        let state = fleet();
        let view = FleetHubView::new(
            state.clone(),
            InventorySynced::default(),
            LeaderInfo::default(),
        );
        let (first, before) = body(view.clusters_json());
        let (again, _) = body(view.clusters_json());
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert_eq!(before["count"], 2);
        assert_eq!(before["items"], Value::Array(view.clusters()));
        tls_failure(&state);
        let (_, after) = body(view.clusters_json());
        assert_eq!(before["items"][1]["consecutiveFailures"], 3);
        assert_eq!(after["items"][1]["consecutiveFailures"], 4);
    }

    #[test]
    fn collector_series_follow_the_next_change() {
        let state = fleet();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(FleetCollector::new(state.clone())));
        let scrape = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        let line = "kleym_hub_spoke_consecutive_failures{cluster=\"fleet/b\"}";
        assert!(scrape().contains(&format!("{line} 3")));
        assert_eq!(scrape(), scrape());
        state.update("fleet/b", |s| s.consecutive_failures = 4);
        assert!(scrape().contains(&format!("{line} 4")));
    }

    #[test]
    fn collector_exposes_per_spoke_series_and_findings_by_kind() {
        let state = fleet();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(FleetCollector::new(state.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("kleym_hub_spoke_phase{cluster=\"fleet/a\",phase=\"Engaged\"} 1"),
            "{out}"
        );
        assert!(out.contains(
            "kleym_hub_spoke_last_sync_timestamp_seconds{cluster=\"fleet/a\"} 1700000000"
        ));
        assert!(out.contains("kleym_hub_spoke_consecutive_failures{cluster=\"fleet/b\"} 3"));
        assert!(out.contains("kleym_hub_findings{kind=\"CrossClusterDrift\"} 0"));
        // A removed spoke's series go with it.
        state.remove("fleet/b");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(!out.contains("fleet/b"), "{out}");
    }
}
