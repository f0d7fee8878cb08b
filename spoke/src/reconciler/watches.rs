//! Watches feeding the caches, and the handlers that turn each change into the (few)
//! bindings it affects.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::model::InferenceModel;
use kleym_api::external::objective::{gaie, llmd};
use kleym_api::external::pool::{v1, v1alpha2};
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::api_availability::ApiKind;
use super::caches::{Cache, Change};
use super::context::Context;
use super::index::{SourceKey, TargetKey};
use super::lean::Lean;
use super::list_watch::{EventHead, Fed, Known, list_watch_known, map_event};
use super::ns_cache::binding_compile_inputs_differ;
use super::observed_output::ObservedOutput;
use super::overlay::Overlay;
use super::queue::ObjectKey;
use super::target_record::TargetRecord;
use super::trim::{CacheEntry, CacheForm};
pub use super::watch_failures::{WatchFailure, WatchFailures};
use crate::compiler::PoolView;

/// Starts the watch for `kind` in `tasks`; it runs until `token` is cancelled.
pub fn spawn_watch(
    ctx: &Arc<Context>,
    tasks: &mut JoinSet<()>,
    kind: ApiKind,
    token: CancellationToken,
) {
    let client = ctx.effects.client.clone();
    match kind {
        ApiKind::Bindings => spawn::<InferenceIdentityBinding>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.bindings,
            Some(own_writes(ctx, |c| &c.state.binding_overlay)),
            on_binding,
            token,
        ),
        ApiKind::ObjectivesLlmd => spawn::<llmd::InferenceObjective>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.objectives_llmd,
            None,
            on_target,
            token,
        ),
        ApiKind::ObjectivesGaie => spawn::<gaie::InferenceObjective>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.objectives_gaie,
            None,
            on_target,
            token,
        ),
        ApiKind::Models => spawn::<InferenceModel>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.models,
            None,
            on_target,
            token,
        ),
        ApiKind::PoolsV1 => spawn::<v1::InferencePool>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.pools_v1,
            None,
            on_pool_v1,
            token,
        ),
        ApiKind::PoolsLegacy => spawn::<v1alpha2::InferencePool>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.pools_legacy,
            None,
            on_pool_legacy,
            token,
        ),
        ApiKind::ClusterSpiffeIds => spawn::<ClusterSPIFFEID>(
            ctx,
            tasks,
            Api::all(client),
            |c| &c.state.caches.cluster_spiffe_ids,
            Some(own_writes(ctx, |c| &c.state.csid_overlay)),
            on_cluster_spiffe_id,
            token,
        ),
    }
}

/// Starts the namespace watch (core API, always served) in `tasks`.
pub fn spawn_namespace_watch(
    ctx: &Arc<Context>,
    tasks: &mut JoinSet<()>,
    token: CancellationToken,
) {
    spawn::<Namespace>(
        ctx,
        tasks,
        Api::all(ctx.effects.client.clone()),
        |c| &c.state.caches.namespaces,
        None,
        on_namespace,
        token,
    );
}

fn spawn<K>(
    ctx: &Arc<Context>,
    tasks: &mut JoinSet<()>,
    api: Api<Lean<K>>,
    cache: fn(&Context) -> &Cache<K::Cached>,
    known: Option<Known<K::Cached>>,
    handler: fn(&Context, Change<K::Cached>),
    token: CancellationToken,
) where
    K: Resource + Clone + CacheForm + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
    K::Cached: Send + Sync + 'static,
{
    let ctx = ctx.clone();
    cache(&ctx).activate();
    ctx.state.sync_may_have_changed();
    let dt = K::DynamicType::default();
    let plural = K::plural(&dt).to_string();
    let group = K::group(&dt);
    let resource = if group.is_empty() {
        plural
    } else {
        format!("{plural}.{group}")
    };
    // Built (and boxed) outside the task: an async block keeps what it captures in its own
    // slot even after moving it on, so building the stream inside kept a dead copy of `api`
    // in every watch task for the spoke's whole engagement.
    let mut stream = Box::pin(list_watch_known(api, known).default_backoff());
    tasks.spawn(async move {
        // Whether a failure of this watch is on record (cleared once its cache synced).
        let mut failed = false;
        loop {
            let next = tokio::select! {
                _ = token.cancelled() => break,
                next = stream.next() => next,
            };
            match next {
                None => break,
                Some(Ok(event)) => {
                    ingest_fed(&ctx, cache(&ctx), handler, unwrap_lean(event));
                    if failed && cache(&ctx).is_ready() {
                        ctx.state.watch_failures.clear(&resource);
                        failed = false;
                    }
                }
                Some(Err(err)) => {
                    let failure = WatchFailure {
                        resource: resource.clone(),
                        error: Arc::new(err),
                    };
                    // The watcher retries with backoff; make RBAC problems loud.
                    tracing::warn!(cluster = %ctx.config.cluster, resource = %failure.resource, category = failure.category().as_str(), error = %failure.error, "watch failed; retrying");
                    // Before the first list completed, the sync is stuck on this: say why.
                    if !cache(&ctx).is_ready() {
                        ctx.state.watch_failures.record(failure);
                        failed = true;
                    }
                }
            }
        }
        if failed {
            ctx.state.watch_failures.clear(&resource);
        }
        tracing::debug!(resource = %resource, "watch stopped");
    });
}

