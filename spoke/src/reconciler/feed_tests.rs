//! What the watches put into the caches, and what the hub's snapshot reads back, driven
//! through the real watch loop body ([`ingest`]) without an API server.

use std::sync::Arc;

use kleym_api::InferenceIdentityBinding;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::context::{Context, SpokeConfig};
use super::list_watch::{EventHead, Fed, peek_head};
use super::metrics::SpokeMetrics;
use super::queue::ObjectKey;
use super::snapshot;
use super::trim::LAST_APPLIED_ANNOTATION;
use super::watches::{self, ingest, ingest_fed, own_writes};

/// A context whose client never connects (needs a Tokio runtime for its request buffer).
fn context() -> Context {
    let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    Context::new(
        client,
        SpokeConfig::new("td.example"),
        Arc::new(SpokeMetrics::default()),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A binding as the API server returns it: managedFields set, a kubectl annotation.
fn served_binding(name: &str, rv: u64, reason: &str) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
        "metadata": {
            "name": name, "namespace": "llm", "uid": format!("uid-{name}"),
            "generation": 1, "resourceVersion": rv.to_string(),
            "annotations": {
                LAST_APPLIED_ANNOTATION: "{\"spec\":{}}",
                "team": "a"
            },
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "apiVersion": "kleym.io/v1alpha1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:mode": {}}}},
                {"manager": "kleym", "operation": "Apply", "apiVersion": "kleym.io/v1alpha1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}},
                 "subresource": "status"}
            ]
        },
        "spec": {
            "targetRef": {"name": "chat"},
            "mode": "PoolOnly",
            "workloadSelectorTemplates": ["k8s:ns:llm", "k8s:sa:model"]
        },
        "status": {
            "observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "False", "reason": reason,
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }
    })
}

fn deliver(ctx: &Context, event: Event<InferenceIdentityBinding>) {
    ingest(ctx, &ctx.state.caches.bindings, watches::on_binding, event);
}

/// Delivers `echo` as the watch does an event whose object the overlay already held.
fn deliver_known(ctx: &Context, echo: Arc<InferenceIdentityBinding>) {
    ingest_fed(
        ctx,
        &ctx.state.caches.bindings,
        watches::on_binding,
        Event::Apply(Fed::<InferenceIdentityBinding, _>::Known(echo)),
    );
}

/// The head of a `MODIFIED` event of `object`, written as the API server writes it: `type`
/// first (`json!` would sort it last).
fn event_head(object: Value) -> EventHead {
    let line = format!(r#"{{"type":"MODIFIED","object":{object}}}"#);
    peek_head(line.as_bytes()).unwrap()
}

/// Activates the binding cache and delivers an initial list of `bindings` (name and
/// resourceVersion), each with a `Ready` condition of `reason`.
fn list_bindings(ctx: &Context, bindings: &[(&str, u64)], reason: &str) {
    ctx.state.caches.bindings.activate();
    deliver(ctx, Event::Init);
    for (name, rv) in bindings {
        deliver(
            ctx,
            Event::InitApply(binding(served_binding(name, *rv, reason))),
        );
    }
    deliver(ctx, Event::InitDone);
}

/// Decoded from text, as a watch event is (`from_value` would size every list exactly).
fn binding(v: Value) -> InferenceIdentityBinding {
    serde_json::from_str(&v.to_string()).unwrap()
}

#[test]
fn cached_objects_carry_no_managed_fields_nor_last_applied_configuration() {
    let rt = runtime();
    let _guard = rt.enter();
    let ctx = context();
    let served = binding(served_binding("a", 1, "Pending"));
    assert!(
        served.metadata.managed_fields.is_some(),
        "the input has them"
    );

    // Initial list and a later watch event both go through the same path.
    ctx.state.caches.bindings.activate();
    deliver(&ctx, Event::Init);
    deliver(&ctx, Event::InitApply(served));
    deliver(&ctx, Event::InitDone);
    deliver(
        &ctx,
        Event::Apply(binding(served_binding("b", 2, "Pending"))),
    );

    for name in ["a", "b"] {
        let cached = ctx.state.caches.bindings.get("llm", name).unwrap();
        assert_eq!(cached.metadata.managed_fields, None, "{name}");
        let annotations = cached.metadata.annotations.clone().unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED_ANNOTATION), "{name}");
        assert_eq!(annotations.get("team").map(String::as_str), Some("a"));
        // Everything the reconciler reads is still there.
        assert_eq!(
            cached.metadata.uid.as_deref(),
            Some(&*format!("uid-{name}"))
        );
        // Lists hold no spare room (serde's pushes leave room for four conditions).
        let conditions = &cached.status.as_ref().unwrap().conditions;
        assert_eq!((conditions.len(), conditions.capacity()), (1, 1), "{name}");
    }

    // Our own writes' responses are kept the same way (read-your-writes overlay).
    ctx.state.record_binding_write(
        &ObjectKey::new("llm", "a"),
        binding(served_binding("a", 3, "Pending")),
    );
    let written = ctx.state.binding_overlay.peek("llm", "a").unwrap();
    assert_eq!(written.metadata.managed_fields, None);
    let conditions = &written.status.as_ref().unwrap().conditions;
    assert_eq!(conditions.capacity(), conditions.len());
}

