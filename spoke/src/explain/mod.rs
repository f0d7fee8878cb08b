//! Which SPIRE entries, and so which SVIDs, one pod gets from the cluster's ClusterSPIFFEIDs,
//! and why each ClusterSPIFFEID does or does not contribute. Pure: the caller reads the
//! objects; nothing here does I/O or reads a clock.
//!
//! The rules are SPIRE Controller Manager's (`pkg/spireentry/reconciler.go` and
//! `entries.go`), re-expressed:
//!
//! - a controller manager reads only ClusterSPIFFEIDs of its class: `className` equal to its
//!   own, or empty when it watches classless objects;
//! - a ClusterSPIFFEID whose spec does not parse (empty or unparsable template, invalid
//!   selector) is skipped whole;
//! - it selects the pod when its `namespaceSelector` selects the namespace's labels (unset:
//!   every namespace), the namespace is not one the manager ignores, and its `podSelector`
//!   selects the pod's labels (unset: every pod);
//! - a pod not yet scheduled gets no entry (it is rendered again once it is);
//! - the entry is: parent `spiffe://<td>/spire/agent/k8s_psat/<cluster>/<node UID>` (or the
//!   manager's `parentIDTemplate`, rendered without the pod's data and required to be a
//!   SPIFFE ID of the trust domain), selectors `k8s:pod-uid:<uid>` plus the rendered `workloadSelectorTemplates`, the
//!   rendered SPIFFE ID (which must be in the manager's trust domain) and DNS names
//!   (rendered, duplicates dropped, order kept);
//! - non-fallback ClusterSPIFFEIDs are evaluated first; a `fallback` one is skipped for a pod
//!   for which any non-fallback one rendered an entry, whether that entry is then kept or
//!   masked (a non-fallback whose render fails does not count);
//! - entries with the same SPIFFE ID, parent and selector set are one entry: the object
//!   created first declares it, ties broken by the one not being deleted, then the one
//!   deleted later, then the smaller UID; the others are masked;
//! - entries with different SPIFFE IDs are all kept: the pod gets several SVIDs.

pub mod containers;
pub mod gotemplate;
pub mod labels;
pub mod pool;
pub mod targets;

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::compiler::spiffe_id::SpiffeId;
use crate::ownership::{self, OWNER_ANNOTATION, Owner};
use gotemplate::{TemplateData, render, render_without_pod};

/// How the SPIRE Controller Manager instance that serves the pod is configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagerConfig {
    /// Trust domain (`trustDomain`).
    pub trust_domain: String,
    /// Cluster name (`clusterName`): part of every parent ID.
    pub cluster_name: String,
    /// Cluster domain (`clusterDomain`), for `.ClusterDomain`.
    pub cluster_domain: String,
    /// The manager's class (`className`); empty when it has none.
    pub class_name: String,
    /// Whether it also reads objects without a class (`watchClassless`).
    pub watch_classless: bool,
    /// Namespaces it ignores (`ignoreNamespaces`): regular expressions, a namespace is
    /// ignored when one of them matches anywhere in its name (Go's `MatchString`).
    pub ignore_namespaces: Vec<String>,
    /// Its `parentIDTemplate`; empty for the default,
    /// `spiffe://<td>/spire/agent/k8s_psat/<clusterName>/<node UID>`.
    #[serde(default, rename = "parentIDTemplate")]
    pub parent_id_template: String,
}

/// The model cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    /// An `ignoreNamespaces` entry is not a regular expression.
    #[error("ignoreNamespaces entry {pattern:?} is not a regular expression: {error}")]
    IgnorePattern {
        /// The entry.
        pattern: String,
        /// Why.
        error: String,
    },
}

