//! `kleym explain binding`: one InferenceIdentityBinding seen from its pods. Reads the
//! binding, every ClusterSPIFFEID, the binding's namespace, its target and pool (resolved
//! with the compiler's own rules, [`kleym_spoke::compiler::resolve`]), the pods of its pool
//! and of its output's `podSelector`, and their nodes; then runs the pure model
//! (`kleym_spoke::explain`) once per pod, as `kleym explain pod` does, and sums up: the
//! pods its identity reaches, the pool's pods it does not reach and why, the pods where
//! SPIRE masks its entry, and its collisions and warnings.
//!
//! The inputs come from an [`ExplainSource`]. Read from the cluster (the local command),
//! that is `get` on the binding, its namespace and each pod's node; `list` on
//! ClusterSPIFFEIDs, on the namespace's objectives (or models) and pools, and on its pods
//! (with the pool's label selector). Through the hub, only the pods and their nodes are read
//! from the spoke; the rest comes from its caches ([`crate::explain_source::HubCaches`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::conditions::READY;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{ConflictPeer, IdentityWarning, InferenceIdentityBinding};
use kleym_spoke::compiler::{BindingInput, Lookup, PoolView, TargetView};
use kleym_spoke::explain::{ManagerConfig, Ownership, Verdict};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::explain::{ExplainError, Scope, binding_verdict, explain_objects, in_scope};
use crate::explain_source::{ClusterReads, ExplainSource};

/// The default number of pods listed per group ([`BindingExplanation::selected`] and
/// [`BindingExplanation::not_selected`]).
pub const DEFAULT_SAMPLE: usize = 10;

/// `kleym explain binding`'s answer: the `-o json|yaml` document (schema in
/// docs/explain.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingExplanation {
    /// The binding.
    pub binding: BindingRef,
    /// The SPIRE Controller Manager configuration the answer assumes.
    pub manager: ManagerConfig,
    /// The ClusterSPIFFEID its status names, when it names one.
    #[serde(rename = "clusterSPIFFEID")]
    pub cluster_spiffe_id: Option<OutputRef>,
    /// Its pool, as the compiler resolves it (target → pool).
    pub pool: PoolResolution,
    /// The pods its identity reaches (an entry SPIRE receives, for some container).
    pub selected: PodGroup<SelectedPod>,
    /// The pool's pods it does not reach, each with why.
    pub not_selected: PodGroup<UnselectedPod>,
    /// Pods for which its entry is masked: an older ClusterSPIFFEID declares the same entry,
    /// so SPIRE's entry follows that object.
    pub masked: Vec<MaskedPod>,
    /// `status.conflictPeers`: bindings of the namespace it collides with.
    pub collisions: Vec<ConflictPeer>,
    /// `status.warnings`.
    pub warnings: Vec<IdentityWarning>,
}

/// The binding explained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.targetRef` as `Kind/name`.
    pub target: String,
    /// Its `Ready` condition, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCondition>,
}

/// A binding's `Ready` condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// The ClusterSPIFFEID a binding produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputRef {
    /// Object name (from the binding's status).
    pub name: String,
    /// Whether the object exists.
    pub exists: bool,
    /// Its `spiffeIDTemplate` (empty when it does not exist).
    pub spiffe_id_template: String,
    /// kleym's ownership proof on the object (`foreign` when it does not exist).
    pub ownership: Ownership,
}

/// The pool a binding targets (the model's type, re-exported here where it was born).
pub use kleym_spoke::explain::targets::PoolResolution;

/// A count and the first pods of a group, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroup<T> {
    /// How many pods.
    pub count: usize,
    /// The first `--sample` of them, in name order.
    pub sample: Vec<T>,
}

/// A pod the binding's identity reaches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectedPod {
    /// Pod name.
    pub name: String,
    /// Node.
    pub node: String,
    /// The containers that get the binding's SPIFFE ID (or may: the agent decides).
    pub containers: Vec<String>,
}

