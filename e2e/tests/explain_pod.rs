//! `kleym explain pod` against a kubesim cluster whose kleym output the real spoke reconciler
//! wrote, beside foreign ClusterSPIFFEIDs: a fallback, an identical duplicate of kleym's
//! output (one of the two masks the other), one of another class, a second SPIFFE ID for the
//! same pods, and kleym's container discriminator. The expected entries are computed here by
//! hand from the objects, not by the model: each entry is its object's literal SPIFFE ID,
//! the parent `spiffe://<td>/spire/agent/k8s_psat/<cluster>/<node UID>`, and the selectors
//! `k8s:pod-uid:<uid>` plus its workload selectors, sorted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::single::{
    condition, create, eventually, inference_namespace, start_spoke, wait_observed,
};
use kleym_spoke::explain::ManagerConfig;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const TD: &str = "prod.example.org";
const NS: &str = "serving";
const CLUSTER: &str = "spoke-1";

fn csid(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": name}, "spec": spec})
}

/// Sorted as SPIRE Controller Manager keys selectors: by type, then value.
fn sorted_selectors(mut s: Vec<String>) -> Vec<String> {
    s.sort_by(|a, b| {
        let (ta, va) = a.split_once(':').unwrap_or((a, ""));
        let (tb, vb) = b.split_once(':').unwrap_or((b, ""));
        (ta, va).cmp(&(tb, vb))
    });
    s
}

