//! `kleym explain` from objects already read (no cluster): which bindings of a pod's
//! namespace target the pod's pool (resolved through their objectives), and the JSON
//! documents of both explanations against the schema `docs/explain.md` documents.
//!
//! The expected sentences and the schema's keys are written here or read from the docs,
//! never derived from the code under test.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::InferenceIdentityBinding;
use kleym_api::TargetKind;
use kleym_api::external::objective;
use kleym_api::external::pool;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::label_map::LabelMap;
use kleym_hub::explain::{PodExplanation, explain_objects, render_text};
use kleym_hub::explain_binding::{BindingExplanation, BindingInputs, explain_binding_objects};
use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kleym_spoke::compiler::{Lookup, PoolRefView, PoolView, TargetView};
use kleym_spoke::explain::ManagerConfig;
use kleym_spoke::explain::targets::NamespaceTargets;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const TD: &str = "prod.example.org";
const NS: &str = "serving";

fn from<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn manager() -> ManagerConfig {
    ManagerConfig {
        trust_domain: TD.into(),
        cluster_name: "spoke-1".into(),
        cluster_domain: "cluster.local".into(),
        class_name: String::new(),
        watch_classless: false,
        ignore_namespaces: Vec::new(),
        parent_id_template: String::new(),
    }
}

fn namespace() -> Namespace {
    from(json!({"metadata": {"name": NS, "labels": {"team": "serving"}}}))
}

fn node() -> Node {
    from(json!({"metadata": {"name": "node-a", "uid": "node-uid"}}))
}

fn pod(name: &str, labels: Value, sa: &str, node: Option<&str>) -> Pod {
    from(json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid"), "labels": labels},
        "spec": {"serviceAccountName": sa, "nodeName": node,
                 "containers": [{"name": "chat", "image": "vllm:1"},
                                {"name": "sidecar", "image": "envoy:1"}]}
    }))
}

/// A binding on `target` whose status is `status`.
fn binding(name: &str, target: &str, sa: &str, status: Value) -> InferenceIdentityBinding {
    from(json!({
        "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid")},
        "spec": {"targetRef": {"kind": "InferenceObjective", "name": target},
                 "mode": "PerObjective",
                 "containerDiscriminator": {"type": "ContainerName", "value": "chat"},
                 "workloadSelectorTemplates": [format!("k8s:sa:{sa}")]},
        "status": status
    }))
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

fn csid(name: &str, created: &str, spec: Value) -> ClusterSPIFFEID {
    from(json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "creationTimestamp": created},
        "spec": spec
    }))
}

/// kleym's output for binding `binding`: its name, the owner annotation, written by
/// kleym's field manager with server-side apply (the ownership proof).
fn kleym_output(binding: &str, created: &str, spec: Value) -> ClusterSPIFFEID {
    let name = cluster_spiffe_id_name(NS, binding);
    let mut o = csid(&name, created, spec);
    o.metadata.annotations = Some(BTreeMap::from([(
        "kleym.io/owner".to_string(),
        format!("{NS}/{binding}/{binding}-uid"),
    )]));
    o.metadata.managed_fields = Some(from(json!([{
        "manager": "kleym", "operation": "Apply", "apiVersion": "spire.spiffe.io/v1alpha1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {"f:kleym.io/owner": {}}}}
    }])));
    o
}

/// kleym's spec for a binding of pool labels `app` with service account `sa`.
fn kleym_spec(id: &str, app: &str, sa: &str) -> Value {
    json!({"spiffeIDTemplate": format!("spiffe://{TD}/ns/{NS}/objective/{id}"),
           "podSelector": {"matchLabels": {"app": app}},
           "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
           "workloadSelectorTemplates": [format!("k8s:ns:{NS}"), format!("k8s:sa:{sa}"),
                                         "k8s:container-name:chat"]})
}

fn objective_view(name: &str, pool_name: &str) -> TargetView {
    TargetView {
        kind: TargetKind::InferenceObjective,
        group: objective::GROUP_LLMD.into(),
        namespace: NS.into(),
        name: name.into(),
        pool_ref: PoolRefView {
            group: pool::GROUP_V1.into(),
            kind: pool::KIND.into(),
            name: pool_name.into(),
            namespace: None,
        },
    }
}

