//! ClusterProfile v1alpha2 end to end: the hub reads v1alpha2 when the hub cluster serves it
//! (cluster-inventory-api v0.2.0's two-version CRD), a fleet written through v1alpha2 (or
//! partly through v1alpha1) converges, and a CRD upgraded from v1alpha1-only to two versions
//! while the hub runs is picked up without a restart and without re-engaging a spoke whose
//! effective access did not change; a spoke reached only through the deprecated
//! `credentialProviders` is refused once v1alpha2 is read.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kleym_api::external::clusterprofile::ClusterProfileVersion;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, status};
use kleym_e2e::fixtures::token_spoke::{init_test_logs, prepare_token_spoke};
use kleym_hub::fleet::PROFILE_FINALIZER;
use kleym_hub::fleet::{FleetState, Phase, SpokeState};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kubesim::ClusterHandle;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const BINDINGS: usize = 2;
const T0: &str = "2026-01-01T00:00:00Z";
const TOKEN: &str = "tok-versions-0123456789";
const CRD_NAME: &str = "clusterprofiles.multicluster.x-k8s.io";

/// Replaces the hub's ClusterProfile CRD with cluster-inventory-api v0.2.0's (v1alpha1 and
/// v1alpha2), through the API as `kubectl apply` of the new CRD would.
/// `spoke` accepts [`TOKEN`] as an admin and holds the bindings to converge.
fn prepare(spoke: &ClusterHandle) {
    prepare_token_spoke(spoke, TOKEN, BINDINGS, BINDINGS).unwrap();
}

async fn upgrade_crd(hub: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(hub.clone());
    let current = api.get(CRD_NAME).await.unwrap();
    let new: Vec<Value> = kubesim::parse_crds(
        "clusterprofiles",
        upstream_crds::CLUSTERPROFILE_V1ALPHA2.yaml,
    )
    .unwrap();
    let mut new: CustomResourceDefinition = serde_json::from_value(new[0].clone()).unwrap();
    new.metadata.resource_version = current.metadata.resource_version;
    api.replace(CRD_NAME, &PostParams::default(), &new)
        .await
        .unwrap();
}

