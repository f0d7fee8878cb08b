//! Published observations: each spoke's [`PublishedSpoke`] as `ClusterIdentityObservation`
//! objects in the hub namespace, written by the replica that engages the spoke
//! ([`ObservationPublisher`], only when the content changed) and read by every replica
//! through one watch ([`ObservationCache`]), so that the replica writing the
//! `FleetIdentityReport` analyses every spoke, whichever replica engages it
//! ([`ReportInputs::Published`]).
//!
//! Why objects of kleym's own kind rather than ConfigMaps: the hub's RBAC can then grant
//! writes on exactly these objects in the hub namespace, and the aggregated `edit` and
//! `admin` roles, which grant ConfigMap writes to namespace editors, do not reach them; the
//! API server also checks their schema before a reader sees them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kleym_api::hub_status::ClusterIdentityObservation;
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use super::FIELD_MANAGER;
use super::writer::WriteFence;
use crate::report::published::{
    Limits, ObservationError, PublishedSpoke, decode_objects, encode, merge, object_name,
};

/// What the fleet report (the `FleetIdentityReport`, `/v1/report` and `/v1/clusters` of
/// the replica writing it) is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReportInputs {
    /// This replica's own fleet state: right when it engages every spoke (leader mode).
    #[default]
    Local,
    /// The observations every replica publishes for the spokes it engages (sharded mode),
    /// this replica's own state for a spoke with none published.
    Published,
}

/// How observations are published and read.
#[derive(Debug, Clone)]
pub struct ObservationOptions {
    /// Where the report's input comes from.
    pub inputs: ReportInputs,
    /// Publish this replica's spokes (default on: the leader publishes every spoke, so a
    /// replica switched to sharded mode finds them).
    pub publish: bool,
    /// The hub namespace, where the objects live.
    pub namespace: String,
    /// Size bounds of one spoke's objects.
    pub limits: Limits,
    /// `lastSync` alone causes a write only when it moved by at least this much.
    pub sync_refresh: Duration,
    /// After writing a spoke, trust the write this long while the watch catches up; after
    /// it, content the watch shows different (edited behind the hub's back) is rewritten.
    pub confirm_window: Duration,
    /// A spoke this replica already published is written again at most once per this
    /// interval (its `ClusterIdentityStatus` has the same bound): during a cold start a
    /// spoke's content changes every pass, and every write reaches every replica's watch.
    /// A spoke not yet published by this process is not bound by it (see `settle`).
    pub min_interval: Duration,
    /// A spoke not yet published by this process is first written once it has settled: no
    /// longer being engaged (Pending, Queued, Connecting, Syncing), and its content unchanged
    /// for this long (in practice: across one pass). Through a cold start a spoke's state
    /// moves for seconds; written at once, it was written mid-way, then held back by
    /// `min_interval` from its final state. Zero: at once, once engaged.
    pub settle: Duration,
    /// A spoke not yet published by this process is written at the latest this long after
    /// the process first saw it, settled or not.
    pub first_write_within: Duration,
    /// The watch cache to read (and to compare writes with); started by the status loop
    /// when `None`.
    pub cache: Option<ObservationCache>,
}

impl Default for ObservationOptions {
    fn default() -> Self {
        ObservationOptions {
            inputs: ReportInputs::Local,
            publish: true,
            namespace: crate::leader::default_namespace(),
            limits: Limits::default(),
            sync_refresh: Duration::from_secs(300),
            confirm_window: Duration::from_secs(30),
            min_interval: Duration::from_secs(10),
            settle: Duration::from_secs(1),
            first_write_within: Duration::from_secs(30),
            cache: None,
        }
    }
}

/// A decoded spoke, kept while its objects are unchanged.
#[derive(Debug, Clone)]
struct Decoded {
    /// `name@resourceVersion` of every part, sorted: the key of the decode.
    key: Vec<String>,
    result: Result<PublishedSpoke, ObservationError>,
}

/// The published observations of the hub namespace, as a watch cache, decoded once per
/// change of their objects.
#[derive(Clone)]
pub struct ObservationCache {
    store: Store<ClusterIdentityObservation>,
    synced: Arc<AtomicBool>,
    version: Arc<AtomicU64>,
    changes: tokio::sync::watch::Receiver<u64>,
    limits: Limits,
    decoded: Arc<Mutex<HashMap<String, Decoded>>>,
    /// The last spoke decoded whole per cluster, served while its parts are being rewritten.
    last_good: Arc<Mutex<HashMap<String, PublishedSpoke>>>,
}

