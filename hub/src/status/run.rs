//! The status loop: on every change of the supervisor's `FleetState` (coalesced), rebuild the
//! report and submit every spoke's `ClusterIdentityStatus` and the `FleetIdentityReport` to a
//! [`StatusWriter`]. Only the leader writes: leadership is checked before each flush and
//! right before every write. In sharded mode every replica writes the
//! `ClusterIdentityStatus` of the spokes it handles (checked right before each write) and
//! the leader alone the `FleetIdentityReport`; no replica deletes a status object (those
//! of deleted profiles go with them, through their ownerReference).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kleym_api::external::clusterprofile::{ClusterProfileVersion, VersionedClusterProfile};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::Api;

use super::compare::report_changed;
use super::first_write::{self, FirstWriteOptions, Progress};
use super::metrics::StatusMetrics;
use super::observations::{
    ObservationCache, ObservationOptions, ObservationPublisher, ReportInputs, engaging,
    report_spokes,
};
use super::writer::{StatusOwnerRef, StatusWriter, WriterOptions};
use crate::fleet::state::FleetState;
use crate::inventory::InventoryVersion;
use crate::report::published::{PublishedSpoke, local_spokes};
use crate::report::{Caps, FullReport, SpokeObservation, bound_report, cluster_status};
use kleym_api::hub_status::FleetIdentityReportStatus;

/// Tuning of [`run_status_loop`].
#[derive(Debug, Clone)]
pub struct StatusLoopOptions {
    /// Write limits.
    pub writer: WriterOptions,
    /// List caps of the written objects.
    pub caps: Caps,
    /// At most one report rebuild per this interval (changes in between coalesce).
    pub min_rebuild: Duration,
    /// Rebuild and flush at least this often even without changes (retries failed writes,
    /// refreshes `lastSuccessfulSync`).
    pub tick: Duration,
    /// Re-read every object and profile UID this often ([`StatusWriter::resync`]), so
    /// objects deleted or edited behind the hub's back, or a profile recreated under the
    /// same name, are repaired.
    pub resync: Duration,
    /// The ClusterProfile version the inventory reads (profiles are listed, and named in
    /// ownerReferences, in it).
    pub profile_version: InventoryVersion,
    /// Where passes are counted.
    pub metrics: StatusMetrics,
    /// Publishing this replica's spokes, and the report's input.
    pub observations: ObservationOptions,
    /// When each status object is first written: the status of a spoke being engaged, and
    /// the report while any spoke is, wait until they settle (see [`super::first_write`]).
    pub first_write: FirstWriteOptions,
}

impl Default for StatusLoopOptions {
    fn default() -> Self {
        StatusLoopOptions {
            writer: WriterOptions::default(),
            caps: Caps::default(),
            min_rebuild: Duration::from_secs(2),
            tick: Duration::from_secs(30),
            resync: Duration::from_secs(600),
            profile_version: InventoryVersion::default(),
            metrics: StatusMetrics::default(),
            observations: ObservationOptions::default(),
            first_write: FirstWriteOptions::default(),
        }
    }
}