impl ManagerConfig {
    /// Whether the manager ignores namespace `name`.
    pub fn ignores(&self, name: &str) -> Result<bool, ExplainError> {
        for pattern in &self.ignore_namespaces {
            let re = regex::Regex::new(pattern).map_err(|e| ExplainError::IgnorePattern {
                pattern: pattern.clone(),
                error: e.to_string(),
            })?;
            if re.is_match(name) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Who a ClusterSPIFFEID belongs to, as far as kleym can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "kind"
)]
pub enum Ownership {
    /// kleym's output for this binding: the ownership proof holds on the object.
    Proven {
        /// `namespace/name` of the binding.
        binding: String,
    },
    /// The object names a binding in kleym's annotation, but the proof fails: a claim only.
    Claimed {
        /// `namespace/name` of the binding it names.
        binding: String,
        /// Why the proof fails.
        why: String,
    },
    /// Not kleym's.
    Foreign,
}

/// The ownership of `obj` under kleym's field manager `field_manager`.
pub fn ownership_of(obj: &ClusterSPIFFEID, field_manager: &str) -> Ownership {
    match ownership::proven_owner(obj, field_manager) {
        Ok(owner) => Ownership::Proven {
            binding: format!("{}/{}", owner.namespace, owner.name),
        },
        Err(foreign) => match obj
            .annotations()
            .get(OWNER_ANNOTATION)
            .and_then(|v| Owner::parse(v))
        {
            Some(owner) => Ownership::Claimed {
                binding: format!("{}/{}", owner.namespace, owner.name),
                why: foreign.why,
            },
            None => Ownership::Foreign,
        },
    }
}

/// One SPIRE entry as SPIRE Controller Manager declares it for the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderedEntry {
    /// SPIFFE ID.
    pub spiffe_id: String,
    /// Parent ID (the agent on the pod's node).
    pub parent_id: String,
    /// Selectors, sorted by type then value as SPIRE Controller Manager keys them.
    pub selectors: Vec<String>,
    /// DNS names, in template order, duplicates dropped.
    pub dns_names: Vec<String>,
}

/// What became of one ClusterSPIFFEID for the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "verdict"
)]
pub enum Verdict {
    /// Its `className` is not read by the manager.
    OtherClass {
        /// The object's class (empty: classless).
        class_name: String,
    },
    /// Its spec does not parse: the manager skips it.
    InvalidSpec {
        /// Why.
        error: String,
    },
    /// Its `namespaceSelector` does not select the pod's namespace.
    NamespaceNotSelected,
    /// The manager ignores the pod's namespace.
    NamespaceIgnored,
    /// Its `podSelector` does not select the pod.
    PodNotSelected,
    /// A fallback, skipped because non-fallback objects gave the pod an entry.
    FallbackNotApplied {
        /// The non-fallback objects that did.
        because_of: Vec<String>,
    },
    /// The pod has no node yet: no entry until it is scheduled.
    NotScheduled,
    /// The pod's node is unknown: SPIRE Controller Manager counts a render failure.
    NodeMissing {
        /// The node name in the pod's spec.
        node: String,
    },
    /// Rendering failed (a template, an invalid SPIFFE ID or selector).
    RenderFailed {
        /// Why.
        error: String,
    },
    /// It declares an entry that SPIRE receives.
    Entry,
    /// It declares an entry that another object declares too, and that object wins.
    Masked {
        /// The winning object.
        by: String,
    },
}

/// One ClusterSPIFFEID and what it does for the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Object name.
    pub name: String,
    /// Object UID.
    pub uid: String,
    /// `spec.fallback`.
    pub fallback: bool,
    /// Who it belongs to.
    pub ownership: Ownership,
    /// The entry it renders for the pod, when it renders one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<RenderedEntry>,
    /// What became of it.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The model's answer for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodModel {
    /// Every ClusterSPIFFEID, in name order, with its verdict.
    pub candidates: Vec<Candidate>,
    /// The entries SPIRE receives for the pod (one per key), in SPIFFE ID order.
    pub entries: Vec<KeptEntry>,
    /// ClusterStaticEntries that declare one of those SPIFFE IDs as another entry (another
    /// parent or selector set): the ID is issued to other workloads too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with_static: Vec<SharedId>,
}

/// A SPIFFE ID of the pod that a ClusterStaticEntry declares for another entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedId {
    /// The SPIFFE ID.
    pub spiffe_id: String,
    /// The ClusterStaticEntry, as `ClusterStaticEntry <name>`.
    pub declared_by: String,
    /// Its parent ID.
    pub parent_id: String,
}

