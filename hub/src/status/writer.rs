//! [`StatusWriter`]: change-only, rate-limited, server-side-apply writes of the hub's status
//! objects.
//!
//! Callers [`submit`](StatusWriter::submit_cluster) the content they want and call
//! [`flush`](StatusWriter::flush) (the status loop does so on every fleet change and on a
//! tick). A flush writes an object only when its content differs from what was last written
//! (or, after a restart, from what the server holds: the first flush reads each object once),
//! and at most once per object per [`WriterOptions::min_interval`]; submissions in between
//! replace each other, so a burst of changes costs one write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kleym_api::hub_status::{
    ClusterIdentityStatus, ClusterIdentityStatusStatus, FLEET_REPORT_NAME, FleetIdentityReport,
    FleetIdentityReportStatus,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::FIELD_MANAGER;
use super::compare::{carry_transition_times, cluster_status_changed, report_changed};
use crate::inventory::InventoryVersion;

/// Errors writing status objects.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A request to the hub's API server failed.
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        /// `get`, `apply` or `apply status`.
        verb: &'static str,
        /// Object kind.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The write fence said no (this replica is not the leader); nothing was sent.
    #[error("not written ({kind} {name}): this replica is not the leader")]
    Fenced {
        /// Object kind.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
    },
}

impl StatusError {
    /// Whether the API server answered 404 Not Found (the object is gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, StatusError::Api { source, .. } if is_not_found(source))
    }
}

/// Whether this process may write now; asked right before every write (the leader check).
pub type WriteFence = Arc<dyn Fn() -> bool + Send + Sync>;

/// Whether this process may write the `ClusterIdentityStatus` of the profile
/// `(namespace, name)` now; asked right before every write of it (sharded mode: only the
/// spoke's owner writes it).
pub type ClusterFence = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// Tuning of a [`StatusWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// At most one write per object per this interval.
    pub min_interval: Duration,
    /// `lastSuccessfulSync` alone triggers a write only when it moved by at least this much.
    pub sync_refresh: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            min_interval: Duration::from_secs(10),
            sync_refresh: Duration::from_secs(300),
        }
    }
}

/// The ClusterProfile a `ClusterIdentityStatus` belongs to (and is owned by).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatusOwnerRef {
    /// Namespace (also the status object's).
    pub namespace: String,
    /// Name (also the status object's).
    pub name: String,
    /// UID, recorded in the ownerReference so the status goes with the profile.
    pub uid: String,
}

/// What one flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Objects written (main object and/or status).
    pub written: usize,
    /// Submissions dropped because nothing changed.
    pub unchanged: usize,
    /// Submissions kept for later because their object was written too recently.
    pub deferred: usize,
    /// Writes that failed (kept for the next flush).
    pub failed: usize,
    /// Of the failed writes, those that found their object gone (404): recreated by the
    /// next flush, with the owner UID then submitted (a profile recreated under the same
    /// name has a new one: the caller should look its profiles' UIDs up again).
    pub gone: usize,
    /// Whether the flush stopped because the write fence said no (the rest stays pending).
    pub fenced: bool,
}

/// Per-object bookkeeping.
#[derive(Debug)]
struct Slot<T> {
    /// Content last written or read from the server; `None` until known.
    written: Option<T>,
    /// Whether the server was consulted (or written) since start.
    known: bool,
    /// The owner UID the main object carries (cluster statuses).
    owner_uid: Option<String>,
    /// When this object was last written.
    last_write: Option<Instant>,
    /// Content waiting to be written.
    pending: Option<T>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            written: None,
            known: false,
            owner_uid: None,
            last_write: None,
            pending: None,
        }
    }
}

impl<T> Slot<T> {
    /// The object is gone behind the writer's back (a status write answered 404: deleted,
    /// or garbage-collected with a profile recreated under the same name): forget what
    /// the server held, so the next flush reads and recreates it at once instead of
    /// failing on every pass until the next resync.
    fn forget(&mut self) {
        self.known = false;
        self.owner_uid = None;
        self.written = None;
        self.last_write = None;
    }

    /// When the pending content may be written (`now` if never written).
    fn due_at(&self, min_interval: Duration, now: Instant) -> Option<Instant> {
        self.pending.as_ref()?;
        Some(self.last_write.map_or(now, |t| t + min_interval))
    }
}