/// Run until `shutdown`: keep the hub's status objects in step with `state`.
pub async fn run_status_loop(
    client: kube::Client,
    state: FleetState,
    options: StatusLoopOptions,
    shutdown: CancellationToken,
) {
    // Leadership is checked before each flush and again right before every write: a
    // flush can outlast it (many objects, a slow hub API server).
    let leader = state.clone();
    let sharded = state.is_sharded();
    let mut writer = StatusWriter::new(client.clone(), options.writer)
        .with_profile_version(options.profile_version.clone());
    writer = if sharded {
        let owner = state.clone();
        writer
            .with_cluster_fence(std::sync::Arc::new(move |ns: &str, name: &str| {
                owner.may_report(&format!("{ns}/{name}"))
            }))
            .with_report_fence(std::sync::Arc::new(move || leader.is_leader()))
    } else {
        writer.with_fence(std::sync::Arc::new(move || leader.is_leader()))
    };
    let mut uids = ProfileUids::default();
    let mut submitted = Submitted::default();
    let mut first = HeldBack::default();
    let observed = &options.observations;
    let cache = (observed.publish || observed.inputs == ReportInputs::Published).then(|| {
        observed.cache.clone().unwrap_or_else(|| {
            ObservationCache::watch(
                client.clone(),
                &observed.namespace,
                observed.limits,
                shutdown.clone(),
            )
        })
    });
    let publish_fence = state.clone();
    // Leader mode: the leader publishes every spoke. Sharded mode: each replica publishes
    // the spokes it runs, whether it leads or not (the scope of each pass says which).
    let mut publisher = cache.as_ref().filter(|_| observed.publish).map(|c| {
        let p = ObservationPublisher::new(client.clone(), c.clone(), observed.clone());
        if sharded {
            p
        } else {
            p.with_fence(std::sync::Arc::new(move || publish_fence.is_leader()))
        }
    });
    // In sharded mode the report also follows the other replicas' observations.
    let mut published_changes = cache
        .as_ref()
        .filter(|_| observed.inputs == ReportInputs::Published)
        .map(ObservationCache::subscribe);
    let mut changes = state.subscribe();
    let mut last_resync = Instant::now();
    loop {
        let started = Instant::now();
        if started.duration_since(last_resync) >= options.resync {
            writer.resync();
            uids.clear();
            submitted.clear();
            last_resync = started;
        }
        let leading = state.is_leader();
        if leading || sharded {
            let observations = Observations {
                cache: cache.as_ref(),
                publisher: publisher.as_mut(),
            };
            sync_once(
                &client,
                &state,
                &options,
                Written {
                    writer: &mut writer,
                    uids: &mut uids,
                    submitted: &mut submitted,
                    first: &mut first,
                },
                observations,
            )
            .await;
        }
        options.metrics.pass(leading);
        // Wait for a change (but not less than min_rebuild), a due deferred write (status or
        // observation), or the tick.
        let earliest = started + options.min_rebuild;
        let due = [
            writer.next_due(),
            publisher.as_ref().and_then(|p| p.next_due()),
            first.statuses.next_due(),
            first.report.next_due(),
        ]
        .into_iter()
        .flatten()
        .min();
        let deadline = due
            .map_or(started + options.tick, |t| t.min(started + options.tick))
            .max(earliest);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(deadline.into()) => {}
            r = changes.changed() => {
                if r.is_err() {
                    return;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(earliest.into()) => {}
                }
            }
            // Another shard's observations changed: only the report's writer needs a pass.
            Some(()) = published_changed(published_changes.as_mut().filter(|_| state.is_leader())) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(earliest.into()) => {}
                }
            }
        }
    }
}

/// The next change of the published observations; never, without them.
async fn published_changed(rx: Option<&mut tokio::sync::watch::Receiver<u64>>) -> Option<()> {
    match rx {
        Some(rx) => rx.changed().await.ok(),
        None => std::future::pending().await,
    }
}

/// The published observations, as one status pass uses them.
struct Observations<'a> {
    /// The watch cache (the report's input in sharded mode).
    cache: Option<&'a ObservationCache>,
    /// This replica's publisher.
    publisher: Option<&'a mut ObservationPublisher>,
}

/// At most one ClusterProfile list per this interval while some profile's UID is unknown.
const RELIST_MIN: Duration = Duration::from_secs(10);

/// ClusterProfile UIDs by spoke name (`<namespace>/<name>`): the inventory's, which the
/// fleet state keeps as the watch sees them; for a spoke the inventory has not shown (a
/// state filled by something else than the supervisor), from a list of the profiles (the
/// hub's RBAC allows `list`/`watch` on them, not `get`). The inventory first, so that no
/// replica lists every profile of the fleet a second time: in sharded mode each one would,
/// whatever its share.
#[derive(Debug, Default)]
struct ProfileUids {
    uids: HashMap<String, String>,
    last_list: Option<Instant>,
}

impl ProfileUids {
    /// Forget every listed UID (the next lookup the inventory cannot answer lists again).
    fn clear(&mut self) {
        self.uids.clear();
        self.last_list = None;
    }

    /// The UID of `name`'s profile: the inventory's, else the last list's.
    fn uid(&self, state: &FleetState, name: &str) -> Option<String> {
        state
            .profile_uid(name)
            .or_else(|| self.uids.get(name).cloned())
    }

    /// Make sure `names` are known if they exist, listing the profiles (at most once per
    /// [`RELIST_MIN`]) only when the inventory does not know one.
    async fn refresh_for(
        &mut self,
        client: &kube::Client,
        version: ClusterProfileVersion,
        state: &FleetState,
        names: &[&str],
    ) {
        let missing = names
            .iter()
            .any(|n| state.profile_uid(n).is_none() && !self.uids.contains_key(*n));
        let now = Instant::now();
        if !missing
            || self
                .last_list
                .is_some_and(|t| now.duration_since(t) < RELIST_MIN)
        {
            return;
        }
        self.last_list = Some(now);
        match Api::<VersionedClusterProfile>::all_with(client.clone(), &version.api_resource())
            .list(&Default::default())
            .await
        {
            Ok(list) => {
                self.uids = list
                    .items
                    .into_iter()
                    .filter_map(|p| {
                        let ns = p.metadata.namespace?;
                        let name = p.metadata.name?;
                        Some((format!("{ns}/{name}"), p.metadata.uid?))
                    })
                    .collect();
            }
            Err(e) => tracing::warn!(error = %e, "listing ClusterProfiles for their UIDs failed"),
        }
    }
}

