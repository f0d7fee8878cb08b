//! The fleet report end to end: an in-process `kleym hub` with the status loop on kubesim
//! (hub + 6 spokes). A planted fleet (within-spoke collision, duplicate SPIFFE ID,
//! overlapping default identity, PoolOnly + PerObjective on one pool, cross-cluster drift,
//! a kleym output masked by an older foreign ClusterSPIFFEID, a narrower pool whose pods
//! get two SVIDs, and a consistent same-ID set that is not a finding) gives exactly the expected
//! `FleetIdentityReport` findings, which clear when fixed; an unreachable spoke, a spoke whose credential plugin fails and a spoke whose
//! RBAC denies kleym show the right `ClusterIdentityStatus` conditions, and recover.

use std::path::Path;
use std::time::Duration;

use kleym_api::hub_status::{
    ClusterIdentityStatus, FLEET_REPORT_NAME, FindingKind, FindingMember, FleetIdentityReport,
};
use kleym_e2e::fixtures::env::{self, NS, POOL, SA};
use kleym_e2e::fixtures::harness::{FleetHarness, grant_admin};
use kleym_e2e::fixtures::plugins::{static_token_plugin, write_script};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, apply_profile, status};
use kleym_hub::report::Caps;
use kleym_hub::status::{StatusLoopOptions, WriterOptions, run_status_loop};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::Api;
use kubesim::{ClusterHandle, clusters::user};
use kubesim_store::WriteOptions;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(90);
const TD: &str = "fleet.example";
const PLANTED: [&str; 3] = ["east", "west", "south"];
const UNREACHABLE: &str = "unreach";
const NO_CREDS: &str = "nocreds";
const NO_RBAC: &str = "norbac";

fn kv(
    store: &kubesim_store::Cluster,
    plural: &str,
    group: &str,
    version: &str,
    ns: Option<&str>,
    obj: Value,
) {
    let res = store.resolve(group, version, plural).expect("served");
    store
        .create(&res, ns, obj, &WriteOptions::default())
        .expect("created");
}