/// A pod of the pool the binding does not reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnselectedPod {
    /// Pod name.
    pub name: String,
    /// Why not (the same sentences as `kleym explain pod`'s `whyNot`).
    pub why_not: Vec<String>,
}

/// A pod where SPIRE keeps another object's declaration of the binding's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaskedPod {
    /// Pod name.
    pub pod: String,
    /// The older ClusterSPIFFEID whose declaration wins.
    pub by: String,
}

/// What [`explain_binding_objects`] reads: everything already fetched.
#[derive(Debug, Clone, Copy)]
pub struct BindingInputs<'a> {
    /// The binding.
    pub binding: &'a InferenceIdentityBinding,
    /// Its namespace.
    pub namespace: &'a Namespace,
    /// Its target and pool as the compiler's lookups.
    pub target: &'a Lookup<TargetView>,
    /// The pool.
    pub pool: &'a Lookup<PoolView>,
    /// The candidate pods: the pool's and those of the output's `podSelector`.
    pub pods: &'a [Pod],
    /// Their nodes, by name (a missing one is a missing node).
    pub nodes: &'a BTreeMap<String, Node>,
    /// Every ClusterSPIFFEID.
    pub objects: &'a [ClusterSPIFFEID],
}

/// Read the cluster through `client` and explain binding `namespace/name`; at most
/// `sample` pods are listed per group.
pub async fn explain_binding(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    manager: &ManagerConfig,
    field_manager: &str,
    sample: usize,
    scope: Scope,
) -> Result<BindingExplanation, ExplainError> {
    explain_binding_from(
        &ClusterReads(client),
        namespace,
        name,
        manager,
        field_manager,
        sample,
        scope,
    )
    .await
}

/// Explain binding `namespace/name` with the inputs `source` reads; at most `sample` pods
/// are listed per group.
pub async fn explain_binding_from(
    source: &impl ExplainSource,
    namespace: &str,
    name: &str,
    manager: &ManagerConfig,
    field_manager: &str,
    sample: usize,
    scope: Scope,
) -> Result<BindingExplanation, ExplainError> {
    let binding =
        source
            .binding(namespace, name)
            .await?
            .ok_or_else(|| ExplainError::BindingNotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })?;
    let ns = source.namespace(namespace).await?;
    let objects = source.cluster_spiffe_ids().await?;
    let objects = in_scope(objects, &ns, scope);
    let (target, pool) = source.target_and_pool(&binding).await?;

    // Candidate pods: the pool's, and those the output selects (kleym writes the pool's
    // labels as the output's matchLabels, so the second list is usually the same pods).
    let mut selectors: BTreeSet<String> = BTreeSet::new();
    if let Lookup::Found(p) = &pool {
        selectors.insert(label_selector(p.match_labels.iter()));
    }
    let output = output_object(&binding, &objects);
    if let Some(o) = output
        && let Some(sel) = &o.spec.pod_selector
        && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
    {
        selectors.insert(label_selector(sel.match_labels.iter().flatten()));
    }
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    for selector in &selectors {
        // An empty selector would list every pod of the namespace: a pool without labels
        // selects nothing.
        if selector.is_empty() {
            continue;
        }
        for p in source.pods(namespace, selector).await? {
            pods.insert(p.name_any(), p);
        }
    }
    let pods: Vec<Pod> = pods.into_values().collect();
    let mut nodes = BTreeMap::new();
    let node_names: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .filter(|n| !n.is_empty())
        .collect();
    for n in node_names {
        if let Some(node) = source.node(&n).await? {
            nodes.insert(n, node);
        }
    }
    explain_binding_objects(
        BindingInputs {
            binding: &binding,
            namespace: &ns,
            target: &target,
            pool: &pool,
            pods: &pods,
            nodes: &nodes,
            objects: &objects,
        },
        manager,
        field_manager,
        sample,
    )
}