/// The observation each spoke's status was last built from and submitted: a pass builds
/// and submits a status only when its spoke moved since. At thousands of spokes most are
/// unchanged in most passes, and building and comparing every status on every pass was a
/// large part of a pass's cost. Comparing is cheap: an unchanged spoke shares its bindings
/// with the fleet state.
#[derive(Debug, Default)]
struct Submitted(HashMap<String, SpokeObservation>);

impl Submitted {
    /// Whether `spoke`'s status need not be built again: the same observation was
    /// submitted, and the writer still tracks it (it keeps the submission until written or
    /// found unchanged; a status it dropped or forgot is submitted again).
    fn is_current(&self, spoke: &SpokeObservation, tracked: bool) -> bool {
        tracked && self.0.get(&spoke.cluster) == Some(spoke)
    }

    /// `spoke`'s status was submitted.
    fn record(&mut self, spoke: &SpokeObservation) {
        self.0.insert(spoke.cluster.clone(), spoke.clone());
    }

    /// Keep only the spokes named in `current`.
    fn retain(&mut self, current: &HashSet<&str>) {
        self.0.retain(|c, _| current.contains(c.as_str()));
    }

    /// Build every status again on the next pass (after a resync: the writer compares
    /// with the server again only what is submitted).
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Where `spoke` stands, for its status's first write.
fn progress(spoke: &PublishedSpoke) -> Progress {
    if spoke.failures > 0 {
        Progress::Failed
    } else if engaging(&spoke.phase) {
        Progress::Engaging
    } else {
        Progress::Settling
    }
}

/// What the status loop keeps from pass to pass.
struct Written<'a> {
    writer: &'a mut StatusWriter,
    uids: &'a mut ProfileUids,
    submitted: &'a mut Submitted,
    first: &'a mut HeldBack,
}

/// The first writes held back (see [`super::first_write`]): each spoke's status, keyed by
/// spoke, with its observation (`lastSync` aside: a reconciler going idle again is no
/// change); the report, with its content.
#[derive(Default)]
struct HeldBack {
    statuses: first_write::FirstWrites<SpokeObservation>,
    report: first_write::FirstWrites<FleetIdentityReportStatus>,
}