fn pool_view(name: &str, app: &str) -> PoolView {
    PoolView {
        group: pool::GROUP_V1.into(),
        namespace: NS.into(),
        name: name.into(),
        match_labels: [("app", app)].into_iter().collect::<LabelMap>(),
    }
}

/// The namespace's objectives and pools: `chat` and `summarize` name `qwen-pool`
/// (`app=vllm-qwen`), `batch` names `llama-pool` (`app=vllm-llama`).
fn targets() -> NamespaceTargets {
    NamespaceTargets {
        llmd_objectives: Some(vec![
            objective_view("chat", "qwen-pool"),
            objective_view("summarize", "qwen-pool"),
            objective_view("batch", "llama-pool"),
        ]),
        gaie_objectives: None,
        models: None,
        pools_v1: Some(vec![
            pool_view("qwen-pool", "vllm-qwen"),
            pool_view("llama-pool", "vllm-llama"),
        ]),
        pools_legacy: None,
    }
}

fn ns_with_name_label() -> Namespace {
    let mut ns = namespace();
    ns.metadata
        .labels
        .get_or_insert_default()
        .insert("kubernetes.io/metadata.name".into(), NS.into());
    ns
}

/// The pod `vllm-0` of `qwen-pool` and three bindings besides one that reaches it:
/// `wrong-sa` targets the objective `summarize` of the same pool but confines its identity
/// to another service account; `llama` targets `batch`, an objective of another pool;
/// `broken` names an objective that does not exist.
fn pool_case() -> (Pod, Vec<InferenceIdentityBinding>, Vec<ClusterSPIFFEID>) {
    let pod = pod(
        "vllm-0",
        json!({"app": "vllm-qwen"}),
        "model-server",
        Some("node-a"),
    );
    let ok = json!({"conditions": [ready("True", "Reconciled", "ok")]});
    let bindings = vec![
        binding("chat-id", "chat", "model-server", ok.clone()),
        binding("wrong-sa", "summarize", "batch-runner", ok.clone()),
        binding("llama", "batch", "model-server", ok),
        binding(
            "broken",
            "missing",
            "model-server",
            json!({"conditions": [ready("False", "TargetNotFound",
                "binding serving/broken: spec.targetRef names InferenceObjective serving/missing, which does not exist")]}),
        ),
    ];
    let objects = vec![
        kleym_output(
            "chat-id",
            "2026-01-01T00:00:00Z",
            kleym_spec("chat", "vllm-qwen", "model-server"),
        ),
        kleym_output(
            "wrong-sa",
            "2026-01-01T00:00:00Z",
            kleym_spec("summarize", "vllm-qwen", "batch-runner"),
        ),
        kleym_output(
            "llama",
            "2026-01-01T00:00:00Z",
            kleym_spec("batch", "vllm-llama", "model-server"),
        ),
    ];
    (pod, bindings, objects)
}

fn explain_pool_case() -> PodExplanation {
    let (pod, bindings, objects) = pool_case();
    let node = node();
    explain_objects(
        &pod,
        &ns_with_name_label(),
        Some(&node),
        &objects,
        &bindings,
        &targets(),
        &manager(),
        "kleym",
    )
    .expect("explained")
}

