//! End-to-end proof of the spoke reconciler against kubesim with the real upstream CRDs:
//! convergence of a realistic inference environment, schema acceptance of the generated
//! ClusterSPIFFEIDs, collisions and their resolution, deletion, foreign objects, zero
//! writes on restart, CRDs installed while running, and RBAC with exactly
//! `deploy/spoke/clusterrole.yaml` (and clearly failing with less).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kleym_api::external::objective::llmd;
use kleym_api::external::pool::v1 as pool_v1;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_spoke::admission_policy::{
    PolicyOptions, SPOKE_POLICY_NAME, SPOKE_USERNAME, admission_policy_with, spoke_params_ref,
};
use kleym_spoke::compiler::output::{cluster_spiffe_id_name, output_labels};
use kleym_spoke::compiler::{SvidPolicy, SvidPolicySettings};
use kleym_spoke::ownership::OWNER_ANNOTATION;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kleym_test_support::single::{condition, create, create_manifest, eventually, repo_yaml_docs};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use kubesim::{ClusterHandle, Kubesim};
use serde_json::{Value, json};

const NS: &str = "llm";
const TD: &str = "prod.example.org";

/// Upstream CRDs (optionally without the ClusterSPIFFEID one) plus ours.
fn crds(with_spire: bool) -> Vec<Value> {
    kleym_test_support::all_crds()
        .expect("CRDs")
        .into_iter()
        .filter(|c| with_spire || c["spec"]["group"] != "spire.spiffe.io")
        .collect()
}

async fn start_cluster(with_spire: bool) -> (Kubesim, ClusterHandle, Client) {
    kleym_test_support::single::start_spoke(crds(with_spire)).await
}

struct Operator {
    token: CancellationToken,
    metrics: Arc<SpokeMetrics>,
    /// Where `metrics` are registered: their labelled families (failure reasons) are only
    /// kept there.
    registry: prometheus_client::registry::Registry,
    spoke_ctx: Arc<kleym_spoke::reconciler::context::Context>,
    task: tokio::task::JoinHandle<Result<(), kleym_spoke::reconciler::Error>>,
}

impl Operator {
    fn start(client: Client) -> Self {
        Self::start_with(client, SvidPolicy::default())
    }

    /// Starts the reconciler with the operator's SVID settings `svid`.
    fn start_with(client: Client, svid: SvidPolicy) -> Self {
        let mut config = SpokeConfig::new(TD);
        config.svid_policy = Arc::new(svid);
        config.discovery_interval = Duration::from_millis(200);
        config.error_backoff = Duration::from_millis(100);
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(SpokeMetrics::register(&mut registry));
        let spoke = Spoke::new(client, config, metrics.clone()).unwrap();
        let spoke_ctx = spoke.context();
        let token = CancellationToken::new();
        let task = tokio::spawn(spoke.run(token.clone()));
        Operator {
            token,
            metrics,
            registry,
            spoke_ctx,
            task,
        }
    }

    /// The reconcile failures by reason, as `/metrics` shows them (for assertion messages).
    fn failure_reasons(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out.lines()
            .filter(|l| l.starts_with("kleym_spoke_reconcile_failures_total{"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("operator stops")
            .unwrap()
            .unwrap();
    }

    /// Waits until caches are synced and no work is pending, twice in a row.
    async fn settle(&self) {
        let mut quiet = 0;
        for _ in 0..600 {
            let idle = self.spoke_ctx.readiness.is_ready() && self.spoke_ctx.queue.is_idle();
            quiet = if idle { quiet + 1 } else { 0 };
            if quiet >= 6 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("operator did not settle");
    }
}

/// Namespace, service account, three model-server pods with two containers, a v1
/// InferencePool and three llm-d InferenceObjectives.
async fn environment(client: &Client) {
    let nss: Api<Namespace> = Api::all(client.clone());
    create(&nss, json!({"metadata": {"name": NS}})).await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    create(&sas, json!({"metadata": {"name": "model-server"}})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for i in 0..3 {
        create(
            &pods,
            json!({
                "metadata": {
                    "name": format!("vllm-qwen-{i}"),
                    "labels": {"app": "vllm-qwen", "inference.networking.k8s.io/engine-type": "vllm"}
                },
                "spec": {
                    "serviceAccountName": "model-server",
                    "containers": [
                        {"name": "chat", "image": "vllm/vllm-openai:v0.8.0"},
                        {"name": "code", "image": "vllm/vllm-openai:v0.8.0"}
                    ]
                }
            }),
        )
        .await;
    }
    let pools: Api<pool_v1::InferencePool> = Api::namespaced(client.clone(), NS);
    create(
        &pools,
        json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "qwen-pool"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-qwen"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}}
            }
        }),
    )
    .await;
    let objectives: Api<llmd::InferenceObjective> = Api::namespaced(client.clone(), NS);
    for (name, priority) in [("chat", 2), ("code", 1), ("batch", 0)] {
        create(
            &objectives,
            json!({
                "apiVersion": "llm-d.ai/v1alpha2",
                "kind": "InferenceObjective",
                "metadata": {"name": name},
                "spec": {"priority": priority, "poolRef": {"name": "qwen-pool"}}
            }),
        )
        .await;
    }
}

fn per_objective(name: &str, objective: &str, container: &str) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "targetRef": {"name": objective},
            "mode": "PerObjective",
            "containerDiscriminator": {"type": "ContainerName", "value": container},
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]
        }
    })
}

