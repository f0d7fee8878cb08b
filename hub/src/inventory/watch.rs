//! Streaming ClusterProfile changes from the hub cluster.

use std::collections::BTreeSet;

use futures::{Stream, StreamExt};
use kleym_api::external::clusterprofile::ClusterProfile;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// Which ClusterProfiles to watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Label selector (`None`: every profile).
    pub label_selector: Option<String>,
}

/// One change of the inventory.
#[derive(Clone, Debug)]
pub enum InventoryEvent {
    /// A profile was added or changed (or listed during a resync).
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

/// Watches ClusterProfiles. Errors are logged and retried with kube's default backoff; the
/// stream only ends when the caller drops it.
pub fn watch(
    client: kube::Client,
    opts: &WatchOptions,
) -> impl Stream<Item = InventoryEvent> + Send + use<> {
    let api: Api<ClusterProfile> = match &opts.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut config = watcher::Config::default();
    if let Some(sel) = &opts.label_selector {
        config = config.labels(sel);
    }
    let mut listing: BTreeSet<String> = BTreeSet::new();
    watcher(api, config)
        .default_backoff()
        .filter_map(move |ev| {
            let out = match ev {
                Ok(watcher::Event::Apply(cp)) => Some(InventoryEvent::Upsert(Box::new(cp))),
                Ok(watcher::Event::Delete(cp)) => Some(InventoryEvent::Deleted(spoke_name(&cp))),
                Ok(watcher::Event::Init) => {
                    listing.clear();
                    None
                }
                Ok(watcher::Event::InitApply(cp)) => {
                    listing.insert(spoke_name(&cp));
                    Some(InventoryEvent::Upsert(Box::new(cp)))
                }
                Ok(watcher::Event::InitDone) => {
                    Some(InventoryEvent::Resynced(std::mem::take(&mut listing)))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching ClusterProfiles failed; retrying");
                    None
                }
            };
            futures::future::ready(out)
        })
}
