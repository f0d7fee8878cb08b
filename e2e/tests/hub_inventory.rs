//! The hub's inventory through the real watch path against kubesim (which validates
//! ClusterProfiles against the upstream CRD schema):
//! - a profile the schema accepts but the typed fields cannot hold is refused by name while
//!   the others engage (before: the initial list failed forever, nothing engaged and the hub
//!   never became ready), also when a profile turns bad during the watch;
//! - a status heartbeat of a refused profile is not forwarded (nor re-logged);
//! - `--clusterprofile-namespace` and `--clusterprofile-selector` decide what engages,
//!   including label changes while running;
//! - the `kleym.io/spire-class-name` property (else `--spire-class-name`) becomes the
//!   `className` of the spoke's ClusterSPIFFEIDs.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_api::external::clusterprofile::ClusterProfileVersion;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, grant_admin, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, apply_profile, status};
use kleym_e2e::fixtures::token_spoke::init_test_logs;
use kleym_hub::fleet::{FleetState, Phase};
use kleym_hub::inventory::{InventoryEvent, InventoryVersion, WatchOptions, watch};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kubesim::ClusterHandle;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const BINDINGS: usize = 2;
const T0: &str = "2026-01-01T00:00:00Z";

/// `spoke` accepts `token` as an admin and holds the standard environment with bindings.
fn prepare_spoke(spoke: &ClusterHandle, token: &str) {
    let user = format!("hub-{}", spoke.name());
    spoke.add_static_token(
        token,
        kubesim_auth::UserInfo {
            username: user.clone(),
            ..Default::default()
        },
    );
    grant_admin(spoke, &user).unwrap();
    env::seed_environment(&spoke.store(), BINDINGS).unwrap();
    env::create_bindings(&spoke.store(), 0..BINDINGS).unwrap();
}

/// Creates (or relabels) the profile `ns/name` with `labels` and sets its status. Untyped, so
/// that writing a profile the typed client could not read back does not depend on the fix
/// under test.
async fn put_profile(
    hub: &kube::Client,
    ns: &str,
    name: &str,
    labels: Value,
    status: Value,
) -> Result<(), kube::Error> {
    let ar = ApiResource::erase::<ClusterProfile>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), ns, &ar);
    if api.get_opt(name).await?.is_none() {
        let cp: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"clusterManager": {"name": "kleym-e2e"}}
        }))
        .map_err(kube::Error::SerdeError)?;
        api.create(&PostParams::default(), &cp).await?;
    } else {
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": labels}})),
        )
        .await?;
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}