fn pool_only(name: &str, objective: &str) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "targetRef": {"name": objective},
            "mode": "PoolOnly",
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]
        }
    })
}

/// Waits until the binding's current generation is observed with `Ready` = `status`.
async fn wait_ready(
    api: &Api<InferenceIdentityBinding>,
    name: &str,
    status: &str,
) -> InferenceIdentityBinding {
    eventually(&format!("{name} Ready={status}"), || async {
        let b = api.get(name).await.ok()?;
        let observed = b.status.as_ref()?.observed_generation;
        let (s, _, _) = condition(&b, conditions::READY)?;
        (observed == b.metadata.generation && s == status).then_some(b)
    })
    .await
}

async fn snapshot_versions(client: &Client) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let bindings: Api<InferenceIdentityBinding> = Api::all(client.clone());
    for b in bindings.list(&ListParams::default()).await.unwrap() {
        out.insert(
            format!(
                "binding/{}/{}",
                b.namespace().unwrap_or_default(),
                b.name_any()
            ),
            b.resource_version().unwrap_or_default(),
        );
    }
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    for c in csids.list(&ListParams::default()).await.unwrap() {
        out.insert(
            format!("csid/{}", c.name_any()),
            c.resource_version().unwrap_or_default(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_converges_collides_resolves_deletes_and_restarts_without_writes() {
    let (_sim, _cluster, client) = start_cluster(true).await;
    environment(&client).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), NS);
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    // Created before the operator starts, so that each binding's first verdict is final
    // (created one by one while running, the PoolOnly binding would add a warning to the
    // PerObjective ones after their first status write: a legitimate extra write).
    for b in [
        per_objective("chat-id", "chat", "chat"),
        per_objective("code-id", "code", "code"),
        pool_only("pool-id", "batch"),
    ] {
        create(&bindings, b).await;
    }
    let op = Operator::start(client.clone());
    for name in ["chat-id", "code-id", "pool-id"] {
        let b = wait_ready(&bindings, name, "True").await;
        let status = b.status.as_ref().unwrap();
        assert_eq!(
            status.conditions.len(),
            5,
            "all five conditions: {status:?}"
        );
        let owned = status
            .cluster_spiffe_id
            .as_ref()
            .expect("owned ClusterSPIFFEID");
        // The object exists under the recorded UID: accepted by the real upstream schema.
        let obj = csids.get(&owned.name).await.unwrap();
        assert_eq!(obj.uid().as_deref(), Some(owned.uid.as_str()));
        assert_eq!(
            obj.labels()
                .get("kleym.io/binding-name")
                .map(String::as_str),
            Some(name)
        );
        assert!(b.finalizers().iter().any(|f| f == "kleym.io/cleanup"));
    }
    let chat = csids
        .get(&cluster_spiffe_id_name(NS, "chat-id"))
        .await
        .unwrap();
    assert_eq!(
        chat.spec.spiffe_id_template,
        format!("spiffe://{TD}/ns/{NS}/objective/chat")
    );
    assert_eq!(
        chat.spec.workload_selector_templates.as_deref().unwrap(),
        [
            "k8s:container-name:chat",
            "k8s:ns:llm",
            "k8s:pod-label:app:vllm-qwen",
            "k8s:sa:model-server"
        ]
    );
    assert_eq!(chat.spec.fallback, Some(false));
    let pool = csids
        .get(&cluster_spiffe_id_name(NS, "pool-id"))
        .await
        .unwrap();
    assert_eq!(
        pool.spec.spiffe_id_template,
        format!("spiffe://{TD}/ns/{NS}/pool/qwen-pool")
    );

    // Writes per binding on create: finalizer + ClusterSPIFFEID apply + status apply.
    op.settle().await;
    let writes_after_create = op.metrics.total_writes();
    assert_eq!(writes_after_create, 9, "3 writes for each of 3 bindings");

    // Collision: a second PerObjective binding on the same pod set, SA and container.
    create(&bindings, per_objective("chat-dup", "batch", "chat")).await;
    for name in ["chat-id", "chat-dup"] {
        let b = eventually(&format!("{name} collides"), || async {
            let b = bindings.get(name).await.ok()?;
            let (s, r, _) = condition(&b, conditions::CONFLICT)?;
            (s == "True" && r == "IdentityCollision").then_some(b)
        })
        .await;
        let peers = &b.status.as_ref().unwrap().conflict_peers;
        assert_eq!(peers.len(), 1, "{peers:?}");
        let (ready, reason, _) = condition(&b, conditions::READY).unwrap();
        assert_eq!(
            (ready.as_str(), reason.as_str()),
            ("False", "IdentityCollision")
        );
        assert!(b.status.as_ref().unwrap().cluster_spiffe_id.is_none());
    }
    eventually("chat-id output withdrawn", || async {
        csids
            .get_opt(&cluster_spiffe_id_name(NS, "chat-id"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // The PoolOnly binding on the same pod set is only warned about, not refused.
    let pool_b = wait_ready(&bindings, "pool-id", "True").await;
    assert!(
        pool_b
            .status
            .as_ref()
            .unwrap()
            .warnings
            .iter()
            .any(|w| w.reason == "PoolAndObjectiveIdentities"),
        "{:?}",
        pool_b.status
    );

    // Resolution: chat-dup moves to its own container; both become Ready again.
    bindings
        .patch(
            "chat-dup",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containerDiscriminator": {"type": "ContainerName", "value": "code"}}})),
        )
        .await
        .unwrap();
    // ...which now collides with code-id instead; move it to a third container.
    bindings
        .patch(
            "chat-dup",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containerDiscriminator": {"type": "ContainerName", "value": "batch"}}})),
        )
        .await
        .unwrap();
    for name in ["chat-id", "chat-dup", "code-id"] {
        let b = wait_ready(&bindings, name, "True").await;
        assert!(b.status.as_ref().unwrap().conflict_peers.is_empty());
    }
    // Events (events.k8s.io/v1) for the collision and its resolution, on chat-id.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    eventually("collision and resolution events", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let reasons: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chat-id"))
            .map(|e| {
                (
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                )
            })
            .collect();
        let has = |t: &str, r: &str| reasons.iter().any(|(a, b)| a == t && b == r);
        (has("Warning", "IdentityCollision") && has("Normal", "IdentityCollisionResolved"))
            .then_some(())
    })
    .await;

    // Deleting a binding removes its ClusterSPIFFEID, then the binding itself goes.
    let code_name = cluster_spiffe_id_name(NS, "code-id");
    bindings
        .delete("code-id", &DeleteParams::default())
        .await
        .unwrap();
    eventually("code-id and its output are gone", || async {
        let b = bindings.get_opt("code-id").await.unwrap();
        let c = csids.get_opt(&code_name).await.unwrap();
        (b.is_none() && c.is_none()).then_some(())
    })
    .await;

    // Restart: a fresh operator over the same cluster changes nothing.
    op.settle().await;
    op.stop().await;
    let before = snapshot_versions(&client).await;
    let op2 = Operator::start(client.clone());
    eventually("restarted operator reconciled every binding", || async {
        let total: u64 = op2.metrics.reconciles_total();
        (total >= 3).then_some(())
    })
    .await;
    op2.settle().await;
    assert_eq!(op2.metrics.total_writes(), 0, "a restart writes nothing");
    assert_eq!(
        snapshot_versions(&client).await,
        before,
        "no resourceVersion changed"
    );
    op2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_object_holding_our_name_is_never_touched() {
    let (_sim, _cluster, client) = start_cluster(true).await;
    environment(&client).await;
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    let name = cluster_spiffe_id_name(NS, "victim");
    let foreign = create(
        &csids,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1",
            "kind": "ClusterSPIFFEID",
            "metadata": {"name": name, "labels": {"kleym.io/managed-by": "kleym"}},
            "spec": {
                "spiffeIDTemplate": "spiffe://prod.example.org/somebody-else",
                "podSelector": {"matchLabels": {"app": "other"}}
            }
        }),
    )
    .await;
    let op = Operator::start(client.clone());
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), NS);
    create(&bindings, per_objective("victim", "chat", "chat")).await;
    let b = eventually("victim refused", || async {
        let b = bindings.get("victim").await.ok()?;
        let (s, r, _) = condition(&b, conditions::RENDER_FAILURE)?;
        (s == "True" && r == "ForeignObjectHoldsName").then_some(b)
    })
    .await;
    let (_, _, message) = condition(&b, conditions::READY).unwrap();
    assert!(message.contains(&name), "{message}");
    op.settle().await;
    let after = csids.get(&name).await.unwrap();
    assert_eq!(
        after.resource_version(),
        foreign.resource_version(),
        "never modified"
    );
    assert_eq!(after.spec, foreign.spec);

    bindings
        .delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    eventually("victim gone", || async {
        bindings
            .get_opt("victim")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    op.settle().await;
    let still = csids.get(&name).await.expect("never deleted");
    assert_eq!(still.uid(), foreign.uid());
    op.stop().await;
}

/// A ready binding whose finalizer was taken off (the hub's Orphan removal, before the
/// spoke was engaged again) gets it back although its output is up to date; deleting it then
/// deletes its ClusterSPIFFEID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_finalizer_is_restored_on_an_up_to_date_binding() {
    let (_sim, _cluster, client) = start_cluster(true).await;
    environment(&client).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), NS);
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    create(&bindings, per_objective("chat-id", "chat", "chat")).await;
    let op = Operator::start(client.clone());
    let b = wait_ready(&bindings, "chat-id", "True").await;
    assert!(b.finalizers().iter().any(|f| f == "kleym.io/cleanup"));
    op.stop().await;

    // Not managed meanwhile: the finalizer goes, the ClusterSPIFFEID stays.
    bindings
        .patch(
            "chat-id",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": []}})),
        )
        .await
        .unwrap();
    let op = Operator::start(client.clone());
    eventually("finalizer restored", || async {
        let b = bindings.get("chat-id").await.ok()?;
        b.finalizers()
            .iter()
            .any(|f| f == "kleym.io/cleanup")
            .then_some(())
    })
    .await;
    let name = cluster_spiffe_id_name(NS, "chat-id");
    bindings
        .delete("chat-id", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ClusterSPIFFEID deleted with its binding", || async {
        csids.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    op.stop().await;
}