#[test]
fn the_echo_of_our_write_leaves_one_copy_of_the_binding() {
    let rt = runtime();
    let _guard = rt.enter();
    let ctx = context();
    list_bindings(&ctx, &[("a", 1)], "Pending");
    let key = ObjectKey::new("llm", "a");

    ctx.state
        .record_binding_write(&key, binding(served_binding("a", 3, "Ready")));
    // An older event (another writer's, before ours) keeps our write readable.
    deliver(&ctx, Event::Apply(binding(served_binding("a", 2, "Other"))));
    assert!(ctx.state.binding_overlay.peek("llm", "a").is_some());
    let current = ctx.state.current_binding(&key).unwrap();
    assert_eq!(current.metadata.resource_version.as_deref(), Some("3"));

    // The echo of our write: the cache holds that version, the overlay lets go of its
    // copy (no reconcile reads the binding again to drop it).
    deliver(&ctx, Event::Apply(binding(served_binding("a", 3, "Ready"))));
    assert!(ctx.state.binding_overlay.peek("llm", "a").is_none());
    let current = ctx.state.current_binding(&key).unwrap();
    assert_eq!(current.metadata.resource_version.as_deref(), Some("3"));
    assert!(Arc::ptr_eq(
        &current,
        &ctx.state.caches.bindings.get("llm", "a").unwrap()
    ));
}

#[test]
fn the_echo_of_our_write_is_the_recorded_object_not_a_second_decode() {
    let rt = runtime();
    let _guard = rt.enter();
    let ctx = Arc::new(context());
    list_bindings(&ctx, &[("a", 1)], "Pending");
    let key = ObjectKey::new("llm", "a");
    let recorded = ctx
        .state
        .record_binding_write(&key, binding(served_binding("a", 3, "Ready")));
    let known = own_writes(&ctx, |c| &c.state.binding_overlay);
    let queued = ctx.queue.len();

    // Another version (someone else's write) is not ours: it is decoded.
    assert!(known(&event_head(served_binding("a", 2, "Ready"))).is_none());
    // Another binding at our version is not ours either.
    let mut elsewhere = served_binding("a", 3, "Ready");
    elsewhere["metadata"]["namespace"] = json!("other");
    assert!(known(&event_head(elsewhere)).is_none());

    // The echo: the overlay's object, which then moves into the cache alone.
    let head = event_head(served_binding("a", 3, "Ready"));
    let echo = known(&head).unwrap();
    assert!(Arc::ptr_eq(&echo, &recorded));
    deliver_known(&ctx, echo);
    assert!(Arc::ptr_eq(
        &ctx.state.caches.bindings.get("llm", "a").unwrap(),
        &recorded
    ));
    assert!(ctx.state.binding_overlay.peek("llm", "a").is_none());
    // Our own echo needs no reconcile.
    assert_eq!(ctx.queue.len(), queued);
}

