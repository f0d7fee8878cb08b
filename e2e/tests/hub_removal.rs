//! Profile deletion honours `--removal-policy`: `Orphan` stops managing the spoke and removes
//! kleym's finalizers but keeps the ClusterSPIFFEIDs; `Cleanup` also deletes the
//! ClusterSPIFFEIDs kleym created (UID-proven) and leaves foreign ones alone.

use std::time::Duration;

use kleym_e2e::fleet::env;
use kleym_e2e::fleet::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fleet::plugins::static_token_plugin;
use kleym_e2e::fleet::profiles::{delete_profile, register_admin_token_spoke};
use kubesim_store::WriteOptions;
use serde_json::json;

const BINDINGS: usize = 3;
const TOKEN: &str = "tok-removal-0123456789";
const LIMIT: Duration = Duration::from_secs(60);

fn has_our_finalizer(b: &serde_json::Value) -> bool {
    b["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "kleym.io/cleanup"))
}

async fn engage(f: &FleetHarness, spoke: &str, policy: &str) -> RunningHub {
    let s = f.spoke(spoke);
    let plugin = static_token_plugin(&f.dir, "ok.sh", TOKEN, None).unwrap();
    let pf = f.dir.join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    register_admin_token_spoke(
        &f.hub_client,
        spoke,
        &s,
        "ok",
        TOKEN,
        BINDINGS + 1,
        0..BINDINGS,
    )
    .await
    .unwrap();
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "fleet.example".into(),
            "--leader-elect=false".into(),
            "--removal-policy".into(),
            policy.into(),
        ])
        .await
        .unwrap();
    let store = s.store();
    wait_for("converged with finalizers", LIMIT, || {
        let store = store.clone();
        async move {
            (env::converged(&store, BINDINGS)
                && env::bindings(&store).iter().all(has_our_finalizer))
            .then_some(())
        }
    })
    .await
    .unwrap();
    hub
}

async fn delete_and_wait(f: &FleetHarness, hub: &RunningHub, spoke: &str) {
    delete_profile(&f.hub_client, spoke).await.unwrap();
    let state = hub.handle.state.clone();
    let name = format!("fleet/{spoke}");
    wait_for("spoke forgotten after removal", LIMIT, || {
        let state = state.clone();
        let name = name.clone();
        async move { state.get(&name).is_none().then_some(()) }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_keeps_identities_and_drops_finalizers() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "orphan").await;
    let store = f.spoke("spoke").store();
    let before = env::csid_names(&store);
    delete_and_wait(&f, &hub, "spoke").await;

    assert!(env::bindings(&store).iter().all(|b| !has_our_finalizer(b)));
    assert_eq!(
        env::csid_names(&store),
        before,
        "Orphan keeps the ClusterSPIFFEIDs"
    );
    // No longer managed: a new binding gets no ClusterSPIFFEID.
    env::create_bindings(&store, BINDINGS..BINDINGS + 1).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!env::csid_names(&store).contains(&env::csid_name(BINDINGS)));
    hub.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_only_what_kleym_created() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let spoke = f.spoke("spoke");
    let store = spoke.store();
    // A ClusterSPIFFEID kleym did not create.
    let res = store
        .resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
        .unwrap();
    store
        .create(
            &res,
            None,
            json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
                   "metadata": {"name": "foreign"},
                   "spec": {"spiffeIDTemplate": "spiffe://other.example/x"}}),
            &WriteOptions::default(),
        )
        .unwrap();
    let hub = engage(&f, "spoke", "cleanup").await;
    delete_and_wait(&f, &hub, "spoke").await;

    assert!(env::bindings(&store).iter().all(|b| !has_our_finalizer(b)));
    let left = env::csid_names(&store);
    assert_eq!(left.into_iter().collect::<Vec<_>>(), ["foreign"]);
    assert_eq!(
        env::bindings(&store).len(),
        BINDINGS,
        "bindings themselves stay"
    );
    hub.stop().await.unwrap();
}
