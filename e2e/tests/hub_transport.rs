//! The hub's spoke transport end to end: an engaged spoke (its reconciler's watches, the
//! hub's probes and writes) holds one HTTP/2 connection, and a `GOAWAY` on it is survived:
//! the watches resume on one new connection and a new binding then costs exactly its three
//! writes (finalizer, ClusterSPIFFEID apply, status apply), nothing written twice.

use std::time::Duration;

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kleym_hub::fleet::Phase;
use serde_json::json;

const TOKEN: &str = "tok-transport-0123456789";
const BINDINGS: usize = 5;
const LIMIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engaged_spoke_holds_one_connection_and_survives_goaway_without_duplicate_writes() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["s1"], dir.path()).await.unwrap();
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str()}}]})
        .to_string(),
    )
    .unwrap();
    let spoke = f.spoke("s1");
    register_admin_token_spoke(
        &f.hub_client,
        "s1",
        &spoke,
        "ok",
        TOKEN,
        BINDINGS + 1,
        0..BINDINGS,
    )
    .await
    .unwrap();
    let flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        pf.display().to_string(),
        "--trust-domain".into(),
        "fleet.example".into(),
        "--leader-elect=false".into(),
    ];
    let hub = f.start_hub(&flags).await.unwrap();
    let store = spoke.store();
    let state = hub.handle.state.clone();
    wait_for("engaged and converged", LIMIT, || {
        let (store, state) = (store.clone(), state.clone());
        async move {
            let engaged = state.get("fleet/s1")?.phase == Phase::Engaged;
            (engaged && env::converged(&store, BINDINGS)).then_some(())
        }
    })
    .await
    .unwrap();

    let connections = || spoke.server().connections.snapshot();
    let engaged = connections();
    println!("engaged spoke: {engaged:?}");
    assert_eq!(engaged.open, 1, "one open connection: {engaged:?}");
    assert_eq!(engaged.accepted_h2, engaged.accepted, "{engaged:?}");

    // GOAWAY on the spoke's connection, mid-watch.
    spoke.requests().clear();
    spoke.faults().goaway_next_connections(1);
    wait_for("GOAWAY sent", LIMIT, || async {
        (connections().goaway_sent == 1).then_some(())
    })
    .await
    .unwrap();
    wait_for("the old connection closed", LIMIT, || async {
        (connections().accepted > engaged.accepted && connections().open == 1).then_some(())
    })
    .await
    .unwrap();

    env::create_bindings(&store, BINDINGS..BINDINGS + 1).unwrap();
    wait_for("the new binding converged", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS + 1).then_some(()) }
    })
    .await
    .unwrap();
    // Let any straggling write land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes: Vec<String> = spoke
        .requests()
        .entries()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect();
    assert_eq!(
        writes.len(),
        3,
        "finalizer, ClusterSPIFFEID apply, status apply, once each: {writes:#?}"
    );
    let after = connections();
    assert_eq!(
        (after.accepted, after.accepted_h2, after.open),
        (engaged.accepted + 1, engaged.accepted + 1, 1),
        "one new HTTP/2 connection carries every resumed watch: {after:?}"
    );
    hub.stop().await.unwrap();
}