/// A ClusterStaticEntry (`spire.spiffe.io/v1alpha1`, cluster-scoped): a literal entry that
/// takes part in the same one-entry-per-key rule as the ClusterSPIFFEIDs' entries
/// (`addClusterStaticEntryEntriesState` in `pkg/spireentry/reconciler.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticEntry {
    /// Object name.
    pub name: String,
    /// `spec.className` (empty: none).
    pub class_name: String,
    /// `spec.spiffeID`.
    pub spiffe_id: String,
    /// `spec.parentID`.
    pub parent_id: String,
    /// `spec.selectors`, `type:value` each.
    pub selectors: Vec<String>,
    /// `spec.dnsNames`.
    pub dns_names: Vec<String>,
    /// Its age and UID, for the precedence between declarations of one entry.
    pub precedence: Precedence,
}

impl StaticEntry {
    /// The name the model gives it in verdicts and entries.
    pub fn label(&self) -> String {
        format!("ClusterStaticEntry {}", self.name)
    }

    /// The entry it declares, when the manager renders it: both IDs must parse and every
    /// selector must be `type:value` (`renderStaticEntry` in `pkg/spireentry/entries.go`;
    /// unlike a pod's entry, no trust domain check).
    fn render(&self) -> Option<RenderedEntry> {
        SpiffeId::parse(&self.spiffe_id).ok()?;
        SpiffeId::parse(&self.parent_id).ok()?;
        let valid = |s: &String| {
            s.split_once(':')
                .is_some_and(|(t, v)| !t.is_empty() && !v.is_empty())
        };
        if !self.selectors.iter().all(valid) {
            return None;
        }
        let mut selectors = self.selectors.clone();
        sort_selectors(&mut selectors);
        selectors.dedup();
        Some(RenderedEntry {
            spiffe_id: self.spiffe_id.clone(),
            parent_id: self.parent_id.clone(),
            selectors,
            dns_names: self.dns_names.clone(),
        })
    }
}

/// Sort selectors by type, then value, as SPIRE Controller Manager keys them.
fn sort_selectors(selectors: &mut [String]) {
    selectors.sort_by(|a, b| {
        let (ta, va) = a.split_once(':').unwrap_or((a, ""));
        let (tb, vb) = b.split_once(':').unwrap_or((b, ""));
        ta.cmp(tb).then_with(|| va.cmp(vb))
    });
}

/// An entry SPIRE receives, with the object that declares it and those it masks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptEntry {
    /// The entry.
    pub entry: RenderedEntry,
    /// The object whose declaration wins.
    pub declared_by: String,
    /// The objects whose identical declarations it masks.
    pub masks: Vec<String>,
}

impl PodModel {
    /// The distinct SPIFFE IDs the pod's entries carry (before per-container selectors).
    pub fn spiffe_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .entries
            .iter()
            .map(|e| e.entry.spiffe_id.clone())
            .collect();
        ids.dedup();
        ids
    }
}

/// The pod's side of the inputs.
#[derive(Debug, Clone, Copy)]
pub struct PodInputs<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its namespace.
    pub namespace: &'a Namespace,
    /// Its node, when the pod is scheduled and the node was found.
    pub node: Option<&'a Node>,
}

/// An object's precedence as SPIRE Controller Manager orders declarations of one entry:
/// the smaller one declares the entry, the others are masked. Also what the report's
/// masking analysis compares (`crate::compiler::collisions`), so both read one rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Precedence {
    /// `metadata.creationTimestamp`, in nanoseconds since the epoch (0 when unset).
    pub created_ns: i128,
    /// `metadata.deletionTimestamp`, in nanoseconds since the epoch, when deleting.
    pub deleted_ns: Option<i128>,
    /// `metadata.uid`.
    pub uid: String,
}

impl Precedence {
    /// The precedence of `obj`.
    pub fn of(obj: &ClusterSPIFFEID) -> Self {
        Self::of_meta(&obj.metadata)
    }

    /// The precedence of an object with metadata `meta`.
    pub fn of_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Precedence {
            created_ns: meta
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_nanosecond())
                .unwrap_or_default(),
            deleted_ns: meta
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0.as_nanosecond()),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