fn verdict_of<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["clusterSPIFFEIDs"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no ClusterSPIFFEID {name} in {doc:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_pod_matches_hand_computed_entries() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, NS).await;
    let node = create(
        &Api::<Node>::all(admin.clone()),
        json!({"metadata": {"name": "node-a"}}),
    )
    .await;
    let pod = create(
        &Api::<Pod>::namespaced(admin.clone(), NS),
        json!({"metadata": {"name": "vllm-0", "labels": {"app": "vllm-qwen"}},
            "spec": {"serviceAccountName": "model-server", "nodeName": "node-a",
                "containers": [{"name": "chat", "image": "vllm:1"},
                               {"name": "sidecar", "image": "envoy:1"}]}}),
    )
    .await;
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
    let mut config = SpokeConfig::new(TD);
    config.discovery_interval = Duration::from_millis(200);
    config.error_backoff = Duration::from_millis(100);
    let spoke = Spoke::new(admin.clone(), config, Arc::new(SpokeMetrics::default())).unwrap();
    let token = CancellationToken::new();
    let task = tokio::spawn(spoke.run(token.clone()));
    let chat = wait_observed(&bindings, "chat-id", conditions::READY).await;
    eventually("broken: refused with InvalidRef", || async {
        let b = bindings.get("broken").await.ok()?;
        let (s, _, _) = condition(&b, conditions::INVALID_REF)?;
        (s == "True").then_some(())
    })
    .await;
    let output_name = chat
        .status
        .as_ref()
        .and_then(|s| s.cluster_spiffe_id.as_ref())
        .map(|o| o.name.clone())
        .expect("chat-id names its output");

    let csids = Api::<ClusterSPIFFEID>::all(admin.clone());
    let output = csids.get(&output_name).await.unwrap();
    let kleym_id = output.spec.spiffe_id_template.clone();
    let kleym_templates = output
        .spec
        .workload_selector_templates
        .clone()
        .unwrap_or_default();
    assert!(
        !kleym_id.contains("{{") && kleym_templates.iter().all(|t| !t.contains("{{")),
        "kleym writes literal IDs and selectors: {:?}",
        output.spec
    );
    // Foreign objects, all created after kleym's output.
    let dup_spec = serde_json::to_value(&output.spec).unwrap();
    create(&csids, csid("zz-duplicate", dup_spec)).await;
    create(
        &csids,
        csid(
            "platform-fallback",
            json!({
        "spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/fallback/{{ .PodMeta.Name }}",
        "fallback": true}),
        ),
    )
    .await;
    create(
        &csids,
        csid(
            "other-class",
            json!({
        "spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/other", "className": "other"}),
        ),
    )
    .await;
    create(
        &csids,
        csid(
            "second-id",
            json!({
        "spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/extra/{{ .PodSpec.ServiceAccountName }}",
        "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
        "workloadSelectorTemplates": ["k8s:ns:{{ .PodMeta.Namespace }}"]}),
        ),
    )
    .await;

    let manager = ManagerConfig {
        trust_domain: TD.into(),
        cluster_name: CLUSTER.into(),
        cluster_domain: "cluster.local".into(),
        class_name: String::new(),
        watch_classless: false,
        ignore_namespaces: vec!["^kube-system$".into()],
        parent_id_template: String::new(),
    };
    let explained = kleym_hub::explain::explain_pod(
        &admin,
        NS,
        "vllm-0",
        &manager,
        "kleym",
        kleym_hub::explain::Scope::Cluster,
    )
    .await
    .unwrap();
    let doc = serde_json::to_value(&explained).unwrap();

    // By hand: the two entries SPIRE receives.
    let pod_uid = pod.uid().unwrap();
    let parent = format!(
        "spiffe://{TD}/spire/agent/k8s_psat/{CLUSTER}/{}",
        node.uid().unwrap()
    );
    let mut kleym_selectors = vec![format!("k8s:pod-uid:{pod_uid}")];
    kleym_selectors.extend(kleym_templates);
    let extra_id = format!("spiffe://{TD}/extra/model-server");
    let extra_selectors = sorted_selectors(vec![
        format!("k8s:pod-uid:{pod_uid}"),
        format!("k8s:ns:{NS}"),
    ]);
    // The older of kleym's output and its duplicate declares the entry; a tie goes to the
    // smaller UID.
    let dup = csids.get("zz-duplicate").await.unwrap();
    let key = |o: &ClusterSPIFFEID| (o.metadata.creation_timestamp.clone().map(|t| t.0), o.uid());
    let (winner, loser) = if key(&output) <= key(&dup) {
        (output_name.as_str(), "zz-duplicate")
    } else {
        ("zz-duplicate", output_name.as_str())
    };
    let mut want = vec![
        json!({"entry": {"spiffeId": kleym_id, "parentId": parent,
            "selectors": sorted_selectors(kleym_selectors), "dnsNames": []},
            "declaredBy": winner, "masks": [loser]}),
        json!({"entry": {"spiffeId": extra_id, "parentId": parent,
            "selectors": extra_selectors, "dnsNames": []},
            "declaredBy": "second-id", "masks": []}),
    ];
    want.sort_by(|a, b| {
        a["entry"]["spiffeId"]
            .as_str()
            .cmp(&b["entry"]["spiffeId"].as_str())
    });
    assert_eq!(doc["entries"], json!(want), "{doc:#}");

    assert_eq!(verdict_of(&doc, winner)["verdict"], "entry");
    assert_eq!(verdict_of(&doc, loser)["verdict"], "masked");
    assert_eq!(verdict_of(&doc, loser)["by"], winner);
    assert_eq!(
        verdict_of(&doc, "platform-fallback")["verdict"],
        "fallbackNotApplied"
    );
    assert_eq!(verdict_of(&doc, "other-class")["verdict"], "otherClass");
    assert_eq!(verdict_of(&doc, "second-id")["verdict"], "entry");
    assert_eq!(
        verdict_of(&doc, &output_name)["ownership"],
        json!({"kind": "proven", "binding": format!("{NS}/chat-id")})
    );
    assert_eq!(
        verdict_of(&doc, "zz-duplicate")["ownership"],
        json!({"kind": "foreign"})
    );

    // The discriminator confines kleym's ID to container `chat`; the second ID reaches both.
    let svids = |c: &str| {
        doc["containers"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["container"] == c))
            .map(|x| x["svids"].clone())
            .unwrap_or_else(|| panic!("no container {c}"))
    };
    let mut chat_want = vec![
        kleym_id.clone(),
        format!("spiffe://{TD}/extra/model-server"),
    ];
    chat_want.sort();
    assert_eq!(svids("chat"), json!(chat_want));
    assert_eq!(
        svids("sidecar"),
        json!([format!("spiffe://{TD}/extra/model-server")])
    );

    // Bindings: chat-id reaches the pod; broken is refused, with its reason.
    let binding = |n: &str| {
        doc["bindings"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == n))
            .cloned()
            .unwrap_or_else(|| panic!("no binding {n}"))
    };
    assert_eq!(binding("chat-id")["selectsPod"], winner == output_name);
    assert_eq!(binding("broken")["selectsPod"], false);
    let why = binding("broken")["whyNot"].to_string();
    assert!(
        why.contains("refused") && why.contains("TargetNotFound") && why.contains("missing"),
        "{why}"
    );

    // The real binary, once: the same JSON; and a clear failure for a missing pod.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("spoke.kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig_yaml()).unwrap();
    let run = |pod: &str, format: &str| {
        let mut cmd = tokio::process::Command::new(kleym_binary().expect("kleym binary"));
        cmd.args(["explain", "pod", pod, "-o", format, "--trust-domain", TD])
            .args([
                "--cluster-name",
                CLUSTER,
                "--ignore-namespace",
                "^kube-system$",
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .kill_on_drop(true);
        cmd.output()
    };
    let out = run(&format!("{NS}/vllm-0"), "json").await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_binary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(from_binary["entries"], doc["entries"]);
    assert_eq!(from_binary["containers"], doc["containers"]);
    let text = run(&format!("{NS}/vllm-0"), "text").await.unwrap();
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    for line in [
        format!("  sidecar: spiffe://{TD}/extra/model-server\n"),
        format!("    not {kleym_id} ({winner}): k8s:container-name:chat does not hold\n"),
        format!("  {loser} ("),
        "    masked by the older ClusterSPIFFEID".to_string(),
        "  other-class (foreign)\n    its className \"other\" is not the controller manager's\n"
            .to_string(),
        "  broken (no output): does not reach the pod\n    the binding is refused: TargetNotFound"
            .to_string(),
    ] {
        assert!(text.contains(&line), "{line:?} not in:\n{text}");
    }
    let missing = run(&format!("{NS}/nope"), "json").await.unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("pod serving/nope not found"), "{stderr}");

    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    let _ = csids.list(&ListParams::default()).await;
}
