//! Watch: initial state, replay from a resourceVersion, 410, selector transitions,
//! bookmarks, timeouts and closing.

mod common;

use common::*;
use kubesim_store::{DeleteOptions, PatchType, Subresource, WatchOptions};
use serde_json::json;
use std::time::Duration;

fn cm(name: &str, app: &str) -> serde_json::Value {
    json!({"metadata": {"name": name, "labels": {"app": app}}})
}

#[tokio::test]
async fn initial_state_then_live_events() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    c.create(&cms, Some("default"), cm("a", "x"), &opts("t"))
        .unwrap();
    c.create(&cms, Some("kube-system"), cm("b", "x"), &opts("t"))
        .unwrap();
    let mut w = c
        .watch(&cms, Some("default"), &WatchOptions::default())
        .unwrap();
    let ev = next(&mut w).await.unwrap();
    assert_eq!((ev.event_type, name_of(&ev).as_str()), ("ADDED", "a"));
    assert_eq!(ev.object["kind"], "ConfigMap");
    assert!(idle(&mut w).await);
    // other namespaces and other types are not delivered
    c.create(&cms, Some("kube-system"), cm("c", "x"), &opts("t"))
        .unwrap();
    let secrets = res(&c, "", "v1", "secrets");
    c.create(
        &secrets,
        Some("default"),
        json!({"metadata": {"name": "s"}}),
        &opts("t"),
    )
    .unwrap();
    c.create(&cms, Some("default"), cm("d", "x"), &opts("t"))
        .unwrap();
    let ev = next(&mut w).await.unwrap();
    assert_eq!((ev.event_type, name_of(&ev).as_str()), ("ADDED", "d"));
    c.patch(
        &cms,
        Some("default"),
        "d",
        PatchType::Merge,
        &json!({"data": {"k": "v"}}),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert_eq!(next(&mut w).await.unwrap().event_type, "MODIFIED");
    c.delete(&cms, Some("default"), "d", &DeleteOptions::default())
        .unwrap();
    let ev = next(&mut w).await.unwrap();
    assert_eq!(ev.event_type, "DELETED");
    assert_eq!(rv(&ev.object), c.current_resource_version());
}

#[tokio::test]
async fn replay_from_resource_version_and_410_when_expired() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let a = c
        .create(&cms, Some("default"), cm("a", "x"), &opts("t"))
        .unwrap()
        .object;
    c.create(&cms, Some("default"), cm("b", "x"), &opts("t"))
        .unwrap();
    c.delete(&cms, Some("default"), "a", &DeleteOptions::default())
        .unwrap();
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(rv(&a).to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    let e1 = next(&mut w).await.unwrap();
    let e2 = next(&mut w).await.unwrap();
    assert_eq!((e1.event_type, name_of(&e1).as_str()), ("ADDED", "b"));
    assert_eq!((e2.event_type, name_of(&e2).as_str()), ("DELETED", "a"));
    assert!(rv(&e2.object) > rv(&e1.object));
    assert!(idle(&mut w).await);

    // shrink history: an old resourceVersion is now expired
    c.set_history_limit(1);
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(rv(&a).to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    let ev = next(&mut w).await.unwrap();
    assert_eq!(ev.event_type, "ERROR");
    assert_eq!(ev.object["code"], 410);
    assert_eq!(ev.object["reason"], "Expired");
    assert!(
        ev.object["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("too old resource version: {} (", rv(&a))),
        "{}",
        ev.object["message"]
    );
    assert!(next(&mut w).await.is_none());

    // expire_history: even the latest-but-one is gone, the current one still works
    c.set_history_limit(100);
    let cur = c.current_resource_version();
    c.create(&cms, Some("default"), cm("z", "x"), &opts("t"))
        .unwrap();
    c.expire_history();
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(cur.to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(next(&mut w).await.unwrap().event_type, "ERROR");
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(c.current_resource_version().to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(idle(&mut w).await);
    assert_eq!(
        c.watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some("abc".into()),
                ..Default::default()
            }
        )
        .err()
        .unwrap()
        .code,
        400
    );
}

#[tokio::test]
async fn selector_transitions_are_added_and_deleted() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    c.create(&cms, Some("default"), cm("a", "x"), &opts("t"))
        .unwrap();
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                label_selector: Some("app=y".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(idle(&mut w).await);
    let relabel = |app: &str| {
        c.patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"app": app}}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object
    };
    let now_y = relabel("y");
    let ev = next(&mut w).await.unwrap();
    assert_eq!(ev.event_type, "ADDED");
    assert_eq!(rv(&ev.object), rv(&now_y));
    relabel("y2");
    let ev = next(&mut w).await.unwrap();
    assert_eq!(ev.event_type, "DELETED");
    // the previous state, at the event's resourceVersion
    assert_eq!(ev.object["metadata"]["labels"]["app"], "y");
    assert_eq!(rv(&ev.object), c.current_resource_version());
    relabel("z");
    assert!(idle(&mut w).await);
    assert!(
        c.watch(
            &cms,
            None,
            &WatchOptions {
                label_selector: Some("a b".into()),
                ..Default::default()
            }
        )
        .is_err()
    );
}

#[tokio::test]
async fn bookmarks_and_initial_events_end() {
    let c = cluster();
    c.set_bookmark_interval(Duration::from_millis(20));
    let cms = res(&c, "", "v1", "configmaps");
    c.create(&cms, Some("default"), cm("a", "x"), &opts("t"))
        .unwrap();
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                allow_bookmarks: true,
                send_initial_events: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(next(&mut w).await.unwrap().event_type, "ADDED");
    let end = next(&mut w).await.unwrap();
    assert_eq!(end.event_type, "BOOKMARK");
    assert_eq!(
        end.object["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(rv(&end.object), c.current_resource_version());
    c.create(&cms, Some("default"), cm("b", "x"), &opts("t"))
        .unwrap();
    let added = next(&mut w).await.unwrap();
    assert_eq!(added.event_type, "ADDED");
    let bm = next(&mut w).await.unwrap();
    assert_eq!(bm.event_type, "BOOKMARK");
    assert_eq!(bm.object["kind"], "ConfigMap");
    assert!(bm.object["metadata"].get("annotations").is_none());
    assert!(rv(&bm.object) >= rv(&added.object));
}

#[tokio::test]
async fn timeout_and_close_end_streams() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    tokio::time::pause();
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                timeout_seconds: Some(30),
                ..Default::default()
            },
        )
        .unwrap();
    // auto-advancing paused time: the timeout fires without waiting 30 s
    let started = tokio::time::Instant::now();
    assert!(futures::StreamExt::next(&mut w).await.is_none());
    assert!(started.elapsed() >= Duration::from_secs(30));
    tokio::time::resume();

    let mut w1 = c.watch(&cms, None, &WatchOptions::default()).unwrap();
    let mut w2 = c
        .watch(&cms, Some("default"), &WatchOptions::default())
        .unwrap();
    assert_eq!(c.watcher_count(), 2);
    c.close_watches();
    assert!(next(&mut w1).await.is_none());
    assert!(next(&mut w2).await.is_none());
    assert_eq!(c.watcher_count(), 0);
    // dropping a stream unregisters it on the next event
    let w3 = c.watch(&cms, None, &WatchOptions::default()).unwrap();
    drop(w3);
    assert_eq!(c.watcher_count(), 0);
}

