//! The status loop: on every change of the supervisor's `FleetState` (coalesced), rebuild the
//! report and submit every spoke's `ClusterIdentityStatus` and the `FleetIdentityReport` to a
//! [`StatusWriter`]. Only the leader writes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_spoke::reconciler::CancellationToken;
use kube::api::Api;

use super::writer::{ProfileRef, StatusWriter, WriterOptions};
use crate::fleet::state::FleetState;
use crate::report::from_fleet::observations;
use crate::report::{Caps, FullReport, bound_report, cluster_status};

/// Tuning of [`run_status_loop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Default for StatusLoopOptions {
    fn default() -> Self {
        StatusLoopOptions {
            writer: WriterOptions::default(),
            caps: Caps::default(),
            min_rebuild: Duration::from_secs(2),
            tick: Duration::from_secs(30),
            resync: Duration::from_secs(600),
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
    let mut writer = StatusWriter::new(client.clone(), options.writer);
    let mut uids: HashMap<String, String> = HashMap::new();
    let mut changes = state.subscribe();
    let mut last_resync = Instant::now();
    loop {
        let started = Instant::now();
        if started.duration_since(last_resync) >= options.resync {
            writer.resync();
            uids.clear();
            last_resync = started;
        }
        if state.is_leader() {
            sync_once(&client, &state, &options, &mut writer, &mut uids).await;
        }
        // Wait for a change (but not less than min_rebuild), a due deferred write, or the tick.
        let earliest = started + options.min_rebuild;
        let deadline = writer
            .next_due()
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
        }
    }
}

/// One rebuild and flush.
async fn sync_once(
    client: &kube::Client,
    state: &FleetState,
    options: &StatusLoopOptions,
    writer: &mut StatusWriter,
    uids: &mut HashMap<String, String>,
) {
    let now = chrono::Utc::now();
    let spokes = observations(state);
    uids.retain(|name, _| spokes.iter().any(|s| &s.cluster == name));
    for tracked in writer.tracked_clusters() {
        let name = format!("{}/{}", tracked.namespace, tracked.name);
        if !uids.contains_key(&name) {
            writer.forget_cluster(&tracked.namespace, &tracked.name);
        }
    }
    for spoke in &spokes {
        let Some((namespace, name)) = spoke.cluster.split_once('/') else {
            continue;
        };
        let uid = match uids.get(&spoke.cluster) {
            Some(uid) => uid.clone(),
            None => {
                let api: Api<ClusterProfile> = Api::namespaced(client.clone(), namespace);
                match api.get_opt(name).await {
                    Ok(Some(p)) => match p.metadata.uid {
                        Some(uid) => {
                            uids.insert(spoke.cluster.clone(), uid.clone());
                            uid
                        }
                        None => continue,
                    },
                    // Gone: its status goes with it; nothing to write.
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(cluster = %spoke.cluster, error = %e, "reading ClusterProfile for its UID failed");
                        continue;
                    }
                }
            }
        };
        writer.submit_cluster(
            ProfileRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid,
            },
            cluster_status(spoke, now, Some(&options.caps)),
        );
    }
    let full = FullReport::build(&spokes, now);
    writer.submit_report(bound_report(&full.summary, &options.caps));
    let stats = writer.flush(Instant::now()).await;
    if stats.written > 0 || stats.failed > 0 {
        tracing::debug!(?stats, "status flush");
    }
}
