//! Bindings with long names converge on kubesim as on a real cluster: the binding of the
//! issue (`team-recommendation-serving/llama-3-70b-instruct-perobjective-binding`, whose
//! ClusterSPIFFEID name has one 86-character part) and the longest legal names (a
//! 63-character namespace, 253-character binding names). Kubernetes limits a DNS-1123
//! subdomain to 253 characters in all, not each dot-separated part to 63; kubesim used to,
//! and these bindings stayed `ClusterSPIFFEIDApplyFailed` there.

use kleym_e2e::single::create;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kleym_api::external::objective::llmd;
use kleym_api::external::pool::v1 as pool_v1;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::Api;
use kube::{Client, ResourceExt};
use kubesim::{Kubesim, KubesimOptions};
use serde_json::{Value, json};

const TD: &str = "prod.example.org";

/// Namespace `ns` with a model-server pod (containers `chat` and `code`), an InferencePool
/// and the objectives `chat` and `code`.
async fn environment(client: &Client, ns: &str) {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": ns}}),
    )
    .await;
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "model-server"}}),
    )
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "vllm-0", "labels": {"app": "vllm"}},
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
    create(
        &Api::<pool_v1::InferencePool>::namespaced(client.clone(), ns),
        json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}
            }
        }),
    )
    .await;
    for objective in ["chat", "code"] {
        create(
            &Api::<llmd::InferenceObjective>::namespaced(client.clone(), ns),
            json!({
                "apiVersion": "llm-d.ai/v1alpha2",
                "kind": "InferenceObjective",
                "metadata": {"name": objective},
                "spec": {"priority": 1, "poolRef": {"name": "pool"}}
            }),
        )
        .await;
    }
}

/// A PerObjective binding of objective `objective`, told apart by the container of the same
/// name (bindings on the same pods without it would collide).
fn per_objective(ns: &str, name: &str, objective: &str) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "targetRef": {"name": objective},
            "mode": "PerObjective",
            "containerDiscriminator": {"type": "ContainerName", "value": objective},
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]
        }
    })
}

/// `(status, reason, message)` of the binding's `Ready` condition once its current
/// generation is observed.
async fn ready(
    api: &Api<InferenceIdentityBinding>,
    name: &str,
) -> Option<(String, String, String)> {
    let b = api.get(name).await.ok()?;
    let status = b.status.as_ref()?;
    if status.observed_generation != b.metadata.generation {
        return None;
    }
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_with_the_longest_legal_names_converge() {
    let mut crds: Vec<Value> = kleym_e2e::fixtures::upstream_crds().expect("upstream CRDs");
    for crd in kleym_api::crds::all() {
        crds.push(serde_json::to_value(crd).unwrap());
    }
    let sim = Kubesim::start(
        &["spoke"],
        KubesimOptions {
            crds,
            ..KubesimOptions::default()
        },
    )
    .await
    .expect("kubesim starts");
    let client = sim.cluster("spoke").unwrap().kube_client().await.unwrap();

    let long_ns = format!("team-recommendation-serving-{}", "x".repeat(35));
    let parts = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let single = "b".repeat(253);
    let cases = [
        (
            "team-recommendation-serving".to_string(),
            "llama-3-70b-instruct-perobjective-binding".to_string(),
            "chat",
        ),
        (long_ns.clone(), parts, "chat"),
        (long_ns.clone(), single, "code"),
    ];
    environment(&client, "team-recommendation-serving").await;
    environment(&client, &long_ns).await;
    for (ns, name, objective) in &cases {
        let api: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), ns);
        create(&api, per_objective(ns, name, objective)).await;
    }

    let mut config = SpokeConfig::new(TD);
    config.discovery_interval = Duration::from_millis(200);
    config.error_backoff = Duration::from_millis(100);
    let spoke = Spoke::new(
        client.clone(),
        config,
        std::sync::Arc::new(SpokeMetrics::default()),
    )
    .expect("valid config");
    let token = CancellationToken::new();
    let task = tokio::spawn(spoke.run(token.clone()));

    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    for (ns, name, objective) in &cases {
        let api: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), ns);
        // A hang guard, not a timing assertion: on failure the last verdict is shown.
        let mut last = None;
        for _ in 0..300 {
            last = ready(&api, name).await;
            if last.as_ref().is_some_and(|(s, _, _)| s == "True") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, reason, message) = last.unwrap_or_default();
        assert_eq!(status, "True", "{ns}/{name}: {reason}: {message}");
        let b = api.get(name).await.unwrap();
        let owned = b
            .status
            .unwrap()
            .cluster_spiffe_id
            .expect("owned ClusterSPIFFEID");
        let expected = cluster_spiffe_id_name(ns, name);
        assert_eq!(owned.name, expected);
        assert!(expected.len() <= 253, "{}", expected.len());
        let obj = csids.get(&expected).await.expect("ClusterSPIFFEID exists");
        assert_eq!(obj.uid().as_deref(), Some(owned.uid.as_str()));
        assert_eq!(
            obj.spec.spiffe_id_template,
            format!("spiffe://{TD}/ns/{ns}/objective/{objective}")
        );
    }

    token.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("operator stops")
        .unwrap()
        .unwrap();
}
