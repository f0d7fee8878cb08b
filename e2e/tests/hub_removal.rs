//! Profile deletion honours `--removal-policy` and never leaves kleym's finalizers behind.
//!
//! `Orphan` stops managing the spoke and removes kleym's finalizers but keeps the
//! ClusterSPIFFEIDs; `Cleanup` also deletes the ClusterSPIFFEIDs kleym created (proven on the
//! object, never by a binding's status, which a tenant can forge) and leaves foreign ones
//! alone — even one that took the name of an object kleym created.
//! The hub's finalizer on the ClusterProfile (`kleym.io/spoke-removal`) keeps a deleted
//! profile until removal ran: also when the spoke was Waiting, or when no hub ran at the
//! time. A 409 or a 500 on one binding's finalizer update is retried; a profile leaving
//! `--clusterprofile-selector` is orphaned whatever the policy; a profile deleted and at once
//! recreated ends engaged, its bindings finalized and its state intact; a profile selected
//! again while its removal still runs ends engaged and keeps kleym's finalizer.

use std::time::Duration;

use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::{
    PROFILE_NS, access_provider, apply_profile, delete_profile, register_admin_token_spoke, status,
};
use kleym_hub::fleet::Phase;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubesim::ErrorRule;
use kubesim_store::{DeleteOptions, WriteOptions};
use serde_json::{Value, json};

const BINDINGS: usize = 3;
const TOKEN: &str = "tok-removal-0123456789";
const LIMIT: Duration = Duration::from_secs(60);
/// kleym's finalizer on bindings.
const BINDING_FINALIZER: &str = "kleym.io/cleanup";
/// The hub's finalizer on ClusterProfiles.
const PROFILE_FINALIZER: &str = "kleym.io/spoke-removal";
const HEALTHY_AT: &str = "2026-01-01T00:00:00Z";

fn has_our_finalizer(b: &Value) -> bool {
    b["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == BINDING_FINALIZER))
}

fn profiles(f: &FleetHarness) -> Api<ClusterProfile> {
    Api::namespaced(f.hub_client.clone(), PROFILE_NS)
}

async fn profile(f: &FleetHarness, spoke: &str) -> Option<ClusterProfile> {
    profiles(f).get_opt(spoke).await.unwrap()
}

fn carries_profile_finalizer(cp: &ClusterProfile) -> bool {
    cp.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == PROFILE_FINALIZER))
}

/// The hub flags: a provider `ok` running a script that prints the spoke's static token.
fn hub_flags(f: &FleetHarness, policy: &str, extra: &[&str]) -> Vec<String> {
    let plugin = static_token_plugin(&f.dir, "ok.sh", TOKEN, None).unwrap();
    let pf = f.dir.join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    let mut flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        pf.display().to_string(),
        "--trust-domain".into(),
        "fleet.example".into(),
        "--leader-elect=false".into(),
        "--removal-policy".into(),
        policy.into(),
    ];
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

async fn register(f: &FleetHarness, spoke: &str) {
    let s = f.spoke(spoke);
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
}

/// Waits until every binding has its ClusterSPIFFEID and kleym's finalizer, and the profile
/// carries the hub's finalizer.
async fn converged(f: &FleetHarness, spoke: &str, bindings: usize) {
    let store = f.spoke(spoke).store();
    let api = profiles(f);
    let spoke = spoke.to_string();
    wait_for("converged with finalizers", LIMIT, || {
        let (store, api, spoke) = (store.clone(), api.clone(), spoke.clone());
        async move {
            let cp = api.get_opt(&spoke).await.ok()??;
            (env::converged(&store, bindings)
                && env::bindings(&store).len() == bindings
                && env::bindings(&store).iter().all(has_our_finalizer)
                && carries_profile_finalizer(&cp))
            .then_some(())
        }
    })
    .await
    .unwrap();
}

