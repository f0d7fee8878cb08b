//! Cluster-wide analysis of compiled bindings: conflicts that refuse bindings and
//! warnings that are only reported.
//!
//! - `IdentityCollision`: two or more PerObjective bindings in one namespace with equal
//!   pool selector (the same pod set), the same `k8s:sa` and the same container selector.
//!   Every member is refused.
//! - `DuplicateSPIFFEID`: bindings computing one SPIFFE ID with different selector sets.
//!   Every member is refused (identical selector sets register identical SPIRE entries,
//!   which SPIRE de-duplicates, so they are not a conflict).
//! - Warning `PoolAndObjectiveIdentities`: a PoolOnly and a PerObjective binding select the
//!   same pods and service account: the discriminated containers receive two SVIDs.
//! - Warning `OverlappingDefaultIdentity`: a ClusterSPIFFEID not managed by kleym, with the
//!   same `className` and `fallback` unset, provably selects the pool's pods and gives the
//!   binding's workloads a second entry; the fix is `fallback: true` on that object.
//! - Warning `MaskedByForeignObject`: such an object renders exactly the entry kleym's
//!   output renders (same SPIFFE ID, parent and selectors) and is older, so SPIRE Controller
//!   Manager keeps its declaration and masks kleym's.
//! - Warning `MultipleSVIDs`: kleym identities with different SPIFFE IDs whose selectors
//!   all hold for the workloads another kleym identity selects (a wider pool, no container
//!   selector), so those workloads receive one SVID per ID.
//!
//! The three foreign and several-SVID rules are SPIRE Controller Manager's, as the explain
//! model states them ([`crate::explain`]), applied to "every pod of the pool" rather than
//! to one pod: the spoke watches no pods, so a finding is claimed only where it holds for
//! every pod the pool selects ([`crate::explain::pool`]).
//!
//! Work is grouping, never pairwise: one pass computes 64-bit fingerprints of the keys,
//! a sort groups them (O(n log n) on integers), and exact keys are compared only within
//! equal-fingerprint runs (plus the size of the groups found). Results are independent
//! of input order, and symmetric (every member of a finding
//! sees the others).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::external::spiffeid::LabelSelector;
use kleym_api::label_map::LabelMap;
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};

use super::CompiledIdentity;
use super::output::NAMESPACE_NAME_LABEL;
use super::refusal::{Reason, Refusal};
use crate::explain::Precedence;
use crate::explain::pool::PoolPods;

/// At most this many peers are listed per finding (the count is always exact).
pub const MAX_LISTED_PEERS: usize = 32;

/// A binding, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BindingRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for BindingRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Labels of each namespace, by name (for evaluating foreign `namespaceSelector`s).
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// A ClusterSPIFFEID kleym does not manage.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ForeignSpiffeId {
    /// Object name.
    pub name: String,
    /// `spec.spiffeIDTemplate`.
    pub spiffe_id_template: String,
    /// Its creation, deletion and UID: which of two identical entries SPIRE keeps.
    pub precedence: Precedence,
    /// `spec.className`.
    pub class_name: Option<String>,
    /// `spec.fallback`.
    pub fallback: bool,
    /// `spec.namespaceSelector` (unset: all namespaces).
    pub namespace_selector: Option<LabelSelector>,
    /// `spec.podSelector` (unset: all pods).
    pub pod_selector: Option<LabelSelector>,
    /// `spec.workloadSelectorTemplates`.
    pub workload_selector_templates: Vec<String>,
    /// `spec.dnsNameTemplates`: the overlap analysis does not read them, `kleym explain`
    /// through the hub renders them from this view (usually empty: no heap).
    pub dns_name_templates: Vec<String>,
}