impl std::fmt::Debug for ObservationCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationCache")
            .field("version", &self.version())
            .field("synced", &self.synced())
            .finish_non_exhaustive()
    }
}

impl ObservationCache {
    /// Watches the observations of `namespace` with `client` until `shutdown`.
    pub fn watch(
        client: kube::Client,
        namespace: &str,
        limits: Limits,
        shutdown: CancellationToken,
    ) -> Self {
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let version = Arc::new(AtomicU64::new(0));
        let api = Api::<ClusterIdentityObservation>::namespaced(client, namespace);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .boxed();
        let (flag, counter) = (synced.clone(), version.clone());
        let (notify, changes) = tokio::sync::watch::channel(0u64);
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ev = events.next() => ev,
                };
                match event {
                    None => return,
                    Some(Ok(ev)) => {
                        if matches!(ev, watcher::Event::InitDone) {
                            flag.store(true, Ordering::Release);
                        }
                        let v = counter.fetch_add(1, Ordering::AcqRel) + 1;
                        notify.send_replace(v);
                    }
                    // The backoff retries; the store keeps the last state meanwhile.
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching ClusterIdentityObservations failed")
                    }
                }
            }
        });
        ObservationCache {
            store,
            synced,
            version,
            changes,
            limits,
            decoded: Arc::default(),
            last_good: Arc::default(),
        }
    }

    /// Moves on every watch event.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Signals every watch event (the status loop rebuilds the report on it).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The first list completed.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The cache's objects, grouped by the cluster they name.
    fn by_cluster(&self) -> HashMap<String, Vec<Arc<ClusterIdentityObservation>>> {
        let mut groups: HashMap<String, Vec<Arc<ClusterIdentityObservation>>> = HashMap::new();
        for o in self.store.state() {
            groups.entry(o.spec.cluster.clone()).or_default().push(o);
        }
        groups
    }

    /// Every published spoke, by cluster, decoded (or refused) once per change of its
    /// objects. A spoke whose parts are mid-rewrite is served as last decoded whole.
    pub fn published(&self) -> BTreeMap<String, Result<PublishedSpoke, ObservationError>> {
        let groups = self.by_cluster();
        let mut decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        let mut last_good = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        decoded.retain(|c, _| groups.contains_key(c));
        last_good.retain(|c, _| groups.contains_key(c));
        let mut out = BTreeMap::new();
        for (cluster, objs) in groups {
            let result = decode_once(&mut decoded, &cluster, &objs, &self.limits).clone();
            let result = match result {
                Ok(s) => {
                    last_good.insert(cluster.clone(), s.clone());
                    Ok(s)
                }
                Err(e @ ObservationError::Incomplete { .. }) => {
                    last_good.get(&cluster).cloned().ok_or(e)
                }
                Err(e) => Err(e),
            };
            out.insert(cluster, result);
        }
        out
    }

    /// Whether `objects` (the cache's objects of `cluster`) decode whole, part 0 naming
    /// `digest`: decoded once per change of the objects, like [`Self::published`], since
    /// the publisher asks this of every spoke on every pass.
    fn verifies(
        &self,
        cluster: &str,
        objects: &[Arc<ClusterIdentityObservation>],
        digest: &str,
    ) -> bool {
        if !objects
            .iter()
            .any(|o| o.spec.part == 0 && o.spec.digest == digest)
        {
            return false;
        }
        let mut decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        decode_once(&mut decoded, cluster, objects, &self.limits).is_ok()
    }

    /// Drops the decodes of clusters without objects in `groups` (a replica that never
    /// builds the report would otherwise keep every spoke it ever published).
    fn forget_decodes_but(&self, groups: &HashMap<String, Vec<Arc<ClusterIdentityObservation>>>) {
        let mut decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        decoded.retain(|c, _| groups.contains_key(c));
    }

    /// The report's input in sharded mode: `local` (this replica's spokes) with each spoke
    /// replaced by its published observation where one exists (see [`merge`]).
    pub fn report_inputs(&self, local: Vec<PublishedSpoke>) -> Vec<PublishedSpoke> {
        merge(local, &self.published())
    }
}

