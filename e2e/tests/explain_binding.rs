//! `kleym explain binding`, and both explanations through the hub API, against one kubesim
//! cluster whose kleym output the real spoke reconciler wrote. The pool `qwen-pool`
//! (`app=vllm-qwen`) has four pods: one the binding reaches (container `chat`), one without
//! a `chat` container, one with another service account and one not scheduled; a fifth pod
//! (`app=vllm-llama`) is outside the pool. The expected reasons are written here from the
//! objects, not taken from the model.
//!
//! The hub path: the cluster is also the hub cluster. The hub reads it as the ServiceAccount
//! `kleym-system/kleym-hub` bound to exactly `deploy/spoke/clusterrole.yaml` (what
//! `kleym trust-config` binds the hub's identity to in a spoke; refused until the optional
//! `deploy/spoke/explain-clusterrole.yaml` is bound too), and reviews callers with a
//! real TokenReview and SubjectAccessReview. `reader` may explain namespace `serving` of
//! cluster `fleet/spoke-1`; `outsider` may read the fleet report only.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::single::{
    condition, create, create_manifest, eventually, inference_namespace, repo_yaml_docs,
    start_spoke, wait_observed,
};
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer};
use kleym_hub::http::{ApiMetrics, ApiState, Registry, StaticHubView, router, serve};
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const TD: &str = "prod.example.org";
const NS: &str = "serving";
const CLUSTER: &str = "spoke-1";
const AUDIENCE: &str = "kleym-hub";

async fn token(admin: &kube::Client, ns: &str, sa: &str, audiences: &[&str]) -> String {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| (*a).to_string()).collect(),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// RBAC of the hub's identity and of the two callers.
async fn access(admin: &kube::Client) {
    for ns in ["kleym-system", "ops"] {
        create(
            &Api::<Namespace>::all(admin.clone()),
            json!({"metadata": {"name": ns}}),
        )
        .await;
    }
    let sa = |ns: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": ns}})
    };
    let crb = |name: &str, role: &str, ns: &str, sa: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    };
    let mut docs = vec![
        sa("kleym-system", "kleym-hub"),
        sa("ops", "reader"),
        sa("ops", "outsider"),
        crb(
            "hub-reviews",
            "system:auth-delegator",
            "kleym-system",
            "kleym-hub",
        ),
        crb(
            "kleym-hub-access",
            "kleym-spoke",
            "kleym-system",
            "kleym-hub",
        ),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "fleet-report"},
            "rules": [{"apiGroups": ["kleym.io"], "resources": ["fleetidentityreports"], "verbs": ["get"]}]}),
        crb("reader-report", "fleet-report", "ops", "reader"),
        crb("outsider-report", "fleet-report", "ops", "outsider"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "explain", "namespace": NS},
            "rules": [{"apiGroups": ["kleym.io"], "resources": ["explanations"],
                "resourceNames": [format!("fleet/{CLUSTER}")], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "reader-explain", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "explain"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ops"}]}),
    ];
    // The shipped ClusterRole, exactly as `kleym trust-config` prints it for the hub.
    docs.insert(0, repo_yaml_docs("deploy/spoke/clusterrole.yaml").remove(0));
    for d in &docs {
        create_manifest(admin, d).await;
    }
}

/// The optional ClusterRole `kleym explain --hub-url` needs, exactly as shipped
/// (`deploy/spoke/explain-clusterrole.yaml`), bound to the hub's ServiceAccount.
async fn grant_explain_reader(admin: &kube::Client) {
    let role = repo_yaml_docs("deploy/spoke/explain-clusterrole.yaml").remove(0);
    assert_eq!(role["metadata"]["name"], "kleym-explain-reader");
    create_manifest(admin, &role).await;
    create_manifest(
        admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kleym-hub-explain"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "kleym-explain-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "kleym-hub", "namespace": "kleym-system"}]}),
    )
    .await;
}

