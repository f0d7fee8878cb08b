//! Streaming ClusterProfile changes from the hub cluster.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kleym_api::external::clusterprofile::{
    ClusterProfile, ClusterProfileVersion, VersionedClusterProfile,
};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use sha2::{Digest, Sha256};

use kleym_spoke::reconciler::trim::LAST_APPLIED_ANNOTATION;

use super::decide::DecisionInputs;
use super::version::{InventoryVersion, NoVersion, VersionChoice, VersionPolicy, choose, discover};

/// Which ClusterProfiles to watch, and through which version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// Only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Label selector (`None`: every profile). Validated by `kleym hub` at start-up
    /// ([`validate_label_selector`](super::selector::validate_label_selector)).
    pub label_selector: Option<String>,
    /// `--clusterprofile-version`.
    pub version_policy: VersionPolicy,
    /// How often the hub cluster's discovery is asked which versions it serves
    /// (`--clusterprofile-discovery-interval`).
    pub discovery_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            label_selector: None,
            version_policy: VersionPolicy::Auto,
            discovery_interval: Duration::from_secs(60),
        }
    }
}

/// One change of the inventory.
#[derive(Clone, Debug)]
pub enum InventoryEvent {
    /// A profile was added, or changed in a way that can change what the hub does with it:
    /// its decision (its [`DecisionInputs`]), its identity (UID), its deletion or its
    /// finalizers (kleym's removal acts on them); changes that cannot (status heartbeats)
    /// are not forwarded.
    Upsert(Box<ClusterProfile>),
    /// A profile was deleted; the spoke name `<namespace>/<name>`.
    Deleted(String),
    /// A full (re)list completed: these spoke names exist; any other known spoke is gone.
    Resynced(BTreeSet<String>),
}

/// The spoke name of a profile.
pub fn spoke_name(cp: &ClusterProfile) -> String {
    format!(
        "{}/{}",
        cp.namespace().unwrap_or_else(|| "default".into()),
        cp.name_any()
    )
}

/// Drops the [`InventoryEvent::Upsert`]s that cannot change what the hub does with a
/// profile: the decision is a pure function of [`DecisionInputs`], and beside it the
/// supervisor acts only on the profile's UID, `deletionTimestamp` and finalizers (removal),
/// so an upsert where all of these equal those last forwarded for that profile would only
/// repeat the same decision (and, for a refused or waiting profile, the same log line) on
/// every status heartbeat.
#[derive(Debug, Default)]
pub struct InventoryFilter {
    // Digest of what was last forwarded, per spoke name (32 bytes, not the profile).
    forwarded: HashMap<String, [u8; 32]>,
}

/// The digest [`InventoryFilter`] compares: the decision inputs plus the metadata the
/// supervisor's removal reads. Leaving the latter out would swallow a deletion (only
/// `deletionTimestamp` changes while kleym's finalizer holds the profile).
fn forward_digest(cp: &ClusterProfile) -> [u8; 32] {
    let meta = &cp.metadata;
    let mut hasher = Sha256::new();
    hasher.update(DecisionInputs::from_profile(cp).digest());
    // Serializing strings and timestamps cannot fail.
    hasher.update(
        serde_json::to_vec(&(&meta.uid, &meta.deletion_timestamp, &meta.finalizers))
            .unwrap_or_default(),
    );
    hasher.finalize().into()
}

impl InventoryFilter {
    /// Passes `ev` on, or `None` when it is an upsert with unchanged inputs.
    pub fn filter(&mut self, ev: InventoryEvent) -> Option<InventoryEvent> {
        match &ev {
            InventoryEvent::Upsert(cp) => {
                let digest = forward_digest(cp);
                match self.forwarded.insert(spoke_name(cp), digest) {
                    Some(previous) if previous == digest => None,
                    _ => Some(ev),
                }
            }
            InventoryEvent::Deleted(name) => {
                self.forwarded.remove(name);
                Some(ev)
            }
            InventoryEvent::Resynced(names) => {
                self.forwarded.retain(|k, _| names.contains(k));
                Some(ev)
            }
        }
    }
}

/// Watches ClusterProfiles through the version [`choose`] picks, switching versions when
/// discovery (asked every [`WatchOptions::discovery_interval`]) changes the choice: the new
/// watch's listing passes the same [`InventoryFilter`], so a profile whose decision inputs
/// read the same through the new version is not forwarded again (its spoke is not
/// re-engaged). The choice is recorded in `version` and logged once per change.
///
/// Errors are logged and retried (watch errors with kube's default backoff, discovery every
/// interval); the stream only ends when the caller drops it. A profile whose content does
/// not decode is still delivered (see [`kleym_api::external::clusterprofile`]) and refused by
/// [`evaluate`](super::evaluate), so it can never hold up the others.
pub fn watch(
    client: kube::Client,
    opts: &WatchOptions,
    version: InventoryVersion,
) -> impl Stream<Item = InventoryEvent> + Send + use<> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(run_watch(client, opts.clone(), version, tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
    )
}