/// Where a kind's read-your-writes overlay is kept.
type OverlayOf<C> = fn(&Context) -> &Overlay<C>;

/// The watch echoes of our own writes, taken from `overlay` rather than decoded again:
/// the object a write returned, when an event carries it at the same resourceVersion.
pub(crate) fn own_writes<C: Resource + Clone + Send + Sync + 'static>(
    ctx: &Arc<Context>,
    overlay: OverlayOf<C>,
) -> Known<C> {
    let ctx = ctx.clone();
    Arc::new(move |head: &EventHead| {
        overlay(&ctx).own_write(&head.namespace, &head.name, &head.resource_version)
    })
}

/// The watch event of a [`Lean`] decode, as the caches take it.
fn unwrap_lean<K, C>(event: watcher::Event<Fed<Lean<K>, C>>) -> watcher::Event<Fed<K, C>> {
    map_event(event, |fed| match fed {
        Fed::Decoded(Lean(obj)) => Fed::Decoded(obj),
        Fed::Known(obj) => Fed::Known(obj),
    })
}

/// Applies one watch event to `cache` and hands each resulting change to `handler`: the
/// watch loop's body, for tests that drive a context without an API server.
pub fn ingest<K: CacheForm>(
    ctx: &Context,
    cache: &Cache<K::Cached>,
    handler: fn(&Context, Change<K::Cached>),
    event: watcher::Event<K>,
) {
    ingest_fed(ctx, cache, handler, map_event(event, Fed::Decoded));
}

/// [`ingest`], for events whose objects may be ones the overlay already held.
pub(crate) fn ingest_fed<K: CacheForm>(
    ctx: &Context,
    cache: &Cache<K::Cached>,
    handler: fn(&Context, Change<K::Cached>),
    event: watcher::Event<Fed<K, K::Cached>>,
) {
    // What the reconciler never reads is dropped before it is cached (most of an object).
    let field_manager = ctx.config.field_manager.as_str();
    let event = map_event(event, |fed| match fed {
        Fed::Decoded(obj) => Arc::new(K::into_cached(obj, field_manager)),
        Fed::Known(obj) => obj,
    });
    let list_done = matches!(event, watcher::Event::InitDone);
    let changes = cache.apply(event);
    if list_done {
        ctx.state.sync_may_have_changed();
    }
    for change in changes {
        // A relist returns unchanged objects: nothing happened to them.
        if let Change::Upsert {
            old: Some(old),
            new,
        } = &change
            && old.entry_version().is_some()
            && old.entry_version() == new.entry_version()
        {
            continue;
        }
        handler(ctx, change);
    }
}

fn object_key<K: Resource>(o: &K) -> ObjectKey {
    ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any())
}

/// The target a binding names.
pub fn binding_target(b: &InferenceIdentityBinding) -> TargetKey {
    TargetKey {
        namespace: b.namespace().unwrap_or_default(),
        kind: b.spec.target_ref.kind,
        name: b.spec.target_ref.name.clone(),
    }
}