fn binding(name: &str, objective: &str, container: &str, id_template: Option<&str>) -> Value {
    let mut spec = json!({
        "targetRef": {"name": objective},
        "mode": "PerObjective",
        "containerDiscriminator": {"type": "ContainerName", "value": container},
        "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{SA}")]
    });
    if let Some(t) = id_template {
        spec["spiffeIDTemplate"] = json!(t);
    }
    json!({"apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

fn create_binding(c: &ClusterHandle, b: Value) {
    kv(
        &c.store(),
        "inferenceidentitybindings",
        "kleym.io",
        "v1alpha1",
        Some(NS),
        b,
    );
}

fn delete(
    c: &ClusterHandle,
    group: &str,
    version: &str,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) {
    let store = c.store();
    let res = store.resolve(group, version, plural).expect("served");
    store
        .delete(&res, ns, name, &Default::default())
        .expect("deleted");
}

fn m(cluster: &str, binding: &str) -> FindingMember {
    FindingMember {
        cluster: format!("{PROFILE_NS}/{cluster}"),
        namespace: NS.into(),
        binding: binding.into(),
    }
}

fn token(name: &str) -> String {
    format!("tok-{name}-0123456789")
}

/// A static-token plugin per spoke; the provider is named after the spoke.
fn plugin(dir: &Path, name: &str) -> String {
    static_token_plugin(dir, &format!("{name}.sh"), &token(name), None)
        .unwrap()
        .display()
        .to_string()
}

fn failing_plugin(dir: &Path, name: &str) {
    write_script(
        dir,
        &format!("{name}.sh"),
        "#!/bin/sh\necho 'vault: permission denied' >&2\nexit 3\n",
    )
    .unwrap();
}

/// Polls `check` every 100 ms until it returns `Ok`, for at most [`LIMIT`]; panics with the
/// last `Err` (what was seen) otherwise.
async fn poll<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if std::time::Instant::now() >= deadline => {
                panic!("timed out after {LIMIT:?} waiting for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn report(client: &kube::Client) -> Option<kleym_api::hub_status::FleetIdentityReportStatus> {
    Api::<FleetIdentityReport>::all(client.clone())
        .get_opt(FLEET_REPORT_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|r| r.status)
}

/// Waits until the spoke's ClusterIdentityStatus condition `type_` has `status`/`reason`.
async fn wait_condition(
    client: &kube::Client,
    spoke: &str,
    type_: &str,
    want: (&str, &str),
) -> ClusterIdentityStatus {
    let api = Api::<ClusterIdentityStatus>::namespaced(client.clone(), PROFILE_NS);
    poll(&format!("{spoke} {type_}={want:?}"), || {
        let api = api.clone();
        async move {
            let obj = api
                .get_opt(spoke)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no ClusterIdentityStatus yet")?;
            let c = obj
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
                .ok_or("no such condition yet")?
                .clone();
            if c.status == want.0 && c.reason == want.1 {
                Ok(obj)
            } else {
                Err(format!("{} {} {}", c.status, c.reason, c.message))
            }
        }
    })
    .await
}

/// A hub-cluster client limited to what the status loop needs.
async fn status_writer_client(f: &FleetHarness) -> kube::Client {
    let store = f.hub.store();
    kv(
        &store,
        "clusterroles",
        "rbac.authorization.k8s.io",
        "v1",
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "kleym-status"},
            "rules": [
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["clusterprofiles"], "verbs": ["list", "watch"]},
                {"apiGroups": ["kleym.io"], "resources": ["clusteridentitystatuses", "fleetidentityreports"],
                 "verbs": ["get", "list", "watch", "create", "patch"]},
                {"apiGroups": ["kleym.io"], "resources": ["clusteridentitystatuses/status", "fleetidentityreports/status"],
                 "verbs": ["get", "patch"]},
                {"apiGroups": ["kleym.io"], "resources": ["clusteridentityobservations"],
                 "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
            ]
        }),
    );
    kv(
        &store,
        "clusterrolebindings",
        "rbac.authorization.k8s.io",
        "v1",
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kleym-status"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kleym-status"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kleym-status"}]
        }),
    );
    f.hub
        .add_static_token("tok-kleym-status-0123456789", user("kleym-status", &[]));
    f.hub
        .client_for_token("tok-kleym-status-0123456789")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_fleet_findings_and_spoke_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<&str> = PLANTED.to_vec();
    names.extend([UNREACHABLE, NO_CREDS, NO_RBAC]);
    let f = FleetHarness::start(&names, dir.path()).await.unwrap();

    let mut providers = Vec::new();
    for name in &names {
        let c = f.spoke(name);
        c.add_static_token(&token(name), user(&format!("hub-{name}"), &[]));
        if *name != NO_RBAC {
            grant_admin(&c, &format!("hub-{name}")).unwrap();
        }
        env::seed_environment(&c.store(), 6).unwrap();
        let script = plugin(dir.path(), name);
        providers.push(json!({"name": name, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": script, "interactiveMode": "Never"}}));
    }
    failing_plugin(dir.path(), NO_CREDS);
    f.spoke(UNREACHABLE).faults().set_refuse_connections(true);

    // Same IDs with the same signature everywhere (b-0, b-2): namespace sameness.
    for name in PLANTED {
        env::create_bindings(&f.spoke(name).store(), 0..3).unwrap_or_else(|e| panic!("{e}"));
    }
    let (east, west, south) = (f.spoke("east"), f.spoke("west"), f.spoke("south"));
    // east: two PerObjective bindings on one pool, service account and container.
    create_binding(&east, binding("collide-x", "obj-3", "shared", None));
    create_binding(&east, binding("collide-y", "obj-4", "shared", None));
    // west: one SPIFFE ID from two selector sets.
    let dup = "spiffe://{{ .TrustDomain }}/ns/llm/shared";
    create_binding(&west, binding("dup-x", "obj-3", "dx", Some(dup)));
    create_binding(&west, binding("dup-y", "obj-4", "dy", Some(dup)));
    // west: a PoolOnly identity on the pool the PerObjective ones use.
    create_binding(
        &west,
        json!({"apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
        "metadata": {"name": "pool-id", "namespace": NS},
        "spec": {"targetRef": {"name": "obj-5"}, "mode": "PoolOnly",
                 "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{SA}")]}}),
    );
    // south: b-1 is re-created on another container (drift with east and west's b-1) …
    delete(
        &south,
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        "b-1",
    );
    create_binding(&south, binding("b-1", "obj-1", "c-other", None));
    // … and a default identity not managed by kleym selects every pod.
    kv(
        &south.store(),
        "clusterspiffeids",
        "spire.spiffe.io",
        "v1alpha1",
        None,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
            "metadata": {"name": "default-id"},
            "spec": {"spiffeIDTemplate": "spiffe://fleet.example/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}"}
        }),
    );

    // south: a ClusterSPIFFEID not managed by kleym that renders exactly the entry kleym
    // renders for b-2 (its templates read only what the pool's pods share), created before
    // kleym's output: SPIRE Controller Manager keeps it and masks kleym's.
    kv(
        &south.store(),
        "clusterspiffeids",
        "spire.spiffe.io",
        "v1alpha1",
        None,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
            "metadata": {"name": "copy-of-b-2"},
            "spec": {
                "spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/objective/obj-2",
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
                "workloadSelectorTemplates": [
                    "k8s:ns:{{ .PodMeta.Namespace }}",
                    "k8s:sa:{{ .PodSpec.ServiceAccountName }}",
                    "k8s:pod-label:app:{{ .PodMeta.Labels.app }}",
                    "k8s:container-name:c-2"
                ]
            }
        }),
    );
    // Creation times have second precision and SPIRE breaks a tie by UID: let the clock
    // pass into the next second so kleym's output is strictly newer.
    let planted_second = chrono::Utc::now().timestamp();
    while chrono::Utc::now().timestamp() <= planted_second {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // south: a narrower pool (the same labels and one more) whose PerObjective binding
    // uses b-0's container: those pods' c-0 containers match b-0's entry and its own, two
    // SVIDs, though no two bindings share a pool.
    kv(
        &south.store(),
        "inferencepools",
        "inference.networking.k8s.io",
        "v1",
        Some(NS),
        json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "gpu-pool", "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-qwen", "tier": "gpu"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "gpu-epp", "port": {"number": 9002}}
            }
        }),
    );
    kv(
        &south.store(),
        "inferenceobjectives",
        "llm-d.ai",
        "v1alpha2",
        Some(NS),
        json!({
            "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": "obj-gpu", "namespace": NS},
            "spec": {"priority": 1, "poolRef": {"name": "gpu-pool"}}
        }),
    );
    create_binding(&south, binding("narrow", "obj-gpu", "c-0", None));

    let pf = dir.path().join("providers.json");
    std::fs::write(&pf, json!({"providers": providers}).to_string()).unwrap();
    let t0 = "2026-01-01T00:00:00Z";
    for name in &names {
        let c = f.spoke(name);
        apply_profile(
            &f.hub_client,
            name,
            status(vec![access_provider(name, &c, None)], true, t0, &[]),
        )
        .await
        .unwrap();
    }
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            TD.into(),
            "--leader-elect=false".into(),
            "--max-backoff-seconds".into(),
            "2".into(),
        ])
        .await
        .unwrap();
    // The status loop runs with exactly the hub-cluster permissions the Helm chart grants
    // for it (charts/kleym/templates/hub-rbac.yaml), not as admin.
    let status_client = status_writer_client(&f).await;
    let stop_status = CancellationToken::new();
    let status_loop = tokio::spawn(run_status_loop(
        status_client,
        hub.handle.state.clone(),
        StatusLoopOptions {
            writer: WriterOptions {
                min_interval: Duration::from_millis(200),
                sync_refresh: Duration::from_secs(300),
            },
            caps: Caps::default(),
            min_rebuild: Duration::from_millis(100),
            tick: Duration::from_millis(500),
            resync: Duration::from_secs(600),
            profile_version: hub.handle.inventory_version.clone(),
            ..StatusLoopOptions::default()
        },
        stop_status.clone(),
    ));

    // Exactly the planted findings.
    let drift_id = format!("spiffe://{TD}/ns/{NS}/objective/obj-1");
    let expected = vec![
        (
            FindingKind::IdentityCollision,
            None,
            vec![m("east", "collide-x"), m("east", "collide-y")],
        ),
        (
            FindingKind::DuplicateSpiffeId,
            Some(format!("spiffe://{TD}/ns/llm/shared")),
            vec![m("west", "dup-x"), m("west", "dup-y")],
        ),
        (
            FindingKind::CrossClusterDrift,
            Some(drift_id.clone()),
            vec![m("east", "b-1"), m("south", "b-1"), m("west", "b-1")],
        ),
    ];
    let client = f.hub_client.clone();
    let got = poll("planted findings", || {
        let client = client.clone();
        let expected = expected.clone();
        async move {
            let r = report(&client).await.ok_or("no FleetIdentityReport yet")?;
            let collisions: Vec<_> = r
                .findings
                .iter()
                .filter(|f| f.severity == kleym_api::hub_status::Severity::Collision)
                .map(|f| (f.kind, f.spiffe_id.clone(), f.members.clone()))
                .collect();
            let overlap = r.findings.iter().any(|f| {
                f.kind == FindingKind::OverlappingDefaultIdentity
                    && f.members
                        .iter()
                        .all(|mm| mm.cluster == format!("{PROFILE_NS}/south"))
                    && f.members.len() == 3
            });
            let pool_and_objective = r.findings.iter().any(|f| {
                f.kind == FindingKind::PoolOnlyAndPerObjective
                    && f.members.contains(&m("west", "pool-id"))
                    && f.members
                        .iter()
                        .all(|mm| mm.cluster == format!("{PROFILE_NS}/west"))
                    && f.members.len() == 6
            });
            let masked = r.findings.iter().any(|f| {
                f.kind == FindingKind::MaskedByForeignObject
                    && f.members == [m("south", "b-2")]
                    && f.spiffe_id.as_deref()
                        == Some(&*format!("spiffe://{TD}/ns/{NS}/objective/obj-2"))
            });
            let several = r.findings.iter().any(|f| {
                f.kind == FindingKind::MultipleSvids
                    && f.members == [m("south", "b-0"), m("south", "narrow")]
            });
            // default-id also selects the narrow pool's pods: a finding of its own
            // (another pool, another message).
            if collisions == expected
                && overlap
                && pool_and_objective
                && masked
                && several
                && r.finding_counts.total == 8
            {
                Ok(r)
            } else {
                Err(format!("{:#?}", r.findings))
            }
        }
    })
    .await;
    let overlap = got
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::OverlappingDefaultIdentity)
        .unwrap();
    assert!(
        overlap.message.contains("fallback: true"),
        "{}",
        overlap.message
    );
    assert!(overlap.message.contains(POOL), "{}", overlap.message);
    assert_eq!(got.finding_counts.collisions, 3);
    assert_eq!(got.finding_counts.warnings, 5);
    assert_eq!(got.finding_counts.masked_by_foreign_object, 1);
    assert_eq!(got.finding_counts.multiple_svids, 1);
    // The objects are named: the masking object and kleym's output; both identities.
    let masked = got
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::MaskedByForeignObject)
        .unwrap();
    let output = kleym_spoke::compiler::output::cluster_spiffe_id_name(NS, "b-2");
    for named in ["copy-of-b-2", output.as_str(), POOL] {
        assert!(masked.message.contains(named), "{}", masked.message);
    }
    let several = got
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::MultipleSvids)
        .unwrap();
    for named in [
        "narrow",
        "b-0",
        "gpu-pool",
        "objective/obj-0",
        "objective/obj-gpu",
    ] {
        assert!(several.message.contains(named), "{}", several.message);
    }

    // Spoke conditions: unreachable, failing credential plugin, RBAC denied.
    let c = wait_condition(&client, UNREACHABLE, "Reachable", ("False", "Unreachable")).await;
    assert_eq!(
        c.metadata.owner_references.unwrap()[0].kind,
        "ClusterProfile"
    );
    let c = wait_condition(
        &client,
        NO_CREDS,
        "CredentialsAvailable",
        ("False", "CredentialPluginFailed"),
    )
    .await;
    let ready = c
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "CredentialPluginFailed")
    );
    wait_condition(&client, NO_RBAC, "Synced", ("False", "Forbidden")).await;
    let east_status = wait_condition(&client, "east", "Ready", ("False", "BindingsNotReady")).await;
    let st = east_status.status.unwrap();
    assert_eq!(st.bindings.total, 5);
    assert_eq!(st.bindings.conflict, 2, "{st:?}");
    assert_eq!(st.trust_domain.as_deref(), Some(TD));
    assert!(st.spoke_version.is_some());

    // Fix everything the way the messages say; the findings clear.
    delete(
        &east,
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        "collide-y",
    );
    delete(
        &west,
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        "dup-y",
    );
    delete(
        &west,
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        "pool-id",
    );
    Api::<kleym_api::InferenceIdentityBinding>::namespaced(south.kube_client().await.unwrap(), NS)
        .patch(
            "b-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"containerDiscriminator": {"type": "ContainerName", "value": "c-1"}}})),
        )
        .await
        .unwrap();
    for name in ["default-id", "copy-of-b-2"] {
        delete(
            &south,
            "spire.spiffe.io",
            "v1alpha1",
            "clusterspiffeids",
            None,
            name,
        );
    }
    delete(
        &south,
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        "narrow",
    );
    poll("findings cleared", || {
        let client = client.clone();
        async move {
            let r = report(&client).await.ok_or("no FleetIdentityReport")?;
            if r.finding_counts.total == 0 && r.findings.is_empty() {
                Ok(())
            } else {
                Err(format!("{:#?}", r.findings))
            }
        }
    })
    .await;

    // The spokes recover.
    f.spoke(UNREACHABLE).faults().set_refuse_connections(false);
    static_token_plugin(
        dir.path(),
        &format!("{NO_CREDS}.sh"),
        &token(NO_CREDS),
        None,
    )
    .unwrap();
    grant_admin(&f.spoke(NO_RBAC), &format!("hub-{NO_RBAC}")).unwrap();
    for name in [UNREACHABLE, NO_CREDS, NO_RBAC, "east"] {
        wait_condition(&client, name, "Ready", ("True", "Ok")).await;
    }

    stop_status.cancel();
    status_loop.await.unwrap();
    hub.stop().await.unwrap();
}
