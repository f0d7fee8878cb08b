//! The published form of a spoke's observation: [`PublishedSpoke`] to and from
//! `ClusterIdentityObservation` specs, so that the replica writing the fleet report can
//! analyse spokes another replica engages. Pure: no I/O (the hub's status loop publishes and
//! reads the objects, `crate::status::observations`).
//!
//! The form holds exactly what [`super::analyze`], [`super::cluster_status`] and
//! `/v1/clusters` read of a spoke, field for field (a ready binding's `Ready` reason and
//! message, which none of them reads, are left out), so a report built from published
//! observations equals the one built from the replica's own state (times at second
//! precision, as the API writes them). A digest of the content (SHA-256 over its canonical
//! JSON, `lastSync` left out because it moves on every sync) lets the writer skip unchanged
//! content and the reader refuse an object whose content does not match it.
//!
//! Size: an observation is split into parts of at most [`Limits::part_bytes`] bytes of
//! JSON; a spoke that would need more than [`Limits::max_parts`] parts, or a binding larger
//! than a part, is published without bindings and with [`INCOMPLETE_PREFIX`] in its error
//! message, which the report shows as the spoke's failing `Synced` condition: never a
//! silently shorter list.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kleym_api::ErrorCategory;
use kleym_api::hub_status::{
    ClusterIdentityObservation, ClusterIdentityObservationSpec, ObservedAdmissionPolicy,
    ObservedBinding, ObservedHealth,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::input::{AdmissionPolicyCheck, BindingSnapshot, Health, SpokeObservation};

/// One spoke as the report and `/v1/clusters` read it: the observation, plus the phase and
/// failure count the supervisor shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PublishedSpoke {
    /// The analysis input.
    pub observation: SpokeObservation,
    /// The supervisor's phase name (`Engaged`, `Standby`, ...).
    pub phase: String,
    /// The supervisor's failures since the last successful sync (`/v1/clusters`'
    /// `consecutiveFailures`).
    pub failures: u32,
}

impl From<&crate::fleet::state::SpokeState> for PublishedSpoke {
    fn from(s: &crate::fleet::state::SpokeState) -> Self {
        PublishedSpoke {
            observation: SpokeObservation::from(s),
            phase: s.phase.as_str().to_string(),
            failures: s.consecutive_failures,
        }
    }
}

/// Every spoke of `state` (this replica's own view), sorted by name.
pub fn local_spokes(state: &crate::fleet::state::FleetState) -> Vec<PublishedSpoke> {
    state.spokes().iter().map(PublishedSpoke::from).collect()
}

/// Size limits of the published form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of JSON one object's spec may hold (well below etcd's 1.5 MiB request limit
    /// and the 1 MiB a Kubernetes object is commonly kept under).
    pub part_bytes: usize,
    /// Objects one spoke may use.
    pub max_parts: u32,
}

impl Default for Limits {
    /// 512 KiB per object, 16 objects per spoke: about 20,000 bindings of a typical size.
    fn default() -> Self {
        Limits {
            part_bytes: 512 * 1024,
            max_parts: 16,
        }
    }
}

/// How the error message of a spoke published without its bindings starts.
pub const INCOMPLETE_PREFIX: &str =
    "the hub replica engaging this spoke could not publish its bindings for the fleet report";

/// A published observation that cannot be used, naming the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObservationError {
    /// A field holds a value the hub never writes.
    #[error("ClusterIdentityObservation {object}: field {field}: {why}")]
    Invalid {
        /// `namespace/name` of the object.
        object: String,
        /// The JSON path of the field.
        field: String,
        /// What is wrong.
        why: String,
    },
    /// The content does not match the digest it carries: it was not written whole by a hub.
    #[error(
        "ClusterIdentityObservation {object}: the content does not match spec.digest (edited by something other than the kleym hub, or garbled)"
    )]
    DigestMismatch {
        /// `namespace/name` of the first part.
        object: String,
    },
    /// The parts of a split observation do not form one whole.
    #[error("ClusterIdentityObservation {object}: {why}")]
    Incomplete {
        /// `namespace/name` of the first part.
        object: String,
        /// Which part is missing or disagrees.
        why: String,
    },
}