impl Ord for Precedence {
    /// Older first; then not deleting before deleting; then deleted later first; then UID.
    fn cmp(&self, other: &Self) -> Ordering {
        self.created_ns
            .cmp(&other.created_ns)
            .then_with(|| match (self.deleted_ns, other.deleted_ns) {
                (None, None) => Ordering::Equal,
                (Some(_), None) => Ordering::Greater,
                (None, Some(_)) => Ordering::Less,
                (Some(a), Some(b)) => b.cmp(&a),
            })
            .then_with(|| self.uid.cmp(&other.uid))
    }
}

impl PartialOrd for Precedence {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Evaluate every ClusterSPIFFEID in `objects` for the pod, as the manager configured by
/// `config` would. `field_manager` is kleym's, for the ownership proof.
pub fn explain_pod(
    inputs: PodInputs<'_>,
    objects: &[ClusterSPIFFEID],
    config: &ManagerConfig,
    field_manager: &str,
) -> Result<PodModel, ExplainError> {
    explain_pod_with_static(inputs, objects, &[], config, field_manager)
}

/// [`explain_pod`], with the cluster's ClusterStaticEntries `statics` declaring entries
/// beside the ClusterSPIFFEIDs: one that declares the very entry of a pod's (same SPIFFE ID,
/// parent and selectors) masks it or is masked by the same precedence; one that declares one
/// of the pod's SPIFFE IDs for another entry is listed in [`PodModel::shared_with_static`].
pub fn explain_pod_with_static(
    inputs: PodInputs<'_>,
    objects: &[ClusterSPIFFEID],
    statics: &[StaticEntry],
    config: &ManagerConfig,
    field_manager: &str,
) -> Result<PodModel, ExplainError> {
    let ignored = config.ignores(&inputs.namespace.name_any())?;
    let mut order: Vec<&ClusterSPIFFEID> = objects.iter().collect();
    order.sort_by_key(|a| a.name_any());
    // Non-fallback objects first, as the manager evaluates them: a fallback's fate depends
    // on what they rendered.
    let mut evaluation: Vec<usize> = (0..order.len()).collect();
    evaluation.sort_by_key(|&i| order[i].spec.fallback.unwrap_or(false));

    let mut candidates: Vec<Option<Candidate>> = vec![None; order.len()];
    let mut non_fallback_rendered: Vec<String> = Vec::new();
    for i in evaluation {
        let obj = order[i];
        let fallback = obj.spec.fallback.unwrap_or(false);
        let (entry, verdict) = evaluate(
            obj,
            inputs,
            config,
            ignored,
            fallback,
            &non_fallback_rendered,
        );
        if entry.is_some() && !fallback {
            non_fallback_rendered.push(obj.name_any());
        }
        candidates[i] = Some(Candidate {
            name: obj.name_any(),
            uid: obj.uid().unwrap_or_default(),
            fallback,
            ownership: ownership_of(obj, field_manager),
            entry,
            verdict,
        });
    }
    let mut candidates: Vec<Candidate> = candidates.into_iter().flatten().collect();

    // Group declarations by entry key and keep the preferred one of each.
    let mut by_key: BTreeMap<(String, String, Vec<String>), Vec<usize>> = BTreeMap::new();
    for (i, c) in candidates.iter().enumerate() {
        if let (Some(e), Verdict::Entry) = (&c.entry, &c.verdict) {
            by_key
                .entry((
                    e.spiffe_id.clone(),
                    e.parent_id.clone(),
                    e.selectors.clone(),
                ))
                .or_default()
                .push(i);
        }
    }
    // The manager reads the ClusterStaticEntries of its class, as its ClusterSPIFFEIDs.
    let statics: Vec<(&StaticEntry, RenderedEntry)> = statics
        .iter()
        .filter(|s| reads_class(config, &s.class_name))
        .filter_map(|s| s.render().map(|e| (s, e)))
        .collect();
    let precedence: Vec<Precedence> = order.iter().map(|o| Precedence::of(o)).collect();
    let mut entries = Vec::new();
    for (key, declared) in by_key {
        // Candidates by index, ClusterStaticEntries by the entry they declare.
        let mut declared: Vec<(Declarer, &Precedence)> = declared
            .into_iter()
            .map(|i| (Declarer::Object(i), &precedence[i]))
            .chain(
                statics
                    .iter()
                    .filter(|(_, e)| {
                        (&e.spiffe_id, &e.parent_id, &e.selectors) == (&key.0, &key.1, &key.2)
                    })
                    .map(|(s, e)| (Declarer::Static(s, e), &s.precedence)),
            )
            .collect();
        declared.sort_by(|a, b| a.1.cmp(b.1));
        let names: Vec<String> = declared
            .iter()
            .map(|(d, _)| match d {
                Declarer::Object(i) => candidates[*i].name.clone(),
                Declarer::Static(s, _) => s.label(),
            })
            .collect();
        let winner_name = names[0].clone();
        for (other, _) in &declared[1..] {
            if let Declarer::Object(i) = other {
                candidates[*i].verdict = Verdict::Masked {
                    by: winner_name.clone(),
                };
            }
        }
        let masks = names[1..].to_vec();
        let entry = match &declared[0].0 {
            Declarer::Object(i) => candidates[*i].entry.clone(),
            Declarer::Static(_, e) => Some((*e).clone()),
        };
        if let Some(entry) = entry {
            entries.push(KeptEntry {
                entry,
                declared_by: winner_name,
                masks,
            });
        }
    }
    let mut shared_with_static = Vec::new();
    for (s, e) in &statics {
        let same_id_other_entry = entries.iter().any(|k| {
            k.entry.spiffe_id == e.spiffe_id
                && (k.entry.parent_id != e.parent_id || k.entry.selectors != e.selectors)
        });
        if same_id_other_entry {
            shared_with_static.push(SharedId {
                spiffe_id: e.spiffe_id.clone(),
                declared_by: s.label(),
                parent_id: e.parent_id.clone(),
            });
        }
    }
    Ok(PodModel {
        candidates,
        entries,
        shared_with_static,
    })
}

/// Who declares an entry: a ClusterSPIFFEID (by its index among the candidates) or a
/// ClusterStaticEntry.
enum Declarer<'a> {
    Object(usize),
    Static(&'a StaticEntry, &'a RenderedEntry),
}