/// Asks discovery and records the outcome; logs it when it changed. `None` when discovery
/// failed (the previous outcome stands).
async fn refresh_choice(
    client: &kube::Client,
    policy: VersionPolicy,
    version: &InventoryVersion,
) -> Option<Result<VersionChoice, NoVersion>> {
    let outcome = match discover(client).await {
        Ok(served) => choose(policy, &served),
        Err(e) => {
            tracing::warn!(error = %e, "asking the hub cluster which ClusterProfile versions it serves failed; retrying");
            return None;
        }
    };
    if version.set(outcome.clone()) {
        match &outcome {
            Ok(c) => tracing::info!(
                api_version = c.version.api_version(),
                reason = %c.reason,
                "reading ClusterProfiles as {}",
                c.version.api_version()
            ),
            Err(e) => tracing::error!(error = %e, "cannot read ClusterProfiles"),
        }
    }
    Some(outcome)
}

async fn run_watch(
    client: kube::Client,
    opts: WatchOptions,
    version: InventoryVersion,
    tx: tokio::sync::mpsc::Sender<InventoryEvent>,
) {
    let scope = format!(
        "namespace={} selector={}",
        opts.namespace.as_deref().unwrap_or("<all>"),
        opts.label_selector.as_deref().unwrap_or("<none>")
    );
    let mut filter = InventoryFilter::default();
    let mut listing: BTreeSet<String> = BTreeSet::new();
    loop {
        // Until a version can be read.
        let choice = loop {
            let outcome = tokio::select! {
                o = refresh_choice(&client, opts.version_policy, &version) => o,
                () = tx.closed() => return,
            };
            if let Some(Ok(c)) = outcome {
                break c;
            }
            tokio::select! {
                () = tokio::time::sleep(opts.discovery_interval) => {}
                () = tx.closed() => return,
            }
        };
        let resource = choice.version.api_resource();
        let api: Api<VersionedClusterProfile> = match &opts.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let mut config = watcher::Config::default();
        if let Some(sel) = &opts.label_selector {
            config = config.labels(sel);
        }
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut rediscover = tokio::time::interval_at(
            tokio::time::Instant::now() + opts.discovery_interval,
            opts.discovery_interval,
        );
        rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = events.next() => {
                    let Some(ev) = ev else { break };
                    let out = translate(ev, choice.version, &mut listing, &scope)
                        .and_then(|ev| filter.filter(ev));
                    if let Some(out) = out
                        && tx.send(out).await.is_err()
                    {
                        return;
                    }
                }
                _ = rediscover.tick() => {
                    match refresh_choice(&client, opts.version_policy, &version).await {
                        Some(Ok(c)) if c == choice => {}
                        // Another version, or none: watch again from the top.
                        Some(_) => break,
                        None => {}
                    }
                }
                () = tx.closed() => return,
            }
        }
    }
}