#[test]
fn the_echo_of_an_earlier_write_is_known_after_a_later_write_returned() {
    let rt = runtime();
    let _guard = rt.enter();
    let ctx = Arc::new(context());
    list_bindings(&ctx, &[("a", 1)], "Pending");
    let key = ObjectKey::new("llm", "a");
    // A reconcile writes the finalizer, then the status, before either echo arrives.
    let first = ctx
        .state
        .record_binding_write(&key, binding(served_binding("a", 3, "Pending")));
    let second = ctx
        .state
        .record_binding_write(&key, binding(served_binding("a", 4, "Ready")));
    let known = own_writes(&ctx, |c| &c.state.binding_overlay);
    let queued = ctx.queue.len();

    // The first write's echo is still ours: no decode, no reconcile, and the later
    // write stays what reconciles read.
    let echo = known(&event_head(served_binding("a", 3, "Pending"))).unwrap();
    assert!(Arc::ptr_eq(&echo, &first));
    deliver_known(&ctx, echo);
    assert_eq!(ctx.queue.len(), queued);
    assert!(Arc::ptr_eq(
        &ctx.state.current_binding(&key).unwrap(),
        &second
    ));
    // Once the cache passed it, the first write is no longer remembered.
    assert!(known(&event_head(served_binding("a", 3, "Pending"))).is_none());

    // The second echo: ours as well, and then the overlay holds nothing.
    let echo = known(&event_head(served_binding("a", 4, "Ready"))).unwrap();
    assert!(Arc::ptr_eq(&echo, &second));
    deliver_known(&ctx, echo);
    assert_eq!(ctx.queue.len(), queued);
    assert!(ctx.state.binding_overlay.peek("llm", "a").is_none());
}

#[test]
fn snapshot_is_rebuilt_only_when_the_binding_cache_changed() {
    let rt = runtime();
    let _guard = rt.enter();
    let ctx = context();
    list_bindings(&ctx, &[("a", 1), ("b", 2)], "Pending");

    let first = snapshot::bindings(&ctx);
    assert_eq!(first.len(), 2);
    assert!(
        Arc::ptr_eq(&first, &snapshot::bindings(&ctx)),
        "no change: the same snapshot, not rebuilt"
    );
    // Other caches and the overlay are not what the snapshot reads.
    ctx.state
        .binding_overlay
        .record(binding(served_binding("a", 9, "Other")));
    assert!(Arc::ptr_eq(&first, &snapshot::bindings(&ctx)));

    // A status change of one binding shows up in the next snapshot.
    deliver(
        &ctx,
        Event::Apply(binding(served_binding("b", 3, "Compiled"))),
    );
    let second = snapshot::bindings(&ctx);
    assert!(!Arc::ptr_eq(&first, &second));
    let reasons: Vec<_> = second
        .iter()
        .map(|s| s.reason.as_deref().unwrap_or_default())
        .collect();
    assert_eq!(reasons, ["Pending", "Compiled"]);
    assert!(Arc::ptr_eq(&second, &snapshot::bindings(&ctx)));

    // A deletion too.
    deliver(
        &ctx,
        Event::Delete(binding(served_binding("a", 4, "Pending"))),
    );
    let third = snapshot::bindings(&ctx);
    let names: Vec<_> = third.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["b"]);
}

