//! `kleym explain pod`: read one pod, its namespace and node, every ClusterSPIFFEID and the
//! bindings of the pod's namespace, and explain with the spoke's pure model
//! (`kleym_spoke::explain`) which SVIDs the pod gets and why. The inputs come from an
//! [`ExplainSource`]: the cluster itself (the local command: reads only, with the caller's
//! own credentials; it needs `get` on the pod, its namespace and its node, `list` on
//! ClusterSPIFFEIDs and on the namespace's InferenceIdentityBindings, objectives, models and
//! pools), or the hub's caches of
//! the spoke plus the reads they cannot answer ([`crate::explain_source::HubCaches`]).

use std::io::{self, Write};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::InferenceIdentityBinding;
use kleym_api::conditions::READY;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::explain::containers::{Applies, ContainerSvids, per_container};
use kleym_spoke::explain::targets::{PoolResolution, TargetsOf, resolve_pool};
use kleym_spoke::explain::{
    Candidate, KeptEntry, ManagerConfig, Ownership, PodInputs, Verdict, explain_pod as model,
};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

pub use crate::explain_source::ExplainError;
use crate::explain_source::{ClusterReads, ExplainSource};

/// `kleym explain pod`'s answer: the `-o json|yaml` document (schema in docs/explain.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodExplanation {
    /// The pod.
    pub pod: PodRef,
    /// The SPIRE Controller Manager configuration the answer assumes.
    pub manager: ManagerConfig,
    /// Every ClusterSPIFFEID of the cluster and what it does for the pod.
    #[serde(rename = "clusterSPIFFEIDs")]
    pub cluster_spiffe_ids: Vec<Candidate>,
    /// The entries SPIRE receives for the pod.
    pub entries: Vec<KeptEntry>,
    /// Per container, which entries apply.
    pub containers: Vec<ContainerSvids>,
    /// The distinct SPIFFE IDs of the pod's entries.
    pub svids: Vec<String>,
    /// Each binding of the pod's namespace: the pool it targets, whether that is the pod's
    /// pool, whether it gives the pod its identity, and why not.
    pub bindings: Vec<BindingVerdict>,
}

/// The pod explained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Node (empty: not scheduled).
    pub node: String,
    /// Service account.
    pub service_account: String,
}

/// One binding of the pod's namespace, seen from the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingVerdict {
    /// Binding name.
    pub name: String,
    /// The ClusterSPIFFEID proven to be its output, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_spiffe_id: Option<String>,
    /// Its pool, resolved through its target as the compiler resolves it.
    pub pool: PoolResolution,
    /// Whether that pool selects the pod: the binding is meant for pods like this one.
    pub targets_pod_pool: bool,
    /// Whether its identity reaches the pod (an entry SPIRE receives, for some container).
    pub selects_pod: bool,
    /// Why not, when it does not (empty when it does).
    pub why_not: Vec<String>,
}

/// Which ClusterSPIFFEIDs an answer may show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every ClusterSPIFFEID of the cluster (the local command: the caller read them all).
    Cluster,
    /// Only those whose `namespaceSelector` selects the namespace asked about (the hub
    /// path: a caller allowed one namespace learns nothing of objects aimed elsewhere).
    /// The entries are the same: an object that does not select the namespace renders no
    /// entry there, so it neither masks nor is masked, nor keeps a fallback away.
    Namespace,
}

/// The ClusterSPIFFEIDs of `objects` that `scope` lets an answer about namespace `ns` show.
pub fn in_scope(
    objects: Vec<ClusterSPIFFEID>,
    ns: &Namespace,
    scope: Scope,
) -> Vec<ClusterSPIFFEID> {
    if scope == Scope::Cluster {
        return objects;
    }
    let labels = ns.labels();
    objects
        .into_iter()
        .filter(|o| {
            o.spec
                .namespace_selector
                .as_ref()
                .is_none_or(|s| kleym_spoke::explain::labels::matches(s, labels).unwrap_or(false))
        })
        .collect()
}