async fn create_namespace(hub: &kube::Client, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(hub.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn wait_phase(state: &FleetState, spoke: &str, phase: Phase) -> kleym_hub::fleet::SpokeState {
    let what = format!("{spoke} {phase:?}");
    wait_for(&what, LIMIT, || {
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

fn bad_ca_status(spoke: &ClusterHandle) -> Value {
    // `QR==` passes the CRD's `format: byte` check (as kube-apiserver's does: Go's decoder
    // ignores trailing bits) but not a strict base64 decoder.
    let mut provider = access_provider("ok", spoke, None);
    provider["cluster"]["certificate-authority-data"] = json!("QR==");
    status(vec![provider], true, T0, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_profiles_are_refused_by_name_while_the_others_engage() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a"], dir.path()).await.unwrap();
    let a = f.spoke("spoke-a");
    prepare_spoke(&a, "tok-a-0123456789");
    let plugin = static_token_plugin(dir.path(), "a.sh", "tok-a-0123456789", None).unwrap();
    let good = status(vec![access_provider("ok", &a, None)], true, T0, &[]);
    let put = |name: &'static str, status: Value| {
        put_profile(&f.hub_client, PROFILE_NS, name, json!({}), status)
    };
    put("good", good.clone()).await.unwrap();
    put("bad-ca", bad_ca_status(&a)).await.unwrap();
    // A condition time without a zone: the CRD's `date-time` format accepts it.
    let mut bad_time = status(vec![access_provider("ok", &a, None)], true, T0, &[]);
    bad_time["conditions"][0]["lastTransitionTime"] = json!("2026-01-01T00:00:00");
    put("bad-time", bad_time).await.unwrap();

    let hub = f
        .start_hub(&[
            "--clusterprofile-access-provider".into(),
            format!("ok={}", plugin.display()),
            "--trust-domain".into(),
            "e2e.example".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    let state = hub.handle.state.clone();
    wait_converged(&a).await;
    wait_phase(&state, "fleet/good", Phase::Engaged).await;
    assert!(hub.handle.inventory_synced.is_synced(), "inventory listed");
    for (spoke, field) in [
        (
            "fleet/bad-ca",
            "status.accessProviders[0].cluster.certificate-authority-data",
        ),
        ("fleet/bad-time", "status.conditions[0].lastTransitionTime"),
    ] {
        let s = wait_phase(&state, spoke, Phase::Refused).await;
        let reason = s.reason.unwrap_or_default();
        assert!(
            reason.contains("does not decode") && reason.contains(field),
            "{spoke}: {reason}"
        );
    }

    // During the watch: the engaged profile turns undecodable, is refused by name (its
    // engagement stops instead of silently staying), and engages again once fixed.
    put("good", bad_ca_status(&a)).await.unwrap();
    let s = wait_phase(&state, "fleet/good", Phase::Refused).await;
    assert!(
        s.reason
            .unwrap_or_default()
            .contains("status.accessProviders[0].cluster.certificate-authority-data")
    );
    put("good", good).await.unwrap();
    wait_phase(&state, "fleet/good", Phase::Engaged).await;
    assert_eq!(state.get("fleet/good").unwrap().engagements, 2);
    hub.stop().await.unwrap();
}

/// Next event of the inventory watch (bounded, so a broken watch fails instead of hanging).
async fn next_event(
    events: &mut (impl futures::Stream<Item = InventoryEvent> + Unpin),
) -> InventoryEvent {
    tokio::time::timeout(LIMIT, events.next())
        .await
        .expect("an inventory event")
        .expect("the watch does not end")
}

fn upserted(ev: &InventoryEvent) -> Option<String> {
    match ev {
        InventoryEvent::Upsert(cp) => Some(kleym_hub::inventory::watch::spoke_name(cp)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_of_a_refused_profile_are_not_forwarded() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a"], dir.path()).await.unwrap();
    let a = f.spoke("spoke-a");
    let refused =
        |healthy: bool, t: &str| status(vec![access_provider("nope", &a, None)], healthy, t, &[]);
    apply_profile(&f.hub_client, "refused", refused(true, T0))
        .await
        .unwrap();
    apply_profile(&f.hub_client, "marker", refused(true, T0))
        .await
        .unwrap();
    let version = InventoryVersion::default();
    let mut events = Box::pin(watch(
        f.hub_client.clone(),
        &WatchOptions::default(),
        version.clone(),
    ));
    let mut listed = BTreeSet::new();
    loop {
        match next_event(&mut events).await {
            InventoryEvent::Resynced(_) => break,
            ev => listed.extend(upserted(&ev)),
        }
    }
    assert_eq!(
        listed,
        BTreeSet::from(["fleet/marker".to_string(), "fleet/refused".to_string()])
    );
    // The harness's hub cluster serves ClusterProfile as v1alpha1 only.
    assert_eq!(version.current(), Some(ClusterProfileVersion::V1alpha1));
    // Heartbeats of `refused` (condition times, an unrelated property), then a real change of
    // `marker`: events arrive in resourceVersion order, so everything forwarded for the
    // heartbeats would come before marker's upsert.
    for (i, t) in ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"]
        .iter()
        .enumerate()
    {
        let mut s = refused(true, t);
        s["properties"] = json!([{"name": "vendor.example/seen", "value": format!("{i}"),
            "lastObservedTime": t}]);
        apply_profile(&f.hub_client, "refused", s).await.unwrap();
    }
    apply_profile(&f.hub_client, "marker", refused(false, T0))
        .await
        .unwrap();
    loop {
        let ev = next_event(&mut events).await;
        match upserted(&ev).as_deref() {
            Some("fleet/marker") => break,
            Some(other) => panic!("heartbeat forwarded: {other}"),
            None => {}
        }
    }
    // A change that can change the decision is forwarded.
    apply_profile(&f.hub_client, "refused", refused(false, T0))
        .await
        .unwrap();
    let ev = next_event(&mut events).await;
    assert_eq!(upserted(&ev).as_deref(), Some("fleet/refused"), "{ev:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_selector_decide_what_engages() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a", "spoke-b"], dir.path())
        .await
        .unwrap();
    let (a, b) = (f.spoke("spoke-a"), f.spoke("spoke-b"));
    prepare_spoke(&a, "tok-a-0123456789");
    prepare_spoke(&b, "tok-b-0123456789");
    let pa = static_token_plugin(dir.path(), "a.sh", "tok-a-0123456789", None).unwrap();
    let pb = static_token_plugin(dir.path(), "b.sh", "tok-b-0123456789", None).unwrap();
    create_namespace(&f.hub_client, "other").await;
    // Every profile is usable: only the filters keep the hub away from the others.
    let to_a = status(vec![access_provider("a", &a, None)], true, T0, &[]);
    let to_b = status(vec![access_provider("b", &b, None)], true, T0, &[]);
    let hub_c = &f.hub_client;
    put_profile(
        hub_c,
        PROFILE_NS,
        "prod",
        json!({"env": "prod"}),
        to_a.clone(),
    )
    .await
    .unwrap();
    put_profile(
        hub_c,
        PROFILE_NS,
        "dev",
        json!({"env": "dev"}),
        to_b.clone(),
    )
    .await
    .unwrap();
    put_profile(hub_c, PROFILE_NS, "nolabel", json!({}), to_b.clone())
        .await
        .unwrap();
    put_profile(hub_c, "other", "prod", json!({"env": "prod"}), to_b.clone())
        .await
        .unwrap();

    let hub = f
        .start_hub(&[
            "--clusterprofile-access-provider".into(),
            format!("a={}", pa.display()),
            "--clusterprofile-access-provider".into(),
            format!("b={}", pb.display()),
            "--clusterprofile-namespace".into(),
            PROFILE_NS.into(),
            "--clusterprofile-selector".into(),
            "env=prod".into(),
            "--trust-domain".into(),
            "e2e.example".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    let state = hub.handle.state.clone();
    wait_converged(&a).await;
    wait_phase(&state, "fleet/prod", Phase::Engaged).await;
    // The inventory was listed (readiness is set as the listing reaches the supervisor, after
    // every listed profile), and only the selected profile is known at all.
    assert!(hub.handle.inventory_synced.is_synced());
    let names: Vec<String> = state.spokes().into_iter().map(|s| s.name).collect();
    assert_eq!(names, vec!["fleet/prod".to_string()]);
    assert!(env::csids(&b.store()).is_empty(), "nothing engaged spoke-b");

    // Labels change while running: dev is selected now, prod no longer.
    put_profile(
        hub_c,
        PROFILE_NS,
        "dev",
        json!({"env": "prod"}),
        to_b.clone(),
    )
    .await
    .unwrap();
    wait_converged(&b).await;
    wait_phase(&state, "fleet/dev", Phase::Engaged).await;
    put_profile(hub_c, PROFILE_NS, "prod", json!({"env": "staging"}), to_a)
        .await
        .unwrap();
    wait_for("fleet/prod forgotten", LIMIT, || {
        let state = state.clone();
        async move { state.get("fleet/prod").is_none().then_some(()) }
    })
    .await
    .unwrap();
    let names: Vec<String> = state.spokes().into_iter().map(|s| s.name).collect();
    assert_eq!(names, vec!["fleet/dev".to_string()]);
    hub.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_class_property_becomes_the_cluster_spiffe_id_class_name() {
    init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a", "spoke-b"], dir.path())
        .await
        .unwrap();
    let (a, b) = (f.spoke("spoke-a"), f.spoke("spoke-b"));
    prepare_spoke(&a, "tok-a-0123456789");
    prepare_spoke(&b, "tok-b-0123456789");
    let pa = static_token_plugin(dir.path(), "a.sh", "tok-a-0123456789", None).unwrap();
    let pb = static_token_plugin(dir.path(), "b.sh", "tok-b-0123456789", None).unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-a",
        status(
            vec![access_provider("a", &a, None)],
            true,
            T0,
            &[("kleym.io/spire-class-name", "spire-east")],
        ),
    )
    .await
    .unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-b",
        status(vec![access_provider("b", &b, None)], true, T0, &[]),
    )
    .await
    .unwrap();
    let hub = f
        .start_hub(&[
            "--clusterprofile-access-provider".into(),
            format!("a={}", pa.display()),
            "--clusterprofile-access-provider".into(),
            format!("b={}", pb.display()),
            "--trust-domain".into(),
            "e2e.example".into(),
            "--spire-class-name".into(),
            "hub-default".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    for (spoke, class) in [(&a, "spire-east"), (&b, "hub-default")] {
        wait_converged(spoke).await;
        let csids = env::csids(&spoke.store());
        assert_eq!(csids.len(), BINDINGS, "{}", spoke.name());
        for o in &csids {
            assert_eq!(o["spec"]["className"], class, "{}: {o}", spoke.name());
        }
    }
    let state = hub.handle.state.clone();
    assert_eq!(
        state
            .get("fleet/spoke-a")
            .unwrap()
            .spire_class_name
            .as_deref(),
        Some("spire-east")
    );
    hub.stop().await.unwrap();
}

/// The hub's start-up check of `--clusterprofile-selector` accepts exactly what kubesim's
/// list/watch parser (kube-apiserver's syntax and messages) accepts.
#[test]
fn selector_check_agrees_with_the_api_server_parser() {
    for s in [
        "",
        "env=prod",
        "env==prod,tier!=db",
        "env in (prod, staging),!legacy,team",
        "region notin (eu-west-1)",
        "x in ()",
        "x in (a,)",
        "kleym.io/fleet=a_b.c-d",
        "gen>3,gen<10",
        "env=",
        "env=prod,",
        "env=pr od",
        "env in prod",
        "env in (a b)",
        "Bad_Prefix/x=y",
        "-x=y",
        "env=-bad-",
        "gen>three",
        "=x",
        "env=(x)",
        "!",
        "a,,b",
        "a=b=c",
        &format!("k={}", "v".repeat(64)),
        &format!("{}=v", "k".repeat(64)),
    ] {
        let hub = kleym_hub::inventory::validate_label_selector(s);
        let server = kubesim_store::selector::LabelSelector::parse(s);
        assert_eq!(
            hub.is_ok(),
            server.is_ok(),
            "{s:?}: hub {hub:?}, server {server:?}"
        );
    }
}