/// `cluster`'s decode of `objects` from `memo`, decoding again only when the objects'
/// names and resourceVersions changed. A refusal is logged when it is first seen.
fn decode_once<'m>(
    memo: &'m mut HashMap<String, Decoded>,
    cluster: &str,
    objects: &[Arc<ClusterIdentityObservation>],
    limits: &Limits,
) -> &'m Result<PublishedSpoke, ObservationError> {
    let mut key: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}@{}",
                o.metadata.name.as_deref().unwrap_or_default(),
                o.metadata.resource_version.as_deref().unwrap_or_default()
            )
        })
        .collect();
    key.sort();
    use std::collections::hash_map::Entry;
    match memo.entry(cluster.to_string()) {
        Entry::Occupied(e) if e.get().key == key => &e.into_mut().result,
        entry => {
            let refs: Vec<&ClusterIdentityObservation> =
                objects.iter().map(AsRef::as_ref).collect();
            let result = decode_objects(&refs, limits);
            if let Err(e) = &result {
                tracing::warn!(cluster = %cluster, error = %e, "a published observation was refused");
            }
            let fresh = Decoded { key, result };
            match entry {
                Entry::Occupied(mut e) => {
                    e.insert(fresh);
                    &e.into_mut().result
                }
                Entry::Vacant(v) => &v.insert(fresh).result,
            }
        }
    }
}

/// Whether a spoke in `phase` (a [`crate::fleet::Phase`] name) is still being engaged:
/// its published state would move again within seconds.
pub(super) fn engaging(phase: &str) -> bool {
    use crate::fleet::Phase;
    [
        Phase::Pending,
        Phase::Queued,
        Phase::Connecting,
        Phase::Syncing,
    ]
    .iter()
    .any(|p| p.as_str() == phase)
}

/// Whether `a` and `b` differ at most in their `lastSync`.
fn same_but_last_sync(a: &PublishedSpoke, b: &PublishedSpoke) -> bool {
    let mut b = b.clone();
    b.observation.last_sync = a.observation.last_sync;
    *a == b
}

/// What one publish pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishStats {
    /// Objects written.
    pub written: usize,
    /// Objects deleted.
    pub deleted: usize,
    /// Spokes unchanged.
    pub unchanged: usize,
    /// Requests that failed (retried on the next pass).
    pub failed: usize,
    /// Spokes whose change waits for [`ObservationOptions::min_interval`].
    pub deferred: usize,
    /// Spokes encoded to learn their digest: those whose content moved since the pass
    /// before (the others reuse the digest computed then).
    pub encoded: usize,
    /// Whether the pass stopped because the write fence said no.
    pub fenced: bool,
}

/// What this publisher last wrote of a spoke.
#[derive(Debug, Clone)]
struct Written {
    digest: String,
    parts: u32,
    last_sync: Option<i64>,
    at: Instant,
}

/// A spoke's digest, kept with the content it was computed from.
#[derive(Debug, Clone)]
struct Encoding {
    spoke: PublishedSpoke,
    /// When this content was first encoded (what `settle` counts from).
    since: Instant,
    digest: String,
    parts: u32,
    last_sync: Option<i64>,
}

/// Writes the observations of the spokes this replica engages (see the module docs).
pub struct ObservationPublisher {
    api: Api<ClusterIdentityObservation>,
    cache: ObservationCache,
    options: ObservationOptions,
    fence: Option<WriteFence>,
    written: HashMap<String, Written>,
    /// The last encoding of each spoke: a pass encodes (serialises and hashes) only the
    /// spokes that moved since the one before. Most spokes of a large fleet are unchanged
    /// in most passes, and encoding each of them on each pass was most of a pass's cost.
    /// Comparing is cheap: an unchanged spoke shares its bindings with the fleet state.
    encodings: HashMap<String, Encoding>,
    /// When this process first saw each spoke it had not written yet (its first write is
    /// held back until it settles, at most `first_write_within` from then).
    first_seen: HashMap<String, Instant>,
    /// When the earliest write held back by `min_interval` is due.
    next_due: Option<Instant>,
}