/// One object's spec, with the object's `namespace/name` (for errors).
#[derive(Debug, Clone, Copy)]
pub struct PartRef<'a> {
    /// `namespace/name` of the object.
    pub object: &'a str,
    /// Its name alone.
    pub name: &'a str,
    /// Its spec.
    pub spec: &'a ClusterIdentityObservationSpec,
}

/// The object name of part `part` of `cluster`'s observation: `<namespace>.<name>` for
/// part 0 when that is a valid name (a namespace has no dot, so the first dot splits it),
/// else a hash; later parts `p<part>-<hash>` (no dot, so never a first part's name).
pub fn object_name(cluster: &str, part: u32) -> String {
    let hash = hex(&Sha256::digest(cluster.as_bytes()))[..40].to_string();
    if part > 0 {
        return format!("p{part}-{hash}");
    }
    let dotted = cluster.replacen('/', ".", 1);
    if dotted.len() <= 253 && cluster.contains('/') {
        dotted
    } else {
        format!("h.{hash}")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the digest covers: every field but `lastSync` and the part bookkeeping.
#[derive(Serialize)]
struct DigestInput<'a> {
    header: &'a ClusterIdentityObservationSpec,
    bindings: &'a [ObservedBinding],
}

fn digest_of(header: &ClusterIdentityObservationSpec, bindings: &[ObservedBinding]) -> String {
    let header = ClusterIdentityObservationSpec {
        digest: String::new(),
        part: 0,
        parts: 1,
        last_sync: None,
        bindings: Vec::new(),
        ..header.clone()
    };
    // Serialising plain structs, strings and sorted maps cannot fail.
    let bytes = serde_json::to_vec(&DigestInput {
        header: &header,
        bindings,
    })
    .unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

fn admission_policy_of(c: &AdmissionPolicyCheck) -> ObservedAdmissionPolicy {
    let (state, detail) = match c {
        AdmissionPolicyCheck::Installed { policy } => ("Installed", Some(policy.clone())),
        AdmissionPolicyCheck::Missing => ("Missing", None),
        AdmissionPolicyCheck::Unknown { why } => ("Unknown", Some(why.clone())),
    };
    ObservedAdmissionPolicy {
        state: state.to_string(),
        detail,
    }
}

fn parse_admission_policy(o: &ObservedAdmissionPolicy) -> Option<AdmissionPolicyCheck> {
    let detail = o.detail.clone().unwrap_or_default();
    match o.state.as_str() {
        "Installed" => Some(AdmissionPolicyCheck::Installed { policy: detail }),
        "Missing" => Some(AdmissionPolicyCheck::Missing),
        "Unknown" => Some(AdmissionPolicyCheck::Unknown { why: detail }),
        _ => None,
    }
}

fn health_str(h: Health) -> String {
    match h {
        Health::Unknown => "Unknown".to_string(),
        Health::Ok => "Ok".to_string(),
        Health::Failed(c) => c.as_str().to_string(),
    }
}

/// Every category, for parsing [`ErrorCategory::as_str`] back.
const CATEGORIES: [ErrorCategory; 10] = [
    ErrorCategory::Unreachable,
    ErrorCategory::Tls,
    ErrorCategory::Credentials,
    ErrorCategory::Unauthorized,
    ErrorCategory::Forbidden,
    ErrorCategory::CrdMissing,
    ErrorCategory::ServerError,
    ErrorCategory::SyncTimeout,
    ErrorCategory::ProfileRefused,
    ErrorCategory::Other,
];

fn parse_health(s: &str) -> Option<Health> {
    match s {
        "Unknown" => Some(Health::Unknown),
        "Ok" => Some(Health::Ok),
        _ => CATEGORIES
            .iter()
            .find(|c| c.as_str() == s)
            .map(|c| Health::Failed(*c)),
    }
}

fn time_of(t: DateTime<Utc>) -> Time {
    super::k8s_time(t)
}

fn chrono_of(t: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), 0)
}