/// `key=value,...`, the list selector of `labels`.
fn label_selector<K: std::fmt::Display, V: std::fmt::Display>(
    labels: impl Iterator<Item = (K, V)>,
) -> String {
    labels
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn output_object<'a>(
    b: &InferenceIdentityBinding,
    objects: &'a [ClusterSPIFFEID],
) -> Option<&'a ClusterSPIFFEID> {
    let want = b.status.as_ref()?.cluster_spiffe_id.as_ref()?;
    objects.iter().find(|o| o.name_any() == want.name)
}

/// Explain from objects already read (the pure half of [`explain_binding`]).
pub fn explain_binding_objects(
    inputs: BindingInputs<'_>,
    manager: &ManagerConfig,
    field_manager: &str,
    sample: usize,
) -> Result<BindingExplanation, ExplainError> {
    let b = inputs.binding;
    let namespace = b.namespace().unwrap_or_default();
    let name = b.name_any();
    let key = format!("{namespace}/{name}");
    let ready = b
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == READY)
        .map(|c| ReadyCondition {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        });
    let output_name = b
        .status
        .as_ref()
        .and_then(|s| s.cluster_spiffe_id.as_ref())
        .map(|o| o.name.clone());
    let cluster_spiffe_id =
        output_name.map(
            |n| match inputs.objects.iter().find(|o| o.name_any() == n) {
                Some(o) => OutputRef {
                    name: n,
                    exists: true,
                    spiffe_id_template: o.spec.spiffe_id_template.clone(),
                    ownership: kleym_spoke::explain::ownership_of(o, field_manager),
                },
                None => OutputRef {
                    name: n,
                    exists: false,
                    spiffe_id_template: String::new(),
                    ownership: Ownership::Foreign,
                },
            },
        );
    let input = BindingInput {
        namespace: namespace.clone(),
        name: name.clone(),
        spec: b.spec.clone(),
        target: inputs.target.clone(),
        pool: inputs.pool.clone(),
    };
    let pool = kleym_spoke::explain::targets::resolve_pool(&input);
    let pool_labels = match &pool {
        PoolResolution::Found { match_labels, .. } => Some(match_labels.clone()),
        PoolResolution::Refused { .. } => None,
    };

    let mut selected = Vec::new();
    let mut not_selected = Vec::new();
    let mut masked = Vec::new();
    for pod in inputs.pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .and_then(|n| inputs.nodes.get(n));
        let e = explain_objects(
            pod,
            inputs.namespace,
            node,
            inputs.objects,
            &[],
            &kleym_spoke::explain::targets::NamespaceTargets::default(),
            manager,
            field_manager,
        )?;
        let verdict = binding_verdict(
            b,
            &pool,
            pod,
            inputs.objects,
            &e.cluster_spiffe_ids,
            &e.containers,
        );
        let own = e
            .cluster_spiffe_ids
            .iter()
            .find(|c| matches!(&c.ownership, Ownership::Proven { binding } if *binding == key));
        if let Some(Verdict::Masked { by }) = own.map(|c| &c.verdict) {
            masked.push(MaskedPod {
                pod: pod.name_any(),
                by: by.clone(),
            });
        }
        let in_pool = pool_labels.as_ref().is_some_and(|want| {
            let have = pod.labels();
            want.iter().all(|(k, v)| have.get(k) == Some(v))
        });
        if verdict.selects_pod {
            let own_name = own.map(|c| c.name.as_str()).unwrap_or_default();
            let containers = e
                .containers
                .iter()
                .filter(|k| {
                    k.entries.iter().any(|x| {
                        x.declared_by == own_name
                            && !matches!(
                                x.applies,
                                kleym_spoke::explain::containers::Applies::No { .. }
                            )
                    })
                })
                .map(|k| k.container.clone())
                .collect();
            selected.push(SelectedPod {
                name: pod.name_any(),
                node: e.pod.node.clone(),
                containers,
            });
        } else if in_pool {
            not_selected.push(UnselectedPod {
                name: pod.name_any(),
                why_not: verdict.why_not,
            });
        }
    }
    fn group<T>(mut v: Vec<T>, sample: usize) -> PodGroup<T> {
        let count = v.len();
        v.truncate(sample);
        PodGroup { count, sample: v }
    }
    let status = b.status.as_ref();
    Ok(BindingExplanation {
        binding: BindingRef {
            namespace,
            name,
            target: format!("{}/{}", b.spec.target_ref.kind, b.spec.target_ref.name),
            ready,
        },
        manager: manager.clone(),
        cluster_spiffe_id,
        pool,
        selected: group(selected, sample),
        not_selected: group(not_selected, sample),
        masked,
        collisions: status.map(|s| s.conflict_peers.clone()).unwrap_or_default(),
        warnings: status.map(|s| s.warnings.clone()).unwrap_or_default(),
    })
}