#[tokio::test]
async fn events_are_shared_between_core_and_events_k8s_io() {
    let c = cluster();
    let core = res(&c, "", "v1", "events");
    let v1 = res(&c, "events.k8s.io", "v1", "events");
    let mut w = c
        .watch(&core, Some("default"), &WatchOptions::default())
        .unwrap();
    let created = c
        .create(
            &v1,
            Some("default"),
            json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "e1"},
                "regarding": {"kind": "ConfigMap", "name": "cm", "namespace": "default"},
                "note": "refused", "reason": "DuplicateSPIFFEID", "type": "Warning",
                "reportingController": "kleym", "reportingInstance": "kleym-0", "action": "Reconcile",
            }),
            &opts("kleym"),
        )
        .unwrap()
        .object;
    assert_eq!(created["apiVersion"], "events.k8s.io/v1");
    assert_eq!(created["note"], "refused");
    let as_core = c.get(&core, Some("default"), "e1").unwrap();
    assert_eq!(as_core["apiVersion"], "v1");
    assert_eq!(as_core["involvedObject"]["name"], "cm");
    assert_eq!(as_core["message"], "refused");
    assert_eq!(as_core["reportingComponent"], "kleym");
    let ev = next(&mut w).await.unwrap();
    assert_eq!(ev.object["involvedObject"]["kind"], "ConfigMap");
    let sel = |r: &kubesim_store::ResourceInfo, f: &str| {
        c.list(
            r,
            None,
            &kubesim_store::ListOptions {
                field_selector: Some(f.into()),
                ..Default::default()
            },
        )
        .unwrap()["items"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(sel(&core, "involvedObject.name=cm"), 1);
    assert_eq!(sel(&v1, "regarding.name=cm,reportingController=kleym"), 1);
    assert_eq!(sel(&v1, "regarding.name=other"), 0);
    // a merge patch through events.k8s.io updates the shared object
    c.patch(
        &v1,
        Some("default"),
        "e1",
        PatchType::Merge,
        &json!({"deprecatedCount": 2}),
        Subresource::Main,
        &opts("kleym"),
    )
    .unwrap();
    assert_eq!(c.get(&core, Some("default"), "e1").unwrap()["count"], 2);
    assert_eq!(next(&mut w).await.unwrap().event_type, "MODIFIED");
}

#[tokio::test]
async fn history_is_bounded_per_cluster_across_types() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let secrets = res(&c, "", "v1", "secrets");
    c.set_history_limit(5);
    let a = c
        .create(&cms, Some("default"), cm("a", "x"), &opts("t"))
        .unwrap()
        .object;
    c.create(&cms, Some("default"), cm("b", "x"), &opts("t"))
        .unwrap();
    // still within the limit: replay works
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(rv(&a).to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(name_of(&next(&mut w).await.unwrap()), "b");
    // five writes to another type push the configmap events out
    for i in 0..5 {
        c.create(
            &secrets,
            Some("default"),
            json!({"metadata": {"name": format!("s{i}")}}),
            &opts("t"),
        )
        .unwrap();
    }
    let mut w = c
        .watch(
            &cms,
            None,
            &WatchOptions {
                resource_version: Some(rv(&a).to_string()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(next(&mut w).await.unwrap().event_type, "ERROR");
}
