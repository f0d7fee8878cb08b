//! The demo's inference environment: what each spoke holds, and the findings planted in it.
//!
//! Every spoke runs the same namespace `llm` with a Qwen model-server pool serving two
//! objectives (`chat`, `summarize`, one vLLM container each) and an embedding pool
//! identified as a whole (PoolOnly), its pods scheduled on one node (so `kleym explain pod`
//! shows their entries). Two mistakes are planted:
//! - spoke 1 has a canary binding that selects the same pods, service account and container
//!   as `summarize`: an `IdentityCollision` (both refused until fixed);
//! - spoke 2 renamed the chat container (`chat-v2`), so `spiffe://<td>/ns/llm/objective/chat`
//!   means a different workload there than elsewhere: a `CrossClusterDrift`.

use serde_json::{Value, json};

/// Namespace of the inference workloads in every spoke.
pub const NS: &str = "llm";
/// Service account of the Qwen model servers.
pub const QWEN_SA: &str = "vllm-qwen";
/// Service account of the embedding servers.
pub const EMBED_SA: &str = "text-embedder";

/// A planted finding the report must show: kind, SPIFFE ID (if the kind has one) and members
/// as `cluster: namespace/binding`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Planted {
    /// Finding kind, as the API spells it.
    pub kind: &'static str,
    /// The SPIFFE ID concerned.
    pub spiffe_id: Option<String>,
    /// Members, sorted.
    pub members: Vec<String>,
}

/// Name of spoke `i` (1-based).
pub fn spoke_name(i: usize) -> String {
    format!("spoke-{i}")
}

/// The cluster name the hub reports for spoke `i` (`<profile namespace>/<profile name>`).
pub fn cluster_name(i: usize) -> String {
    format!(
        "{}/{}",
        crate::fixtures::profiles::PROFILE_NS,
        spoke_name(i)
    )
}

/// Container serving the `chat` objective in spoke `i` (renamed in spoke 2: the drift).
fn chat_container(i: usize) -> &'static str {
    if i == 2 { "chat-v2" } else { "chat" }
}

/// One object to create: `(group, version, plural, namespace, body)`.
pub type Seed = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Value,
);

/// The node every demo pod runs on (scheduled pods get entries; `kleym explain pod` shows
/// them with the node's agent as parent).
pub const NODE: &str = "gpu-node-1";

/// A pod of the demo, scheduled on [`NODE`].
pub const EXPLAINED_POD: &str = "qwen-0";

fn pod(name: &str, app: &str, sa: &str, containers: &[(&str, &str)]) -> Seed {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(n, image)| json!({"name": n, "image": image, "ports": [{"containerPort": 8000}]}))
        .collect();
    (
        "",
        "v1",
        "pods",
        Some(NS),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
            "spec": {"serviceAccountName": sa, "nodeName": NODE, "containers": containers}
        }),
    )
}

fn objective(name: &str, pool: &str, priority: i64) -> Seed {
    (
        "llm-d.ai",
        "v1alpha2",
        "inferenceobjectives",
        Some(NS),
        json!({
            "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"priority": priority, "poolRef": {"name": pool}}
        }),
    )
}

fn pool(name: &str, app: &str, epp: &str) -> Seed {
    (
        "inference.networking.k8s.io",
        "v1",
        "inferencepools",
        Some(NS),
        json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": app}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": epp, "port": {"number": 9002}}
            }
        }),
    )
}

fn per_objective(name: &str, objective: &str, sa: &str, container: &str) -> Seed {
    (
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        json!({
            "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "targetRef": {"kind": "InferenceObjective", "name": objective},
                "selectorSource": "DerivedFromPool",
                "mode": "PerObjective",
                "containerDiscriminator": {"type": "ContainerName", "value": container},
                "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{sa}")]
            }
        }),
    )
}