/// A peer whose write failed waits out its backoff: another binding's reconcile does not
/// enqueue it at once (two failing peers would otherwise enqueue each other as fast as the
/// failures come back), and does again once it succeeded.
#[test]
fn a_peer_in_its_error_backoff_is_left_to_its_retry() {
    use super::evaluation::BindingDecision;
    use super::queue::ObjectKey;
    use super::reconcile::enqueue_changed_peers;
    use crate::compiler::{Reason, Refusal};
    use kleym_api::ConflictPeer;
    use std::time::Duration;

    let rt = runtime();
    let _guard = rt.enter();
    let ctx = context();
    list_bindings(&ctx, &[("a", 1), ("b", 2)], "Compiled");
    // b now collides with a; its status does not say so yet.
    let b_name = "b".to_string();
    let b_verdict = BindingDecision {
        output: None,
        refusal: Some(Refusal::new(Reason::IdentityCollision, "m")),
        computed_spiffe_ids: Vec::new(),
        rendered_selectors: Vec::new(),
        conflict_peers: vec![ConflictPeer {
            name: "a".into(),
            reason: "IdentityCollision".into(),
        }],
        warnings: Vec::new(),
    };
    let (a, b) = (ObjectKey::new("llm", "a"), ObjectKey::new("llm", "b"));
    let nudge = || enqueue_changed_peers(&ctx.state, &ctx.queue, &a, [(&b_name, &b_verdict)]);
    let drain = || {
        let mut keys = Vec::new();
        while !ctx.queue.is_empty() {
            let key = rt.block_on(ctx.queue.next()).unwrap();
            ctx.queue.done(&key);
            keys.push(key);
        }
        keys
    };

    // The initial list enqueued both.
    assert_eq!(drain().len(), 2);
    nudge();
    assert_eq!(drain(), std::slice::from_ref(&b));

    // b's status write failed: while its retry is not due, a's reconcile leaves it alone.
    ctx.state.next_backoff(&b, Duration::from_secs(60));
    assert!(ctx.state.backing_off(&b));
    nudge();
    assert!(drain().is_empty());

    // Succeeded since: nudged again.
    ctx.state.reset_backoff(&b);
    nudge();
    assert_eq!(drain(), [b]);
}

/// A namespace's statuses are compared with its evaluation once, then only where a write
/// changed one: a peer whose status did not change is not compared (nor enqueued) again,
/// one whose status changed is, and a peer left to its retry is compared again next time.
#[test]
fn peers_are_compared_again_only_after_their_status_changed() {
    use super::evaluation::{BindingDecision, NO_FINDINGS, NamespaceEvaluation};
    use super::queue::ObjectKey;
    use super::reconcile::nudge_peers;
    use crate::compiler::{Reason, Refusal};
    use kleym_api::ConflictPeer;
    use std::time::Duration;

    let rt = runtime();
    let _guard = rt.enter();
    let ctx = context();
    list_bindings(&ctx, &[("a", 1), ("b", 2), ("c", 3)], "Compiled");
    // b collides with a (its status does not say so); c's findings match its status.
    let clean = |_: &str| NO_FINDINGS.clone();
    let colliding = BindingDecision {
        refusal: Some(Refusal::new(Reason::IdentityCollision, "m")),
        conflict_peers: vec![ConflictPeer {
            name: "a".into(),
            reason: "IdentityCollision".into(),
        }],
        ..clean("b")
    };
    let evaluation = Arc::new(NamespaceEvaluation::from_findings([
        ("a".to_string(), clean("a")),
        ("b".to_string(), colliding),
        ("c".to_string(), clean("c")),
    ]));
    let served = ctx.state.served();
    let cache = &ctx.state.namespace_cache;
    let (stamp, _) = cache.lookup("llm", &served);
    assert!(cache.store("llm", stamp, &served, Arc::clone(&evaluation)));

    let (a, b) = (ObjectKey::new("llm", "a"), ObjectKey::new("llm", "b"));
    let nudge = || nudge_peers(&ctx.state, &ctx.queue, &a, &evaluation);
    let drain = || {
        let mut keys = Vec::new();
        while !ctx.queue.is_empty() {
            let key = rt.block_on(ctx.queue.next()).unwrap();
            ctx.queue.done(&key);
            keys.push(key);
        }
        keys
    };
    assert_eq!(drain().len(), 3, "the initial list enqueued every binding");

    // First use: every peer compared, b enqueued.
    nudge();
    assert_eq!(drain(), std::slice::from_ref(&b));
    // No status changed since: nothing compared, nothing enqueued (b's own reconcile is
    // what comes next).
    assert!(evaluation.take_peers_to_check().is_empty());
    nudge();
    assert!(drain().is_empty());

    // b's status was rewritten, still without the collision: compared again, enqueued.
    deliver(&ctx, Event::Apply(binding(served_binding("b", 4, "Other"))));
    nudge();
    assert_eq!(drain(), std::slice::from_ref(&b));
    // c's status changed but still matches its findings: compared, not enqueued.
    deliver(&ctx, Event::Apply(binding(served_binding("c", 5, "Other"))));
    let to_check: Vec<_> = evaluation
        .take_peers_to_check()
        .into_iter()
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(to_check, ["c"]);

    // Our own status write of b marks it too.
    ctx.state
        .record_binding_write(&b, binding(served_binding("b", 6, "Written")));
    ctx.state.next_backoff(&b, Duration::from_secs(60));
    nudge();
    assert!(drain().is_empty(), "left to its retry");
    // Still waiting to be compared: enqueued once its backoff is over, with no new write.
    ctx.state.reset_backoff(&b);
    nudge();
    assert_eq!(drain(), [b]);
    nudge();
    assert!(drain().is_empty());
}