pub(crate) fn on_binding(ctx: &Context, change: Change<InferenceIdentityBinding>) {
    match change {
        Change::Upsert { old, new } => {
            let key = object_key(new.as_ref());
            ctx.state
                .index
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .upsert_binding(&key, binding_target(&new));
            // What reconciles read of this binding is the newer of cache and overlay: it
            // changed if the new version differs from the cached one or from our write.
            let written = ctx.state.binding_overlay.peek(&key.namespace, &key.name);
            if binding_compile_inputs_differ(old.as_deref(), Some(&new))
                || written.is_some_and(|w| binding_compile_inputs_differ(Some(&w), Some(&new)))
            {
                ctx.state.namespace_cache.invalidate(&key.namespace);
            } else {
                // Its status may have changed: compared with its findings again.
                ctx.state
                    .namespace_cache
                    .binding_changed(&key.namespace, &key.name);
            }
            let relevant = binding_change_needs_reconcile(old.as_deref(), &new);
            let own_echo = ctx.state.binding_overlay.is_own_write(
                &key.namespace,
                &key.name,
                new.metadata.resource_version.as_deref(),
            );
            ctx.state.binding_overlay.caught_up(
                &key.namespace,
                &key.name,
                new.metadata.resource_version.as_deref(),
            );
            if relevant && !own_echo {
                ctx.queue.enqueue(key);
            }
        }
        Change::Removed(gone) => {
            let key = object_key(gone.as_ref());
            ctx.state.binding_overlay.forget(&key.namespace, &key.name);
            ctx.state.compile_memo.forget(&key);
            let namespace_empty = {
                let mut ix = ctx.state.index.write().unwrap_or_else(|p| p.into_inner());
                ix.remove_binding(&key);
                ix.bindings_in_namespace(&key.namespace).is_empty()
            };
            if namespace_empty {
                ctx.state.namespace_cache.evict(&key.namespace);
            } else {
                ctx.state.namespace_cache.invalidate(&key.namespace);
            }
            ctx.effects.metrics.forget(&key);
            // Peers whose verdict depended on this binding (collisions) must be re-evaluated.
            let peers = peers_to_revisit(ctx, &key, gone.as_ref());
            ctx.queue.enqueue_all(peers);
        }
    }
}

/// Does this version of a binding need a reconcile? Our own status writes come back as
/// events: only a first sight, a spec change (generation), deletion, finalizer or UID
/// changes, or a status that vanished need one. (Status read back only to enqueue the
/// binding itself: no object is chosen from it, see `crate::ownership`.)
pub fn binding_change_needs_reconcile(
    old: Option<&InferenceIdentityBinding>,
    new: &InferenceIdentityBinding,
) -> bool {
    old.is_none_or(|o| {
        o.metadata.generation != new.metadata.generation
            || o.metadata.deletion_timestamp != new.metadata.deletion_timestamp
            || o.metadata.finalizers != new.metadata.finalizers
            || o.metadata.uid != new.metadata.uid
            || o.status.is_none() != new.status.is_none()
    })
}

/// Bindings in the namespace that recorded `gone` as a conflict peer, or that `gone`
/// recorded as one. (Status read back only to pick bindings of the same namespace to
/// enqueue: a forged peer name costs a reconcile, which re-derives everything from specs
/// and proves ownership on the objects, see `crate::ownership`.)
fn peers_to_revisit(
    ctx: &Context,
    key: &ObjectKey,
    gone: &InferenceIdentityBinding,
) -> Vec<ObjectKey> {
    let mut out: Vec<ObjectKey> = gone
        .status
        .iter()
        .flat_map(|s| s.conflict_peers.iter())
        .map(|p| ObjectKey::new(key.namespace.clone(), p.name.clone()))
        .collect();
    let names = ctx
        .state
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(&key.namespace);
    for k in names {
        if let Some(b) = ctx.state.caches.bindings.get(&k.namespace, &k.name)
            && b.status
                .as_ref()
                .is_some_and(|s| s.conflict_peers.iter().any(|p| p.name == key.name))
        {
            out.push(k);
        }
    }
    out
}

/// Did the view the compiler reads of an object change (appeared, vanished, or differs)?
fn view_changed<K, V: PartialEq>(change: &Change<K>, view: fn(&K) -> V) -> bool {
    match change {
        Change::Upsert {
            old: Some(old),
            new,
        } => view(old) != view(new),
        Change::Upsert { old: None, .. } | Change::Removed(_) => true,
    }
}