/// Write `e` as readable text.
pub fn render_text(e: &BindingExplanation, out: &mut impl Write) -> io::Result<()> {
    let b = &e.binding;
    writeln!(
        out,
        "Binding {}/{} (target {})",
        b.namespace, b.name, b.target
    )?;
    match &b.ready {
        Some(r) => writeln!(out, "  Ready={} {}: {}", r.status, r.reason, r.message)?,
        None => writeln!(out, "  Ready not reported yet")?,
    }
    match &e.cluster_spiffe_id {
        None => writeln!(out, "\nClusterSPIFFEID: none")?,
        Some(o) if !o.exists => writeln!(
            out,
            "\nClusterSPIFFEID: {} (named by its status, but not found)",
            o.name
        )?,
        Some(o) => {
            let proof = match &o.ownership {
                Ownership::Proven { binding } => format!("ownership proven for {binding}"),
                Ownership::Claimed { binding, why } => {
                    format!("claimed for {binding}, not proven: {why}")
                }
                Ownership::Foreign => "not kleym's: the ownership proof fails".to_string(),
            };
            writeln!(out, "\nClusterSPIFFEID: {} ({proof})", o.name)?;
            writeln!(out, "  SPIFFE ID template {}", o.spiffe_id_template)?;
        }
    }
    match &e.pool {
        PoolResolution::Found {
            target,
            name,
            group,
            match_labels,
        } => writeln!(
            out,
            "\nPool: {name} ({group}) via {target}, selects {}",
            label_selector(match_labels.iter())
        )?,
        PoolResolution::Refused { reason, message } => {
            writeln!(out, "\nPool: not resolved: {reason}: {message}")?
        }
    }
    writeln!(out, "\nPods it reaches: {}", e.selected.count)?;
    for p in &e.selected.sample {
        writeln!(
            out,
            "  {} (node {}): {}",
            p.name,
            p.node,
            p.containers.join(", ")
        )?;
    }
    if e.selected.sample.len() < e.selected.count {
        writeln!(out, "  ...")?;
    }
    writeln!(
        out,
        "\nPods of its pool it does not reach: {}",
        e.not_selected.count
    )?;
    for p in &e.not_selected.sample {
        writeln!(out, "  {}", p.name)?;
        for why in &p.why_not {
            writeln!(out, "    {why}")?;
        }
    }
    if e.not_selected.sample.len() < e.not_selected.count {
        writeln!(out, "  ...")?;
    }
    if !e.masked.is_empty() {
        writeln!(
            out,
            "\nMasked by SPIRE (an older object declares the same entry):"
        )?;
        for m in &e.masked {
            writeln!(out, "  {}: by {}", m.pod, m.by)?;
        }
    }
    writeln!(out, "\nCollisions:")?;
    if e.collisions.is_empty() {
        writeln!(out, "  none")?;
    }
    for c in &e.collisions {
        writeln!(out, "  {} ({})", c.name, c.reason)?;
    }
    writeln!(out, "\nWarnings:")?;
    if e.warnings.is_empty() {
        writeln!(out, "  none")?;
    }
    for w in &e.warnings {
        writeln!(out, "  {}: {}", w.reason, w.message)?;
    }
    Ok(())
}