#[test]
fn the_list_that_completes_the_sync_wakes_the_waiters_at_once() {
    use super::api_availability::{ApiKind, ServedApis};
    use k8s_openapi::api::core::v1::Namespace;

    let rt = runtime();
    rt.block_on(async {
        // The clock stands still: whatever wakes the waiters, a timer cannot.
        tokio::time::pause();
        let ctx = Arc::new(context());
        *ctx.state.served.write().unwrap() = ServedApis::from_kinds([ApiKind::Bindings]);
        let waiter = tokio::spawn({
            let ctx = Arc::clone(&ctx);
            async move { ctx.state.until_synced().await }
        });
        let readiness = super::config::CachesSynced::default();
        let mirror = tokio::spawn({
            let (ctx, readiness) = (Arc::clone(&ctx), readiness.clone());
            async move { ctx.state.mirror_synced(&readiness).await }
        });
        let settle = || async {
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        assert!(!waiter.is_finished(), "nothing has synced yet");

        // The namespaces complete first: the bindings still have not.
        ctx.state.caches.namespaces.activate();
        ingest::<Namespace>(
            &ctx,
            &ctx.state.caches.namespaces,
            watches::on_namespace,
            Event::Init,
        );
        ingest::<Namespace>(
            &ctx,
            &ctx.state.caches.namespaces,
            watches::on_namespace,
            Event::InitDone,
        );
        settle().await;
        assert!(!waiter.is_finished(), "the bindings have not synced");
        assert!(!ctx.state.all_synced());

        list_bindings(&ctx, &[("a", 1)], "Pending");
        settle().await;
        assert!(ctx.state.all_synced());
        assert!(
            waiter.is_finished(),
            "the waiter was not woken by the list that completed the sync"
        );
        assert!(readiness.is_ready(), "the readiness flag follows");
        mirror.abort();
    });
}

/// Discovery publishes the served set before it starts each watch: a served API whose
/// watch has not started yet holds the sync back, or a binding list completing in between
/// would let reconciles run and fail on that cache ("not synced yet").
#[test]
fn a_served_api_whose_watch_has_not_started_holds_the_sync() {
    use super::api_availability::{ApiKind, ServedApis};
    use k8s_openapi::api::core::v1::Namespace;

    runtime().block_on(async {
        let ctx = context();
        *ctx.state.served.write().unwrap() =
            ServedApis::from_kinds([ApiKind::Bindings, ApiKind::ClusterSpiffeIds]);
        ctx.state.caches.namespaces.activate();
        for event in [Event::Init, Event::InitDone] {
            ingest::<Namespace>(
                &ctx,
                &ctx.state.caches.namespaces,
                watches::on_namespace,
                event,
            );
        }
        list_bindings(&ctx, &[("a", 1)], "Pending");
        assert!(
            !ctx.state.all_synced(),
            "the ClusterSPIFFEID watch has not started: not synced"
        );
        let csids = &ctx.state.caches.cluster_spiffe_ids;
        csids.activate();
        assert!(!ctx.state.all_synced(), "started, not listed: not synced");
        csids.apply(Event::Init);
        csids.apply(Event::InitDone);
        assert!(ctx.state.all_synced());
    });
}