/// A binding deleted while nothing reconciled the cluster and without kleym's finalizer (the
/// hub's Orphan removal took it off; the cluster left the fleet and came back) left its
/// ClusterSPIFFEID behind: the next reconciler deletes it, and only it (a live binding's
/// output and a foreign object labelled as the gone binding's stay untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_output_of_a_binding_deleted_meanwhile_is_swept() {
    let (_sim, _cluster, client) = start_cluster(true).await;
    environment(&client).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), NS);
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    create(&bindings, per_objective("gone", "chat", "chat")).await;
    create(&bindings, per_objective("kept", "code", "code")).await;
    let op = Operator::start(client.clone());
    wait_ready(&bindings, "gone", "True").await;
    wait_ready(&bindings, "kept", "True").await;
    op.stop().await;

    // Not managed meanwhile: the finalizer goes, then the binding.
    bindings
        .patch(
            "gone",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": []}})),
        )
        .await
        .unwrap();
    bindings
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let orphan = cluster_spiffe_id_name(NS, "gone");
    let kept = csids
        .get(&cluster_spiffe_id_name(NS, "kept"))
        .await
        .unwrap();
    assert!(
        csids.get_opt(&orphan).await.unwrap().is_some(),
        "left behind"
    );
    // A foreign object carrying kleym's labels for another gone binding: labels prove nothing.
    let decoy = create(
        &csids,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1",
            "kind": "ClusterSPIFFEID",
            "metadata": {"name": "decoy", "labels": {
                "kleym.io/managed-by": "kleym",
                "kleym.io/binding-namespace": NS,
                "kleym.io/binding-name": "also-gone"
            }},
            "spec": {
                "spiffeIDTemplate": "spiffe://prod.example.org/somebody-else",
                "podSelector": {"matchLabels": {"app": "other"}}
            }
        }),
    )
    .await;

    let op = Operator::start(client.clone());
    eventually("the orphan swept", || async {
        csids.get_opt(&orphan).await.ok()?.is_none().then_some(())
    })
    .await;
    op.settle().await;
    let after = csids.get(&kept.name_any()).await.unwrap();
    assert_eq!(
        after.resource_version(),
        kept.resource_version(),
        "live output untouched"
    );
    let after = csids.get("decoy").await.expect("foreign object kept");
    assert_eq!(after.resource_version(), decoy.resource_version());
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterspiffeid_crd_installed_while_running_is_picked_up() {
    let (_sim, _cluster, client) = start_cluster(false).await;
    environment(&client).await;
    let op = Operator::start(client.clone());
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), NS);
    create(&bindings, per_objective("chat-id", "chat", "chat")).await;
    eventually("missing CRD reported", || async {
        let b = bindings.get("chat-id").await.ok()?;
        let (s, r, _) = condition(&b, conditions::RENDER_FAILURE)?;
        (s == "True" && r == "ClusterSPIFFEIDCRDMissing").then_some(())
    })
    .await;

    let spire: Vec<CustomResourceDefinition> = kubesim::parse_crds(
        "spire.spiffe.io_clusterspiffeids.yaml",
        upstream_crds::upstream_yaml("spire.spiffe.io_clusterspiffeids.yaml"),
    )
    .unwrap()
    .into_iter()
    .map(|v| serde_json::from_value(v).unwrap())
    .collect();
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in spire {
        crd_api.create(&PostParams::default(), &crd).await.unwrap();
    }
    let b = wait_ready(&bindings, "chat-id", "True").await;
    let owned = b.status.unwrap().cluster_spiffe_id.unwrap();
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    assert_eq!(csids.get(&owned.name).await.unwrap().uid(), Some(owned.uid));
    op.stop().await;
}