async fn engage(f: &FleetHarness, spoke: &str, policy: &str, extra: &[&str]) -> RunningHub {
    register(f, spoke).await;
    let hub = f.start_hub(&hub_flags(f, policy, extra)).await.unwrap();
    converged(f, spoke, BINDINGS).await;
    hub
}

async fn wait_phase(hub: &RunningHub, spoke: &str, phase: Phase) {
    let state = hub.handle.state.clone();
    let name = format!("{PROFILE_NS}/{spoke}");
    wait_for(&format!("{name} {phase:?}"), LIMIT, || {
        let (state, name) = (state.clone(), name.clone());
        async move {
            state
                .get(&name)
                .is_some_and(|s| s.phase == phase)
                .then_some(())
        }
    })
    .await
    .unwrap();
}

/// Waits until the profile is gone, no binding carries kleym's finalizer and the hub forgot
/// the spoke.
async fn removed(f: &FleetHarness, hub: &RunningHub, spoke: &str) {
    let store = f.spoke(spoke).store();
    let api = profiles(f);
    let state = hub.handle.state.clone();
    let name = format!("{PROFILE_NS}/{spoke}");
    let spoke = spoke.to_string();
    wait_for(
        "profile gone, finalizers removed, spoke forgotten",
        LIMIT,
        || {
            let (store, api, state, name, spoke) = (
                store.clone(),
                api.clone(),
                state.clone(),
                name.clone(),
                spoke.clone(),
            );
            async move {
                (api.get_opt(&spoke).await.ok()?.is_none()
                    && !env::bindings(&store).iter().any(has_our_finalizer)
                    && state.get(&name).is_none())
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// The spoke's profile turns `ControlPlaneHealthy=False`: the hub stops its reconciler.
async fn make_unhealthy(f: &FleetHarness, hub: &RunningHub, spoke: &str) {
    let s = f.spoke(spoke);
    apply_profile(
        &f.hub_client,
        spoke,
        status(
            vec![access_provider("ok", &s, None)],
            false,
            "2026-01-01T00:05:00Z",
            &[],
        ),
    )
    .await
    .unwrap();
    wait_phase(hub, spoke, Phase::Waiting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_keeps_identities_and_drops_finalizers() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "orphan", &[]).await;
    let store = f.spoke("spoke").store();
    let before = env::csid_names(&store);
    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;

    assert_eq!(
        env::csid_names(&store),
        before,
        "Orphan keeps the ClusterSPIFFEIDs"
    );
    // No longer managed: nothing watches the spoke's bindings or ClusterSPIFFEIDs any more
    // (the reconciler's watches are closed), so a new binding cannot be seen, and the
    // profile is gone, so nothing engages the spoke again. Proven from those signals (kubesim
    // counts open watches per type; its own RBAC watches are not kleym's), not from a pause.
    let kleym_watches = |store: &kubesim_store::Cluster| {
        store
            .watcher_counts()
            .into_iter()
            .filter(|(kind, _)| !kind.ends_with(".rbac.authorization.k8s.io"))
            .collect::<Vec<_>>()
    };
    wait_for("the reconciler's watches closed", LIMIT, || {
        let store = store.clone();
        async move { kleym_watches(&store).is_empty().then_some(()) }
    })
    .await
    .unwrap();
    let csid_writes = |store: &kubesim_store::Cluster| {
        store
            .write_counts()
            .get("clusterspiffeids.spire.spiffe.io")
            .copied()
    };
    let writes_before = csid_writes(&store);
    assert!(
        writes_before.is_some_and(|n| n > 0),
        "kleym wrote ClusterSPIFFEIDs before"
    );
    env::create_bindings(&store, BINDINGS..BINDINGS + 1).unwrap();
    assert!(!env::csid_names(&store).contains(&env::csid_name(BINDINGS)));
    assert_eq!(
        kleym_watches(&store),
        vec![],
        "something watches the spoke again"
    );
    assert!(
        hub.handle
            .state
            .get(&format!("{PROFILE_NS}/spoke"))
            .is_none()
    );
    assert_eq!(csid_writes(&store), writes_before);
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
    let hub = engage(&f, "spoke", "cleanup", &[]).await;
    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;

    let left = env::csid_names(&store);
    assert_eq!(left.into_iter().collect::<Vec<_>>(), ["foreign"]);
    assert_eq!(
        env::bindings(&store).len(),
        BINDINGS,
        "bindings themselves stay"
    );
    hub.stop().await.unwrap();
}

/// No task runs for a Waiting spoke; the removal runs all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_deleted_while_its_spoke_waits_still_drops_the_finalizers() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "orphan", &[]).await;
    make_unhealthy(&f, &hub, "spoke").await;
    let store = f.spoke("spoke").store();
    assert!(env::bindings(&store).iter().all(has_our_finalizer));

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;
    assert!(env::converged(&store, BINDINGS), "Orphan keeps them");
    hub.stop().await.unwrap();
}

/// Deleted while no hub runs: the profile waits (kleym's finalizer); the next hub finds it
/// with its deletionTimestamp and runs the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_deleted_while_the_hub_is_down_is_removed_when_it_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "cleanup", &[]).await;
    hub.stop().await.unwrap();

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    let cp = profile(&f, "spoke")
        .await
        .expect("kept by kleym's finalizer");
    assert!(cp.metadata.deletion_timestamp.is_some());
    let store = f.spoke("spoke").store();
    assert!(env::bindings(&store).iter().all(has_our_finalizer));
    assert!(env::converged(&store, BINDINGS));

    let hub = f.start_hub(&hub_flags(&f, "cleanup", &[])).await.unwrap();
    removed(&f, &hub, "spoke").await;
    assert!(env::csid_names(&store).is_empty(), "Cleanup ran");
    hub.stop().await.unwrap();
}

/// kleym's ClusterSPIFFEID of binding 0 is replaced by a foreign object of the same name
/// (another UID) while the spoke waits; Cleanup deletes the other two and spares it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_spares_a_foreign_object_that_took_the_name_of_one_kleym_created() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "cleanup", &[]).await;
    make_unhealthy(&f, &hub, "spoke").await;
    let store = f.spoke("spoke").store();
    let res = store
        .resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
        .unwrap();
    let name = env::csid_name(0);
    let ours = store.get(&res, None, &name).unwrap();
    store
        .delete(&res, None, &name, &DeleteOptions::default())
        .unwrap();
    let foreign = store
        .create(
            &res,
            None,
            json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
                   "metadata": {"name": name},
                   "spec": {"spiffeIDTemplate": "spiffe://other.example/taken"}}),
            &WriteOptions::default(),
        )
        .unwrap()
        .object;
    assert_ne!(ours["metadata"]["uid"], foreign["metadata"]["uid"]);

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;
    let left = env::csids(&store);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["metadata"]["uid"], foreign["metadata"]["uid"]);
    assert_eq!(
        left[0]["spec"]["spiffeIDTemplate"],
        "spiffe://other.example/taken"
    );
    hub.stop().await.unwrap();
}