fn pool_only(name: &str, objective: &str, sa: &str) -> Seed {
    (
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
        Some(NS),
        json!({
            "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "targetRef": {"name": objective},
                "selectorSource": "DerivedFromPool",
                "mode": "PoolOnly",
                "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{sa}")],
                "svid": {"ttl": "1h"}
            }
        }),
    )
}

/// Everything spoke `i` (1-based) holds, in creation order (inputs before bindings).
pub fn spoke_objects(i: usize) -> Vec<Seed> {
    let chat = chat_container(i);
    let image = "vllm/vllm-openai:v0.10.1";
    let mut out = vec![
        (
            "",
            "v1",
            "namespaces",
            None,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": NS, "labels": {"kubernetes.io/metadata.name": NS}}}),
        ),
        (
            "",
            "v1",
            "serviceaccounts",
            Some(NS),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": QWEN_SA, "namespace": NS}}),
        ),
        (
            "",
            "v1",
            "serviceaccounts",
            Some(NS),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": EMBED_SA, "namespace": NS}}),
        ),
        (
            "",
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE,
                   "labels": {"kubernetes.io/hostname": NODE}}}),
        ),
        pod(
            EXPLAINED_POD,
            "vllm-qwen",
            QWEN_SA,
            &[(chat, image), ("summarize", image)],
        ),
        pod(
            "qwen-1",
            "vllm-qwen",
            QWEN_SA,
            &[(chat, image), ("summarize", image)],
        ),
        pod(
            "embedder-0",
            "text-embedder",
            EMBED_SA,
            &[("tei", "ghcr.io/huggingface/text-embeddings-inference:1.8")],
        ),
        pool("qwen-pool", "vllm-qwen", "qwen-epp"),
        pool("embed-pool", "text-embedder", "embed-epp"),
        objective("chat", "qwen-pool", 10),
        objective("summarize", "qwen-pool", 5),
        objective("embed", "embed-pool", 1),
    ];
    if i == 1 {
        out.push(objective("summarize-canary", "qwen-pool", 5));
    }
    out.push(per_objective("chat", "chat", QWEN_SA, chat));
    out.push(per_objective(
        "summarize",
        "summarize",
        QWEN_SA,
        "summarize",
    ));
    out.push(pool_only("embed", "embed", EMBED_SA));
    if i == 1 {
        // The planted collision: same pods, service account and container as `summarize`.
        out.push(per_objective(
            "summarize-canary",
            "summarize-canary",
            QWEN_SA,
            "summarize",
        ));
    }
    out
}

/// Number of bindings in a fleet of `spokes` spokes.
pub fn binding_count(spokes: usize) -> usize {
    (1..=spokes)
        .map(|i| {
            spoke_objects(i)
                .iter()
                .filter(|(_, _, plural, _, _)| *plural == "inferenceidentitybindings")
                .count()
        })
        .sum()
}

/// The findings planted in a fleet of `spokes` spokes, sorted.
pub fn planted_findings(spokes: usize, trust_domain: &str) -> Vec<Planted> {
    let mut out = Vec::new();
    if spokes >= 1 {
        out.push(Planted {
            kind: "IdentityCollision",
            spiffe_id: None,
            members: vec![
                format!("{}: {NS}/summarize", cluster_name(1)),
                format!("{}: {NS}/summarize-canary", cluster_name(1)),
            ],
        });
    }
    if spokes >= 2 {
        out.push(Planted {
            kind: "CrossClusterDrift",
            spiffe_id: Some(format!("spiffe://{trust_domain}/ns/{NS}/objective/chat")),
            members: (1..=spokes)
                .map(|i| format!("{}: {NS}/chat", cluster_name(i)))
                .collect(),
        });
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_findings_follow_the_fleet_size() {
        assert_eq!(planted_findings(1, "td").len(), 1);
        let three = planted_findings(3, "td");
        assert_eq!(three.len(), 2);
        let drift = three
            .iter()
            .find(|p| p.kind == "CrossClusterDrift")
            .unwrap();
        assert_eq!(drift.members.len(), 3);
        assert_eq!(binding_count(3), 4 + 3 + 3);
    }
}