#[test]
fn explain_pod_resolves_which_bindings_target_the_pods_pool_through_their_objectives() {
    let e = explain_pool_case();
    let doc = serde_json::to_value(&e).expect("JSON");
    let b = |name: &str| {
        doc["bindings"]
            .as_array()
            .and_then(|a| a.iter().find(|b| b["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no binding {name} in {doc:#}"))
    };
    // The binding that reaches the pod.
    assert_eq!(b("chat-id")["targetsPodPool"], true);
    assert_eq!(b("chat-id")["selectsPod"], true);
    assert_eq!(b("chat-id")["whyNot"], json!([]));

    // Same pool through another objective, wrong service account: listed as targeting the
    // pod's pool, with the selector that does not hold in any container.
    let wrong = b("wrong-sa");
    assert_eq!(wrong["targetsPodPool"], true, "{wrong:#}");
    assert_eq!(wrong["selectsPod"], false);
    assert_eq!(
        wrong["pool"],
        json!({"resolved": "true", "target": "InferenceObjective serving/summarize (llm-d.ai)",
               "name": "qwen-pool", "group": "inference.networking.k8s.io",
               "matchLabels": {"app": "vllm-qwen"}})
    );
    assert_eq!(
        wrong["whyNot"],
        json!([
            "no container matches its workload selectors (container chat: \
                k8s:sa:batch-runner does not hold; container sidecar: \
                k8s:container-name:chat does not hold)"
        ])
    );

    // An objective of another pool: not the pod's pool, and that is the reason given.
    let llama = b("llama");
    assert_eq!(llama["targetsPodPool"], false, "{llama:#}");
    assert_eq!(llama["selectsPod"], false);
    assert_eq!(
        llama["whyNot"],
        json!([
            "it targets InferencePool llama-pool (inference.networking.k8s.io) via \
                InferenceObjective serving/batch (llm-d.ai), which does not select the pod: \
                needs app=vllm-llama (the pod has app=vllm-qwen)"
        ])
    );

    // A target that does not resolve: the compiler's refusal.
    let broken = b("broken");
    assert_eq!(broken["targetsPodPool"], false);
    assert_eq!(broken["pool"]["resolved"], "false");
    assert_eq!(broken["pool"]["reason"], "TargetNotFound");
    assert_eq!(
        broken["whyNot"],
        json!([
            "the binding is refused: TargetNotFound: binding serving/broken: \
                spec.targetRef names InferenceObjective serving/missing, which does not exist"
        ])
    );

    // The text groups them: the bindings meant for the pod first.
    let mut out = Vec::new();
    render_text(&e, &mut out).expect("text");
    let text = String::from_utf8(out).expect("UTF-8");
    let mine = text
        .split("Bindings in namespace serving that target the pod's pool:\n")
        .nth(1)
        .and_then(|t| t.split("\nOther bindings in namespace serving:\n").next())
        .unwrap_or_else(|| panic!("no section of the pod's pool in:\n{text}"));
    let others = text
        .split("\nOther bindings in namespace serving:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no section of other bindings in:\n{text}"));
    for name in ["chat-id", "wrong-sa"] {
        assert!(mine.contains(&format!("  {name} (")), "{name} in:\n{mine}");
        assert!(
            !others.contains(&format!("  {name} (")),
            "{name} in:\n{others}"
        );
    }
    for name in ["llama", "broken"] {
        assert!(
            others.contains(&format!("  {name} (")),
            "{name} in:\n{others}"
        );
        assert!(!mine.contains(&format!("  {name} (")), "{name} in:\n{mine}");
    }
    assert!(
        mine.contains("    no container matches its workload selectors (container chat: k8s:sa:batch-runner does not hold"),
        "{mine}"
    );
}