/// Installs deploy/spoke's ServiceAccount and binding with `role` as the ClusterRole and
/// returns a client authenticated as that ServiceAccount.
async fn operator_client(cluster: &ClusterHandle, admin: &Client, role: Value) -> Client {
    for doc in repo_yaml_docs("deploy/spoke/namespace.yaml")
        .into_iter()
        .chain(repo_yaml_docs("deploy/spoke/serviceaccount.yaml"))
        .chain([role])
        .chain(repo_yaml_docs("deploy/spoke/clusterrolebinding.yaml"))
    {
        create_manifest(admin, &doc).await;
    }
    let token = cluster
        .issue_sa_token(
            "kleym-system",
            "kleym-spoke",
            &[],
            Duration::from_secs(3600),
            None,
        )
        .await
        .unwrap();
    cluster.client_for_token(&token).await.unwrap()
}

/// The spoke admission policy for the `kleym spoke` ServiceAccount, in this test's trust
/// domain, with the default SVID settings as its parameters.
async fn install_admission_policy(admin: &Client) {
    install_admission_policy_with(admin, &SvidPolicy::default()).await;
}

/// The spoke admission policy, its parameters the settings `svid` (in `kleym-system`, as
/// `deploy/spoke/`).
async fn install_admission_policy_with(admin: &Client, svid: &SvidPolicy) {
    for doc in admission_policy_with(
        &PolicyOptions {
            name: SPOKE_POLICY_NAME.into(),
            usernames: vec![SPOKE_USERNAME.into()],
            trust_domain: TD.into(),
            cluster_domain: svid.cluster_domain().into(),
        },
        &spoke_params_ref(),
        svid,
    ) {
        create_manifest(admin, &doc).await;
    }
}

/// A ClusterSPIFFEID exactly as kleym would write it for binding `NS/direct`.
fn kleym_shaped(binding: &str) -> Value {
    json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {
            "name": cluster_spiffe_id_name(NS, binding),
            "labels": output_labels(NS, binding),
            "annotations": {OWNER_ANNOTATION: format!("{NS}/{binding}/0b6c9a52-2f4e-4d7e-9a43-6f1d0c2b9e11")},
        },
        "spec": {
            "spiffeIDTemplate": format!("spiffe://{TD}/ns/{NS}/pool/qwen-pool"),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
            "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
            "workloadSelectorTemplates": [format!("k8s:ns:{NS}"), "k8s:sa:model-server"],
            "dnsNameTemplates": [format!("qwen.{NS}.svc"), format!("qwen.{NS}.svc.cluster.local")],
        }
    })
}