/// A binding's target (an objective of either group or a legacy model) changed: the
/// index learns its pool, and the bindings naming it are reconciled unless only its
/// status changed.
pub(crate) fn on_target(ctx: &Context, change: Change<TargetRecord>) {
    let (obj, alive) = match &change {
        Change::Upsert { new, .. } => (new.clone(), true),
        Change::Removed(gone) => (gone.clone(), false),
    };
    let view = obj.view();
    let source = SourceKey {
        group: view.group.clone(),
        target: TargetKey {
            namespace: view.namespace.clone(),
            kind: view.kind,
            name: view.name.clone(),
        },
    };
    let affected = {
        let mut ix = ctx.state.index.write().unwrap_or_else(|p| p.into_inner());
        if alive {
            ix.upsert_source(source.clone(), view.pool_ref.name.clone());
        } else {
            ix.remove_source(&source);
        }
        ix.bindings_for_target(&source.target)
    };
    if view_changed(&change, |t: &TargetRecord| t.view().clone()) {
        ctx.state
            .namespace_cache
            .invalidate(&source.target.namespace);
    }
    // Status-only updates of objectives do not change any identity.
    if let Change::Upsert {
        old: Some(old),
        new,
    } = &change
        && old.generation() == new.generation()
        && old.generation().is_some()
    {
        return;
    }
    ctx.queue.enqueue_all(affected);
}

pub(crate) fn on_pool_v1(ctx: &Context, change: Change<v1::InferencePool>) {
    on_pool(ctx, change, PoolView::from_v1)
}

pub(crate) fn on_pool_legacy(ctx: &Context, change: Change<v1alpha2::InferencePool>) {
    on_pool(ctx, change, PoolView::from_v1alpha2)
}

fn on_pool<K: Resource>(ctx: &Context, change: Change<K>, view: fn(&K) -> PoolView) {
    if view_changed(&change, view) {
        let obj = match &change {
            Change::Upsert { new, .. } => new,
            Change::Removed(gone) => gone,
        };
        ctx.state
            .namespace_cache
            .invalidate(&obj.namespace().unwrap_or_default());
    }
    let obj = match &change {
        Change::Upsert {
            old: Some(old),
            new,
        } => {
            if old.meta().generation == new.meta().generation && old.meta().generation.is_some() {
                return; // status only (GAIE controllers write pool status often)
            }
            new.clone()
        }
        Change::Upsert { old: None, new } => new.clone(),
        Change::Removed(gone) => gone.clone(),
    };
    let affected = ctx
        .state
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_for_pool(&obj.namespace().unwrap_or_default(), &obj.name_any());
    ctx.queue.enqueue_all(affected);
}

pub(crate) fn on_cluster_spiffe_id(ctx: &Context, change: Change<ObservedOutput>) {
    let (obj, old) = match &change {
        Change::Upsert { old, new } => (new.clone(), old.clone()),
        Change::Removed(gone) => (gone.clone(), None),
    };
    let name = obj.name_any();
    if let Change::Removed(gone) = &change {
        ctx.state.csid_overlay.forget("", &name);
        if let Some(uid) = gone.uid() {
            ctx.state.csid_overlay.forget_deleted(&uid);
        }
    }
    let mut affected = Vec::new();
    // The binding that (wants to) own this name: ours changed, was deleted, or a foreign
    // holder of our name appeared or went away.
    if let Some(k) = ctx
        .state
        .name_claims
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .claimant(&name)
    {
        affected.push(k.clone());
    }
    let foreign_changed = {
        let mut foreign = ctx
            .state
            .foreign_spiffe_ids
            .write()
            .unwrap_or_else(|p| p.into_inner());
        match (&change, obj.foreign()) {
            (Change::Upsert { .. }, Some(f)) => {
                foreign.insert(name.clone(), f.clone()).as_ref() != Some(f)
            }
            _ => foreign.remove(&name).is_some(),
        }
    };
    // Every namespace's overlap analysis reads the foreign ClusterSPIFFEIDs.
    if foreign_changed {
        ctx.state.namespace_cache.invalidate_all();
    }
    // The echo of our own apply: the binding that wrote it already acted on it (unless
    // the write changed the foreign set, e.g. a migrated object is proven kleym's now).
    let echo = matches!(&change, Change::Upsert { new, .. } if ctx.state
        .csid_overlay
        .is_own_write("", &name, new.meta().resource_version.as_deref()));
    if let Change::Upsert { new, .. } = &change {
        ctx.state
            .csid_overlay
            .caught_up("", &name, new.meta().resource_version.as_deref());
    }
    if echo && !foreign_changed {
        return;
    }
    // Whose output it is, by the ownership proof (labels can be copied onto any object,
    // and such an object must stay in the overlap analysis below).
    let owner = crate::ownership::proven_owner(obj.as_ref(), &ctx.config.field_manager);
    // Another ClusterSPIFFEID: its selection can overlap any binding's pods (overlap
    // warnings). Only spec changes matter, not SPIRE's frequent status writes.
    let spec_changed = old
        .as_ref()
        .is_none_or(|o| o.meta().generation != obj.meta().generation);
    let owner_is_foreign = owner.is_err();
    if let Ok(owner) = owner
        && !echo
    {
        affected.push(ObjectKey::new(owner.namespace, owner.name));
    }
    if foreign_changed || (owner_is_foreign && spec_changed) {
        affected.extend(
            ctx.state
                .index
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .all_bindings(),
        );
    }
    ctx.queue.enqueue_all(affected);
}