/// Serves the hub API on loopback for cluster `fleet/spoke-1`, read through `spoke`.
async fn start_api(
    reviews: kube::Client,
    spoke: kube::Client,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    let auth = ApiAuth::new(
        AuthConfig::new(AuthMode::Enforce, AUDIENCE),
        Arc::new(KubeReviewer::new(reviews)),
        metrics.clone(),
    );
    let view = Arc::new(StaticHubView::leader());
    view.set_cluster(
        "fleet",
        CLUSTER,
        json!({"cluster": format!("fleet/{CLUSTER}")}),
    );
    view.set_spoke_client("fleet", CLUSTER, spoke);
    let app = router(ApiState {
        view,
        registry: Arc::new(registry),
        auth,
        metrics,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, app, None, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// `kleym explain <args> -o json` with the manager's settings; (exit code, stdout, stderr).
async fn kleym(args: &[&str]) -> (Option<i32>, Value, String) {
    let out = tokio::process::Command::new(kleym_binary().expect("kleym binary"))
        .arg("explain")
        .args(args)
        .args([
            "-o",
            "json",
            "--trust-domain",
            TD,
            "--cluster-name",
            CLUSTER,
        ])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn pod(name: &str, app: &str, sa: &str, node: Option<&str>, containers: &[&str]) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| json!({"name": c, "image": format!("{c}:1")}))
        .collect();
    let mut spec = json!({"serviceAccountName": sa, "containers": containers});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": spec})
}

fn hub_args<'a>(addr: &'a str, token: &'a Path) -> Vec<&'a str> {
    vec![
        "--hub-url",
        addr,
        "--cluster",
        "fleet/spoke-1",
        "--token-file",
        token.to_str().unwrap(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_binding_and_the_hub_path_agree_with_the_objects() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, NS).await;
    create(
        &Api::<Node>::all(admin.clone()),
        json!({"metadata": {"name": "node-a"}}),
    )
    .await;
    let pods = Api::<Pod>::namespaced(admin.clone(), NS);
    for p in [
        pod(
            "vllm-0",
            "vllm-qwen",
            "model-server",
            Some("node-a"),
            &["chat", "sidecar"],
        ),
        pod(
            "vllm-1",
            "vllm-qwen",
            "model-server",
            Some("node-a"),
            &["batch"],
        ),
        pod("vllm-2", "vllm-qwen", "default", Some("node-a"), &["chat"]),
        pod("vllm-3", "vllm-qwen", "model-server", None, &["chat"]),
        pod(
            "llama-0",
            "vllm-llama",
            "model-server",
            Some("node-a"),
            &["chat"],
        ),
    ] {
        create(&pods, p).await;
    }
    let bindings = Api::<InferenceIdentityBinding>::namespaced(admin.clone(), NS);
    for (name, target) in [("chat-id", "chat"), ("broken", "missing")] {
        create(
            &bindings,
            json!({"apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
                "metadata": {"name": name},
                "spec": {"targetRef": {"name": target}, "mode": "PerObjective",
                    "containerDiscriminator": {"type": "ContainerName", "value": "chat"},
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]}}),
        )
        .await;
    }
    // A foreign object aimed at another namespace: the hub path must not show it.
    create(
        &Api::<ClusterSPIFFEID>::all(admin.clone()),
        json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
            "metadata": {"name": "elsewhere"},
            "spec": {"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/elsewhere",
                "namespaceSelector": {"matchLabels": {"team": "other"}}}}),
    )
    .await;
    let mut config = SpokeConfig::new(TD);
    config.discovery_interval = Duration::from_millis(200);
    config.error_backoff = Duration::from_millis(100);
    let spoke = Spoke::new(admin.clone(), config, Arc::new(SpokeMetrics::default())).unwrap();
    let stop_spoke = CancellationToken::new();
    let task = tokio::spawn(spoke.run(stop_spoke.clone()));
    let chat = wait_observed(&bindings, "chat-id", conditions::READY).await;
    eventually("broken: refused with InvalidRef", || async {
        let b = bindings.get("broken").await.ok()?;
        let (s, _, _) = condition(&b, conditions::INVALID_REF)?;
        (s == "True").then_some(())
    })
    .await;
    let output = chat
        .status
        .as_ref()
        .and_then(|s| s.cluster_spiffe_id.as_ref())
        .map(|o| o.name.clone())
        .expect("chat-id names its output");

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("spoke.kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig_yaml()).unwrap();
    let kc = kubeconfig.to_str().unwrap();

    // Locally, with the admin's kubeconfig.
    let (code, local, err) = kleym(&[
        "binding",
        "serving/chat-id",
        "--sample",
        "1",
        "--kubeconfig",
        kc,
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        local["clusterSPIFFEID"]["name"],
        output.as_str(),
        "{local:#}"
    );
    assert_eq!(
        local["clusterSPIFFEID"]["ownership"],
        json!({"kind": "proven", "binding": "serving/chat-id"})
    );
    assert_eq!(local["pool"]["resolved"], "true", "{local:#}");
    assert_eq!(local["pool"]["name"], "qwen-pool");
    assert_eq!(local["pool"]["matchLabels"], json!({"app": "vllm-qwen"}));
    assert_eq!(local["selected"]["count"], 1, "{local:#}");
    assert_eq!(
        local["selected"]["sample"],
        json!([{"name": "vllm-0", "node": "node-a", "containers": ["chat"]}])
    );
    // Three pool pods not reached; --sample 1 lists the first by name only.
    assert_eq!(local["notSelected"]["count"], 3, "{local:#}");
    assert_eq!(local["notSelected"]["sample"].as_array().unwrap().len(), 1);
    assert_eq!(local["masked"], json!([]));
    let (_, all, _) = kleym(&["binding", "serving/chat-id", "--kubeconfig", kc]).await;
    let why = |pod: &str| {
        all["notSelected"]["sample"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["name"] == pod))
            .map(|p| p["whyNot"].to_string())
            .unwrap_or_else(|| panic!("{pod} not among the pods not reached: {all:#}"))
    };
    assert!(why("vllm-1").contains("container batch: k8s:container-name:chat does not hold"));
    assert!(
        why("vllm-2").contains("k8s:sa:model-server does not hold"),
        "{}",
        why("vllm-2")
    );
    assert!(why("vllm-3").contains("not scheduled"), "{}", why("vllm-3"));
    assert!(
        !all["notSelected"].to_string().contains("llama-0"),
        "a pod outside the pool is not listed: {all:#}"
    );

    // The text form says the same.
    let text = tokio::process::Command::new(kleym_binary().expect("kleym binary"))
        .args([
            "explain",
            "binding",
            "serving/chat-id",
            "--trust-domain",
            TD,
        ])
        .args(["--cluster-name", CLUSTER, "--kubeconfig", kc])
        .output()
        .await
        .unwrap();
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    for line in [
        format!("ClusterSPIFFEID: {output} (ownership proven for serving/chat-id)\n"),
        "Pods it reaches: 1\n  vllm-0 (node node-a): chat\n".to_string(),
        "Pods of its pool it does not reach: 3\n".to_string(),
        "  vllm-3\n    the pod is not scheduled yet\n".to_string(),
    ] {
        assert!(text.contains(&line), "{line:?} not in:\n{text}");
    }

    // A refused binding: the pool does not resolve, for the compiler's reason.
    let (code, broken, err) = kleym(&["binding", "serving/broken", "--kubeconfig", kc]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(broken["pool"]["resolved"], "false", "{broken:#}");
    assert_eq!(broken["pool"]["reason"], "TargetNotFound");
    assert_eq!(broken["selected"]["count"], 0);
    assert_eq!(broken["clusterSPIFFEID"], Value::Null);
    let (code, _, err) = kleym(&["binding", "serving/nope", "--kubeconfig", kc]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("binding serving/nope not found"), "{err}");

    // Label mismatch, from the pod's side: the binding's objective names a pool that does
    // not select this pod, and the answer names the pool and the label it needs.
    let (code, llama, err) = kleym(&["pod", "serving/llama-0", "--kubeconfig", kc]).await;
    assert_eq!(code, Some(0), "{err}");
    let chat_verdict = llama["bindings"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "chat-id"))
        .cloned()
        .unwrap_or_else(|| panic!("{llama:#}"));
    assert_eq!(chat_verdict["selectsPod"], false);
    assert_eq!(chat_verdict["targetsPodPool"], false);
    assert_eq!(
        chat_verdict["whyNot"],
        json!([
            "it targets InferencePool qwen-pool (inference.networking.k8s.io) via \
             InferenceObjective serving/chat (llm-d.ai), which does not select the pod: \
             needs app=vllm-qwen (the pod has app=vllm-llama)"
        ])
    );

    // Through the hub.
    access(&admin).await;
    let hub_identity = token(&admin, "kleym-system", "kleym-hub", &[]).await;
    let hub_client = cluster.client_for_token(&hub_identity).await.unwrap();
    let (addr, _stop_api) = start_api(hub_client.clone(), hub_client).await;
    let url = format!("http://{addr}");
    let reader = dir.path().join("reader.token");
    std::fs::write(&reader, token(&admin, "ops", "reader", &[AUDIENCE]).await).unwrap();
    let outsider = dir.path().join("outsider.token");
    std::fs::write(
        &outsider,
        token(&admin, "ops", "outsider", &[AUDIENCE]).await,
    )
    .unwrap();

    // The shipped spoke ClusterRole grants nothing on pods: until the operator grants the
    // optional explain reader role, the hub answers with the refused read named.
    let mut args = vec!["pod", "serving/vllm-0"];
    args.extend(hub_args(&url, &reader));
    let (code, _, err) = kleym(&args).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("502")
            && err.contains(r#"cannot get resource "pods""#)
            && err.contains("kleym trust-config --allow-explain"),
        "{err}"
    );
    grant_explain_reader(&admin).await;

    let mut args = vec!["binding", "serving/chat-id"];
    args.extend(hub_args(&url, &reader));
    let (code, via_hub, err) = kleym(&args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        via_hub, all,
        "the hub's explanation of the binding is the local one"
    );

    let mut args = vec!["pod", "serving/vllm-0"];
    args.extend(hub_args(&url, &reader));
    let (code, pod_via_hub, err) = kleym(&args).await;
    assert_eq!(code, Some(0), "{err}");
    let (_, mut pod_local, _) = kleym(&["pod", "serving/vllm-0", "--kubeconfig", kc]).await;
    let names = |doc: &Value| -> Vec<String> {
        doc["clusterSPIFFEIDs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&pod_local).contains(&"elsewhere".to_string()));
    assert!(
        !names(&pod_via_hub).contains(&"elsewhere".to_string()),
        "the hub path shows only objects aimed at the namespace asked: {pod_via_hub:#}"
    );
    // Apart from that object, the same explanation.
    if let Some(a) = pod_local["clusterSPIFFEIDs"].as_array_mut() {
        a.retain(|c| c["name"] != "elsewhere");
    }
    assert_eq!(pod_via_hub, pod_local);

    // Refusals: another caller, another namespace, an unknown cluster.
    let mut args = vec!["pod", "serving/vllm-0"];
    args.extend(hub_args(&url, &outsider));
    let (code, _, err) = kleym(&args).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("403") && err.contains("explanations.kleym.io") && err.contains("serving"),
        "{err}"
    );
    let mut args = vec!["pod", "kleym-system/anything"];
    args.extend(hub_args(&url, &reader));
    let (code, _, err) = kleym(&args).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("403"), "{err}");
    let args = vec![
        "pod",
        "serving/vllm-0",
        "--hub-url",
        &url,
        "--cluster",
        "fleet/nope",
        "--token-file",
        reader.to_str().unwrap(),
    ];
    let (code, _, err) = kleym(&args).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("404") && err.contains("cluster fleet/nope is not in the hub's inventory"),
        "{err}"
    );
    let mut args = vec!["binding", "serving/nope"];
    args.extend(hub_args(&url, &reader));
    let (code, _, err) = kleym(&args).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("binding serving/nope not found in cluster fleet/spoke-1"),
        "{err}"
    );

    stop_spoke.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
}
