//! The spoke transport against kubesim: every watch and request of a spoke client shares one
//! HTTP/2 connection; an HTTP/1.1-only server still works; a `GOAWAY` mid-watch is survived
//! without relisting; a connection that stops answering is noticed by the HTTP/2 PING and
//! replaced; a rotated client certificate opens a new connection and the old one drains.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kleym_hub::access::ExecApiVersion;
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialMetrics, Keepalive, SpokeClient, SpokeCredentials,
    build_spoke_client,
};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use support::*;
use tokio::sync::mpsc;

const V1: &str = "client.authentication.k8s.io/v1";
/// Far above any deadline under test, far below the transport's 295 s read timeout: only the
/// mechanism under test can end a wait within it.
const PATIENCE: Duration = Duration::from_secs(60);

/// One kubesim cluster with namespaces `ns-0` … `ns-7`.
async fn kubesim() -> (Kubesim, ClusterHandle) {
    let sim = Kubesim::start(&["spoke"], KubesimOptions::default())
        .await
        .unwrap();
    let cluster = sim.cluster("spoke").unwrap();
    let api: Api<Namespace> = Api::all(cluster.in_process_client());
    for i in 0..8 {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(format!("ns-{i}")),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns).await.unwrap();
    }
    (sim, cluster)
}

async fn client_for(
    cluster: &ClusterHandle,
    dir: &std::path::Path,
    opts: ClientOptions,
) -> SpokeClient {
    let s = write_script(dir, "p.sh", &print_token(V1, &cluster.admin_token(), None));
    let mut access = access_for(&s, ExecApiVersion::V1, &cluster.url());
    access.cluster.certificate_authority_pem = Some(cluster.ca_pem().into_bytes().into());
    let creds = Arc::new(SpokeCredentials::new(
        access,
        CacheOptions::default(),
        CredentialMetrics::default(),
    ));
    build_spoke_client(creds, &opts).await.unwrap()
}

/// A watcher on ConfigMaps of `ns`, its events (names, or `init`/`synced`/`error`) sent to
/// the returned channel.
fn watch(client: &kube::Client, ns: &str) -> mpsc::UnboundedReceiver<String> {
    watch_task(client, ns).0
}

/// [`watch`], with its task (abort it to end the watch).
fn watch_task(
    client: &kube::Client,
    ns: &str,
) -> (mpsc::UnboundedReceiver<String>, tokio::task::JoinHandle<()>) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            let name = |cm: &ConfigMap| cm.metadata.name.clone().unwrap_or_default();
            let out = match ev {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitDone) => "synced".to_string(),
                Ok(Event::InitApply(cm) | Event::Apply(cm)) => name(&cm),
                Ok(Event::Delete(cm)) => format!("deleted {}", name(&cm)),
                Err(_) => "error".to_string(),
            };
            if tx.send(out).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

/// Waits for `want` on `rx`, returning everything seen before it.
async fn until(rx: &mut mpsc::UnboundedReceiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(ev) = rx.recv().await {
            if ev == want {
                return;
            }
            seen.push(ev);
        }
        panic!("watch ended before {want:?}; saw {seen:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} within {PATIENCE:?}"));
    seen
}

/// Creates a ConfigMap through kubesim's in-process client: no connection is opened.
async fn create(cluster: &ClusterHandle, ns: &str, name: &str) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.in_process_client(), ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
}

#[tokio::test]
async fn every_watch_and_request_of_a_spoke_shares_one_http2_connection() {
    let (_sim, cluster) = kubesim().await;
    let dir = tempfile::tempdir().unwrap();
    let spoke = client_for(&cluster, dir.path(), ClientOptions::default()).await;
    let client = spoke.client.clone();

    // Eight watches and twenty requests at once, all started before any connection exists.
    let mut watches: Vec<_> = (0..8).map(|i| watch(&client, &format!("ns-{i}"))).collect();
    let gets = (0..20).map(|_| client.apiserver_version());
    for v in futures::future::join_all(gets).await {
        v.unwrap();
    }
    for w in &mut watches {
        until(w, "synced").await;
    }
    create(&cluster, "ns-3", "late").await;
    until(&mut watches[3], "late").await;

    let counts = cluster.server().connections.snapshot();
    assert_eq!(counts.accepted, 1, "{counts:?}");
    assert_eq!(counts.accepted_h2, 1, "{counts:?}");
    assert_eq!(counts.open, 1, "{counts:?}");
}

#[tokio::test]
async fn an_http1_only_server_still_works() {
    let (_sim, cluster) = kubesim().await;
    cluster.faults().set_h1_only(true);
    let dir = tempfile::tempdir().unwrap();
    let spoke = client_for(&cluster, dir.path(), ClientOptions::default()).await;
    let client = spoke.client.clone();

    let mut watches: Vec<_> = (0..3).map(|i| watch(&client, &format!("ns-{i}"))).collect();
    for w in &mut watches {
        until(w, "synced").await;
    }
    client.apiserver_version().await.unwrap();
    create(&cluster, "ns-1", "seen").await;
    until(&mut watches[1], "seen").await;

    let counts = cluster.server().connections.snapshot();
    assert_eq!(counts.accepted_h2, 0, "{counts:?}");
    // HTTP/1.1: a connection per open watch.
    assert!(counts.accepted >= 3, "{counts:?}");
}