/// Writes `ClusterIdentityStatus` and `FleetIdentityReport` objects (see the module docs).
pub struct StatusWriter {
    client: kube::Client,
    options: WriterOptions,
    fence: Option<WriteFence>,
    cluster_fence: Option<ClusterFence>,
    report_fence: Option<WriteFence>,
    profile_version: InventoryVersion,
    clusters: HashMap<StatusOwnerRef, Slot<ClusterIdentityStatusStatus>>,
    report: Slot<FleetIdentityReportStatus>,
}

impl StatusWriter {
    /// A writer using `client` (the hub cluster).
    pub fn new(client: kube::Client, options: WriterOptions) -> Self {
        StatusWriter {
            client,
            options,
            fence: None,
            cluster_fence: None,
            report_fence: None,
            profile_version: InventoryVersion::default(),
            clusters: HashMap::new(),
            report: Slot::default(),
        }
    }

    /// Writes only while `fence` returns true, asked right before every write request (not
    /// once per flush: leadership can be lost in the middle of one, and a deposed leader
    /// must not overwrite what its successor wrote).
    pub fn with_fence(mut self, fence: WriteFence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Sharded mode: writes a `ClusterIdentityStatus` only while `fence` says this replica
    /// owns its spoke, asked right before every write of it; one it does not own is
    /// dropped from the writer (never deleted: it is its owner's), and the flush goes on.
    pub fn with_cluster_fence(mut self, fence: ClusterFence) -> Self {
        self.cluster_fence = Some(fence);
        self
    }

    /// Writes the `FleetIdentityReport` only while `fence` (as well as the fence of
    /// [`Self::with_fence`]) returns true: sharded mode's leader check for the report alone.
    pub fn with_report_fence(mut self, fence: WriteFence) -> Self {
        self.report_fence = Some(fence);
        self
    }

    /// Names the owning ClusterProfile in the `apiVersion` the inventory reads (default:
    /// v1alpha1), so the ownerReference stays resolvable by the garbage collector whichever
    /// version the hub cluster serves.
    pub fn with_profile_version(mut self, version: InventoryVersion) -> Self {
        self.profile_version = version;
        self
    }

    /// Want `status` on the `ClusterIdentityStatus` of `profile`.
    pub fn submit_cluster(&mut self, profile: StatusOwnerRef, status: ClusterIdentityStatusStatus) {
        // A profile recreated under the same name has a new UID: start over. Looked for
        // only when this very profile is new: a scan per submission made every pass of the
        // status loop quadratic in the number of spokes.
        if !self.clusters.contains_key(&profile) {
            self.clusters
                .retain(|k, _| !(k.namespace == profile.namespace && k.name == profile.name));
        }
        self.clusters.entry(profile).or_default().pending = Some(status);
    }

    /// Want `status` on the fleet's `FleetIdentityReport`.
    pub fn submit_report(&mut self, status: FleetIdentityReportStatus) {
        self.report.pending = Some(status);
    }

    /// Stop tracking a profile that is gone (its status object is garbage-collected with it).
    pub fn forget_cluster(&mut self, namespace: &str, name: &str) {
        self.clusters
            .retain(|k, _| !(k.namespace == namespace && k.name == name));
    }

    /// Forget what the server holds: the next flush of each object reads it again and
    /// rewrites it if it differs (an object deleted or edited behind the hub's back, or
    /// garbage-collected after its profile was recreated). Costs one read per object.
    pub fn resync(&mut self) {
        for slot in self.clusters.values_mut() {
            slot.known = false;
            slot.written = None;
            slot.owner_uid = None;
        }
        self.report.known = false;
        self.report.written = None;
    }

    /// Whether `profile`'s status is tracked: submitted since it was last forgotten, and
    /// not dropped as another replica's. A tracked status keeps what was submitted until it
    /// is written or found unchanged, and is rewritten after a [`Self::resync`] only if
    /// submitted again.
    pub fn tracks(&self, profile: &StatusOwnerRef) -> bool {
        self.clusters.contains_key(profile)
    }

    /// Profiles currently tracked.
    pub fn tracked_clusters(&self) -> Vec<StatusOwnerRef> {
        self.clusters.keys().cloned().collect()
    }

    /// When the earliest deferred submission becomes writable (`None`: nothing pending).
    pub fn next_due(&self) -> Option<Instant> {
        let (interval, now) = (self.options.min_interval, Instant::now());
        self.clusters
            .values()
            .filter_map(|s| s.due_at(interval, now))
            .chain(self.report.due_at(interval, now))
            .min()
    }

    /// Write what is due and changed. Errors are counted and logged, the content stays
    /// pending; one failing object does not stop the others.
    pub async fn flush(&mut self, now: Instant) -> WriteStats {
        let mut stats = WriteStats::default();
        let interval = self.options.min_interval;
        let refresh = self.options.sync_refresh.as_secs() as i64;
        let keys: Vec<StatusOwnerRef> = self
            .clusters
            .iter()
            .filter(|(_, s)| s.due_at(interval, now).is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        stats.deferred += self
            .clusters
            .values()
            .filter(|s| s.due_at(interval, now).is_some_and(|t| t > now))
            .count();
        for key in keys {
            match self.flush_cluster(&key, now, refresh).await {
                Ok(true) => stats.written += 1,
                Ok(false) => stats.unchanged += 1,
                Err(e @ StatusError::Fenced { .. }) => {
                    tracing::debug!(error = %e, "status flush stopped");
                    stats.fenced = true;
                    return stats;
                }
                Err(e) => {
                    stats.failed += 1;
                    if e.is_not_found() {
                        stats.gone += 1;
                    }
                    tracing::warn!(error = %e, "writing ClusterIdentityStatus failed; will retry");
                }
            }
        }
        match self.report.due_at(interval, now) {
            Some(t) if t <= now => match self.flush_report(now).await {
                Ok(true) => stats.written += 1,
                Ok(false) => stats.unchanged += 1,
                Err(e @ StatusError::Fenced { .. }) => {
                    tracing::debug!(error = %e, "status flush stopped");
                    stats.fenced = true;
                }
                Err(e) => {
                    stats.failed += 1;
                    tracing::warn!(error = %e, "writing FleetIdentityReport failed; will retry");
                }
            },
            Some(_) => stats.deferred += 1,
            None => {}
        }
        stats
    }

    async fn flush_cluster(
        &mut self,
        key: &StatusOwnerRef,
        now: Instant,
        refresh: i64,
    ) -> Result<bool, StatusError> {
        let api: Api<ClusterIdentityStatus> = Api::namespaced(self.client.clone(), &key.namespace);
        let profile_api_version = self.profile_version.for_writes().api_version();
        let full_name = format!("{}/{}", key.namespace, key.name);
        let err = |verb, source| StatusError::Api {
            verb,
            kind: "ClusterIdentityStatus",
            name: full_name.clone(),
            source,
        };
        let cluster_fence = self.cluster_fence.clone();
        let mine = || {
            cluster_fence
                .as_ref()
                .is_none_or(|f| f(&key.namespace, &key.name))
        };
        if !mine() {
            self.clusters.remove(key);
            return Ok(false);
        }
        let Some(slot) = self.clusters.get_mut(key) else {
            return Ok(false);
        };
        if !slot.known {
            let current = api.get_opt(&key.name).await.map_err(|e| err("get", e))?;
            if let Some(obj) = current {
                slot.owner_uid = obj
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "ClusterProfile" && o.name == key.name)
                    .map(|o| o.uid.clone());
                slot.written = obj.status;
            }
            slot.known = true;
        }
        let Some(mut want) = slot.pending.take() else {
            return Ok(false);
        };
        // Status read back (audit): the ClusterIdentityStatus written earlier only carries
        // transition times over and decides whether a write is needed; the object written
        // is always the one named after the profile being reported, never one read from a
        // status, and it lives in the hub cluster, where spoke tenants have no access.
        carry_transition_times(slot.written.as_ref(), &mut want);
        let owner_ok = slot.owner_uid.as_deref() == Some(key.uid.as_str());
        let changed = slot
            .written
            .as_ref()
            .is_none_or(|old| cluster_status_changed(old, &want, refresh));
        if owner_ok && !changed {
            return Ok(false);
        }
        let fence = self.fence.clone();
        let may_write = || fence.as_ref().is_none_or(|f| f());
        let fenced = || StatusError::Fenced {
            kind: "ClusterIdentityStatus",
            name: full_name.clone(),
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if !mine() {
            self.clusters.remove(key);
            return Ok(false);
        }
        if !owner_ok {
            if !may_write() {
                slot.pending = Some(want);
                return Err(fenced());
            }
            let obj = json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "ClusterIdentityStatus",
                "metadata": {
                    "name": key.name,
                    "namespace": key.namespace,
                    "labels": {kleym_api::labels::MANAGED_BY: kleym_api::labels::MANAGED_BY_VALUE},
                    "ownerReferences": [{
                        "apiVersion": profile_api_version,
                        "kind": "ClusterProfile",
                        "name": key.name,
                        "uid": key.uid,
                        "controller": true,
                    }],
                },
                "spec": {"clusterProfile": key.name},
            });
            if let Err(e) = api.patch(&key.name, &params, &Patch::Apply(obj)).await {
                slot.pending = Some(want);
                return Err(err("apply", e));
            }
            slot.owner_uid = Some(key.uid.clone());
        }
        let body = json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "ClusterIdentityStatus",
            "status": want,
        });
        if !mine() {
            self.clusters.remove(key);
            return Ok(false);
        }
        if !may_write() {
            slot.pending = Some(want);
            return Err(fenced());
        }
        if let Err(e) = api
            .patch_status(&key.name, &params, &Patch::Apply(body))
            .await
        {
            if is_not_found(&e) {
                slot.forget();
            }
            slot.pending = Some(want);
            return Err(err("apply status", e));
        }
        slot.written = Some(want);
        slot.last_write = Some(now);
        Ok(true)
    }

    async fn flush_report(&mut self, now: Instant) -> Result<bool, StatusError> {
        let api: Api<FleetIdentityReport> = Api::all(self.client.clone());
        let err = |verb, source| StatusError::Api {
            verb,
            kind: "FleetIdentityReport",
            name: FLEET_REPORT_NAME.to_string(),
            source,
        };
        let (fence, report_fence) = (self.fence.clone(), self.report_fence.clone());
        let may_write =
            || fence.as_ref().is_none_or(|f| f()) && report_fence.as_ref().is_none_or(|f| f());
        let fenced = || StatusError::Fenced {
            kind: "FleetIdentityReport",
            name: FLEET_REPORT_NAME.to_string(),
        };
        let slot = &mut self.report;
        let mut exists = slot.known;
        if !slot.known {
            let current = api
                .get_opt(FLEET_REPORT_NAME)
                .await
                .map_err(|e| err("get", e))?;
            exists = current.is_some();
            // Status read back (audit): only compared with the report we want and the
            // source of `generatedAt`; the one object written is FLEET_REPORT_NAME.
            slot.written = current.and_then(|o| o.status);
            slot.known = exists;
        }
        let Some(mut want) = slot.pending.take() else {
            return Ok(false);
        };
        if let Some(old) = &slot.written
            && !report_changed(old, &want)
        {
            return Ok(false);
        }
        // `generatedAt` is the time of this content change; keep it when only it differs.
        if want.generated_at.is_none() {
            want.generated_at = slot.written.as_ref().and_then(|o| o.generated_at.clone());
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if !exists {
            if !may_write() {
                slot.pending = Some(want);
                return Err(fenced());
            }
            let obj = json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "FleetIdentityReport",
                "metadata": {
                    "name": FLEET_REPORT_NAME,
                    "labels": {kleym_api::labels::MANAGED_BY: kleym_api::labels::MANAGED_BY_VALUE},
                },
                "spec": {},
            });
            if let Err(e) = api
                .patch(FLEET_REPORT_NAME, &params, &Patch::Apply(obj))
                .await
            {
                slot.pending = Some(want);
                return Err(err("apply", e));
            }
            slot.known = true;
        }
        let body = json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "FleetIdentityReport",
            "status": want,
        });
        if !may_write() {
            slot.pending = Some(want);
            return Err(fenced());
        }
        if let Err(e) = api
            .patch_status(FLEET_REPORT_NAME, &params, &Patch::Apply(body))
            .await
        {
            if is_not_found(&e) {
                slot.forget();
            }
            slot.pending = Some(want);
            return Err(err("apply status", e));
        }
        slot.written = Some(want);
        slot.last_write = Some(now);
        Ok(true)
    }
}

/// Whether the API server answered 404 Not Found.
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