pub(crate) fn on_namespace(ctx: &Context, change: Change<Namespace>) {
    // Namespace labels feed the overlap analysis of other ClusterSPIFFEIDs'
    // namespaceSelectors; only label changes matter.
    let (ns, changed) = match &change {
        Change::Upsert { old, new } => (
            new.name_any(),
            old.as_ref()
                .is_none_or(|o| o.metadata.labels != new.metadata.labels),
        ),
        Change::Removed(gone) => (gone.name_any(), true),
    };
    if matches!(change, Change::Removed(_)) {
        ctx.state.namespace_cache.evict(&ns);
    } else if changed {
        ctx.state.namespace_cache.invalidate(&ns);
    }
    if changed {
        let affected = ctx
            .state
            .index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .bindings_in_namespace(&ns);
        ctx.queue.enqueue_all(affected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::{ConflictPeer, InferenceIdentityBindingStatus};

    /// A context whose client never connects (needs a Tokio runtime for its request buffer).
    fn offline_context() -> Arc<Context> {
        let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        Arc::new(Context::new(
            client,
            super::super::config::SpokeConfig::new("td.example"),
            Arc::new(super::super::metrics::SpokeMetrics::default()),
        ))
    }

    #[tokio::test]
    async fn every_kind_has_a_cache_and_a_watch() {
        for kind in ApiKind::ALL {
            let ctx = offline_context();
            let mut tasks = JoinSet::new();
            let token = CancellationToken::new();
            spawn_watch(&ctx, &mut tasks, kind, token.clone());
            // Starting a watch activates the cache it feeds: exactly `kind`'s.
            for other in ApiKind::ALL {
                assert_eq!(
                    ctx.state.caches.of_kind(other).is_active(),
                    other == kind,
                    "watch of {kind} activated the cache of {other}"
                );
            }
            token.cancel();
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }

    fn binding(generation: i64) -> InferenceIdentityBinding {
        let spec = serde_json::from_value(serde_json::json!({
            "targetRef": {"name": "chat"},
            "containerDiscriminator": {"type": "ContainerName", "value": "c"},
            "workloadSelectorTemplates": ["k8s:ns:a", "k8s:sa:s"]
        }))
        .unwrap();
        let mut b = InferenceIdentityBinding::new("b", spec);
        b.metadata.namespace = Some("a".into());
        b.metadata.generation = Some(generation);
        b.metadata.uid = Some("u".into());
        b
    }

    #[test]
    fn status_echo_needs_no_reconcile_but_spec_and_deletion_do() {
        let old = binding(1);
        assert!(binding_change_needs_reconcile(None, &old), "first sight");
        let mut with_status = old.clone();
        with_status.status = Some(InferenceIdentityBindingStatus::default());
        assert!(
            binding_change_needs_reconcile(Some(&old), &with_status),
            "status appeared"
        );
        let mut status_changed = with_status.clone();
        status_changed.status.as_mut().unwrap().conflict_peers = vec![ConflictPeer {
            name: "x".into(),
            reason: "IdentityCollision".into(),
        }];
        assert!(
            !binding_change_needs_reconcile(Some(&with_status), &status_changed),
            "a status update (ours) alone"
        );
        let mut labels_only = with_status.clone();
        labels_only.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
        assert!(!binding_change_needs_reconcile(
            Some(&with_status),
            &labels_only
        ));
        assert!(
            binding_change_needs_reconcile(Some(&with_status), &binding(2)),
            "spec"
        );
        let mut deleting = with_status.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(5).unwrap(),
            ));
        assert!(binding_change_needs_reconcile(
            Some(&with_status),
            &deleting
        ));
    }
}