/// Read the cluster through `client` and explain pod `namespace/name`.
pub async fn explain_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    manager: &ManagerConfig,
    field_manager: &str,
    scope: Scope,
) -> Result<PodExplanation, ExplainError> {
    explain_pod_from(
        &ClusterReads(client),
        namespace,
        name,
        manager,
        field_manager,
        scope,
    )
    .await
}

/// Explain pod `namespace/name` with the inputs `source` reads.
pub async fn explain_pod_from(
    source: &impl ExplainSource,
    namespace: &str,
    name: &str,
    manager: &ManagerConfig,
    field_manager: &str,
    scope: Scope,
) -> Result<PodExplanation, ExplainError> {
    let pod = source
        .pod(namespace, name)
        .await?
        .ok_or_else(|| ExplainError::PodNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    let ns = source.namespace(namespace).await?;
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let node = if node_name.is_empty() {
        None
    } else {
        source.node(&node_name).await?
    };
    let objects = source.cluster_spiffe_ids().await?;
    let objects = in_scope(objects, &ns, scope);
    let bindings = source.bindings(namespace).await?;
    let targets = source.namespace_targets(namespace, &bindings).await?;
    explain_objects(
        &pod,
        &ns,
        node.as_ref(),
        &objects,
        &bindings,
        targets.as_ref(),
        manager,
        field_manager,
    )
}

/// Explain from objects already read (the pure half of [`explain_pod`]); `targets` holds
/// the namespace's objectives, models and pools, to resolve each binding's pool.
#[allow(clippy::too_many_arguments)]
pub fn explain_objects(
    pod: &Pod,
    namespace: &Namespace,
    node: Option<&Node>,
    objects: &[ClusterSPIFFEID],
    bindings: &[InferenceIdentityBinding],
    targets: &dyn TargetsOf,
    manager: &ManagerConfig,
    field_manager: &str,
) -> Result<PodExplanation, ExplainError> {
    let inputs = PodInputs {
        pod,
        namespace,
        node,
    };
    let m = model(inputs, objects, manager, field_manager)?;
    let containers = per_container(pod, &m.entries);
    let svids = m.spiffe_ids();
    let spec = pod.spec.as_ref();
    let bindings = bindings
        .iter()
        .map(|b| {
            let pool = resolve_pool(&targets.input_for(b));
            binding_verdict(b, &pool, pod, objects, &m.candidates, &containers)
        })
        .collect();
    Ok(PodExplanation {
        pod: PodRef {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".to_string()),
        },
        manager: manager.clone(),
        cluster_spiffe_ids: m.candidates,
        entries: m.entries,
        containers,
        svids,
        bindings,
    })
}

/// Whether binding `b`, whose pool resolves to `pool`, targets `pod`'s pool, whether its
/// identity reaches the pod, and why not, from the model's answer for the pod
/// (`candidates`, `containers`).
pub(crate) fn binding_verdict(
    b: &InferenceIdentityBinding,
    pool: &PoolResolution,
    pod: &Pod,
    objects: &[ClusterSPIFFEID],
    candidates: &[Candidate],
    containers: &[ContainerSvids],
) -> BindingVerdict {
    let key = format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
    let output = candidates
        .iter()
        .find(|c| matches!(&c.ownership, Ownership::Proven { binding } if *binding == key));
    let mut why_not = Vec::new();
    let mut selects_pod = false;
    match output {
        None => {
            let ready = b
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == READY);
            match ready {
                Some(c) if c.status != "True" => why_not.push(format!(
                    "the binding is refused: {}: {}",
                    c.reason, c.message
                )),
                _ => why_not
                    .push("no ClusterSPIFFEID is proven to be this binding's output".to_string()),
            }
        }
        Some(c) => match &c.verdict {
            Verdict::Entry | Verdict::Masked { .. } => {
                if let Verdict::Masked { by } = &c.verdict {
                    why_not.push(format!(
                        "its entry is masked by the older ClusterSPIFFEID {by}, which declares the same entry"
                    ));
                }
                let applies_somewhere = containers.iter().any(|k| {
                    k.entries.iter().any(|e| {
                        e.declared_by == c.name && !matches!(e.applies, Applies::No { .. })
                    })
                });
                let spiffe_id = c.entry.as_ref().map(|e| e.spiffe_id.as_str());
                let no_container: Vec<String> = containers
                    .iter()
                    .filter_map(|k| {
                        k.entries
                            .iter()
                            .find(|e| Some(e.spiffe_id.as_str()) == spiffe_id)
                            .and_then(|e| match &e.applies {
                                Applies::No { selector } => Some(format!(
                                    "container {}: {selector} does not hold",
                                    k.container
                                )),
                                _ => None,
                            })
                    })
                    .collect();
                if matches!(c.verdict, Verdict::Entry) && applies_somewhere {
                    selects_pod = true;
                } else if !applies_somewhere {
                    why_not.push(format!(
                        "no container matches its workload selectors ({})",
                        no_container.join("; ")
                    ));
                }
            }
            Verdict::PodNotSelected => {
                why_not.push(format!(
                    "its podSelector does not select the pod's labels{}",
                    label_mismatch(c, pod, objects)
                ));
            }
            other => why_not.push(verdict_text(other)),
        },
    }
    let targets_pod_pool = pool.selects(pod.labels());
    if !selects_pod && !targets_pod_pool {
        // Not meant for this pod: that is the whole answer. The output's verdict would only
        // restate it (its podSelector is the other pool's labels).
        why_not = vec![match pool {
            PoolResolution::Found {
                target,
                name,
                group,
                ..
            } => {
                let missing = pool.missing_labels(pod.labels());
                if missing.is_empty() {
                    format!(
                        "it targets InferencePool {name} ({group}) via {target}, which has no labels and selects no pod"
                    )
                } else {
                    format!(
                        "it targets InferencePool {name} ({group}) via {target}, which does not select the pod: needs {}",
                        missing.join(", ")
                    )
                }
            }
            PoolResolution::Refused { reason, message } => {
                format!("the binding is refused: {reason}: {message}")
            }
        }];
    }
    BindingVerdict {
        name: b.name_any(),
        cluster_spiffe_id: output.map(|c| c.name.clone()),
        pool: pool.clone(),
        targets_pod_pool,
        selects_pod,
        why_not,
    }
}