#[tokio::test]
async fn a_goaway_mid_watch_resumes_every_watch_without_relisting() {
    let (_sim, cluster) = kubesim().await;
    let dir = tempfile::tempdir().unwrap();
    let spoke = client_for(&cluster, dir.path(), ClientOptions::default()).await;
    let client = spoke.client.clone();
    create(&cluster, "ns-0", "before").await;

    let mut watches: Vec<_> = (0..3).map(|i| watch(&client, &format!("ns-{i}"))).collect();
    for w in &mut watches {
        until(w, "synced").await;
    }
    let before = cluster.server().connections.snapshot();

    assert_eq!(before.open, 1, "{before:?}");

    // The spoke's connection goes away.
    cluster.faults().goaway_next_connections(1);
    tokio::time::timeout(PATIENCE, async {
        while cluster.server().connections.snapshot().goaway_sent < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    // The watches' streams are cut after the grace period; give them time to resume.
    tokio::time::sleep(kubesim::faults::GOAWAY_GRACE * 2).await;

    for i in 0..3 {
        create(&cluster, &format!("ns-{i}"), "after").await;
    }
    for (i, w) in watches.iter_mut().enumerate() {
        let seen = until(w, "after").await;
        // Resumed from its resourceVersion: no new list (`init`), nothing replayed.
        assert!(
            !seen.iter().any(|e| e == "init" || e == "before"),
            "watch {i} relisted or replayed: {seen:?}"
        );
    }
    // Exactly one "before" write happened, and the watches see each new object once.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns-0");
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    let after = cluster.server().connections.snapshot();
    assert_eq!(
        (after.accepted, after.accepted_h2, after.open),
        (2, 2, 1),
        "one new connection after GOAWAY carries every resumed watch: {after:?}"
    );
    // The new connection resumed the TLS session (the client kept the server's ticket).
    assert_eq!(after.resumed, 1, "{after:?}");
}

#[tokio::test]
async fn a_silent_connection_is_noticed_by_the_ping_and_replaced() {
    let (_sim, cluster) = kubesim().await;
    let dir = tempfile::tempdir().unwrap();
    let opts = ClientOptions {
        keepalive: Keepalive {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        },
        ..ClientOptions::default()
    };
    let spoke = client_for(&cluster, dir.path(), opts).await;
    let client = spoke.client.clone();
    let mut watches: Vec<_> = (0..3).map(|i| watch(&client, &format!("ns-{i}"))).collect();
    for w in &mut watches {
        until(w, "synced").await;
    }
    assert_eq!(cluster.server().connections.snapshot().accepted, 1);

    // The open connection stops answering; the socket stays open. Without the PING, only
    // the 295 s read timeout would notice.
    cluster.faults().set_silent_connections(true);
    for w in &mut watches {
        until(w, "error").await;
    }
    // The watchers resume on a new connection (new connections are answered).
    create(&cluster, "ns-2", "recovered").await;
    until(&mut watches[2], "recovered").await;
    client.apiserver_version().await.unwrap();
    let counts = cluster.server().connections.snapshot();
    assert_eq!(counts.accepted, 2, "one replacement connection: {counts:?}");
    // Lifting the silence closes the silenced connection (the client gave up on it).
    cluster.faults().set_silent_connections(false);
    tokio::time::timeout(PATIENCE, async {
        while cluster.server().connections.snapshot().open > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
}

async fn until_open(cluster: &ClusterHandle, open: u64) {
    tokio::time::timeout(PATIENCE, async {
        while cluster.server().connections.snapshot().open != open {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "open connections never {open}: {:?}",
            cluster.server().connections.snapshot()
        )
    });
}

fn write_cert(cluster: &ClusterHandle, dir: &std::path::Path, user: &str) {
    let (cert, key) = cluster
        .issue_client_cert(user, &["system:masters".to_string()])
        .unwrap();
    let doc = serde_json::json!({"apiVersion": V1, "kind": "ExecCredential",
        "status": {"clientCertificateData": cert, "clientKeyData": key}});
    std::fs::write(dir.join("cred.json"), doc.to_string()).unwrap();
}

#[tokio::test]
async fn a_rotated_client_certificate_opens_a_new_connection_and_the_old_one_drains() {
    let (_sim, cluster) = kubesim().await;
    let dir = tempfile::tempdir().unwrap();
    write_cert(&cluster, dir.path(), "hub-a");
    let s = write_script(dir.path(), "p.sh", r#"cat "$KLEYM_TEST_DIR/cred.json""#);
    let mut access = access_for(&s, ExecApiVersion::V1, &cluster.url());
    access.cluster.certificate_authority_pem = Some(cluster.ca_pem().into_bytes().into());
    let creds = Arc::new(SpokeCredentials::new(
        access,
        CacheOptions::default(),
        CredentialMetrics::default(),
    ));
    let old = build_spoke_client(creds.clone(), &ClientOptions::default())
        .await
        .unwrap();
    let (mut old_events, old_watch) = watch_task(&old.client, "ns-0");
    until(&mut old_events, "synced").await;
    assert_eq!(cluster.server().connections.snapshot().accepted, 1);

    // The plugin hands out another certificate and the old one is rejected: rebuild.
    write_cert(&cluster, dir.path(), "hub-b");
    let current = creds.get().await.unwrap();
    creds.invalidate_after_401(current.generation);
    assert!(old.needs_rebuild().await);
    let new = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    let mut new_events = watch(&new.client, "ns-0");
    until(&mut new_events, "synced").await;
    let counts = cluster.server().connections.snapshot();
    assert_eq!((counts.accepted, counts.open), (2, 2), "{counts:?}");

    // The old client's last watch ends and the client goes: its connection closes.
    old_watch.abort();
    drop(old);
    until_open(&cluster, 1).await;
    create(&cluster, "ns-0", "after-rotation").await;
    until(&mut new_events, "after-rotation").await;
}

/// A response body larger than `max_response_bytes` fails its request with the limit named,
/// over HTTP/2 and HTTP/1.1, for kube's client and the reconciler's writes alike, and the
/// server stops sending once the client gave up; a watch's body is not limited by the
/// transport (its lines are, where they are read), and responses under the limit pass.
#[tokio::test]
async fn a_response_body_over_the_limit_fails_its_request_but_a_watch_is_read_on() {
    use kleym_spoke::reconciler::limits::{Oversized, too_large_in};
    use kubesim::faults::EndlessBody;
    let (_sim, cluster) = kubesim().await;
    let dir = tempfile::tempdir().unwrap();
    const LIMIT: u64 = 1024 * 1024;
    const ENDLESS: u64 = 16 * 1024 * 1024;
    let faults = cluster.faults();
    for (verb, resource) in [
        ("list", "configmaps"),
        ("patch", "configmaps"),
        ("watch", "secrets"),
    ] {
        faults.add_endless_body(EndlessBody {
            verb: verb.into(),
            resource: resource.into(),
            bytes: if verb == "watch" { 3 * LIMIT } else { ENDLESS },
        });
    }
    for h1_only in [false, true] {
        faults.set_h1_only(h1_only);
        let opts = ClientOptions {
            max_response_bytes: LIMIT,
            ..ClientOptions::default()
        };
        let spoke = client_for(&cluster, dir.path(), opts).await;
        let client = spoke.client.clone();
        // Under the limit (kubesim's own namespaces and the test's 8).
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let listed = namespaces.list(&ListParams::default()).await.unwrap();
        assert!(listed.items.len() >= 8, "{}", listed.items.len());
        // A list over it.
        let before = faults.endless_stats();
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "ns-0");
        let err = configmaps.list(&ListParams::default()).await.unwrap_err();
        let too_large = too_large_in(&err).unwrap_or_else(|| panic!("h1 {h1_only}: {err}"));
        assert_eq!(
            (too_large.what, too_large.limit),
            (Oversized::ResponseBody, LIMIT)
        );
        assert!(err.to_string().contains("--max-response-mib"), "{err}");
        // A write's response over it, on the reconciler's own way.
        let write = http::Request::patch("/api/v1/namespaces/ns-0/configmaps/x?fieldManager=kleym")
            .header("content-type", "application/apply-patch+yaml")
            .body(b"{}".to_vec())
            .unwrap();
        let writes = spoke.cluster_client().writes.unwrap();
        let err = writes.send_write(write).await.unwrap_err();
        assert!(too_large_in(&err).is_some(), "h1 {h1_only}: {err}");
        // The server stopped sending: both bodies ended long before their 16 MiB.
        let until_ended = async {
            while faults.endless_stats().ended < before.ended + 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, until_ended).await.unwrap();
        let sent = faults.endless_stats().bytes_sent - before.bytes_sent;
        assert!(sent < ENDLESS, "h1 {h1_only}: {sent} bytes sent");
        // A watch's body is read past the limit, to its end.
        let request = http::Request::get("/api/v1/namespaces/ns-0/secrets?watch=true")
            .body(Vec::new())
            .unwrap();
        let mut body = client.request_stream(request).await.unwrap();
        let mut read = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = futures::AsyncReadExt::read(&mut body, &mut buf)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            read += n as u64;
        }
        assert_eq!(read, 3 * LIMIT, "h1 {h1_only}");
    }
}