impl ForeignSpiffeId {
    /// View of `obj`, or `None` when it is proven to be kleym's output
    /// ([`crate::ownership::proven_owner`], with kleym's `field_manager`). Labels alone do
    /// not make an object kleym's: anyone who may write ClusterSPIFFEIDs can copy them,
    /// which would hide the object from the overlap warning.
    pub fn from_object(obj: &ClusterSPIFFEID, field_manager: &str) -> Option<Self> {
        if crate::ownership::proven_owner(obj, field_manager).is_ok() {
            return None;
        }
        Some(ForeignSpiffeId {
            name: obj.metadata.name.clone().unwrap_or_default(),
            spiffe_id_template: obj.spec.spiffe_id_template.clone(),
            precedence: Precedence::of(obj),
            class_name: obj.spec.class_name.clone(),
            fallback: obj.spec.fallback.unwrap_or(false),
            namespace_selector: obj.spec.namespace_selector.clone(),
            pod_selector: obj.spec.pod_selector.clone(),
            workload_selector_templates: obj
                .spec
                .workload_selector_templates
                .clone()
                .unwrap_or_default(),
            dns_name_templates: obj.spec.dns_name_templates.clone().unwrap_or_default(),
        })
    }
}

/// A conflict with other bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictFinding {
    /// `IdentityCollision` or `DuplicateSPIFFEID`.
    pub reason: Reason,
    /// The other members, sorted (at most [`MAX_LISTED_PEERS`]).
    pub peers: Vec<BindingRef>,
    /// How many other members there are.
    pub peer_count: usize,
    /// What the members share (pod set, service account, container, or SPIFFE ID).
    pub detail: String,
}

/// Warning reasons (stable strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WarningReason {
    /// A PoolOnly and a PerObjective identity select the same pods.
    PoolAndObjectiveIdentities,
    /// A non-kleym, non-fallback ClusterSPIFFEID also selects the pool's pods.
    OverlappingDefaultIdentity,
    /// An older non-kleym ClusterSPIFFEID renders the same entry: kleym's is masked.
    MaskedByForeignObject,
    /// kleym identities with different SPIFFE IDs select the same workloads.
    MultipleSvids,
}

impl WarningReason {
    /// The stable reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningReason::PoolAndObjectiveIdentities => "PoolAndObjectiveIdentities",
            WarningReason::OverlappingDefaultIdentity => "OverlappingDefaultIdentity",
            WarningReason::MaskedByForeignObject => "MaskedByForeignObject",
            WarningReason::MultipleSvids => "MultipleSVIDs",
        }
    }
}

/// A warning about one binding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Warning {
    /// Reason.
    pub reason: WarningReason,
    /// Explanation and suggested fix.
    pub message: String,
}

/// The collision analysis' findings for one binding: conflicts and warnings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CollisionFindings {
    /// Conflicts, `IdentityCollision` first.
    pub conflicts: Vec<ConflictFinding>,
    /// Warnings, sorted.
    pub warnings: Vec<Warning>,
}

impl CollisionFindings {
    /// The refusal the conflicts impose on `binding`, if any (`IdentityCollision` wins
    /// over `DuplicateSPIFFEID`).
    pub fn refusal(&self, binding: &BindingRef) -> Option<Refusal> {
        let c = self.conflicts.first()?;
        let mut peers = c
            .peers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if c.peer_count > c.peers.len() {
            peers.push_str(&format!(" and {} more", c.peer_count - c.peers.len()));
        }
        let message = match c.reason {
            Reason::IdentityCollision => format!(
                "binding {binding} collides with {peers}: PerObjective bindings select the same pods, service account and container ({}); give each objective its own container (spec.containerDiscriminator)",
                c.detail
            ),
            _ => format!(
                "binding {binding} computes SPIFFE ID {} like {peers}, with different selectors; one SPIFFE ID must describe one workload (change spec.spiffeIDTemplate)",
                c.detail
            ),
        };
        Some(Refusal::new(c.reason, message))
    }