/// A tenant of the spoke's namespace: its bindings and their status, `get` on
/// ClusterSPIFFEIDs (to learn a UID), nothing else. Returns its client.
async fn spoke_tenant(f: &FleetHarness, spoke: &str) -> kube::Client {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let cluster = f.spoke(spoke);
    let admin = cluster.kube_client().await.unwrap();
    let pp = PostParams::default();
    fn typed<K: serde::de::DeserializeOwned>(v: Value) -> K {
        serde_json::from_value(v).unwrap()
    }
    Api::<ServiceAccount>::namespaced(admin.clone(), env::NS)
        .create(&pp, &typed(json!({"metadata": {"name": "tenant"}})))
        .await
        .unwrap();
    let subjects = json!([{"kind": "ServiceAccount", "name": "tenant", "namespace": env::NS}]);
    Api::<Role>::namespaced(admin.clone(), env::NS)
        .create(
            &pp,
            &typed(json!({
                "metadata": {"name": "bindings"},
                "rules": [
                    {"apiGroups": ["kleym.io"], "resources": ["inferenceidentitybindings"],
                     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                    {"apiGroups": ["kleym.io"], "resources": ["inferenceidentitybindings/status"],
                     "verbs": ["get", "update", "patch"]}
                ]
            })),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), env::NS)
        .create(
            &pp,
            &typed(json!({
                "metadata": {"name": "tenant-bindings"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"},
                "subjects": subjects
            })),
        )
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &pp,
            &typed(json!({
                "metadata": {"name": "clusterspiffeid-reader"},
                "rules": [{"apiGroups": ["spire.spiffe.io"], "resources": ["clusterspiffeids"],
                           "verbs": ["get"]}]
            })),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin)
        .create(
            &pp,
            &typed(json!({
                "metadata": {"name": "tenant-clusterspiffeid-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "clusterspiffeid-reader"},
                "subjects": subjects
            })),
        )
        .await
        .unwrap();
    let token = cluster
        .issue_sa_token(env::NS, "tenant", &[], Duration::from_secs(3600), None)
        .await
        .unwrap();
    cluster.client_for_token(&token).await.unwrap()
}

/// Cleanup reads no status: a tenant forges `status.clusterSPIFFEID` of binding 1 to name a
/// platform ClusterSPIFFEID (carrying kleym's labels, so Cleanup's label-selected list has
/// it), and of binding 0 to name a foreign object (kleym's labels too) that replaced
/// binding 0's output at its name. Cleanup deletes the outputs proven to be kleym's and
/// neither victim: same UID, same resourceVersion (before: both were deleted, the forged
/// UIDs satisfying the delete's precondition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_ignores_a_forged_status() {
    use kleym_api::InferenceIdentityBinding;
    use kleym_api::external::spiffeid::ClusterSPIFFEID;
    use kube::ResourceExt;
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "cleanup", &[]).await;
    make_unhealthy(&f, &hub, "spoke").await;
    let admin = f.spoke("spoke").kube_client().await.unwrap();
    let csids: Api<ClusterSPIFFEID> = Api::all(admin);
    let kleym_labels = |binding: &str| {
        json!({"kleym.io/managed-by": "kleym", "kleym.io/binding-namespace": env::NS,
               "kleym.io/binding-name": binding})
    };
    let platform: ClusterSPIFFEID = serde_json::from_value(json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": "platform-default", "labels": kleym_labels(&env::binding_name(1))},
        "spec": {"spiffeIDTemplate": "spiffe://fleet.example/platform"}
    }))
    .unwrap();
    csids
        .create(&PostParams::default(), &platform)
        .await
        .unwrap();
    let taken = env::csid_name(0);
    csids
        .delete(&taken, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let squatter: ClusterSPIFFEID = serde_json::from_value(json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": taken, "labels": kleym_labels(&env::binding_name(0))},
        "spec": {"spiffeIDTemplate": "spiffe://fleet.example/taken"}
    }))
    .unwrap();
    csids
        .create(&PostParams::default(), &squatter)
        .await
        .unwrap();

    let tenant = spoke_tenant(&f, "spoke").await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(tenant.clone(), env::NS);
    let tenant_csids: Api<ClusterSPIFFEID> = Api::all(tenant);
    let mut victims = Vec::new();
    for (i, victim) in [(1, "platform-default".to_string()), (0, taken.clone())] {
        let obj = tenant_csids.get(&victim).await.expect("the tenant may get");
        let denied = tenant_csids
            .delete(&victim, &kube::api::DeleteParams::default())
            .await
            .expect_err("the tenant may not delete ClusterSPIFFEIDs");
        assert!(
            matches!(&denied, kube::Error::Api(s) if s.code == 403),
            "{denied:?}"
        );
        bindings
            .patch_status(
                &env::binding_name(i),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"clusterSPIFFEID": {
                    "name": victim, "uid": obj.uid().unwrap()}}})),
            )
            .await
            .expect("the tenant may write its binding's status");
        victims.push((victim, obj.uid(), obj.resource_version()));
    }

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;
    for (victim, uid, rv) in &victims {
        let after = csids.get(victim).await.expect("kept");
        assert_eq!(
            (&after.uid(), &after.resource_version()),
            (uid, rv),
            "{victim}: same UID and resourceVersion"
        );
    }
    let left = env::csid_names(&f.spoke("spoke").store());
    assert_eq!(
        left.into_iter().collect::<Vec<_>>(),
        [taken, "platform-default".to_string()],
        "kleym's own outputs (bindings 1 and 2) are deleted"
    );
    hub.stop().await.unwrap();
}

