//! Fleet analysis: within-spoke findings lifted from the spokes' verdicts, and cross-cluster
//! drift found by grouping every binding of the fleet by SPIFFE ID.
//!
//! The spoke compiler (`kleym_spoke::compiler::collisions`) already decided, per cluster,
//! which bindings collide and which carry warnings (including the findings made on SPIRE
//! Controller Manager's entry rules: a kleym output masked by an older foreign object,
//! workloads that receive several SVIDs); its verdicts reach the hub as binding
//! status (conflict peers, warnings). The hub only regroups them into findings (connected
//! peers form one finding) and adds what no spoke can see: the same SPIFFE ID compiled from
//! different workload signatures in different clusters.
//!
//! Cost: hashing and grouping, O(n log n) in the number of bindings (the sort of the
//! findings and members dominates); the output order is independent of the input order.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use kleym_api::hub_status::{Finding, FindingKind, FindingMember};

use super::input::{BindingSnapshot, SpokeObservation, WorkloadSignature};

/// Spoke conflict reason for [`FindingKind::IdentityCollision`].
const REASON_IDENTITY_COLLISION: &str = "IdentityCollision";
/// Spoke conflict reason for [`FindingKind::DuplicateSpiffeId`].
const REASON_DUPLICATE_SPIFFE_ID: &str = "DuplicateSPIFFEID";
/// Spoke warning reason for [`FindingKind::PoolOnlyAndPerObjective`].
const WARNING_POOL_AND_OBJECTIVE: &str = "PoolAndObjectiveIdentities";
/// Spoke warning reason for [`FindingKind::OverlappingDefaultIdentity`].
const WARNING_OVERLAPPING_DEFAULT: &str = "OverlappingDefaultIdentity";
/// Spoke warning reason for [`FindingKind::MaskedByForeignObject`].
const WARNING_MASKED: &str = "MaskedByForeignObject";
/// Spoke warning reason for [`FindingKind::MultipleSvids`].
const WARNING_MULTIPLE_SVIDS: &str = "MultipleSVIDs";

/// How many names a finding message spells out before "and N more".
const NAMES_IN_MESSAGE: usize = 5;

/// Every finding of the fleet, uncapped, in report order (collisions first, then by kind,
/// SPIFFE ID and members).
pub fn analyze<S: Borrow<SpokeObservation>>(spokes: &[S]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for spoke in spokes.iter().map(Borrow::borrow) {
        lift_conflicts(spoke, REASON_IDENTITY_COLLISION, &mut findings);
        lift_conflicts(spoke, REASON_DUPLICATE_SPIFFE_ID, &mut findings);
        lift_warnings(spoke, &mut findings);
    }
    cross_cluster_drift(spokes, &mut findings);
    for f in &mut findings {
        f.members.sort();
        f.members.dedup();
        f.member_count = f.members.len() as i64;
    }
    findings.sort_by(|a, b| {
        (a.severity, a.kind, &a.spiffe_id, &a.members).cmp(&(
            b.severity,
            b.kind,
            &b.spiffe_id,
            &b.members,
        ))
    });
    findings
}

fn member(cluster: &str, namespace: &str, binding: &str) -> FindingMember {
    FindingMember {
        cluster: cluster.to_string(),
        namespace: namespace.to_string(),
        binding: binding.to_string(),
    }
}

/// `a, b, c and 3 more`.
fn name_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    let mut s = names
        .iter()
        .take(NAMES_IN_MESSAGE)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMES_IN_MESSAGE {
        s.push_str(&format!(" and {} more", names.len() - NAMES_IN_MESSAGE));
    }
    s
}

/// The one SPIFFE ID all `bindings` share, if they share exactly one.
fn shared_spiffe_id(bindings: &[&BindingSnapshot]) -> Option<String> {
    let ids: BTreeSet<&String> = bindings.iter().flat_map(|b| &b.spiffe_ids).collect();
    let mut it = ids.into_iter();
    match (it.next(), it.next()) {
        (Some(id), None) => Some(id.clone()),
        _ => None,
    }
}

/// Union-find over binding keys, with path halving.
struct Components<'a> {
    parent: HashMap<(&'a str, &'a str), (&'a str, &'a str)>,
}

impl<'a> Components<'a> {
    fn find(&mut self, mut k: (&'a str, &'a str)) -> (&'a str, &'a str) {
        loop {
            let p = *self.parent.entry(k).or_insert(k);
            if p == k {
                return k;
            }
            let gp = *self.parent.entry(p).or_insert(p);
            self.parent.insert(k, gp);
            k = gp;
        }
    }

    fn union(&mut self, a: (&'a str, &'a str), b: (&'a str, &'a str)) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            // Smaller key as root keeps the result independent of edge order.
            let (root, child) = if ra < rb { (ra, rb) } else { (rb, ra) };
            self.parent.insert(child, root);
        }
    }
}