/// The label pairs the kleym ClusterSPIFFEID requires that the pod lacks (kleym writes the
/// pool's labels as `matchLabels`).
fn label_mismatch(c: &Candidate, pod: &Pod, objects: &[ClusterSPIFFEID]) -> String {
    let Some(obj) = objects.iter().find(|o| o.name_any() == c.name) else {
        return String::new();
    };
    let labels = pod.labels();
    let missing: Vec<String> = obj
        .spec
        .pod_selector
        .iter()
        .flat_map(|s| s.match_labels.iter().flatten())
        .filter(|(k, v)| labels.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| match labels.get(k) {
            Some(have) => format!("{k}={v} (the pod has {k}={have})"),
            None => format!("{k}={v} (the pod has no {k})"),
        })
        .collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!(": needs {}", missing.join(", "))
    }
}

fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::OtherClass { class_name } if class_name.is_empty() => {
            "it has no className, and the controller manager does not watch classless objects"
                .to_string()
        }
        Verdict::OtherClass { class_name } => {
            format!("its className {class_name:?} is not the controller manager's")
        }
        Verdict::InvalidSpec { error } => format!("SPIRE cannot parse its spec: {error}"),
        Verdict::NamespaceNotSelected => {
            "its namespaceSelector does not select the pod's namespace".to_string()
        }
        Verdict::NamespaceIgnored => {
            "the controller manager ignores the pod's namespace".to_string()
        }
        Verdict::PodNotSelected => "its podSelector does not select the pod".to_string(),
        Verdict::FallbackNotApplied { because_of } => format!(
            "a fallback, not applied: {} give the pod an entry",
            because_of.join(", ")
        ),
        Verdict::NotScheduled => "the pod is not scheduled yet".to_string(),
        Verdict::NodeMissing { node } => format!("the pod's node {node} was not found"),
        Verdict::RenderFailed { error } => format!("rendering failed: {error}"),
        Verdict::Entry => "declares an entry SPIRE receives".to_string(),
        Verdict::Masked { by } => format!("masked by the older ClusterSPIFFEID {by}"),
    }
}