/// The first finalizer update gets a 409, the next a 500: both bindings are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_and_a_server_error_on_binding_updates_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "orphan", &[]).await;
    let faults = f.spoke("spoke").faults();
    faults
        .fail_next("patch", "inferenceidentitybindings", 409, 1)
        .unwrap();
    faults
        .fail_next("patch", "inferenceidentitybindings", 500, 1)
        .unwrap();

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    removed(&f, &hub, "spoke").await;
    assert!(
        faults.snapshot().fail_next.is_empty(),
        "both faults were hit: {:?}",
        faults.snapshot().fail_next
    );
    assert!(env::converged(&f.spoke("spoke").store(), BINDINGS));
    hub.stop().await.unwrap();
}

/// A label change that takes the profile out of `--clusterprofile-selector` is not a
/// deletion: Orphan, even under Cleanup; the profile stays, without kleym's finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_selector_orphans_even_under_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    register(&f, "spoke").await;
    let label = |v: &str| json!({"metadata": {"labels": {"kleym.example/fleet": v}}});
    profiles(&f)
        .patch(
            "spoke",
            &PatchParams::default(),
            &Patch::Merge(&label("yes")),
        )
        .await
        .unwrap();
    let hub = f
        .start_hub(&hub_flags(
            &f,
            "cleanup",
            &["--clusterprofile-selector", "kleym.example/fleet=yes"],
        ))
        .await
        .unwrap();
    converged(&f, "spoke", BINDINGS).await;
    let store = f.spoke("spoke").store();
    let before = env::csid_names(&store);

    profiles(&f)
        .patch(
            "spoke",
            &PatchParams::default(),
            &Patch::Merge(&label("no")),
        )
        .await
        .unwrap();
    let api = profiles(&f);
    let state = hub.handle.state.clone();
    let s2 = store.clone();
    wait_for("orphaned and released", LIMIT, || {
        let (api, state, store) = (api.clone(), state.clone(), s2.clone());
        async move {
            let cp = api.get_opt("spoke").await.ok()??;
            (!carries_profile_finalizer(&cp)
                && !env::bindings(&store).iter().any(has_our_finalizer)
                && state.get("fleet/spoke").is_none())
            .then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(
        env::csid_names(&store),
        before,
        "a label change never deletes identities"
    );
    hub.stop().await.unwrap();
}

/// Deleted, then recreated as soon as the name is free: the new profile is engaged after
/// the old one's removal, and that removal's end does not wipe the new engagement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_deleted_and_recreated_at_once_ends_engaged() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let hub = engage(&f, "spoke", "orphan", &[]).await;
    let old_uid = profile(&f, "spoke").await.unwrap().metadata.uid;

    delete_profile(&f.hub_client, "spoke").await.unwrap();
    let api = profiles(&f);
    let fresh: ClusterProfile = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": "spoke", "namespace": PROFILE_NS},
        "spec": {"clusterManager": {"name": "kleym-e2e"}}
    }))
    .unwrap();
    // Create fails with 409 while the old profile waits for its removal.
    wait_for("recreated", LIMIT, || {
        let (api, fresh) = (api.clone(), fresh.clone());
        async move { api.create(&PostParams::default(), &fresh).await.ok() }
    })
    .await
    .unwrap();
    let s = f.spoke("spoke");
    apply_profile(
        &f.hub_client,
        "spoke",
        status(vec![access_provider("ok", &s, None)], true, HEALTHY_AT, &[]),
    )
    .await
    .unwrap();
    let cp = profile(&f, "spoke").await.unwrap();
    assert_ne!(cp.metadata.uid, old_uid, "a new object");

    converged(&f, "spoke", BINDINGS).await;
    wait_phase(&hub, "spoke", Phase::Engaged).await;
    // Still managed after the old removal ended: a new binding is compiled and shows in
    // the published state.
    let store = s.store();
    env::create_bindings(&store, BINDINGS..BINDINGS + 1).unwrap();
    converged(&f, "spoke", BINDINGS + 1).await;
    let state = hub.handle.state.clone();
    wait_for("state lists the new binding", LIMIT, || {
        let state = state.clone();
        async move {
            state
                .get("fleet/spoke")
                .is_some_and(|s| s.phase == Phase::Engaged && s.bindings.len() == BINDINGS + 1)
                .then_some(())
        }
    })
    .await
    .unwrap();
    // The old profile's removal job ran to its end (its last steps publish its outcome and
    // are what could overwrite the new engagement's state); a signal, not a pause.
    wait_for("the old removal ended", LIMIT, || {
        let state = state.clone();
        async move { (state.removals_ended("done") == 1).then_some(()) }
    })
    .await
    .unwrap();
    let st = state.get("fleet/spoke").expect("state kept");
    assert_eq!(st.phase, Phase::Engaged);
    assert!(env::bindings(&store).iter().all(has_our_finalizer));
    hub.stop().await.unwrap();
}

