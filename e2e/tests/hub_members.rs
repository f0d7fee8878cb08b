//! One member cluster, several ClusterProfiles (same `multicluster.x-k8s.io/inventory-member-id`):
//! the hub engages the cluster once, through the oldest usable profile, marks the other
//! `Duplicate` naming it, and the report counts the cluster once with no drift; deleting the
//! chosen profile hands the cluster over to the other without any cleanup of its identities
//! (even under `--removal-policy cleanup`, which would delete them if the cluster left).

use std::time::Duration;

use kleym_api::external::clusterprofile::INVENTORY_MEMBER_ID_LABEL;
use kleym_api::hub_status::reasons;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::plugins::{count_runs, static_token_plugin};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, status};
use kleym_e2e::fixtures::token_spoke::{init_test_logs, prepare_token_spoke};
use kleym_hub::fleet::{FleetState, Phase, SpokeState};
use kleym_hub::report::from_fleet::observations;
use kleym_hub::report::{FullReport, cluster_status};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kubesim::ClusterHandle;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const BINDINGS: usize = 3;
const TOKEN: &str = "tok-members-0123456789";
const MEMBER: &str = "east.k8s.example.com";

/// Creates the profile `name` (labelled with `member`) and sets its status.
/// `spoke` accepts [`TOKEN`] as an admin and holds the bindings to converge.
fn prepare(spoke: &ClusterHandle) {
    prepare_token_spoke(spoke, TOKEN, BINDINGS + 1, BINDINGS).unwrap();
}

async fn put_profile(hub: &kube::Client, name: &str, member: Option<&str>, status: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        hub.clone(),
        PROFILE_NS,
        &kleym_api::external::clusterprofile::ClusterProfileVersion::V1alpha1.api_resource(),
    );
    let labels = match member {
        Some(m) => json!({INVENTORY_MEMBER_ID_LABEL: m}),
        None => json!({}),
    };
    let cp: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": PROFILE_NS, "labels": labels},
        "spec": {"clusterManager": {"name": name}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cp).await.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
    .unwrap();
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

/// `kleym_hub_spoke_engage_duration_seconds` counts `engagements` and its sum is in seconds:
/// more than 0, and no more than the test has run (milliseconds would be ~1000 times that).
fn assert_engage_histogram_in_seconds(state: &FleetState, engagements: u64, ran: Duration) {
    let mut registry = prometheus_client::registry::Registry::default();
    kleym_hub::fleet::FleetMetrics::register_engage(&mut registry, state);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let count = value("kleym_hub_spoke_engage_duration_seconds_count");
    let sum = value("kleym_hub_spoke_engage_duration_seconds_sum");
    assert_eq!(count, engagements as f64, "{text}");
    assert!(
        sum > 0.0 && sum <= ran.as_secs_f64(),
        "sum {sum} s after {ran:?}: not seconds\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_listed_twice_is_engaged_once_and_handed_over_without_cleanup() {
    init_test_logs();
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["east"], dir.path()).await.unwrap();
    let east = f.spoke("east");
    prepare(&east);
    let execs = dir.path().join("execs");
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, Some(&execs)).unwrap();
    let reach = status(
        vec![access_provider("ok", &east, None)],
        true,
        "2026-01-01T00:00:00Z",
        &[],
    );
    // Two cluster managers list the same cluster; "ocm" first (older).
    put_profile(&f.hub_client, "east-ocm", Some(MEMBER), reach.clone()).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // creationTimestamp has 1 s resolution
    put_profile(&f.hub_client, "east-capi", Some(MEMBER), reach.clone()).await;

    let hub = f
        .start_hub(&[
            "--clusterprofile-access-provider".into(),
            format!("ok={}", plugin.display()),
            "--trust-domain".into(),
            "e2e.example".into(),
            "--leader-elect=false".into(),
            "--removal-policy".into(),
            "cleanup".into(),
        ])
        .await
        .unwrap();
    let state = hub.handle.state.clone();
    let store = east.store();
    wait_for("east converged", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS).then_some(()) }
    })
    .await
    .unwrap();
    let chosen = wait_phase(&state, "fleet/east-ocm", Phase::Engaged).await;
    let dup = wait_phase(&state, "fleet/east-capi", Phase::Duplicate).await;
    assert_eq!(chosen.engagements, 1);
    assert_engage_histogram_in_seconds(&state, 1, started.elapsed());
    assert_eq!(dup.engagements, 0, "the duplicate was never engaged");
    let of = dup.duplicate_of.clone().unwrap();
    assert_eq!(
        (of.cluster_profile.as_str(), of.member_id.as_str()),
        ("fleet/east-ocm", MEMBER)
    );
    // One engagement, so one credential exec (a second engagement of the same access would
    // share the cache, so the engagement counts above are the real proof).
    assert_eq!(count_runs(&execs), 1);

    // The report counts the cluster once, with no drift of the member with itself.
    let report = FullReport::from_fleet(&state, chrono::Utc::now());
    assert_eq!(report.summary.clusters.total, 1);
    assert_eq!(report.summary.clusters.duplicates, 1);
    assert_eq!(report.summary.bindings, BINDINGS as i64);
    assert!(
        report.summary.findings.is_empty(),
        "{:?}",
        report.summary.findings
    );
    let dup_obs = observations(&state)
        .into_iter()
        .find(|o| o.cluster == "fleet/east-capi")
        .unwrap();
    let dup_status = cluster_status(&dup_obs, chrono::Utc::now(), None);
    let ready = dup_status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, reasons::DUPLICATE);
    assert!(
        ready.message.contains("fleet/east-ocm"),
        "{}",
        ready.message
    );

    // Hand-over: the chosen profile is deleted. Cleanup would delete kleym's
    // ClusterSPIFFEIDs if the cluster left the fleet; it does not leave.
    let csids = env::csid_names(&store);
    assert_eq!(csids.len(), BINDINGS);
    let csid_writes = || {
        store
            .write_counts()
            .get("clusterspiffeids.spire.spiffe.io")
            .copied()
    };
    let writes_before = csid_writes();
    let api: Api<DynamicObject> = Api::namespaced_with(
        f.hub_client.clone(),
        PROFILE_NS,
        &kleym_api::external::clusterprofile::ClusterProfileVersion::V1alpha1.api_resource(),
    );
    api.delete("east-ocm", &DeleteParams::default())
        .await
        .unwrap();
    let taken_over = wait_phase(&state, "fleet/east-capi", Phase::Engaged).await;
    assert_eq!(taken_over.duplicate_of, None);
    wait_for("the deleted profile released and gone", LIMIT, || {
        let api = api.clone();
        let state = state.clone();
        async move {
            (api.get_opt("east-ocm").await.ok()?.is_none() && state.get("fleet/east-ocm").is_none())
                .then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(state.removals_ended("handed_over"), 1);
    assert_eq!(
        state.removals_ended("done"),
        0,
        "the removal policy never ran"
    );
    assert_eq!(env::csid_names(&store), csids, "identities kept");
    assert_eq!(
        csid_writes(),
        writes_before,
        "no ClusterSPIFFEID deleted or rewritten"
    );
    // The cluster is still managed: a new binding compiles through the new profile.
    env::create_bindings(&store, BINDINGS..BINDINGS + 1).unwrap();
    wait_for("the new binding converged", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS + 1).then_some(()) }
    })
    .await
    .unwrap();
    let report = FullReport::from_fleet(&state, chrono::Utc::now());
    assert_eq!(report.summary.clusters.total, 1);
    assert_eq!(report.summary.clusters.duplicates, 0);
    hub.stop().await.unwrap();
}