/// Lift one conflict reason of one spoke: bindings linked by conflict peers of that reason
/// (peers are in the same namespace) form one finding.
fn lift_conflicts(spoke: &SpokeObservation, reason: &str, out: &mut Vec<Finding>) {
    let mut comps = Components {
        parent: HashMap::new(),
    };
    let by_key: HashMap<(&str, &str), &BindingSnapshot> = spoke
        .bindings
        .iter()
        .map(|b| ((b.namespace.as_str(), b.name.as_str()), b.as_ref()))
        .collect();
    let mut involved = Vec::new();
    for b in spoke.bindings.iter().map(AsRef::as_ref) {
        for p in b.conflict_peers.iter().filter(|p| p.reason == reason) {
            let (me, peer) = (
                (b.namespace.as_str(), b.name.as_str()),
                (b.namespace.as_str(), p.name.as_str()),
            );
            comps.union(me, peer);
            involved.push(me);
            involved.push(peer);
        }
    }
    let mut groups: BTreeMap<(&str, &str), BTreeSet<(&str, &str)>> = BTreeMap::new();
    for k in involved {
        let root = comps.find(k);
        groups.entry(root).or_default().insert(k);
    }
    for ((namespace, _), keys) in groups {
        let observed: Vec<&BindingSnapshot> =
            keys.iter().filter_map(|k| by_key.get(k).copied()).collect();
        let names = name_list(keys.iter().map(|(_, n)| *n));
        let cluster = &spoke.cluster;
        let (kind, spiffe_id, message) = if reason == REASON_IDENTITY_COLLISION {
            let what = observed
                .first()
                .map(|b| format!(" ({})", WorkloadSignature::of(b)))
                .unwrap_or_default();
            (
                FindingKind::IdentityCollision,
                None,
                format!(
                    "in cluster {cluster}, namespace {namespace}: PerObjective bindings {names} select the same pods, service account and container{what}, so their identities cannot be told apart and the spoke refuses all of them; give each objective its own container (spec.containerDiscriminator) or its own service account"
                ),
            )
        } else {
            let id = shared_spiffe_id(&observed);
            let shown = id.as_deref().unwrap_or("one SPIFFE ID");
            (
                FindingKind::DuplicateSpiffeId,
                id.clone(),
                format!(
                    "in cluster {cluster}, namespace {namespace}: bindings {names} compute {shown} with different selectors, and one SPIFFE ID must describe one workload; give all but one of them another ID (spec.spiffeIDTemplate)"
                ),
            )
        };
        out.push(Finding {
            kind,
            severity: kind.severity(),
            spiffe_id,
            members: keys
                .iter()
                .map(|(ns, name)| member(cluster, ns, name))
                .collect(),
            member_count: 0,
            message,
        });
    }
}

/// Lift the warnings of one spoke: bindings carrying the same warning (same reason and
/// message, in one namespace) form one finding.
fn lift_warnings(spoke: &SpokeObservation, out: &mut Vec<Finding>) {
    let mut groups: BTreeMap<(FindingKind, &str, &str), Vec<&BindingSnapshot>> = BTreeMap::new();
    for b in spoke.bindings.iter().map(AsRef::as_ref) {
        for w in &b.warnings {
            let kind = match w.reason.as_str() {
                WARNING_POOL_AND_OBJECTIVE => FindingKind::PoolOnlyAndPerObjective,
                WARNING_OVERLAPPING_DEFAULT => FindingKind::OverlappingDefaultIdentity,
                WARNING_MASKED => FindingKind::MaskedByForeignObject,
                WARNING_MULTIPLE_SVIDS => FindingKind::MultipleSvids,
                // A reason this hub does not know (newer spoke): still counted in the
                // cluster status, but not a fleet finding kind.
                _ => continue,
            };
            groups
                .entry((kind, b.namespace.as_str(), w.message.as_str()))
                .or_default()
                .push(b);
        }
    }
    for ((kind, namespace, message), bindings) in groups {
        out.push(Finding {
            kind,
            severity: kind.severity(),
            spiffe_id: shared_spiffe_id(&bindings),
            members: bindings
                .iter()
                .map(|b| member(&spoke.cluster, namespace, &b.name))
                .collect(),
            member_count: 0,
            message: format!(
                "in cluster {}, namespace {namespace}: {message}",
                spoke.cluster
            ),
        });
    }
}

/// The same SPIFFE ID (hence one trust domain) from different workload signatures in
/// different clusters. The same ID with the same signature in several clusters is
/// "namespace sameness" and fine.
fn cross_cluster_drift<S: Borrow<SpokeObservation>>(spokes: &[S], out: &mut Vec<Finding>) {
    let mut by_id: HashMap<&str, Vec<(&str, &BindingSnapshot)>> = HashMap::new();
    for spoke in spokes.iter().map(Borrow::borrow) {
        for b in spoke.bindings.iter().map(AsRef::as_ref) {
            for id in &b.spiffe_ids {
                by_id
                    .entry(id.as_str())
                    .or_default()
                    .push((spoke.cluster.as_str(), b));
            }
        }
    }
    for (id, members) in by_id {
        if members.len() < 2 {
            continue;
        }
        let clusters: BTreeSet<&str> = members.iter().map(|(c, _)| *c).collect();
        let mut by_signature: BTreeMap<WorkloadSignature, BTreeSet<&str>> = BTreeMap::new();
        for (c, b) in &members {
            by_signature
                .entry(WorkloadSignature::of(b))
                .or_default()
                .insert(c);
        }
        // With two clusters and two signatures, some pair in different clusters differs.
        if clusters.len() < 2 || by_signature.len() < 2 {
            continue;
        }
        let shown = by_signature.len().min(NAMES_IN_MESSAGE);
        let mut variants = by_signature
            .iter()
            .take(shown)
            .map(|(sig, cs)| format!("{} in {}", sig, name_list(cs.iter().copied())))
            .collect::<Vec<_>>()
            .join("; ");
        if by_signature.len() > shown {
            variants.push_str(&format!(
                "; and {} more variants",
                by_signature.len() - shown
            ));
        }
        out.push(Finding {
            kind: FindingKind::CrossClusterDrift,
            severity: FindingKind::CrossClusterDrift.severity(),
            spiffe_id: Some(id.to_string()),
            members: members
                .iter()
                .map(|(c, b)| member(c, &b.namespace, &b.name))
                .collect(),
            member_count: 0,
            message: format!(
                "SPIFFE ID {id} stands for different workloads in different clusters ({variants}); one ID must mean one workload across the trust domain: align the service account, container discriminator and pool selector of these bindings, or give them different IDs (spec.spiffeIDTemplate)"
            ),
        });
    }
}