/// Write `e` as readable text.
pub fn render_text(e: &PodExplanation, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "Pod {}/{} (UID {}, node {}, service account {})",
        e.pod.namespace,
        e.pod.name,
        e.pod.uid,
        if e.pod.node.is_empty() {
            "<none>"
        } else {
            &e.pod.node
        },
        e.pod.service_account
    )?;
    writeln!(out, "\nSVIDs per container:")?;
    for c in &e.containers {
        let init = if c.init { " (init)" } else { "" };
        let ids = if c.svids.is_empty() {
            "none".to_string()
        } else {
            c.svids.join(", ")
        };
        writeln!(out, "  {}{init}: {ids}", c.container)?;
        for ce in &c.entries {
            match &ce.applies {
                Applies::Yes => {}
                Applies::No { selector } => writeln!(
                    out,
                    "    not {} ({}): {selector} does not hold",
                    ce.spiffe_id, ce.declared_by
                )?,
                Applies::Depends { selectors } => writeln!(
                    out,
                    "    maybe {} ({}): the agent decides {}",
                    ce.spiffe_id,
                    ce.declared_by,
                    selectors.join(", ")
                )?,
            }
        }
    }
    writeln!(out, "\nEntries SPIRE receives for the pod:")?;
    if e.entries.is_empty() {
        writeln!(out, "  none")?;
    }
    for k in &e.entries {
        writeln!(
            out,
            "  {}  (declared by {})",
            k.entry.spiffe_id, k.declared_by
        )?;
        writeln!(out, "    parent    {}", k.entry.parent_id)?;
        writeln!(out, "    selectors {}", k.entry.selectors.join(", "))?;
        if !k.masks.is_empty() {
            writeln!(out, "    masks     {}", k.masks.join(", "))?;
        }
    }
    writeln!(out, "\nClusterSPIFFEIDs:")?;
    for c in &e.cluster_spiffe_ids {
        let owner = match &c.ownership {
            Ownership::Proven { binding } => format!("kleym, binding {binding}"),
            Ownership::Claimed { binding, why } => {
                format!("claimed by binding {binding}, not proven: {why}")
            }
            Ownership::Foreign => "foreign".to_string(),
        };
        let kind = if c.fallback { " [fallback]" } else { "" };
        writeln!(out, "  {}{kind} ({owner})", c.name)?;
        if let Some(entry) = &c.entry {
            writeln!(
                out,
                "    renders {} [{}]",
                entry.spiffe_id,
                entry.selectors.join(", ")
            )?;
        }
        writeln!(out, "    {}", verdict_text(&c.verdict))?;
    }
    // Bindings meant for the pod (their pool selects it) first: their "why not" is the
    // answer to "why does this pod not get the identity I declared".
    let (mine, others): (Vec<&BindingVerdict>, Vec<&BindingVerdict>) = e
        .bindings
        .iter()
        .partition(|b| b.targets_pod_pool || b.selects_pod);
    for (title, group) in [
        (
            format!(
                "Bindings in namespace {} that target the pod's pool:",
                e.pod.namespace
            ),
            mine,
        ),
        (
            format!("Other bindings in namespace {}:", e.pod.namespace),
            others,
        ),
    ] {
        writeln!(out, "\n{title}")?;
        if group.is_empty() {
            writeln!(out, "  none")?;
        }
        for b in group {
            let output = b.cluster_spiffe_id.as_deref().unwrap_or("no output");
            if b.selects_pod {
                writeln!(out, "  {} ({output}): gives the pod its identity", b.name)?;
            } else {
                writeln!(out, "  {} ({output}): does not reach the pod", b.name)?;
            }
            for why in &b.why_not {
                writeln!(out, "    {why}")?;
            }
        }
    }
    Ok(())
}