fn binding_of(b: &BindingSnapshot) -> ObservedBinding {
    ObservedBinding {
        namespace: b.namespace.clone(),
        name: b.name.clone(),
        mode: b.mode,
        spiffe_ids: b.spiffe_ids.clone(),
        service_account: b.service_account.clone(),
        container_discriminator: b.container_discriminator.clone(),
        pool_selector: b.pool_selector.iter().cloned().collect(),
        ready: b.ready,
        // A ready binding's reason and message are read by nothing the report builds (its
        // status lists only bindings that are not ready): a third of a binding's bytes.
        reason: b.reason.clone().filter(|_| !b.ready),
        message: b.message.clone().filter(|_| !b.ready),
        conflict_peers: b.conflict_peers.clone(),
        warnings: b.warnings.clone(),
    }
}

fn snapshot_of(b: &ObservedBinding) -> BindingSnapshot {
    BindingSnapshot {
        namespace: b.namespace.clone(),
        name: b.name.clone(),
        mode: b.mode,
        spiffe_ids: b.spiffe_ids.clone(),
        service_account: b.service_account.clone(),
        container_discriminator: b.container_discriminator.clone(),
        pool_selector: b
            .pool_selector
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ready: b.ready,
        reason: b.reason.clone(),
        message: b.message.clone(),
        conflict_peers: b.conflict_peers.clone(),
        warnings: b.warnings.clone(),
    }
}

fn json_len<T: Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// The specs of the objects that publish `spoke`, part 0 first. Always at least one; the
/// content is bounded by `limits` (see the module docs).
pub fn encode(spoke: &PublishedSpoke, limits: &Limits) -> Vec<ClusterIdentityObservationSpec> {
    let o = &spoke.observation;
    let mut header = ClusterIdentityObservationSpec {
        cluster: o.cluster.clone(),
        digest: String::new(),
        part: 0,
        parts: 1,
        phase: Some(spoke.phase.clone()).filter(|p| !p.is_empty()),
        trust_domain: o.trust_domain.clone(),
        health: Some(ObservedHealth {
            credentials: health_str(o.credentials),
            reachable: health_str(o.reachable),
            synced: health_str(o.synced),
        }),
        error_message: o.error_message.clone(),
        consecutive_failures: (o.consecutive_failures > 0).then_some(o.consecutive_failures),
        failures_since_sync: (spoke.failures > 0).then_some(spoke.failures),
        next_retry: o.next_retry.map(time_of),
        spoke_version: o.spoke_version.clone(),
        last_sync: o.last_sync.map(time_of),
        duplicate_of: o.duplicate_of.clone(),
        admission_policy: o.admission_policy.as_ref().map(admission_policy_of),
        bindings: Vec::new(),
    };
    let bindings: Vec<ObservedBinding> = o.bindings.iter().map(|b| binding_of(b)).collect();
    // Room for the bindings of one part: the header (with its digest) is repeated in each.
    let room = limits
        .part_bytes
        .saturating_sub(json_len(&header) + 64 + 200);
    let mut parts: Vec<Vec<ObservedBinding>> = vec![Vec::new()];
    let mut used = 0usize;
    let mut too_large = None;
    for b in bindings.iter() {
        let len = json_len(b) + 1;
        if len > room {
            too_large = Some(format!(
                "binding {}/{} alone takes {len} bytes",
                b.namespace, b.name
            ));
            break;
        }
        if used + len > room {
            parts.push(Vec::new());
            used = 0;
        }
        used += len;
        if let Some(last) = parts.last_mut() {
            last.push(b.clone());
        }
    }
    if too_large.is_none() && parts.len() > limits.max_parts as usize {
        too_large = Some(format!(
            "its {} bindings need {} objects of at most {} bytes, more than {}",
            bindings.len(),
            parts.len(),
            limits.part_bytes,
            limits.max_parts
        ));
    }
    if let Some(why) = too_large {
        // Published without bindings, saying so where the report shows it.
        header.health = Some(ObservedHealth {
            synced: ErrorCategory::Other.as_str().to_string(),
            ..header.health.clone().unwrap_or_default()
        });
        header.error_message = Some(format!("{INCOMPLETE_PREFIX}: {why}"));
        header.digest = digest_of(&header, &[]);
        return vec![header];
    }
    header.digest = digest_of(&header, &bindings);
    let count = parts.len() as u32;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, bindings)| {
            let mut spec = if i == 0 {
                header.clone()
            } else {
                // Later parts repeat only what identifies them.
                ClusterIdentityObservationSpec {
                    cluster: header.cluster.clone(),
                    digest: header.digest.clone(),
                    ..Default::default()
                }
            };
            spec.part = i as u32;
            spec.parts = count;
            spec.bindings = bindings;
            spec
        })
        .collect()
}