/// Whether the manager configured by `config` reads objects of class `class`
/// (`reconcileClass` in `pkg/spireentry/reconciler.go`).
fn reads_class(config: &ManagerConfig, class: &str) -> bool {
    (class.is_empty() && config.watch_classless) || class == config.class_name
}

fn evaluate(
    obj: &ClusterSPIFFEID,
    inputs: PodInputs<'_>,
    config: &ManagerConfig,
    ignored: bool,
    fallback: bool,
    non_fallback_rendered: &[String],
) -> (Option<RenderedEntry>, Verdict) {
    let spec = &obj.spec;
    let class = spec.class_name.clone().unwrap_or_default();
    if !reads_class(config, &class) {
        return (None, Verdict::OtherClass { class_name: class });
    }
    if spec.spiffe_id_template.is_empty() {
        return (
            None,
            Verdict::InvalidSpec {
                error: "empty spiffeIDTemplate".into(),
            },
        );
    }
    let ns_labels = inputs.namespace.labels();
    let pod_labels = inputs.pod.labels();
    let ns_match = spec
        .namespace_selector
        .as_ref()
        .map(|s| labels::matches(s, ns_labels))
        .unwrap_or(Ok(true));
    let pod_match = spec
        .pod_selector
        .as_ref()
        .map(|s| labels::matches(s, pod_labels))
        .unwrap_or(Ok(true));
    let (ns_match, pod_match) = match (ns_match, pod_match) {
        (Ok(n), Ok(p)) => (n, p),
        (Err(e), _) => {
            return (
                None,
                Verdict::InvalidSpec {
                    error: format!("namespaceSelector: {e}"),
                },
            );
        }
        (_, Err(e)) => {
            return (
                None,
                Verdict::InvalidSpec {
                    error: format!("podSelector: {e}"),
                },
            );
        }
    };
    if !ns_match {
        return (None, Verdict::NamespaceNotSelected);
    }
    if ignored {
        return (None, Verdict::NamespaceIgnored);
    }
    if !pod_match {
        return (None, Verdict::PodNotSelected);
    }
    if fallback && !non_fallback_rendered.is_empty() {
        return (
            None,
            Verdict::FallbackNotApplied {
                because_of: non_fallback_rendered.to_vec(),
            },
        );
    }
    let node_name = inputs
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if node_name.is_empty() {
        return (None, Verdict::NotScheduled);
    }
    let Some(node) = inputs.node else {
        return (None, Verdict::NodeMissing { node: node_name });
    };
    match render_entry(obj, inputs.pod, node, config) {
        Ok(entry) => (Some(entry), Verdict::Entry),
        Err(error) => (None, Verdict::RenderFailed { error }),
    }
}