    /// Conflict peers in the binding-status form (same namespace: names only).
    pub fn conflict_peers(&self) -> Vec<ConflictPeer> {
        let mut out: Vec<ConflictPeer> = self
            .conflicts
            .iter()
            .flat_map(|c| {
                c.peers.iter().map(|p| ConflictPeer {
                    name: p.name.clone(),
                    reason: c.reason.as_str().to_string(),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Warnings in the binding-status form.
    pub fn status_warnings(&self) -> Vec<IdentityWarning> {
        self.warnings
            .iter()
            .map(|w| IdentityWarning {
                reason: w.reason.as_str().to_string(),
                message: w.message.clone(),
            })
            .collect()
    }
}

/// Verdicts for every binding with a finding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Analysis {
    /// Bindings with at least one conflict or warning.
    pub verdicts: BTreeMap<BindingRef, CollisionFindings>,
}

impl Analysis {
    /// The verdict for `binding` (empty when it has no findings).
    pub fn verdict(&self, binding: &BindingRef) -> CollisionFindings {
        self.verdicts.get(binding).cloned().unwrap_or_default()
    }

    /// The refusal conflicts impose on `binding`, if any.
    pub fn refusal(&self, binding: &BindingRef) -> Option<Refusal> {
        self.verdicts.get(binding)?.refusal(binding)
    }
}

/// Pod labels of a pool, borrowed.
type Labels<'a> = &'a LabelMap;
/// Binding indices grouped by a key.
type Groups<K> = HashMap<K, Vec<usize>>;

fn labels_desc(labels: &LabelMap) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Members of one group, as indices into the identity slice, sorted by binding.
fn sorted_members(ids: &[&CompiledIdentity], mut members: Vec<usize>) -> Vec<usize> {
    members.sort_by(|a, b| ids[*a].binding.cmp(&ids[*b].binding));
    members.dedup_by(|a, b| ids[*a].binding == ids[*b].binding);
    members
}

/// Record for each member of `members` a finding naming the others in `peers_of`.
fn add_conflicts(
    ids: &[&CompiledIdentity],
    verdicts: &mut BTreeMap<BindingRef, CollisionFindings>,
    members: &[usize],
    reason: Reason,
    detail: &str,
    peers_of: impl Fn(usize) -> Vec<usize>,
) {
    for &m in members {
        let peers = peers_of(m);
        if peers.is_empty() {
            continue;
        }
        verdicts
            .entry(ids[m].binding.clone())
            .or_default()
            .conflicts
            .push(ConflictFinding {
                reason,
                peer_count: peers.len(),
                peers: peers
                    .iter()
                    .take(MAX_LISTED_PEERS)
                    .map(|&p| ids[p].binding.clone())
                    .collect(),
                detail: detail.to_string(),
            });
    }
}

fn fingerprint(value: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Namespace, pool labels and service account: the pods an identity can land on.
fn pod_set_key(id: &CompiledIdentity) -> (&str, Labels<'_>, &str) {
    (
        id.binding.namespace.as_str(),
        id.pool_labels(),
        id.service_account.as_str(),
    )
}

/// The IdentityCollision key: PerObjective only, pod set plus container selector.
fn collision_key(id: &CompiledIdentity) -> Option<(&str, Labels<'_>, &str, &str)> {
    (id.mode == IdentityMode::PerObjective).then(|| {
        let (ns, labels, sa) = pod_set_key(id);
        (
            ns,
            labels,
            sa,
            id.container_selector.as_deref().unwrap_or(""),
        )
    })
}

/// 64-bit fingerprints of every grouping key, computed in one pass so that each
/// identity's (heap-scattered) fields are read once; exact keys are compared only inside
/// groups whose fingerprints match.
struct Fingerprints {
    pod_set: Vec<u64>,
    collision: Vec<Option<u64>>,
    spiffe_id: Vec<u64>,
}

impl Fingerprints {
    fn new(ids: &[&CompiledIdentity]) -> Self {
        let mut fp = Fingerprints {
            pod_set: Vec::with_capacity(ids.len()),
            collision: Vec::with_capacity(ids.len()),
            spiffe_id: Vec::with_capacity(ids.len()),
        };
        for id in ids {
            fp.pod_set.push(fingerprint(pod_set_key(id)));
            fp.collision.push(collision_key(id).map(fingerprint));
            fp.spiffe_id.push(fingerprint(id.spiffe_id()));
        }
        fp
    }
}

/// Groups of at least two indices with equal exact `key`, each sorted by binding.
fn groups_by<'a, K: PartialEq>(
    ids: &[&'a CompiledIdentity],
    fingerprints: impl Iterator<Item = Option<u64>>,
    key: impl Fn(&'a CompiledIdentity) -> K,
) -> Vec<Vec<usize>> {
    // Sorting (fingerprint, index) pairs groups without a heap allocation per key.
    let mut pairs: Vec<(u64, usize)> = fingerprints
        .enumerate()
        .filter_map(|(i, fp)| fp.map(|fp| (fp, i)))
        .collect();
    pairs.sort_unstable();
    let mut out = Vec::new();
    for run in pairs.chunk_by(|a, b| a.0 == b.0) {
        if run.len() < 2 {
            continue;
        }
        // Split a fingerprint group by exact key (almost always a single part).
        let mut parts: Vec<(K, Vec<usize>)> = Vec::new();
        for &(_, m) in run {
            let k = key(ids[m]);
            match parts.iter_mut().find(|(pk, _)| *pk == k) {
                Some((_, v)) => v.push(m),
                None => parts.push((k, vec![m])),
            }
        }
        out.extend(
            parts
                .into_iter()
                .map(|(_, v)| sorted_members(ids, v))
                .filter(|v| v.len() >= 2),
        );
    }
    out
}

/// The precedence of each binding's ClusterSPIFFEID as it exists in the cluster (see
/// [`Precedence`]). A binding missing here has no output yet: the one it gets will be
/// created after every object that exists now, so any identical foreign entry masks it.
pub type OutputPrecedence = BTreeMap<BindingRef, Precedence>;

/// Analyze all compiled bindings of one cluster (one entry per binding) against each
/// other and against the cluster's foreign ClusterSPIFFEIDs.
pub fn analyze(
    identities: &[CompiledIdentity],
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
) -> Analysis {
    let refs: Vec<&CompiledIdentity> = identities.iter().collect();
    analyze_refs(&refs, foreign, namespaces)
}

/// [`analyze`] over borrowed identities, so a caller holding them elsewhere (the
/// reconciler's compile memo) need not clone every identity of the namespace per call.
/// Every output counts as not created yet (see [`OutputPrecedence`]).
pub fn analyze_refs(
    identities: &[&CompiledIdentity],
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
) -> Analysis {
    analyze_observed(identities, foreign, namespaces, &OutputPrecedence::new())
}

/// [`analyze_refs`] knowing when the bindings' outputs were created (`outputs`), which
/// decides whether an identical foreign entry masks kleym's or kleym's masks it.
pub fn analyze_observed(
    identities: &[&CompiledIdentity],
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
    outputs: &OutputPrecedence,
) -> Analysis {
    let mut verdicts: BTreeMap<BindingRef, CollisionFindings> = BTreeMap::new();
    let fps = Fingerprints::new(identities);

    // IdentityCollision: PerObjective, same namespace, pod set, service account, container.
    for members in groups_by(identities, fps.collision.iter().copied(), collision_key) {
        let first = &identities[members[0]];
        let detail = format!(
            "pool selector {}, service account {}, {}",
            labels_desc(first.pool_labels()),
            first.service_account,
            first.container_selector.as_deref().unwrap_or("")
        );
        add_conflicts(
            identities,
            &mut verdicts,
            &members,
            Reason::IdentityCollision,
            &detail,
            |m| members.iter().copied().filter(|&p| p != m).collect(),
        );
    }

    // DuplicateSPIFFEID: one ID, several selector sets.
    let by_id = groups_by(identities, fps.spiffe_id.iter().copied().map(Some), |id| {
        id.spiffe_id()
    });
    for members in by_id {
        let distinct: BTreeSet<&[String]> =
            members.iter().map(|&m| identities[m].selectors()).collect();
        if distinct.len() < 2 {
            continue;
        }
        add_conflicts(
            identities,
            &mut verdicts,
            &members,
            Reason::DuplicateSPIFFEID,
            identities[members[0]].spiffe_id(),
            |m| {
                members
                    .iter()
                    .copied()
                    .filter(|&p| identities[p].selectors() != identities[m].selectors())
                    .collect()
            },
        );
    }

    let pod_sets = groups_by(
        identities,
        fps.pod_set.iter().copied().map(Some),
        pod_set_key,
    );
    pool_and_objective_warnings(identities, &pod_sets, &mut verdicts);
    foreign_object_warnings(identities, foreign, namespaces, outputs, &mut verdicts);
    multiple_svid_warnings(identities, &mut verdicts);

    for v in verdicts.values_mut() {
        v.conflicts
            .sort_by(|a, b| a.reason.cmp(&b.reason).then_with(|| a.peers.cmp(&b.peers)));
        v.warnings.sort();
        v.warnings.dedup();
    }
    Analysis { verdicts }
}

fn pool_and_objective_warnings(
    ids: &[&CompiledIdentity],
    pod_sets: &[Vec<usize>],
    verdicts: &mut BTreeMap<BindingRef, CollisionFindings>,
) {
    for members in pod_sets {
        let (pool_only, per_objective): (Vec<usize>, Vec<usize>) = members
            .iter()
            .partition(|&&m| ids[m].mode == IdentityMode::PoolOnly);
        if pool_only.is_empty() || per_objective.is_empty() {
            continue;
        }
        let names = |v: &[usize]| {
            let mut s = v
                .iter()
                .take(MAX_LISTED_PEERS)
                .map(|&m| ids[m].binding.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            if v.len() > MAX_LISTED_PEERS {
                s.push_str(&format!(" and {} more", v.len() - MAX_LISTED_PEERS));
            }
            s
        };
        let first = &ids[members[0]];
        let message = format!(
            "PoolOnly binding(s) {} and PerObjective binding(s) {} select the same pods (pool selector {}, service account {}): the discriminated containers receive two SVIDs",
            names(&pool_only),
            names(&per_objective),
            labels_desc(first.pool_labels()),
            first.service_account
        );
        for &m in pool_only.iter().chain(&per_objective) {
            verdicts
                .entry(ids[m].binding.clone())
                .or_default()
                .warnings
                .push(Warning {
                    reason: WarningReason::PoolAndObjectiveIdentities,
                    message: message.clone(),
                });
        }
    }
}

/// Whether `binding` is refused by a conflict (its output is withdrawn: it declares no
/// entry to mask or to add).
fn refused(verdicts: &BTreeMap<BindingRef, CollisionFindings>, binding: &BindingRef) -> bool {
    verdicts
        .get(binding)
        .is_some_and(|v| !v.conflicts.is_empty())
}

/// The trust domain of a SPIFFE ID kleym compiled (`spiffe://<td>/…`).
fn trust_domain_of(spiffe_id: &str) -> &str {
    spiffe_id
        .strip_prefix("spiffe://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
}

/// What a foreign object's entry is to a binding's, for every pod of the binding's pool.
enum Relation {
    /// The same entry (SPIFFE ID and selectors; the parent is the pod's node for both).
    SameEntry,
    /// Another entry whose selectors hold for every workload the binding's entry selects.
    AlsoApplies,
    /// Neither can be shown for every pod of the pool.
    Unproven,
}

fn relation(f: &ForeignSpiffeId, id: &CompiledIdentity, pods: &PoolPods<'_>) -> Relation {
    let ours = id.selectors();
    let rendered: Vec<Option<String>> = f
        .workload_selector_templates
        .iter()
        .map(|t| pods.render(t))
        .collect();
    if pods.render(&f.spiffe_id_template).as_deref() == Some(id.spiffe_id())
        && rendered.len() == ours.len()
    {
        // Both entries also carry the pod's `k8s:pod-uid`, and SPIRE Controller Manager
        // keys an entry by its sorted selectors as they are (duplicates included).
        let mut theirs: Vec<&str> = rendered.iter().flatten().map(String::as_str).collect();
        theirs.sort_unstable();
        if theirs.len() == ours.len() && theirs.iter().zip(ours).all(|(t, o)| *t == o) {
            return Relation::SameEntry;
        }
    }
    let applies = f
        .workload_selector_templates
        .iter()
        .zip(&rendered)
        .all(|(template, value)| match value {
            Some(s) => ours.binary_search(s).is_ok(),
            None => is_pod_intrinsic(template),
        });
    if applies {
        Relation::AlsoApplies
    } else {
        Relation::Unproven
    }
}

fn foreign_object_warnings(
    ids: &[&CompiledIdentity],
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
    outputs: &OutputPrecedence,
    verdicts: &mut BTreeMap<BindingRef, CollisionFindings>,
) {
    // A fallback never applies where kleym's (non-fallback) entry renders: it neither
    // masks kleym's entry nor adds one.
    let candidates: Vec<&ForeignSpiffeId> = foreign.iter().filter(|f| !f.fallback).collect();
    if candidates.is_empty() {
        return;
    }
    // Namespace and pod selection are shared by every binding on one pod set: evaluate
    // them once per group; only the workload selectors are checked per binding.
    let mut groups: Groups<(&str, Labels, &str)> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let class = id.output.spec.class_name.as_deref().unwrap_or("");
        let key = (id.binding.namespace.as_str(), id.pool_labels(), class);
        groups.entry(key).or_default().push(i);
    }
    let mut namespace_match: HashMap<(usize, &str), bool> = HashMap::new();
    let mut found: Vec<(BindingRef, Warning)> = Vec::new();
    for ((ns, pool_labels, class), members) in groups {
        for (fi, f) in candidates.iter().enumerate() {
            if f.class_name.as_deref().unwrap_or("") != class {
                continue;
            }
            let ns_ok = *namespace_match
                .entry((fi, ns))
                .or_insert_with(|| namespace_provably_selected(f, ns, namespaces.get(ns)));
            let pods_ok = f
                .pod_selector
                .as_ref()
                .is_none_or(|sel| selector_provably_matches(sel, pool_labels, false));
            if !ns_ok || !pods_ok {
                continue;
            }
            for &m in &members {
                let id = &ids[m];
                let pods = PoolPods {
                    trust_domain: trust_domain_of(id.spiffe_id()),
                    namespace: ns,
                    service_account: &id.service_account,
                    labels: pool_labels,
                };
                let warning = match relation(f, id, &pods) {
                    Relation::Unproven => continue,
                    Relation::AlsoApplies => Warning {
                        reason: WarningReason::OverlappingDefaultIdentity,
                        message: format!(
                            "ClusterSPIFFEID {} (not managed by kleym, fallback not set) also selects the pods of InferencePool {}/{} (service account {}): they receive two SVIDs; set `fallback: true` on {} so it applies only where no other identity does",
                            f.name, ns, id.pool.name, id.service_account, f.name
                        ),
                    },
                    Relation::SameEntry => {
                        // The older declaration wins (SPIRE Controller Manager's order);
                        // when kleym's is older the foreign one is masked, and the pods
                        // get kleym's entry, once.
                        let foreign_wins = outputs
                            .get(&id.binding)
                            .is_none_or(|ours| f.precedence < *ours);
                        if !foreign_wins || refused(verdicts, &id.binding) {
                            continue;
                        }
                        let output = id.output_name();
                        Warning {
                            reason: WarningReason::MaskedByForeignObject,
                            message: format!(
                                "ClusterSPIFFEID {} (not managed by kleym, older than kleym's {output}) renders the same SPIRE entry as {output} for the pods of InferencePool {}/{} (SPIFFE ID {}, the same selectors): SPIRE Controller Manager keeps the older declaration and masks kleym's, so {}'s settings (TTL, DNS names, federation) apply and its owner controls this identity; delete {} or change its spiffeIDTemplate",
                                f.name,
                                ns,
                                id.pool.name,
                                id.spiffe_id(),
                                f.name,
                                f.name
                            ),
                        }
                    }
                };
                found.push((id.binding.clone(), warning));
            }
        }
    }
    for (binding, warning) in found {
        verdicts.entry(binding).or_default().warnings.push(warning);
    }
}

/// Labels of a pool beyond which the several-SVID analysis compares pools only for
/// equality (it enumerates the subsets of a pool's labels: 2^n lookups).
const MAX_ENUMERATED_LABELS: usize = 10;

/// Fingerprint of what decides which workloads a kleym identity can select: namespace,
/// service account, pool labels (in order) and container selector.
fn scope_fingerprint<'a>(
    namespace: &str,
    service_account: &str,
    container: Option<&str>,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut h = DefaultHasher::new();
    namespace.hash(&mut h);
    service_account.hash(&mut h);
    container.hash(&mut h);
    for (k, v) in labels {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

/// `small ⊆ big`, both sorted.
fn is_sorted_subset(small: &[String], big: &[String]) -> bool {
    let mut big = big.iter();
    small.iter().all(|s| big.any(|b| b == s))
}

/// kleym identities with different SPIFFE IDs whose selectors all hold for the workloads
/// one identity selects. A workload receives one SVID per entry whose selectors it
/// satisfies; identity O's selectors hold for every workload identity B selects when O's
/// selectors are a subset of B's (kleym's selectors are the namespace, the service
/// account, the pool's labels, the container and the binding's own literal selectors).
///
/// Work: identities are indexed by [`scope_fingerprint`]; for each distinct selector set
/// the candidates are looked up under each subset of its pool's labels, with its own
/// container selector or none, and checked exactly. Cases the analysis already reports
/// (`IdentityCollision` refuses; `PoolAndObjectiveIdentities` on one pool) are not
/// repeated.
fn multiple_svid_warnings(
    ids: &[&CompiledIdentity],
    verdicts: &mut BTreeMap<BindingRef, CollisionFindings>,
) {
    let live: Vec<usize> = (0..ids.len())
        .filter(|&i| !refused(verdicts, &ids[i].binding))
        .collect();
    let mut by_scope: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut anchors: HashMap<&[String], Vec<usize>> = HashMap::new();
    for &i in &live {
        let id = ids[i];
        by_scope
            .entry(scope_fingerprint(
                &id.binding.namespace,
                &id.service_account,
                id.container_selector.as_deref(),
                id.pool_labels().iter(),
            ))
            .or_default()
            .push(i);
        anchors.entry(id.selectors()).or_default().push(i);
    }
    let mut anchors: Vec<(&[String], Vec<usize>)> = anchors.into_iter().collect();
    anchors.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut found: Vec<(BindingRef, Warning)> = Vec::new();
    for (selectors, members) in anchors {
        let rep = ids[members[0]];
        let labels: Vec<(&str, &str)> = rep.pool_labels().iter().collect();
        // `None`: every label (the pool itself); `Some(mask)`: the labels whose bit is set.
        let masks: Vec<Option<u32>> = if labels.len() > MAX_ENUMERATED_LABELS {
            vec![None]
        } else {
            (1..(1u32 << labels.len())).map(Some).collect()
        };
        let mut containers = vec![None];
        if rep.container_selector.is_some() {
            containers.push(rep.container_selector.as_deref());
        }
        let mut covered: BTreeSet<usize> = members.iter().copied().collect();
        for mask in masks {
            for container in &containers {
                let subset = labels
                    .iter()
                    .enumerate()
                    .filter(|(bit, _)| mask.is_none_or(|m| m & (1u32 << bit) != 0))
                    .map(|(_, pair)| *pair);
                let fp = scope_fingerprint(
                    &rep.binding.namespace,
                    &rep.service_account,
                    *container,
                    subset,
                );
                for &o in by_scope.get(&fp).into_iter().flatten() {
                    if is_sorted_subset(ids[o].selectors(), selectors) {
                        covered.insert(o);
                    }
                }
            }
        }
        let spiffe_ids: BTreeSet<&str> = covered.iter().map(|&o| ids[o].spiffe_id()).collect();
        if spiffe_ids.len() < 2 {
            continue;
        }
        if covered
            .iter()
            .all(|&o| pod_set_key(ids[o]) == pod_set_key(rep))
        {
            // On one pod set the only several-ID cases are a PoolOnly beside PerObjective
            // identities (`PoolAndObjectiveIdentities`) and colliding PerObjective ones
            // (refused): report only what those do not.
            let ids_of = |mode: IdentityMode| -> BTreeSet<&str> {
                covered
                    .iter()
                    .filter(|&&o| ids[o].mode == mode)
                    .map(|&o| ids[o].spiffe_id())
                    .collect()
            };
            if ids_of(IdentityMode::PoolOnly).len() <= 1
                && ids_of(IdentityMode::PerObjective).len() <= 1
            {
                continue;
            }
        }
        let mut anchor_names: Vec<&str> = members
            .iter()
            .map(|&m| ids[m].binding.name.as_str())
            .collect();
        anchor_names.sort_unstable();
        let mut holders: Vec<(&str, &str)> = covered
            .iter()
            .map(|&o| (ids[o].binding.name.as_str(), ids[o].spiffe_id()))
            .collect();
        holders.sort_unstable();
        let listed = holders
            .iter()
            .take(MAX_LISTED_PEERS)
            .map(|(name, id)| format!("{name} ({id})"))
            .collect::<Vec<_>>()
            .join(", ");
        let more = holders.len().saturating_sub(MAX_LISTED_PEERS);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let container = rep
            .container_selector
            .as_deref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default();
        let message = format!(
            "the workloads that binding(s) {} select (InferencePool {}/{}, service account {}{container}) match the selectors of {} kleym identities with {} different SPIFFE IDs, so each receives {} SVIDs: {listed}{more}; give each identity its own pods (pool), service account or container (spec.containerDiscriminator)",
            anchor_names.join(", "),
            rep.binding.namespace,
            rep.pool.name,
            rep.service_account,
            holders.len(),
            spiffe_ids.len(),
            spiffe_ids.len(),
        );
        for &o in &covered {
            found.push((
                ids[o].binding.clone(),
                Warning {
                    reason: WarningReason::MultipleSvids,
                    message: message.clone(),
                },
            ));
        }
    }
    for (binding, warning) in found {
        verdicts.entry(binding).or_default().warnings.push(warning);
    }
}

/// Whether `f`'s `namespaceSelector` provably selects `namespace`. The apiserver always
/// sets the name label; other labels are known only if the caller supplied the namespace.
fn namespace_provably_selected(
    f: &ForeignSpiffeId,
    namespace: &str,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match &f.namespace_selector {
        None => true,
        Some(sel) => {
            let mut known = namespace_labels.map(LabelMap::from).unwrap_or_default();
            known.insert(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string());
            selector_provably_matches(sel, &known, namespace_labels.is_some())
        }
    }
}

/// Evaluate a label selector against `labels`. With `complete == false`, a requirement on
/// a key missing from `labels` cannot be proven and fails.
pub fn selector_provably_matches(sel: &LabelSelector, labels: &LabelMap, complete: bool) -> bool {
    let match_labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = sel.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(&req.key);
        let values = req.values.as_deref().unwrap_or_default();
        match (req.operator.as_str(), value) {
            ("In", Some(v)) => values.iter().any(|x| x == v),
            ("NotIn", Some(v)) => !values.iter().any(|x| x == v),
            ("NotIn", None) => complete,
            ("Exists", Some(_)) => true,
            ("DoesNotExist", Some(_)) => false,
            ("DoesNotExist", None) => complete,
            _ => false,
        }
    });
    match_labels_ok && expressions_ok
}

/// Templated selectors that hold for every pod by construction.
const POD_INTRINSIC_TEMPLATES: [&str; 5] = [
    "k8s:ns:{{.PodMeta.Namespace}}",
    "k8s:sa:{{.PodSpec.ServiceAccountName}}",
    "k8s:pod-uid:{{.PodMeta.UID}}",
    "k8s:pod-name:{{.PodMeta.Name}}",
    "k8s:node-name:{{.PodSpec.NodeName}}",
];

/// Whether a template that has no value for the pool as a whole ([`PoolPods::render`])
/// still holds for every pod by construction (the pod's own UID, name or node).
fn is_pod_intrinsic(template: &str) -> bool {
    let compact: String = template.chars().filter(|c| *c != ' ').collect();
    POD_INTRINSIC_TEMPLATES.contains(&compact.as_str())
}