/// The spoke published by `parts` (every object naming one cluster, in any order): checked
/// field by field, assembled, and its digest verified.
pub fn decode(parts: &[PartRef<'_>], limits: &Limits) -> Result<PublishedSpoke, ObservationError> {
    let first = parts
        .iter()
        .find(|p| p.spec.part == 0)
        .or_else(|| parts.first())
        .ok_or_else(|| ObservationError::Incomplete {
            object: "(none)".into(),
            why: "no object".into(),
        })?;
    let object = first.object.to_string();
    let invalid = |field: &str, why: String| ObservationError::Invalid {
        object: object.clone(),
        field: field.to_string(),
        why,
    };
    let header = first.spec;
    let cluster = &header.cluster;
    match cluster.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {}
        _ => {
            return Err(invalid(
                "spec.cluster",
                format!("{cluster:?} is not <namespace>/<name>"),
            ));
        }
    }
    if header.part != 0 {
        return Err(ObservationError::Incomplete {
            object,
            why: format!("part 0 of {cluster}'s observation is missing"),
        });
    }
    if header.parts == 0 || header.parts > limits.max_parts {
        return Err(invalid(
            "spec.parts",
            format!("{} is not within 1..={}", header.parts, limits.max_parts),
        ));
    }
    let mut by_part: BTreeMap<u32, &ClusterIdentityObservationSpec> = BTreeMap::new();
    for p in parts {
        let expected = object_name(&p.spec.cluster, p.spec.part);
        if p.name != expected {
            return Err(ObservationError::Invalid {
                object: p.object.to_string(),
                field: "metadata.name".into(),
                why: format!(
                    "part {} of cluster {:?} must be named {expected:?}",
                    p.spec.part, p.spec.cluster
                ),
            });
        }
        if p.spec.digest != header.digest || p.spec.parts != header.parts && p.spec.part > 0 {
            return Err(ObservationError::Incomplete {
                object: object.clone(),
                why: format!(
                    "part {} ({}) belongs to another version of the observation (being rewritten)",
                    p.spec.part, p.object
                ),
            });
        }
        if by_part.insert(p.spec.part, p.spec).is_some() {
            return Err(invalid(
                "spec.part",
                format!("part {} appears twice", p.spec.part),
            ));
        }
    }
    if let Some(missing) = (0..header.parts).find(|i| !by_part.contains_key(i)) {
        return Err(ObservationError::Incomplete {
            object,
            why: format!("part {missing} of {} is missing", header.parts),
        });
    }
    if let Some(extra) = by_part.keys().find(|i| **i >= header.parts) {
        return Err(invalid(
            "spec.part",
            format!("part {extra} of an observation of {} parts", header.parts),
        ));
    }
    let bindings: Vec<ObservedBinding> = by_part
        .values()
        .flat_map(|s| s.bindings.iter().cloned())
        .collect();
    let health = header
        .health
        .as_ref()
        .ok_or_else(|| invalid("spec.health", "missing".into()))?;
    let aspect = |field: &str, v: &str| {
        parse_health(v).ok_or_else(|| {
            invalid(
                field,
                format!("{v:?} is neither Ok, Unknown nor an error category"),
            )
        })
    };
    let credentials = aspect("spec.health.credentials", &health.credentials)?;
    let reachable = aspect("spec.health.reachable", &health.reachable)?;
    let synced = aspect("spec.health.synced", &health.synced)?;
    for (i, b) in bindings.iter().enumerate() {
        if b.namespace.is_empty() || b.name.is_empty() {
            return Err(invalid(
                &format!("spec.bindings[{i}]"),
                "a binding needs a namespace and a name".into(),
            ));
        }
    }
    let time = |field: &str, t: &Option<Time>| match t {
        None => Ok(None),
        Some(t) => chrono_of(t)
            .map(Some)
            .ok_or_else(|| invalid(field, "not a representable time".into())),
    };
    let next_retry = time("spec.nextRetry", &header.next_retry)?;
    let admission_policy = match &header.admission_policy {
        None => None,
        Some(o) => Some(parse_admission_policy(o).ok_or_else(|| {
            invalid(
                "spec.admissionPolicy.state",
                format!("{:?} is neither Installed, Missing nor Unknown", o.state),
            )
        })?),
    };
    let last_sync = time("spec.lastSync", &header.last_sync)?;
    // Last: the fields above are named precisely when wrong; this catches the rest.
    if digest_of(header, &bindings) != header.digest {
        return Err(ObservationError::DigestMismatch { object });
    }
    let observation = SpokeObservation {
        cluster: cluster.clone(),
        trust_domain: header.trust_domain.clone(),
        credentials,
        reachable,
        synced,
        error_message: header.error_message.clone(),
        consecutive_failures: header.consecutive_failures.unwrap_or(0),
        next_retry,
        spoke_version: header.spoke_version.clone(),
        last_sync,
        bindings: Arc::new(bindings.iter().map(|b| Arc::new(snapshot_of(b))).collect()),
        duplicate_of: header.duplicate_of.clone(),
        admission_policy,
    };
    Ok(PublishedSpoke {
        observation,
        phase: header.phase.clone().unwrap_or_default(),
        failures: header.failures_since_sync.unwrap_or(0),
    })
}