impl ObservationPublisher {
    /// A publisher writing into `options.namespace`, comparing with `cache`.
    pub fn new(client: kube::Client, cache: ObservationCache, options: ObservationOptions) -> Self {
        ObservationPublisher {
            api: Api::namespaced(client, &options.namespace),
            cache,
            options,
            fence: None,
            written: HashMap::new(),
            encodings: HashMap::new(),
            first_seen: HashMap::new(),
            next_due: None,
        }
    }

    /// When a write held back by [`ObservationOptions::min_interval`] falls due (the status
    /// loop runs a pass then).
    pub fn next_due(&self) -> Option<Instant> {
        self.next_due
    }

    /// Writes only while `fence` says yes, asked before every request.
    pub fn with_fence(mut self, fence: WriteFence) -> Self {
        self.fence = Some(fence);
        self
    }

    fn may_write(&self) -> bool {
        self.fence.as_ref().is_none_or(|f| f())
    }

    /// Publishes `spokes` (those this replica engages; in leader mode every spoke), and
    /// deletes the objects of spokes that are gone: those of a cluster not among `spokes`
    /// for which `in_scope` holds (in leader mode every cluster; in sharded mode the ones
    /// this replica answers for).
    pub async fn publish(
        &mut self,
        spokes: &[PublishedSpoke],
        in_scope: &(dyn Fn(&str) -> bool + Send + Sync),
    ) -> PublishStats {
        let mut stats = PublishStats::default();
        if !self.cache.synced() {
            // Comparing with an empty cache would rewrite every spoke after a restart.
            return stats;
        }
        // One grouping per pass: looking each spoke up in the whole cache made a pass
        // quadratic in spokes.
        let on_server = self.cache.by_cluster();
        self.cache.forget_decodes_but(&on_server);
        let now = Instant::now();
        self.next_due = None;
        for spoke in spokes {
            let cluster = spoke.observation.cluster.clone();
            let mut specs = None;
            if self
                .encodings
                .get(&cluster)
                .is_none_or(|e| e.spoke != *spoke)
            {
                let fresh = encode(spoke, &self.options.limits);
                let Some(first) = fresh.first() else { continue };
                stats.encoded += 1;
                // `lastSync` alone moves whenever the spoke's reconciler goes idle again;
                // like a write of a published spoke, settling does not wait for it.
                let since = match self.encodings.get(&cluster) {
                    Some(e) if same_but_last_sync(&e.spoke, spoke) => e.since,
                    _ => now,
                };
                self.encodings.insert(
                    cluster.clone(),
                    Encoding {
                        spoke: spoke.clone(),
                        since,
                        digest: first.digest.clone(),
                        parts: first.parts,
                        last_sync: first.last_sync.as_ref().map(|t| t.0.as_second()),
                    },
                );
                specs = Some(fresh);
            }
            let Some(encoding) = self.encodings.get(&cluster) else {
                continue;
            };
            let since = encoding.since;
            let digest = encoding.digest.clone();
            let parts = encoding.parts;
            let last_sync = encoding.last_sync;
            let server: &[Arc<ClusterIdentityObservation>] =
                on_server.get(&cluster).map_or(&[], Vec::as_slice);
            let sync_stale = |w: &Written| match (w.last_sync, last_sync) {
                (Some(o), Some(n)) => (n - o).abs() >= self.options.sync_refresh.as_secs() as i64,
                (None, None) => false,
                _ => true,
            };
            let up_to_date = match self.written.get(&cluster) {
                Some(w) if w.digest == digest && w.parts == parts && !sync_stale(w) => {
                    // Ours, as the watch shows it, or written recently enough that the
                    // watch may not show it yet.
                    self.cache.verifies(&cluster, server, &digest)
                        || now.duration_since(w.at) < self.options.confirm_window
                }
                Some(_) => false,
                // Not written by this process: current if the server holds this content
                // and its lastSync is recent enough.
                None => self.cache.verifies(&cluster, server, &digest),
            };
            if up_to_date {
                if !self.written.contains_key(&cluster) {
                    self.written.insert(
                        cluster.clone(),
                        Written {
                            digest,
                            parts,
                            last_sync,
                            at: now,
                        },
                    );
                }
                stats.unchanged += 1;
                continue;
            }
            // A spoke this process has not written yet: first written once it settled (see
            // `ObservationOptions::settle`), since each write reaches every replica's watch
            // and a later change would wait for `min_interval`.
            if !self.written.contains_key(&cluster) {
                let latest = *self.first_seen.entry(cluster.clone()).or_insert(now)
                    + self.options.first_write_within;
                let due = if engaging(&spoke.phase) {
                    latest
                } else {
                    (since + self.options.settle).min(latest)
                };
                if now < due {
                    self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
                    stats.deferred += 1;
                    continue;
                }
            }
            // Content this process wrote moments ago changed: the change waits for the
            // interval. (Our own content gone from the server is repaired at once.)
            if let Some(w) = self.written.get(&cluster)
                && (w.digest != digest || w.parts != parts)
            {
                let due = w.at + self.options.min_interval;
                if now < due {
                    self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
                    stats.deferred += 1;
                    continue;
                }
            }
            // Written (rarely: new content, a retry, a repair): encoded again if this pass
            // reused the digest.
            let specs = specs.unwrap_or_else(|| encode(spoke, &self.options.limits));
            // Later parts first, part 0 (which names the digest readers assemble) last.
            for spec in specs.iter().rev() {
                if !self.may_write() {
                    stats.fenced = true;
                    return stats;
                }
                let name = object_name(&cluster, spec.part);
                let body = json!({
                    "apiVersion": "kleym.io/v1alpha1",
                    "kind": "ClusterIdentityObservation",
                    "metadata": {
                        "name": name,
                        "namespace": self.options.namespace,
                        "labels": {"app.kubernetes.io/managed-by": "kleym"},
                    },
                    "spec": spec,
                });
                match self
                    .api
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(body),
                    )
                    .await
                {
                    Ok(_) => stats.written += 1,
                    Err(e) => {
                        // The rest waits for the next pass: a hub API server refusing one
                        // write (RBAC, overload) would most likely refuse them all.
                        tracing::warn!(error = %e, cluster = %cluster, object = %name, "publishing the observation failed; retrying on the next pass");
                        stats.failed += 1;
                        self.written.remove(&cluster);
                        return stats;
                    }
                }
            }
            self.written.insert(
                cluster.clone(),
                Written {
                    digest,
                    parts,
                    last_sync,
                    at: now,
                },
            );
            // Parts the observation no longer has.
            let keep: HashSet<String> = (0..parts).map(|i| object_name(&cluster, i)).collect();
            let stale: Vec<String> = server
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .filter(|n| !keep.contains(n))
                .collect();
            for name in stale {
                if !self.delete(&name, &mut stats).await {
                    return stats;
                }
            }
        }
        // Spokes gone: their objects go too.
        let current: HashSet<&str> = spokes
            .iter()
            .map(|s| s.observation.cluster.as_str())
            .collect();
        self.written.retain(|c, _| current.contains(c.as_str()));
        self.encodings.retain(|c, _| current.contains(c.as_str()));
        self.first_seen.retain(|c, _| current.contains(c.as_str()));
        for (cluster, objects) in on_server {
            if current.contains(cluster.as_str()) || !in_scope(&cluster) {
                continue;
            }
            for name in objects.iter().filter_map(|o| o.metadata.name.clone()) {
                if !self.delete(&name, &mut stats).await {
                    return stats;
                }
            }
        }
        stats
    }

    /// Deletes `name`; false when the fence stopped the pass.
    async fn delete(&self, name: &str, stats: &mut PublishStats) -> bool {
        if !self.may_write() {
            stats.fenced = true;
            return false;
        }
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => stats.deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(error = %e, object = %name, "deleting an observation failed");
                stats.failed += 1;
            }
        }
        true
    }
}

/// The report's input as `inputs` chooses: `local` itself, or merged with `cache`.
pub fn report_spokes(
    inputs: ReportInputs,
    cache: Option<&ObservationCache>,
    local: Vec<PublishedSpoke>,
) -> Vec<PublishedSpoke> {
    match (inputs, cache) {
        (ReportInputs::Published, Some(c)) => c.report_inputs(local),
        _ => local,
    }
}