/// Relabelled out of the selector, then back in while the removal job still retries its
/// Orphan pass (every binding update fails): the job finishes first, quietly, and leaves
/// kleym's finalizer to the new engagement, which ends engaged with the profile carrying it
/// (before, the job released it after the engagement had checked it: an engaged spoke whose
/// profile could be deleted without removal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_selected_again_during_its_removal_keeps_kleyms_finalizer() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    register(&f, "spoke").await;
    let label = |v: &str| json!({"metadata": {"labels": {"kleym.example/fleet": v}}});
    let relabel = |v: &'static str| {
        let api = profiles(&f);
        async move {
            api.patch("spoke", &PatchParams::default(), &Patch::Merge(&label(v)))
                .await
                .unwrap();
        }
    };
    relabel("yes").await;
    let hub = f
        .start_hub(&hub_flags(
            &f,
            "orphan",
            &["--clusterprofile-selector", "kleym.example/fleet=yes"],
        ))
        .await
        .unwrap();
    converged(&f, "spoke", BINDINGS).await;

    let faults = f.spoke("spoke").faults();
    faults
        .add_error_rule(ErrorRule {
            verb: Some("patch".into()),
            resource: Some("inferenceidentitybindings".into()),
            rate: 1.0,
            code: 500,
        })
        .unwrap();
    relabel("no").await;
    let state = hub.handle.state.clone();
    wait_for("the removal retrying", LIMIT, || {
        let state = state.clone();
        async move {
            let s = state.get("fleet/spoke")?;
            (s.phase == Phase::Removing
                && s.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("failed, retrying")))
            .then_some(())
        }
    })
    .await
    .unwrap();
    relabel("yes").await;
    wait_for("engagement pending", LIMIT, || {
        let state = state.clone();
        async move {
            let s = state.get("fleet/spoke")?;
            (s.engagements == 2).then_some(())
        }
    })
    .await
    .unwrap();
    faults.clear_error_rules();

    wait_phase(&hub, "spoke", Phase::Engaged).await;
    converged(&f, "spoke", BINDINGS).await;
    let cp = profile(&f, "spoke").await.unwrap();
    assert!(
        carries_profile_finalizer(&cp),
        "{:?}",
        cp.metadata.finalizers
    );
    hub.stop().await.unwrap();
}