/// Drops what the hub never reads of a profile before it is forwarded: the supervisor keeps
/// every profile it was given (and the engage chain a copy), and `managedFields`, decoded
/// as a tree of JSON maps per field manager, was most of that copy: 7.5 MB of heap at
/// 1000 profiles (heaptrack, `fleet-bench --spokes 1000`). Likewise the client-side apply
/// annotation, a second copy of the whole object. Neither is a decision input, nor part
/// of what [`InventoryFilter`] compares.
fn drop_unread_metadata(cp: &mut ClusterProfile) {
    let meta = &mut cp.metadata;
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// One watcher event as an inventory event (before the filter).
fn translate(
    ev: Result<watcher::Event<VersionedClusterProfile>, watcher::Error>,
    version: ClusterProfileVersion,
    listing: &mut BTreeSet<String>,
    scope: &str,
) -> Option<InventoryEvent> {
    let typed = |obj| {
        let mut cp = ClusterProfile::from_versioned(obj, version);
        drop_unread_metadata(&mut cp);
        cp
    };
    match ev {
        Ok(watcher::Event::Apply(obj)) => Some(InventoryEvent::Upsert(Box::new(typed(obj)))),
        Ok(watcher::Event::Delete(obj)) => Some(InventoryEvent::Deleted(spoke_name(&typed(obj)))),
        Ok(watcher::Event::Init) => {
            listing.clear();
            None
        }
        Ok(watcher::Event::InitApply(obj)) => {
            let cp = typed(obj);
            listing.insert(spoke_name(&cp));
            Some(InventoryEvent::Upsert(Box::new(cp)))
        }
        Ok(watcher::Event::InitDone) => Some(InventoryEvent::Resynced(std::mem::take(listing))),
        Err(e) => {
            tracing::warn!(error = %e, %scope, api_version = version.api_version(), "watching ClusterProfiles failed; retrying");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn upsert(name: &str, heartbeat: &str, status: &str) -> InventoryEvent {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "m"}},
            "status": {
                "accessProviders": [{"name": "nope", "cluster": {"server": "https://h"}}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": status,
                    "reason": "R", "message": "", "lastTransitionTime": heartbeat}],
                "properties": [{"name": "x", "value": "y", "lastObservedTime": heartbeat}]
            }
        }))
        .unwrap();
        InventoryEvent::Upsert(Box::new(cp))
    }

    #[test]
    fn forwarded_profiles_carry_no_managed_fields_or_last_applied_copy() {
        let versioned: VersionedClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {
                "name": "a", "namespace": "fleet", "uid": "u1",
                "annotations": {
                    LAST_APPLIED_ANNOTATION: "{\"kind\":\"ClusterProfile\"}",
                    "example.com/keep": "yes"
                },
                "managedFields": [{
                    "manager": "cluster-manager", "operation": "Apply",
                    "apiVersion": "multicluster.x-k8s.io/v1alpha1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:clusterManager": {"f:name": {}}}}
                }]
            },
            "spec": {"clusterManager": {"name": "m"}}
        }))
        .unwrap();
        let mut listing = BTreeSet::new();
        let out = translate(
            Ok(watcher::Event::InitApply(versioned)),
            ClusterProfileVersion::V1alpha1,
            &mut listing,
            "test",
        );
        let Some(InventoryEvent::Upsert(cp)) = out else {
            panic!("expected an upsert, got {out:?}");
        };
        assert_eq!(cp.metadata.managed_fields, None);
        let annotations = cp.metadata.annotations.clone().unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED_ANNOTATION));
        // What the hub may read stays.
        assert_eq!(
            annotations.get("example.com/keep").map(String::as_str),
            Some("yes")
        );
        assert_eq!(cp.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(cp.spec.cluster_manager.name, "m");
        assert!(listing.contains("fleet/a"));
    }

    fn passes(f: &mut InventoryFilter, ev: InventoryEvent) -> bool {
        f.filter(ev).is_some()
    }

    #[test]
    fn forwards_upserts_only_when_the_decision_inputs_change() {
        let mut f = InventoryFilter::default();
        assert!(passes(&mut f, upsert("a", "2026-01-01T00:00:00Z", "True")));
        // Heartbeats (times only) are dropped, for as long as they come.
        for t in ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"] {
            assert!(!passes(&mut f, upsert("a", t, "True")));
        }
        // Another profile is tracked on its own.
        assert!(passes(&mut f, upsert("b", "2026-01-01T00:00:00Z", "True")));
        // A change of an input passes, and so does the change back.
        assert!(passes(&mut f, upsert("a", "2026-01-01T00:03:00Z", "False")));
        assert!(passes(&mut f, upsert("a", "2026-01-01T00:04:00Z", "True")));
        // After a deletion the same content is new again.
        assert!(passes(&mut f, InventoryEvent::Deleted("fleet/a".into())));
        assert!(passes(&mut f, upsert("a", "2026-01-01T00:04:00Z", "True")));
        // A resync forgets the profiles it did not list.
        let listed: BTreeSet<String> = ["fleet/a".to_string()].into();
        assert!(passes(&mut f, InventoryEvent::Resynced(listed)));
        assert!(!passes(&mut f, upsert("a", "2026-01-01T00:05:00Z", "True")));
        assert!(passes(&mut f, upsert("b", "2026-01-01T00:00:00Z", "True")));
    }

    fn with_meta(ev: InventoryEvent, edit: impl FnOnce(&mut ClusterProfile)) -> InventoryEvent {
        match ev {
            InventoryEvent::Upsert(mut cp) => {
                edit(&mut cp);
                InventoryEvent::Upsert(cp)
            }
            other => other,
        }
    }

    #[test]
    fn forwards_deletion_finalizer_and_uid_changes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let t = "2026-01-01T00:00:00Z";
        let mut f = InventoryFilter::default();
        assert!(passes(&mut f, upsert("a", t, "True")));
        // kleym's finalizer added (the removal needs to know it is there).
        let fin = |cp: &mut ClusterProfile| {
            cp.metadata.finalizers = Some(vec!["kleym.io/spoke-removal".into()]);
        };
        assert!(passes(&mut f, with_meta(upsert("a", t, "True"), fin)));
        assert!(!passes(&mut f, with_meta(upsert("a", t, "True"), fin)));
        // Deleted while the finalizer holds it: only deletionTimestamp changes.
        let deleting = |cp: &mut ClusterProfile| {
            fin(cp);
            cp.metadata.deletion_timestamp =
                Some(Time("2026-01-01T00:10:00Z".parse().expect("timestamp")));
        };
        assert!(passes(&mut f, with_meta(upsert("a", t, "True"), deleting)));
        // A recreated profile (new UID) with equal content.
        let recreated = |cp: &mut ClusterProfile| cp.metadata.uid = Some("uid-2".into());
        assert!(passes(&mut f, with_meta(upsert("a", t, "True"), recreated)));
    }
}