/// Every verdict, ownership and container answer the pod schema documents, over four
/// explanations of one namespace's objects (scheduled, not scheduled, node missing,
/// namespace ignored).
fn pod_documents() -> Vec<Value> {
    let (pod0, bindings, mut objects) = pool_case();
    let chat = objects[0].clone();
    let mut dup = chat.clone();
    dup.metadata = from(json!({"name": "zz-duplicate", "uid": "zz-duplicate-uid",
                                "creationTimestamp": "2026-02-01T00:00:00Z"}));
    objects.push(dup);
    let later = "2026-02-01T00:00:00Z";
    objects.push(csid(
        "platform-fallback",
        later,
        json!({"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/fallback", "fallback": true}),
    ));
    objects.push(csid(
        "other-class",
        later,
        json!({"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/other", "className": "other"}),
    ));
    objects.push(csid("invalid", later, json!({"spiffeIDTemplate": ""})));
    objects.push(csid(
        "elsewhere",
        later,
        json!({"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/elsewhere",
               "namespaceSelector": {"matchLabels": {"team": "other"}}}),
    ));
    objects.push(csid(
        "bad-render",
        later,
        json!({"spiffeIDTemplate": "spiffe://other.example.org/x"}),
    ));
    let mut claimed = csid(
        "claimed",
        later,
        json!({"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/claimed",
               "workloadSelectorTemplates": ["k8s:pod-image-count:2"],
               "dnsNameTemplates": ["{{ .PodMeta.Name }}.serving.svc"]}),
    );
    claimed.metadata.annotations = Some(BTreeMap::from([(
        "kleym.io/owner".to_string(),
        format!("{NS}/ghost/ghost-uid"),
    )]));
    objects.push(claimed);

    let ns = ns_with_name_label();
    let node = node();
    let explain = |pod: &Pod, node: Option<&Node>, manager: &ManagerConfig| {
        let e = explain_objects(
            pod,
            &ns,
            node,
            &objects,
            &bindings,
            &targets(),
            manager,
            "kleym",
        )
        .expect("explained");
        serde_json::to_value(e).expect("JSON")
    };
    let unscheduled = pod("vllm-9", json!({"app": "vllm-qwen"}), "model-server", None);
    let lost = pod(
        "vllm-8",
        json!({"app": "vllm-qwen"}),
        "model-server",
        Some("node-gone"),
    );
    let mut ignoring = manager();
    ignoring.ignore_namespaces = vec!["^serving$".into()];
    vec![
        explain(&pod0, Some(&node), &manager()),
        explain(&unscheduled, None, &manager()),
        explain(&lost, None, &manager()),
        explain(&pod0, Some(&node), &ignoring),
    ]
}

/// `kleym explain binding` of `chat-id` (reaching one pod, not another, masked on a third,
/// with a collision and a warning) and of `broken` (its target does not resolve).
fn binding_documents() -> Vec<Value> {
    let (_, bindings, mut objects) = pool_case();
    let chat_output = objects[0].clone();
    // An older foreign copy of kleym's spec, for the canary pod only: it declares the same
    // entry there, and masks kleym's.
    let mut canary_spec = serde_json::to_value(&chat_output.spec).expect("JSON");
    canary_spec["podSelector"]["matchLabels"]["canary"] = json!("yes");
    objects.push(csid("aa-canary-copy", "2025-01-01T00:00:00Z", canary_spec));
    let mut chat = bindings[0].clone();
    chat.status = Some(from(json!({
        "conditions": [ready("True", "Reconciled", "ok")],
        "clusterSPIFFEID": {"name": chat_output.metadata.name, "uid": "x"},
        "conflictPeers": [{"name": "wrong-sa", "reason": "IdentityCollision"}],
        "warnings": [{"reason": "OverlappingDefaultIdentity", "message": "m"}]
    })));
    let pods = vec![
        pod(
            "vllm-0",
            json!({"app": "vllm-qwen"}),
            "model-server",
            Some("node-a"),
        ),
        pod(
            "vllm-1",
            json!({"app": "vllm-qwen"}),
            "default",
            Some("node-a"),
        ),
        pod(
            "vllm-2",
            json!({"app": "vllm-qwen", "canary": "yes"}),
            "model-server",
            Some("node-a"),
        ),
    ];
    let nodes = BTreeMap::from([("node-a".to_string(), node())]);
    let ns = ns_with_name_label();
    let explain = |b: &InferenceIdentityBinding, target: Lookup<TargetView>| {
        let pool = match &target {
            Lookup::Found(_) => Lookup::Found(pool_view("qwen-pool", "vllm-qwen")),
            _ => Lookup::NotFound,
        };
        let e: BindingExplanation = explain_binding_objects(
            BindingInputs {
                binding: b,
                namespace: &ns,
                target: &target,
                pool: &pool,
                pods: &pods,
                nodes: &nodes,
                objects: &objects,
            },
            &manager(),
            "kleym",
            10,
        )
        .expect("explained");
        serde_json::to_value(e).expect("JSON")
    };
    let chat_doc = explain(&chat, Lookup::Found(objective_view("chat", "qwen-pool")));
    // The case is what it says: one pod reached, one not, one masked.
    assert_eq!(chat_doc["selected"]["count"], 1, "{chat_doc:#}");
    assert_eq!(chat_doc["notSelected"]["count"], 2, "{chat_doc:#}");
    assert_eq!(
        chat_doc["masked"][0]["by"], "aa-canary-copy",
        "{chat_doc:#}"
    );
    vec![chat_doc, explain(&bindings[3], Lookup::NotFound)]
}