/// The policy's denial of `err`, checked as kube-apiserver words it; returns the rule's part.
fn denial(err: kube::Error, name: &str) -> String {
    let kube::Error::Api(ae) = err else {
        panic!("expected an API error, got {err}");
    };
    assert_eq!((ae.code, ae.reason.as_str()), (403, "Forbidden"), "{ae:?}");
    let prefix = format!(
        "clusterspiffeids.spire.spiffe.io \"{name}\" is forbidden: ValidatingAdmissionPolicy '{SPOKE_POLICY_NAME}' with binding '{SPOKE_POLICY_NAME}' denied request: ClusterSPIFFEID {name}: "
    );
    ae.message
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{:?} does not start with {prefix:?}", ae.message))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_refuses_what_kleym_would_never_write() {
    let (_sim, cluster, admin) = start_cluster(true).await;
    environment(&admin).await;
    let role = repo_yaml_docs("deploy/spoke/clusterrole.yaml").remove(0);
    let kleym = operator_client(&cluster, &admin, role).await;
    install_admission_policy(&admin).await;
    let as_kleym: Api<ClusterSPIFFEID> = Api::all(kleym);
    let as_admin: Api<ClusterSPIFFEID> = Api::all(admin.clone());
    let typed = |v: Value| -> ClusterSPIFFEID { serde_json::from_value(v).unwrap() };
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };

    // What kleym writes passes (so each refusal below is its one change's doing) ...
    let base = kleym_shaped("direct");
    let name = base["metadata"]["name"].as_str().unwrap().to_string();
    as_kleym.create(&dry, &typed(base.clone())).await.unwrap();
    // ... and each thing kleym never writes is refused, naming the rule.
    let cases: [(&str, &str, Value, &str); 5] = [
        ("admin", "/spec/admin", json!(true), "spec.admin is set"),
        (
            "downstream",
            "/spec/downstream",
            json!(true),
            "spec.downstream is set",
        ),
        (
            "cross-namespace selector",
            "/spec/namespaceSelector",
            json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NS, "other"]}]}),
            "spec.namespaceSelector must pin exactly one namespace",
        ),
        (
            "ID outside the namespace",
            "/spec/spiffeIDTemplate",
            json!(format!("spiffe://{TD}/ns/other/pool/qwen-pool")),
            "spec.spiffeIDTemplate must be under",
        ),
        (
            "foreign DNS name",
            "/spec/dnsNameTemplates",
            json!(["api.bank.example.com"]),
            "spec.dnsNameTemplates may only name services of llm",
        ),
    ];
    for (what, pointer, value, rule) in cases {
        let mut bad = base.clone();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        bad.pointer_mut(parent).unwrap()[key] = value;
        for params in [&dry, &PostParams::default()] {
            let err = as_kleym
                .create(params, &typed(bad.clone()))
                .await
                .unwrap_err();
            let why = denial(err, &name);
            assert!(why.starts_with(rule), "{what}: {why}");
        }
    }
    assert!(
        as_admin.get_opt(&name).await.unwrap().is_none(),
        "nothing was stored"
    );

    // A platform admin is not bounded: it creates a foreign (admin) ClusterSPIFFEID ...
    let mut foreign = base.clone();
    foreign["metadata"] = json!({"name": "platform-admin-id"});
    foreign["spec"]["admin"] = json!(true);
    as_admin
        .create(&PostParams::default(), &typed(foreign))
        .await
        .unwrap();
    // ... which kleym's user may neither edit nor delete.
    let err = as_kleym
        .patch(
            "platform-admin-id",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"admin": false}})),
        )
        .await
        .unwrap_err();
    let why = denial(err, "platform-admin-id");
    assert!(why.contains("kleym may not change it"), "{why}");
    let err = as_kleym
        .delete("platform-admin-id", &DeleteParams::default())
        .await
        .unwrap_err();
    let why = denial(err, "platform-admin-id");
    assert!(why.contains("kleym may not delete it"), "{why}");
    assert!(
        as_admin
            .get_opt("platform-admin-id")
            .await
            .unwrap()
            .is_some()
    );
}

/// SVID settings beyond the defaults: suffixes for every namespace and for `NS`, longer
/// TTLs, a federation partner, a reserved hub name.
fn wider_svid_settings() -> SvidPolicy {
    SvidPolicy::new(SvidPolicySettings {
        cluster_domain: "corp.internal".into(),
        dns_suffixes: vec!["apps.example.org".into(), "b.example".into()],
        namespace_dns_suffixes: vec![
            (NS.into(), format!("web.{NS}.svc.corp.internal")),
            (NS.into(), "xn--q.b.example".into()),
            ("other".into(), "other.example".into()),
        ],
        max_ttl: Duration::from_secs(48 * 3600),
        max_jwt_ttl: Duration::from_secs(2 * 3600),
        federates_with: vec!["partner.example".into()],
        hub_x509_usernames: vec!["hub.apps.example.org".into()],
        ..SvidPolicySettings::default()
    })
    .unwrap()
}

/// Dry-run creates of `kleym_shaped` with `spec` fields replaced, as kleym's user (sent as
/// written: the typed ClusterSPIFFEID drops a zero TTL): `Ok` or the policy's denial (the
/// rule's part).
async fn try_spec(as_kleym: &Api<DynamicObject>, fields: Value) -> Result<(), String> {
    let mut obj = kleym_shaped("direct");
    let name = obj["metadata"]["name"].as_str().unwrap().to_string();
    // A name of every cluster domain, so that each case's one change decides.
    obj["spec"]["dnsNameTemplates"] = json!([format!("qwen.{NS}.svc")]);
    for (k, v) in fields.as_object().unwrap() {
        obj["spec"][k] = v.clone();
    }
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match as_kleym
        .create(&dry, &serde_json::from_value(obj).unwrap())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(denial(e, &name)),
    }
}