/// Render the entry `obj` declares for `pod` on `node`.
pub fn render_entry(
    obj: &ClusterSPIFFEID,
    pod: &Pod,
    node: &Node,
    config: &ManagerConfig,
) -> Result<RenderedEntry, String> {
    let to_json = |v: Result<serde_json::Value, serde_json::Error>| {
        v.map_err(|e| format!("cannot read the pod or node as JSON: {e}"))
    };
    let pod_meta = to_json(serde_json::to_value(&pod.metadata))?;
    let pod_spec = to_json(serde_json::to_value(&pod.spec))?;
    let node_meta = to_json(serde_json::to_value(&node.metadata))?;
    let node_spec = to_json(serde_json::to_value(&node.spec))?;
    let data = TemplateData {
        trust_domain: &config.trust_domain,
        cluster_name: &config.cluster_name,
        cluster_domain: &config.cluster_domain,
        pod_meta: &pod_meta,
        pod_spec: &pod_spec,
        node_meta: &node_meta,
        node_spec: &node_spec,
    };
    // The parent first, as the manager renders it, and before the pod's data is set.
    let parent_id = if config.parent_id_template.is_empty() {
        format!(
            "spiffe://{}/spire/agent/k8s_psat/{}/{}",
            config.trust_domain,
            config.cluster_name,
            node.uid().unwrap_or_default()
        )
    } else {
        let parent = render_without_pod(&config.parent_id_template, &data)
            .map_err(|e| format!("failed to render parent ID: {e}"))?;
        let id = SpiffeId::parse(&parent).map_err(|e| {
            format!("failed to render parent ID: invalid SPIFFE ID {parent:?}: {e}")
        })?;
        if id.trust_domain().as_str() != config.trust_domain {
            return Err(format!(
                "failed to render parent ID: invalid SPIFFE ID: expected trust domain {:?} but got {:?}",
                config.trust_domain,
                id.trust_domain().as_str()
            ));
        }
        parent
    };
    let rendered = render(&obj.spec.spiffe_id_template, &data)
        .map_err(|e| format!("failed to render SPIFFE ID: {e}"))?;
    let id =
        SpiffeId::parse(&rendered).map_err(|e| format!("invalid SPIFFE ID {rendered:?}: {e}"))?;
    if id.trust_domain().as_str() != config.trust_domain {
        return Err(format!(
            "invalid SPIFFE ID: expected trust domain {:?} but got {:?}",
            config.trust_domain,
            id.trust_domain().as_str()
        ));
    }
    let mut dns_names: Vec<String> = Vec::new();
    for t in obj.spec.dns_name_templates.iter().flatten() {
        let name = render(t, &data).map_err(|e| format!("failed to render DNS name: {e}"))?;
        if !dns_names.contains(&name) {
            dns_names.push(name);
        }
    }
    let mut selectors = vec![format!("k8s:pod-uid:{}", pod.uid().unwrap_or_default())];
    for t in obj.spec.workload_selector_templates.iter().flatten() {
        let s = render(t, &data).map_err(|e| format!("failed to render workload selector: {e}"))?;
        match s.split_once(':') {
            None => {
                return Err(format!(
                    "invalid workload selector {s:?}: expected at least one colon separate the type from the value"
                ));
            }
            Some(("", _)) => {
                return Err(format!(
                    "invalid workload selector {s:?}: type cannot be empty"
                ));
            }
            Some((_, "")) => {
                return Err(format!(
                    "invalid workload selector {s:?}: value cannot be empty"
                ));
            }
            Some(_) => selectors.push(s),
        }
    }
    sort_selectors(&mut selectors);
    Ok(RenderedEntry {
        spiffe_id: rendered,
        parent_id,
        selectors,
        dns_names,
    })
}

#[cfg(test)]
mod upstream_cases;