/// One rebuild and flush.
async fn sync_once(
    client: &kube::Client,
    state: &FleetState,
    options: &StatusLoopOptions,
    written: Written<'_>,
    observations: Observations<'_>,
) {
    let Written {
        writer,
        uids,
        submitted,
        first,
    } = written;
    let now = chrono::Utc::now();
    let sharded = state.is_sharded();
    let leading = state.is_leader();
    // Sharded mode: the leader alone writes the report, from every shard's published
    // observations; the others neither decode nor merge them.
    let writes_report = !sharded || leading;
    // Every listed spoke: in sharded mode those other replicas run are `Standby` here, and
    // the report takes their published observations instead. A sharded replica that does
    // not write the report needs only its own (most of the fleet is not).
    let listed = if writes_report {
        local_spokes(state)
    } else {
        Vec::new()
    };
    let local: Vec<PublishedSpoke> = if !sharded {
        listed.clone()
    } else if writes_report {
        // Only the spokes this replica handles are its to publish and report.
        listed
            .iter()
            .filter(|s| state.may_report(&s.observation.cluster))
            .cloned()
            .collect()
    } else {
        state
            .reported_spokes()
            .iter()
            .map(PublishedSpoke::from)
            .collect()
    };
    if let Some(publisher) = observations.publisher {
        let stats = if sharded {
            // Each replica answers for the spokes it runs; the leader also for spokes no
            // longer listed at all (their owner may have gone with them).
            let names: HashSet<String> = listed
                .iter()
                .map(|s| s.observation.cluster.clone())
                .collect();
            publisher
                .publish(&local, &|c| {
                    state.may_report(c) || (leading && !names.contains(c))
                })
                .await
        } else {
            // Leader mode: this replica engages every spoke, and answers for every object.
            publisher.publish(&local, &|_| true).await
        };
        if stats.written > 0 || stats.deleted > 0 || stats.failed > 0 {
            tracing::debug!(?stats, "observations published");
        }
    }
    let (report_input, report_engaging) = if writes_report {
        let inputs = report_spokes(options.observations.inputs, observations.cache, listed);
        // The report waits while any spoke is on its way; failing spokes do not hold it
        // (the report shows them the same way on every retry).
        let engaging = inputs.iter().any(|s| progress(s) == Progress::Engaging);
        (
            inputs.into_iter().map(|s| s.observation).collect(),
            engaging,
        )
    } else {
        (Vec::new(), false)
    };
    let (progress_now, spokes): (Vec<Progress>, Vec<SpokeObservation>) = local
        .into_iter()
        .map(|s| (progress(&s), s.observation))
        .unzip();
    let names: Vec<&str> = spokes.iter().map(|s| s.cluster.as_str()).collect();
    uids.refresh_for(client, options.profile_version.for_writes(), state, &names)
        .await;
    // A set: one lookup per tracked profile (a list made each pass quadratic in spokes).
    let current: HashSet<&str> = names.iter().copied().collect();
    for tracked in writer.tracked_clusters() {
        let name = format!("{}/{}", tracked.namespace, tracked.name);
        if !current.contains(name.as_str())
            || uids.uid(state, &name).as_deref() != Some(tracked.uid.as_str())
        {
            writer.forget_cluster(&tracked.namespace, &tracked.name);
        }
    }
    submitted.retain(&current);
    first.statuses.begin_pass(|c| current.contains(c));
    first.report.begin_pass(|_| writes_report);
    let started = Instant::now();
    for (spoke, progress) in spokes.iter().zip(progress_now) {
        let Some((namespace, name)) = spoke.cluster.split_once('/') else {
            continue;
        };
        // No UID: the profile is gone (its status goes with it) or not listed yet.
        let Some(uid) = uids.uid(state, &spoke.cluster) else {
            continue;
        };
        let owner = StatusOwnerRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
        };
        let held = first.statuses.holds(
            &spoke.cluster,
            || SpokeObservation {
                last_sync: None,
                ..spoke.clone()
            },
            |a, b| a == b,
            progress,
            started,
            options.first_write,
        );
        if held || submitted.is_current(spoke, writer.tracks(&owner)) {
            continue;
        }
        writer.submit_cluster(owner, cluster_status(spoke, now, Some(&options.caps)));
        submitted.record(spoke);
    }
    if writes_report {
        let full = FullReport::build(&report_input, now);
        let report = bound_report(&full.summary, &options.caps);
        let held = first.report.holds(
            "report",
            || report.clone(),
            |a, b| !report_changed(a, b),
            if report_engaging {
                Progress::Engaging
            } else {
                Progress::Settling
            },
            started,
            options.first_write,
        );
        if !held {
            writer.submit_report(report);
        }
    }
    let stats = writer.flush(Instant::now()).await;
    if stats.gone > 0 {
        // A status object vanished: its profile may have been recreated under the same
        // name (the garbage collector then removed the status with the old profile). The
        // inventory shows the new UID as it comes; listed UIDs are listed again on the
        // next pass instead of at the next resync.
        uids.clear();
    }
    if stats.written > 0 || stats.failed > 0 {
        tracing::debug!(?stats, "status flush");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::BindingSnapshot;
    use crate::report::shared;

    fn spoke(name: &str, version: &str) -> SpokeObservation {
        SpokeObservation {
            cluster: name.to_string(),
            spoke_version: Some(version.to_string()),
            bindings: shared([BindingSnapshot {
                namespace: "llm".into(),
                name: "b".into(),
                ready: true,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_status_is_built_again_only_when_its_spoke_moved_or_the_writer_let_go() {
        let mut submitted = Submitted::default();
        let east = spoke("fleet/east", "v1.33.1");
        assert!(!submitted.is_current(&east, true), "never submitted");
        submitted.record(&east);
        assert!(submitted.is_current(&east, true));
        // Equal content in other allocations (a copy, not the same bindings) is unchanged.
        assert!(submitted.is_current(&spoke("fleet/east", "v1.33.1"), true));
        assert!(!submitted.is_current(&spoke("fleet/east", "v1.34.0"), true));
        let mut unready = east.clone();
        unready.bindings = shared([BindingSnapshot {
            namespace: "llm".into(),
            name: "b".into(),
            ready: false,
            ..Default::default()
        }]);
        assert!(!submitted.is_current(&unready, true), "a binding moved");
        assert!(
            !submitted.is_current(&east, false),
            "the writer dropped or forgot it"
        );

        submitted.record(&spoke("fleet/west", "v1.33.1"));
        submitted.retain(&HashSet::from(["fleet/west"]));
        assert!(!submitted.is_current(&east, true), "no longer listed");
        assert!(submitted.is_current(&spoke("fleet/west", "v1.33.1"), true));
        submitted.clear();
        assert!(!submitted.is_current(&spoke("fleet/west", "v1.33.1"), true));
    }
}