/// Creates (or updates) the profile `name` through `version` and sets its status.
async fn put_profile(
    hub: &kube::Client,
    version: ClusterProfileVersion,
    name: &str,
    status: Value,
) {
    let ar = version.api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), PROFILE_NS, &ar);
    if api.get_opt(name).await.unwrap().is_none() {
        let cp: DynamicObject = serde_json::from_value(json!({
            "apiVersion": version.api_version(),
            "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": PROFILE_NS},
            "spec": {"clusterManager": {"name": "kleym-e2e"}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &cp).await.unwrap();
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
    .unwrap();
}

/// A healthy status reaching `spoke` through the provider `ok`, in `accessProviders`, or in
/// the deprecated `credentialProviders` only.
fn reach(spoke: &ClusterHandle, deprecated_field: bool) -> Value {
    let mut s = status(vec![access_provider("ok", spoke, None)], true, T0, &[]);
    if deprecated_field {
        let providers = s["accessProviders"].take();
        s["credentialProviders"] = providers;
        if let Some(o) = s.as_object_mut() {
            o.remove("accessProviders");
        }
    }
    s
}

async fn wait_phase(state: &FleetState, spoke: &str, phase: Phase) -> SpokeState {
    wait_for(&format!("{spoke} {phase:?}"), LIMIT, || {
        let state = state.clone();
        let spoke = spoke.to_string();
        async move { state.get(&spoke).filter(|s| s.phase == phase) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", state.spokes()))
}

async fn wait_converged(spoke: &ClusterHandle) {
    let store = spoke.store();
    wait_for(&format!("{} converged", spoke.name()), LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS).then_some(()) }
    })
    .await
    .unwrap();
}

fn hub_flags(plugin: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut flags = vec![
        "--clusterprofile-access-provider".to_string(),
        format!("ok={}", plugin.display()),
        "--trust-domain".into(),
        "e2e.example".into(),
        "--leader-elect=false".into(),
    ];
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_written_through_v1alpha2_and_v1alpha1_converges_read_as_v1alpha2() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let names = ["new-1", "new-2", "old-1", "legacy"];
    let f = FleetHarness::start(&names, dir.path()).await.unwrap();
    upgrade_crd(&f.hub_client).await;
    for n in names {
        prepare(&f.spoke(n));
    }
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    // Two profiles written as v1alpha2, one as v1alpha1 (a cluster manager not moved yet),
    // and one whose only access is v1alpha1's deprecated credentialProviders.
    let v2 = ClusterProfileVersion::V1alpha2;
    let v1 = ClusterProfileVersion::V1alpha1;
    put_profile(&f.hub_client, v2, "new-1", reach(&f.spoke("new-1"), false)).await;
    put_profile(&f.hub_client, v2, "new-2", reach(&f.spoke("new-2"), false)).await;
    put_profile(&f.hub_client, v1, "old-1", reach(&f.spoke("old-1"), false)).await;
    put_profile(&f.hub_client, v1, "legacy", reach(&f.spoke("legacy"), true)).await;

    let hub = f.start_hub(&hub_flags(&plugin, &[])).await.unwrap();
    let state = hub.handle.state.clone();
    for n in ["new-1", "new-2", "old-1"] {
        wait_converged(&f.spoke(n)).await;
        wait_phase(&state, &format!("{PROFILE_NS}/{n}"), Phase::Engaged).await;
    }
    assert_eq!(
        hub.handle.inventory_version.current(),
        Some(ClusterProfileVersion::V1alpha2)
    );
    // Read through v1alpha2, the deprecated field does not exist: no provider.
    let legacy = wait_phase(&state, "fleet/legacy", Phase::Refused).await;
    assert!(
        legacy.reason.as_deref().unwrap_or("").contains("offers []"),
        "{:?}",
        legacy.reason
    );
    assert!(env::csid_names(&f.spoke("legacy").store()).is_empty());
    // The finalizer was written through v1alpha2 and reads the same through v1alpha1.
    for version in ClusterProfileVersion::ALL {
        let api: Api<DynamicObject> =
            Api::namespaced_with(f.hub_client.clone(), PROFILE_NS, &version.api_resource());
        for n in ["new-1", "new-2", "old-1"] {
            let cp = api.get(n).await.unwrap();
            assert!(
                cp.metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|x| x == PROFILE_FINALIZER),
                "{n} through {version}"
            );
        }
    }
    hub.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_upgraded_during_a_run_is_read_as_v1alpha2_without_reengaging() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "legacy", "late"];
    let f = FleetHarness::start(&names, dir.path()).await.unwrap();
    for n in names {
        prepare(&f.spoke(n));
    }
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let v1 = ClusterProfileVersion::V1alpha1;
    put_profile(&f.hub_client, v1, "a", reach(&f.spoke("a"), false)).await;
    // b lists its provider in both fields (a manager writing both during the deprecation):
    // its effective access is the same through either version.
    let mut both = reach(&f.spoke("b"), false);
    both["credentialProviders"] = both["accessProviders"].clone();
    put_profile(&f.hub_client, v1, "b", both).await;
    put_profile(&f.hub_client, v1, "legacy", reach(&f.spoke("legacy"), true)).await;

    let hub = f
        .start_hub(&hub_flags(
            &plugin,
            &["--clusterprofile-discovery-interval-seconds", "1"],
        ))
        .await
        .unwrap();
    let state = hub.handle.state.clone();
    for n in ["a", "b", "legacy"] {
        wait_converged(&f.spoke(n)).await;
        wait_phase(&state, &format!("{PROFILE_NS}/{n}"), Phase::Engaged).await;
    }
    assert_eq!(
        hub.handle.inventory_version.current(),
        Some(ClusterProfileVersion::V1alpha1),
        "only v1alpha1 is served"
    );
    let engagements = |n: &str| state.get(&format!("{PROFILE_NS}/{n}")).unwrap().engagements;
    assert_eq!((engagements("a"), engagements("b")), (1, 1));

    upgrade_crd(&f.hub_client).await;
    let version = hub.handle.inventory_version.clone();
    wait_for("the hub reads v1alpha2", LIMIT, || {
        let version = version.clone();
        async move { (version.current() == Some(ClusterProfileVersion::V1alpha2)).then_some(()) }
    })
    .await
    .unwrap();
    // legacy's access was credentialProviders alone: refused now, as v1alpha2 says.
    wait_phase(&state, "fleet/legacy", Phase::Refused).await;
    // A profile added after the switch is seen by the new watch; events come in order, so
    // once it is engaged the new watch's listing of a and b has been handled too.
    put_profile(
        &f.hub_client,
        ClusterProfileVersion::V1alpha2,
        "late",
        reach(&f.spoke("late"), false),
    )
    .await;
    wait_converged(&f.spoke("late")).await;
    wait_phase(&state, "fleet/late", Phase::Engaged).await;
    for n in ["a", "b"] {
        let s = state.get(&format!("{PROFILE_NS}/{n}")).unwrap();
        assert_eq!(s.phase, Phase::Engaged, "{n}");
        assert_eq!(s.engagements, 1, "{n} was re-engaged");
    }
    hub.stop().await.unwrap();
}
