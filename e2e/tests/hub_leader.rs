//! Leader election: of two hub replicas only the Lease holder engages spokes; the standby
//! never even runs its credential plugin (so it cannot write). When the leader stops it
//! releases the Lease and the standby takes over and converges new bindings.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kleym_e2e::fleet::env;
use kleym_e2e::fleet::harness::{FleetHarness, HUB_NS, wait_for};
use kleym_e2e::fleet::plugins::{count_runs, static_token_plugin};
use kleym_e2e::fleet::profiles::register_admin_token_spoke;
use kleym_hub::fleet::Phase;
use kube::Api;
use serde_json::json;

const TOKEN: &str = "tok-leader-0123456789";
const LIMIT: Duration = Duration::from_secs(60);

fn flags(pf: &std::path::Path) -> Vec<String> {
    [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--namespace",
        HUB_NS,
        "--lease-duration-seconds",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_engages_and_the_standby_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, 3, 0..1)
        .await
        .unwrap();
    let store = s.store();
    // Each replica has its own plugin script so their execs can be told apart.
    let mut pfs = Vec::new();
    let mut counts = Vec::new();
    for r in ["a", "b"] {
        let count = dir.path().join(format!("{r}.count"));
        let plugin =
            static_token_plugin(dir.path(), &format!("{r}.sh"), TOKEN, Some(&count)).unwrap();
        let pf = dir.path().join(format!("{r}.json"));
        std::fs::write(&pf, json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]}).to_string()).unwrap();
        pfs.push(pf);
        counts.push(count);
    }

    let a = f.start_hub(&flags(&pfs[0])).await.unwrap();
    let a_state = a.handle.state.clone();
    wait_for("replica a leads", LIMIT, || {
        let st = a_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    let b = f.start_hub(&flags(&pfs[1])).await.unwrap();
    wait_for("binding 0 compiled by the leader", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 1).then_some(()) }
    })
    .await
    .unwrap();
    let b_state = b.handle.state.clone();
    wait_for("replica b lists the profile as standby", LIMIT, || {
        let st = b_state.clone();
        async move { (st.get("fleet/spoke")?.phase == Phase::Standby).then_some(()) }
    })
    .await
    .unwrap();
    // A second binding is compiled while both run; b still never ran its plugin.
    env::create_bindings(&store, 1..2).unwrap();
    wait_for("binding 1 compiled", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 2).then_some(()) }
    })
    .await
    .unwrap();
    assert!(!b_state.is_leader());
    assert_eq!(
        count_runs(&counts[1]),
        0,
        "the standby never exec'ed (never contacted a spoke)"
    );
    assert_eq!(count_runs(&counts[0]), 1);
    let leases: Api<Lease> = Api::namespaced(f.hub_client.clone(), HUB_NS);
    let holder = leases
        .get("kleym-hub")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert!(holder.is_some());

    // The leader stops (releasing the Lease): the standby takes over.
    a.stop().await.unwrap();
    wait_for("replica b leads", LIMIT, || {
        let st = b_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    env::create_bindings(&store, 2..3).unwrap();
    wait_for("binding 2 compiled by the new leader", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 3).then_some(()) }
    })
    .await
    .unwrap();
    assert!(count_runs(&counts[1]) >= 1);
    let new_holder = leases
        .get("kleym-hub")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_ne!(new_holder, holder);
    b.stop().await.unwrap();
}
