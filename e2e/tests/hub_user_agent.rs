//! Every request a hub replica sends to a spoke names the replica in its `User-Agent`
//! (`kleym-hub/<version> (replica <identity>)`), so a spoke's audit log (kubesim's request
//! log) tells replicas apart; and since kube-apiserver derives a write's default field
//! manager from the user agent, every write kleym makes names its field manager itself: the
//! ClusterSPIFFEIDs stay proven kleym's (`ownership::verify` with kleym's field manager), and
//! no object carries a manager derived from the user agent. The removal job's finalizer
//! patch (the hub's own write, not the reconciler's) is among the writes checked.

use std::time::Duration;

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::{delete_profile, register_admin_token_spoke};
use kleym_spoke::ownership::{self, Owner};
use kleym_spoke::reconciler::context::DEFAULT_FIELD_MANAGER;
use serde_json::{Value, json};

const TOKEN: &str = "tok-user-agent-0123456789";
const LIMIT: Duration = Duration::from_secs(60);
const BINDINGS: usize = 2;
/// The replica's `--instance`, the prefix of its identity.
const INSTANCE: &str = "replica-ua";

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_names_the_replica_and_writes_keep_kleyms_field_manager() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let spoke = f.spoke("spoke");
    let store = spoke.store();
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
        "spoke",
        &spoke,
        "ok",
        TOKEN,
        BINDINGS,
        0..BINDINGS,
    )
    .await
    .unwrap();
    spoke.requests().clear();
    let flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--leader-elect=false",
        "--removal-policy",
        "orphan",
        "--instance",
        INSTANCE,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let hub = f.start_hub(&flags).await.unwrap();
    wait_for("converged", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS).then_some(()) }
    })
    .await
    .unwrap();

    // The ClusterSPIFFEIDs are proven kleym's on the objects alone.
    let bindings = env::bindings(&store);
    for i in 0..BINDINGS {
        let b = bindings
            .iter()
            .find(|b| b["metadata"]["name"] == env::binding_name(i).as_str())
            .unwrap_or_else(|| panic!("no binding {}", env::binding_name(i)));
        let owner = Owner {
            namespace: env::NS.to_string(),
            name: env::binding_name(i),
            uid: b["metadata"]["uid"].as_str().unwrap().to_string(),
        };
        let csid = env::csids(&store)
            .into_iter()
            .find(|c| c["metadata"]["name"] == env::csid_name(i).as_str())
            .unwrap_or_else(|| panic!("no ClusterSPIFFEID {}", env::csid_name(i)));
        let typed: ClusterSPIFFEID = serde_json::from_value(csid).unwrap();
        ownership::verify(&typed, DEFAULT_FIELD_MANAGER, &owner)
            .unwrap_or_else(|e| panic!("binding {}: not proven kleym's: {e:?}", owner.name));
    }

    // Orphan removal: the hub's removal job patches the bindings' finalizers away.
    delete_profile(&f.hub_client, "spoke").await.unwrap();
    wait_for("finalizers removed", LIMIT, || {
        let store = store.clone();
        async move {
            env::bindings(&store)
                .iter()
                .all(|b| {
                    b["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(Vec::is_empty)
                })
                .then_some(())
        }
    })
    .await
    .unwrap();
    hub.stop().await.unwrap();

    // Every request names this replica, with one identity for the whole process.
    let log = spoke.requests().entries();
    let prefix = format!(
        "kleym-hub/{} (replica {INSTANCE}_",
        env!("CARGO_PKG_VERSION")
    );
    let agents: std::collections::BTreeSet<Option<String>> =
        log.iter().map(|r| r.user_agent.clone()).collect();
    assert_eq!(
        agents.len(),
        1,
        "one user agent for the whole process: {agents:?}"
    );
    let agent = agents.into_iter().next().flatten().expect("a user agent");
    assert!(
        agent.starts_with(&prefix) && agent.ends_with(')'),
        "{agent:?} does not name the replica as {prefix}<suffix>)"
    );
    let writes: Vec<_> = log
        .iter()
        .filter(|r| matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE"))
        .collect();
    assert!(
        writes
            .iter()
            .any(|r| r.method == "PATCH" && r.path.contains("/inferenceidentitybindings/")),
        "the finalizer patches are in the log: {writes:?}"
    );

    // No binding or ClusterSPIFFEID carries a manager the API server derived from the user
    // agent (`kleym-hub`): kleym named its own on every write.
    let derived = prefix.split('/').next().unwrap().to_string();
    for obj in env::bindings(&store)
        .iter()
        .chain(env::csids(&store).iter())
    {
        let m = managers(obj);
        assert!(
            !m.contains(&derived),
            "{}: managers {m:?}",
            obj["metadata"]["name"]
        );
    }
    assert!(
        env::csids(&store)
            .iter()
            .all(|c| managers(c).iter().any(|m| m == DEFAULT_FIELD_MANAGER))
    );
}