/// What the report shows for a spoke whose published observation was refused: no bindings,
/// and the refusal as its failing `Synced` condition (the other aspects are not known).
pub fn refused(cluster: &str, phase: &str, error: &ObservationError) -> PublishedSpoke {
    PublishedSpoke {
        observation: SpokeObservation {
            cluster: cluster.to_string(),
            synced: Health::Failed(ErrorCategory::Other),
            error_message: Some(format!(
                "the published observation of this spoke was refused: {error}"
            )),
            ..Default::default()
        },
        phase: phase.to_string(),
        failures: 0,
    }
}

/// Every published spoke in `objects` (the observations of one hub namespace), by cluster:
/// decoded, or why not. Objects are grouped by the cluster they name; [`decode`] checks
/// that each is named after it, so one object cannot stand in for another spoke's.
pub fn assemble(
    objects: &[Arc<ClusterIdentityObservation>],
    limits: &Limits,
) -> BTreeMap<String, Result<PublishedSpoke, ObservationError>> {
    let mut by_cluster: BTreeMap<&str, Vec<&ClusterIdentityObservation>> = BTreeMap::new();
    for o in objects {
        by_cluster
            .entry(o.spec.cluster.as_str())
            .or_default()
            .push(o);
    }
    by_cluster
        .into_iter()
        .map(|(cluster, objs)| (cluster.to_string(), decode_objects(&objs, limits)))
        .collect()
}

/// [`decode`] over whole objects.
pub fn decode_objects(
    objects: &[&ClusterIdentityObservation],
    limits: &Limits,
) -> Result<PublishedSpoke, ObservationError> {
    let names: Vec<(String, &str)> = objects
        .iter()
        .map(|o| {
            let ns = o.metadata.namespace.as_deref().unwrap_or_default();
            let name = o.metadata.name.as_deref().unwrap_or_default();
            (format!("{ns}/{name}"), name)
        })
        .collect();
    let parts: Vec<PartRef<'_>> = objects
        .iter()
        .zip(&names)
        .map(|(o, (object, name))| PartRef {
            object,
            name,
            spec: &o.spec,
        })
        .collect();
    decode(&parts, limits)
}

/// The report's input in sharded mode: every spoke this replica knows (`local`, its own
/// view of the inventory, sorted by name), each as its owner published it where a published
/// observation exists, else as this replica sees it. A refused observation shows as
/// [`refused`]; a published observation of a spoke this replica does not know (a removed
/// profile not yet cleaned up, or an object someone made up) is left out.
pub fn merge(
    local: Vec<PublishedSpoke>,
    published: &BTreeMap<String, Result<PublishedSpoke, ObservationError>>,
) -> Vec<PublishedSpoke> {
    local
        .into_iter()
        .map(|l| match published.get(&l.observation.cluster) {
            None => l,
            Some(Ok(p)) => p.clone(),
            Some(Err(e)) => refused(&l.observation.cluster, &l.phase, e),
        })
        .collect()
}

#[cfg(test)]
#[path = "published_tests.rs"]
mod tests;
