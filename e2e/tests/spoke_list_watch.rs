//! The spoke's own list-then-watch loop (`kleym_spoke::reconciler::list_watch`) against
//! kubesim, side by side with kube-runtime's `watcher` it replaces: paged lists, watch
//! events, a watch that ends (resumed, not listed again) and `410 Gone` (listed again) give
//! both the same events in the same order.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use std::sync::{Arc, Mutex};

use kleym_spoke::reconciler::list_watch::{EventHead, Fed, Known, list_watch, list_watch_known};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kubesim::{Kubesim, KubesimOptions};

/// More than two list pages (500 each).
const OBJECTS: usize = 1001;

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm
}

fn describe(item: Result<Event<ConfigMap>, watcher::Error>) -> String {
    match item {
        Ok(Event::Init) => "init".into(),
        Ok(Event::InitApply(o)) => format!("list {}", o.name_any()),
        Ok(Event::InitDone) => "listed".into(),
        Ok(Event::Apply(o)) => format!("apply {}", o.name_any()),
        Ok(Event::Delete(o)) => format!("delete {}", o.name_any()),
        Err(watcher::Error::WatchError(s)) => format!("watch error {}", s.code),
        Err(e) => format!("error {e}"),
    }
}

async fn take<S>(stream: &mut S, n: usize) -> Vec<String>
where
    S: Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
            Ok(Some(item)) => out.push(describe(item)),
            Ok(None) => panic!("stream ended after {out:?}"),
            Err(_) => panic!("no event within 20 s after {} events", out.len()),
        }
    }
    out
}

/// kubesim with one cluster, and the ConfigMaps of its `default` namespace.
async fn configmaps() -> (Kubesim, Api<ConfigMap>) {
    let sim = Kubesim::start(&["spoke"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let cluster = sim.cluster("spoke").expect("cluster");
    let api = Api::namespaced(cluster.kube_client().await.unwrap(), "default");
    (sim, api)
}

fn listing(names: &[String]) -> Vec<String> {
    let mut want = vec!["init".to_string()];
    want.extend(names.iter().map(|n| format!("list {n}")));
    want.push("listed".into());
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_in_pages_watches_resumes_and_lists_again_on_gone_like_kube_runtime() {
    let (sim, api) = configmaps().await;
    let cluster = sim.cluster("spoke").expect("cluster");
    let mut names: Vec<String> = (0..OBJECTS).map(|i| format!("cm-{i:05}")).collect();
    for name in &names {
        api.create(&PostParams::default(), &cm(name)).await.unwrap();
    }

    let mut ours = Box::pin(list_watch(api.clone()));
    let mut theirs = Box::pin(watcher::watcher(api.clone(), watcher::Config::default()));

    // The list, across three pages.
    let want = listing(&names);
    assert_eq!(take(&mut ours, want.len()).await, want);
    assert_eq!(take(&mut theirs, want.len()).await, want);

    // A watch event.
    api.create(&PostParams::default(), &cm("new-1"))
        .await
        .unwrap();
    let want = vec!["apply new-1".to_string()];
    assert_eq!(take(&mut ours, 1).await, want);
    assert_eq!(take(&mut theirs, 1).await, want);

    // Every watch ends: both resume from their resourceVersion, nothing is listed again.
    cluster.faults().drop_watches();
    api.create(&PostParams::default(), &cm("new-2"))
        .await
        .unwrap();
    api.delete("new-1", &DeleteParams::default()).await.unwrap();
    let want = vec!["apply new-2".to_string(), "delete new-1".to_string()];
    assert_eq!(take(&mut ours, 2).await, want);
    assert_eq!(take(&mut theirs, 2).await, want);

    // The next watches get 410 Gone: both report it and list again.
    cluster.faults().force_gone_on_next_watches(2);
    cluster.faults().drop_watches();
    names.push("new-2".into());
    names.sort();
    let mut want = vec!["watch error 410".to_string()];
    want.extend(listing(&names));
    assert_eq!(take(&mut ours, want.len()).await, want);
    assert_eq!(take(&mut theirs, want.len()).await, want);

    // And watch again from the new list.
    api.delete("new-2", &DeleteParams::default()).await.unwrap();
    let want = vec!["delete new-2".to_string()];
    assert_eq!(take(&mut ours, 1).await, want);
    assert_eq!(take(&mut theirs, 1).await, want);
}

/// The echo of a write the caller holds (by name and resourceVersion) comes back as that
/// object, not decoded again; other events, on the same watch, are decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_of_an_object_the_caller_holds_is_handed_back_not_decoded() {
    let (_sim, api) = configmaps().await;
    let held: Arc<Mutex<Option<Arc<ConfigMap>>>> = Arc::default();
    let lookup = Arc::clone(&held);
    let known: Known<ConfigMap> = Arc::new(move |head: &EventHead| {
        let held = lookup.lock().unwrap().clone()?;
        (head.namespace == held.namespace().unwrap_or_default()
            && head.name == held.name_any()
            && Some(&head.resource_version) == held.metadata.resource_version.as_ref())
        .then_some(held)
    });
    let mut stream = Box::pin(list_watch_known(api.clone(), Some(known)));
    let mut next = async || match tokio::time::timeout(Duration::from_secs(20), stream.next()).await
    {
        Ok(Some(Ok(event))) => event,
        other => panic!("no event: {other:?}"),
    };
    assert!(matches!(next().await, Event::Init));
    assert!(matches!(next().await, Event::InitDone));

    // Ours: the write's response is what the watch hands back.
    let written = Arc::new(
        api.create(&PostParams::default(), &cm("mine"))
            .await
            .unwrap(),
    );
    *held.lock().unwrap() = Some(Arc::clone(&written));
    match next().await {
        Event::Apply(Fed::Known(obj)) => assert!(Arc::ptr_eq(&obj, &written)),
        other => panic!("expected our own object, got {other:?}"),
    }
    // Someone else's write to the same object is decoded.
    let mut changed = (*written).clone();
    changed.data = Some([("k".to_string(), "v".to_string())].into());
    api.replace("mine", &PostParams::default(), &changed)
        .await
        .unwrap();
    match next().await {
        Event::Apply(Fed::Decoded(obj)) => {
            assert_eq!(
                obj.data.unwrap_or_default().get("k").map(String::as_str),
                Some("v")
            );
        }
        other => panic!("expected a decoded object, got {other:?}"),
    }
    // And a deletion is always decoded.
    api.delete("mine", &DeleteParams::default()).await.unwrap();
    assert!(matches!(next().await, Event::Delete(Fed::Decoded(_))));
}