/// The rows of the schema table under `heading` in docs/explain.md: (field, description).
fn schema_rows(heading: &str) -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/explain.md");
    let docs = std::fs::read_to_string(path).expect("docs/explain.md");
    let section = docs
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?} in docs/explain.md"))
        .1;
    let section = section.split("\n#").next().unwrap_or_default();
    let rows: Vec<(String, String)> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // "| field | type | description |" splits into ["", field, type, description, ""].
            Some((cells.get(1)?.to_string(), cells.get(3)?.to_string()))
        })
        .collect();
    assert!(rows.len() >= 5, "too few schema rows under {heading:?}");
    rows
}

/// The backquoted spans of a Markdown cell.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn is_word(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The JSON keys and string values a schema table documents. A span like
/// `{"kind": "claimed", "binding", "why"}` documents each quoted word; other spans document
/// themselves when they are one lower-case word (capitalized spans are values of
/// Kubernetes' own fields, such as a condition's `True`, and prose spans are skipped).
fn documented(rows: &[(String, String)]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut top = BTreeSet::new();
    let mut words = BTreeSet::new();
    for (field, description) in rows {
        for s in spans(field) {
            let name = s.trim_end_matches("[]");
            match name.strip_prefix('…') {
                Some(nested) => words.insert(nested.to_string()),
                None => {
                    top.insert(name.to_string());
                    words.insert(name.to_string())
                }
            };
        }
        for s in spans(description) {
            let s = s.trim_end_matches("[]").to_string();
            if s.starts_with('{') {
                words.extend(
                    s.split('"')
                        .skip(1)
                        .step_by(2)
                        .filter(|w| is_word(w))
                        .map(str::to_string),
                );
            } else if is_word(&s) {
                words.insert(s);
            }
        }
    }
    (top, words)
}

/// Every key (outside label maps, whose keys are the user's) and every string value.
fn walk(v: &Value, keys: &mut BTreeSet<String>, values: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                keys.insert(k.clone());
                if k != "matchLabels" {
                    walk(child, keys, values);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| walk(c, keys, values)),
        Value::String(s) => {
            values.insert(s.clone());
        }
        _ => {}
    }
}

/// Check `docs` against the table under `heading`, whose rows may refer to the tables under
/// `also` ("as for `explain pod`") for the keys of nested objects.
fn check_against_schema(heading: &str, also: &[&str], docs: &[Value]) {
    let (top, words) = documented(&schema_rows(heading));
    let mut allowed = words.clone();
    for h in also {
        allowed.extend(documented(&schema_rows(h)).1);
    }
    let (mut keys, mut values) = (BTreeSet::new(), BTreeSet::new());
    let mut top_keys = BTreeSet::new();
    for d in docs {
        walk(d, &mut keys, &mut values);
        top_keys.extend(d.as_object().expect("an object").keys().cloned());
    }
    let snake: Vec<&String> = keys.iter().filter(|k| k.contains('_')).collect();
    assert!(snake.is_empty(), "{heading}: keys with '_': {snake:?}");
    let absent_top: Vec<&String> = top.difference(&top_keys).collect();
    assert!(
        absent_top.is_empty(),
        "{heading}: documented top-level fields absent: {absent_top:?}"
    );
    let absent: Vec<&String> = words
        .iter()
        .filter(|w| !keys.contains(*w) && !values.contains(*w))
        .collect();
    assert!(
        absent.is_empty(),
        "{heading}: documented keys or values the JSON never carries: {absent:?}"
    );
    let undocumented: Vec<&String> = keys.iter().filter(|k| !allowed.contains(*k)).collect();
    assert!(
        undocumented.is_empty(),
        "{heading}: keys the schema does not document: {undocumented:?}"
    );
}

#[test]
fn explain_json_matches_the_documented_schema() {
    let pod_schema = "## The JSON/YAML schema";
    check_against_schema(pod_schema, &[], &pod_documents());
    check_against_schema(
        "### Its JSON/YAML schema",
        &[pod_schema],
        &binding_documents(),
    );
}