/// With a DNS suffix, longer TTLs and federation configured on the spoke AND as the policy's
/// parameters, kleym converges under the policy; a direct write as kleym's user outside the
/// parameters is denied with the rule named; the policy enforces exactly the compiler's DNS
/// rule (name by name); and editing the ConfigMap alone changes what is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_takes_the_operators_svid_settings_as_parameters() {
    let (_sim, cluster, admin) = start_cluster(true).await;
    environment(&admin).await;
    let role = repo_yaml_docs("deploy/spoke/clusterrole.yaml").remove(0);
    let kleym = operator_client(&cluster, &admin, role).await;
    let svid = wider_svid_settings();
    install_admission_policy_with(&admin, &svid).await;

    // kleym converges writing what only the wider settings allow.
    let op = Operator::start_with(kleym.clone(), svid.clone());
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), NS);
    let mut b = per_objective("chat-id", "chat", "chat");
    b["spec"]["svid"] = json!({
        "dnsNameTemplates": ["chat.apps.example.org", format!("x.web.{NS}.svc.corp.internal"), format!("qwen.{NS}.svc.corp.internal")],
        "ttl": "36h",
        "jwtTtl": "90m",
        "federatesWith": ["partner.example"],
    });
    create(&bindings, b).await;
    let ready = wait_ready(&bindings, "chat-id", "True").await;
    let owned = ready.status.unwrap().cluster_spiffe_id.unwrap();
    let csids: Api<ClusterSPIFFEID> = Api::all(admin.clone());
    let written = serde_json::to_value(csids.get(&owned.name).await.unwrap()).unwrap();
    assert_eq!(written["spec"]["ttl"], "36h");
    assert_eq!(written["spec"]["federatesWith"], json!(["partner.example"]));
    op.settle().await;
    assert_eq!(
        op.metrics.failures_total(),
        0,
        "no write was denied: {}",
        op.failure_reasons()
    );
    op.stop().await;

    let as_kleym: Api<DynamicObject> =
        Api::all_with(kleym.clone(), &ApiResource::erase::<ClusterSPIFFEID>(&()));
    let at = "ConfigMap kleym-system/kleym-spoke-bounds";
    // Outside the parameters: each denied, naming the rule.
    let cases = [
        (
            json!({"dnsNameTemplates": ["api.bank.example.com"]}),
            format!(
                "spec.dnsNameTemplates may only name services of llm (<service>.llm.svc[.corp.internal]) or names under the DNS suffixes allowed to llm in {at}: apps.example.org, b.example, web.llm.svc.corp.internal, xn--q.b.example"
            ),
        ),
        (
            json!({"dnsNameTemplates": ["qwen.llm.svc.cluster.local"]}),
            "spec.dnsNameTemplates may only name".into(),
        ),
        (
            json!({"dnsNameTemplates": ["hub.apps.example.org"]}),
            format!(
                "spec.dnsNameTemplates names one of the reserved names (the hub's X.509 user names, reservedDNSNames in {at})"
            ),
        ),
        (
            json!({"ttl": "49h"}),
            format!("spec.ttl 49h is not a positive duration of at most 48h (maxTtl in {at})"),
        ),
        (
            json!({"ttl": "0s"}),
            "spec.ttl 0s is not a positive duration".into(),
        ),
        (
            json!({"ttl": "-1h"}),
            "spec.ttl -1h is not a positive duration".into(),
        ),
        (json!({"ttl": "1h 2m"}), "spec.ttl 1h 2m is not".into()),
        (json!({"ttl": "+1h"}), "spec.ttl +1h is not".into()),
        (
            json!({"jwtTtl": "121m"}),
            format!(
                "spec.jwtTtl 121m is not a positive duration of at most 2h (maxJwtTtl in {at})"
            ),
        ),
        (
            json!({"federatesWith": ["evil.example"]}),
            format!(
                "spec.federatesWith may only list the trust domains {at} allows (federatesWith): partner.example"
            ),
        ),
        (
            json!({"autoPopulateDNSNames": true}),
            "spec.autoPopulateDNSNames is set".into(),
        ),
    ];
    for (fields, rule) in cases {
        let why = try_spec(&as_kleym, fields.clone())
            .await
            .err()
            .unwrap_or_else(|| panic!("{fields} was allowed"));
        assert!(why.starts_with(&rule), "{fields}: {why}");
    }
    // Within them: what the binding CRD lets a tenant write and the compiler passes on.
    for fields in [
        json!({"ttl": "48h", "jwtTtl": "2h"}),
        json!({"ttl": "1h30m", "jwtTtl": "1.5h"}),
        json!({"ttl": "1\u{b5}s", "jwtTtl": "500ms"}),
        json!({"federatesWith": ["partner.example"]}),
    ] {
        try_spec(&as_kleym, fields.clone())
            .await
            .unwrap_or_else(|e| panic!("{fields}: {e}"));
    }
    // The DNS rule is the compiler's, name by name (suffix order, IDNA labels, Service
    // names, the cluster domain, other namespaces' suffixes).
    for name in [
        "chat.llm.svc",
        "chat.llm.svc.corp.internal",
        "chat.llm.svc.cluster.local",
        "1chat.llm.svc",
        "xn--80ak6aa92e.llm.svc",
        "ab--c.llm.svc",
        "a.b.llm.svc",
        "llm.svc",
        "chat.other.svc",
        "a.apps.example.org",
        "a.b.apps.example.org",
        "apps.example.org",
        "evilapps.example.org",
        "xn--80ak6aa92e.apps.example.org",
        "a.xn--80ak6aa92e.apps.example.org",
        "x.web.llm.svc.corp.internal",
        "a.x.web.llm.svc.corp.internal",
        "web.llm.svc.corp.internal",
        "a.xn--q.b.example",
        "xn--z.xn--q.b.example",
        "q.b.example",
        "x.other.example",
        "hub.apps.example.org",
        "Chat.llm.svc",
        "chat..llm.svc",
        &format!("{}.apps.example.org", "a".repeat(64)),
    ] {
        let policy = try_spec(&as_kleym, json!({"dnsNameTemplates": [name]})).await;
        assert_eq!(
            policy.is_ok(),
            svid.allows_dns_name(NS, name),
            "{name}: the policy says {policy:?}"
        );
    }

    // Editing the ConfigMap, and nothing else, changes what is allowed.
    let policies: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
            ),
            "validatingadmissionpolicies",
        ),
    );
    let policy_version = policies
        .get(SPOKE_POLICY_NAME)
        .await
        .unwrap()
        .resource_version();
    // kleym's own user cannot widen its bounds: the shipped ClusterRole grants no ConfigMaps.
    let err = Api::<ConfigMap>::namespaced(kleym.clone(), "kleym-system")
        .patch(
            SPOKE_POLICY_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"maxTtl": "8760h"}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(ae) if ae.code == 403),
        "{err}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kleym-system");
    let wide = json!({"ttl": "36h", "dnsNameTemplates": ["a.apps.example.org"], "federatesWith": ["partner.example"]});
    try_spec(&as_kleym, wide.clone()).await.unwrap();
    cms.patch(
        SPOKE_POLICY_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"maxTtl": "12h", "dnsSuffixes": "", "federatesWith": "partner.example, other.example"}})),
    )
    .await
    .unwrap();
    let why = try_spec(&as_kleym, json!({"ttl": "36h"}))
        .await
        .unwrap_err();
    assert!(
        why.starts_with("spec.ttl 36h is not a positive duration of at most 12h"),
        "{why}"
    );
    let why = try_spec(
        &as_kleym,
        json!({"dnsNameTemplates": ["a.apps.example.org"]}),
    )
    .await
    .unwrap_err();
    assert!(
        why.ends_with(&format!(
            "allowed to llm in {at}: web.llm.svc.corp.internal, xn--q.b.example"
        )),
        "only the namespace's suffixes are left: {why}"
    );
    try_spec(
        &as_kleym,
        json!({"ttl": "12h", "federatesWith": ["other.example"]}),
    )
    .await
    .unwrap();
    assert_eq!(
        policies
            .get(SPOKE_POLICY_NAME)
            .await
            .unwrap()
            .resource_version(),
        policy_version,
        "the policy itself was not edited"
    );

    // Without its ConfigMap the policy denies every write of kleym's user ...
    cms.delete(SPOKE_POLICY_NAME, &DeleteParams::default())
        .await
        .unwrap();
    // (even one exactly as kleym writes it). The API server looks the parameters up before
    // it evaluates the match conditions, so other users' writes are refused as well: the
    // policy fails closed for everyone until the ConfigMap is back.
    let mut base = kleym_shaped("direct");
    base["spec"]["dnsNameTemplates"] = json!([format!("qwen.{NS}.svc")]);
    let base: ClusterSPIFFEID = serde_json::from_value(base).unwrap();
    let typed_kleym = Api::<ClusterSPIFFEID>::all(kleym);
    for api in [&typed_kleym, &csids] {
        let err = api.create(&PostParams::default(), &base).await.unwrap_err();
        let kube::Error::Api(ae) = err else {
            panic!("expected an API error, got {err}");
        };
        assert!(
            ae.message.ends_with(&format!(
                "ValidatingAdmissionPolicy '{SPOKE_POLICY_NAME}' with binding '{SPOKE_POLICY_NAME}' denied request: no params found for policy binding with `Deny` parameterNotFoundAction"
            )),
            "{ae:?}"
        );
    }
    assert_eq!(csids.get_opt(&base.name_any()).await.unwrap(), None);
    // Restored, the same write of kleym's user passes.
    create_manifest(
        &admin,
        &kleym_spoke::admission_policy::params_config_map(&spoke_params_ref(), &svid),
    )
    .await;
    typed_kleym
        .create(&PostParams::default(), &base)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_with_exactly_the_shipped_cluster_role() {
    let (_sim, cluster, admin) = start_cluster(true).await;
    environment(&admin).await;
    let role = repo_yaml_docs("deploy/spoke/clusterrole.yaml").remove(0);
    let client = operator_client(&cluster, &admin, role).await;
    // With the admission policy that bounds kleym's own user installed: kleym never writes
    // what its policy forbids (creates, updates and deletes below).
    install_admission_policy(&admin).await;
    let op = Operator::start(client);
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), NS);
    create(&bindings, per_objective("chat-id", "chat", "chat")).await;
    create(&bindings, per_objective("chat-dup", "batch", "chat")).await;
    create(&bindings, pool_only("pool-id", "batch")).await;
    wait_ready(&bindings, "pool-id", "True").await;
    eventually("collision reported under the shipped role", || async {
        let b = bindings.get("chat-dup").await.ok()?;
        let (s, _, _) = condition(&b, conditions::CONFLICT)?;
        (s == "True").then_some(())
    })
    .await;
    bindings
        .delete("pool-id", &DeleteParams::default())
        .await
        .unwrap();
    eventually("pool-id cleaned up under the shipped role", || async {
        bindings
            .get_opt("pool-id")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    op.settle().await;
    assert_eq!(
        op.metrics.failures_total(),
        0,
        "no reconcile failed with the shipped ClusterRole: {}",
        op.failure_reasons()
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_patch_on_clusterspiffeids_the_binding_says_so() {
    let (_sim, cluster, admin) = start_cluster(true).await;
    environment(&admin).await;
    let mut role = repo_yaml_docs("deploy/spoke/clusterrole.yaml").remove(0);
    for rule in role["rules"].as_array_mut().unwrap() {
        if rule["resources"] == json!(["clusterspiffeids"]) {
            rule["verbs"] = json!(["list", "watch", "delete"]);
        }
    }
    let client = operator_client(&cluster, &admin, role).await;
    let op = Operator::start(client);
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), NS);
    create(&bindings, per_objective("chat-id", "chat", "chat")).await;
    let b = eventually("apply failure reported", || async {
        let b = bindings.get("chat-id").await.ok()?;
        let (s, r, _) = condition(&b, conditions::READY)?;
        (s == "False" && r == "ClusterSPIFFEIDApplyFailed").then_some(b)
    })
    .await;
    let (_, _, message) = condition(&b, conditions::READY).unwrap();
    assert!(message.to_lowercase().contains("forbidden"), "{message}");
    // The reconcile itself fails (and is retried with backoff) after writing that status.
    eventually("the failure is counted", || async {
        (op.metrics.failures_total() > 0).then_some(())
    })
    .await;
    // Counted under its reason, as `/metrics` shows it.
    let reasons = op.failure_reasons();
    assert!(reasons.contains("reason=\"Forbidden\""), "{reasons}");
    op.stop().await;
}

/// Stopping a reconciler at once (`run_with_abort`'s abort, what the hub does when it loses
/// leadership or gives up on a sync) stops every task it runs: once it has returned, no
/// request of its reaches the cluster and nothing more is written, although reconciles were
/// in flight (each of its requests is held 1 s by the server; those held at the stop are
/// dropped with their connection, never handled). Before, workers, watches and discovery
/// were detached tasks that outlived the reconciler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_reconciler_sends_nothing_once_it_returned() {
    use kleym_test_support::env;
    use kleym_test_support::recording::RecordingAuthenticator;

    const N: usize = 40;
    let (_sim, cluster, _admin) = start_cluster(true).await;
    let store = cluster.store();
    env::seed_environment(&store, N).unwrap();
    env::create_bindings(&store, 0..N).unwrap();
    let recorder = RecordingAuthenticator::install(&cluster, "stopper");
    // Every request waits 1 s in the server: at any moment each busy worker has one there.
    recorder.set_delay(Duration::from_secs(1));
    // Every task alive now is kubesim's or the admin client's; the reconciler's client, its
    // connections (both ends) and the reconciler's own tasks come on top.
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let baseline = alive();
    let client = cluster.client_for_token(recorder.token()).await.unwrap();
    let mut config = SpokeConfig::new(TD);
    config.discovery_interval = Duration::from_millis(200);
    let spoke = Spoke::new(client, config, Arc::new(SpokeMetrics::default())).unwrap();
    let ctx = spoke.context();
    let (shutdown, abort) = (CancellationToken::new(), CancellationToken::new());
    let task = tokio::spawn(spoke.run_with_abort(shutdown.clone(), abort.clone()));
    eventually("caches synced", || {
        let ready = ctx.readiness.clone();
        async move { ready.is_ready().then_some(()) }
    })
    .await;
    eventually("a first ClusterSPIFFEID", || {
        let store = store.clone();
        async move { (!env::csid_names(&store).is_empty()).then_some(()) }
    })
    .await;

    abort.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the reconciler stops")
        .unwrap()
        .unwrap();
    let returned = chrono::Utc::now();
    let rv = store.current_resource_version();
    assert!(
        !env::converged_with(&store, N, cluster_spiffe_id_name),
        "reconciles were still to do when it was stopped"
    );
    // Proof that nothing can still come, rather than a pause: kubesim serves each connection
    // in a task of this runtime, and the reconciler's client runs its connections in tasks
    // too. Once the last clone of the client is gone (`ctx` holds one) and the tasks are
    // back to the baseline, no task of the reconciler is left to send anything, its
    // connections are closed at both ends, and every request the server held for it has
    // been let through (recorded) or dropped.
    drop(ctx);
    eventually(
        "every task of the reconciler and its connections ended",
        || async { (alive() <= baseline).then_some(()) },
    )
    .await;
    assert_eq!(
        recorder.arrived_after(returned),
        Vec::<chrono::DateTime<chrono::Utc>>::new(),
        "requests of the reconciler after it returned"
    );
    assert_eq!(
        recorder.passed_after(returned),
        Vec::<chrono::DateTime<chrono::Utc>>::new(),
        "requests of the reconciler handled after it returned"
    );
    assert_eq!(
        store.current_resource_version(),
        rv,
        "a write landed after the reconciler returned"
    );
    drop(shutdown);
}
