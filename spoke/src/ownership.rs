//! Which binding owns a ClusterSPIFFEID: the one proof every place that acts on a
//! ClusterSPIFFEID goes through (the reconciler's apply, delete and adoption, the finalizer's
//! cleanup, the overlap warning, the hub's `Cleanup` removal).
//!
//! **The binding's status is never proof.** `status.clusterSPIFFEID` is kleym's *output*,
//! and a tenant who may write its binding's status subresource can write any name and UID
//! there. Ownership is proven on the ClusterSPIFFEID itself, which is cluster-scoped: a
//! tenant cannot write it, so nothing it carries can be forged from a namespace. An object
//! is the output of binding `namespace/name` (UID `uid`) only if all of these hold:
//!
//! - its annotation [`OWNER_ANNOTATION`] is `<namespace>/<name>/<uid>` of that binding (the
//!   UID makes a binding re-created under the same name a different owner);
//! - kleym's field manager wrote that annotation by server-side apply (`managedFields`):
//!   someone who copies the annotation with another tool does not make the object kleym's;
//! - its name is the one the compiler gives that binding ([`cluster_spiffe_id_name`]).
//!
//! **Labels are output, not proof.** kleym's labels ([`output_labels`]) are for finding
//! objects. Anyone who can set a label on a ClusterSPIFFEID can also write the annotation,
//! and a tenant can do neither (every field of a cluster-scoped object is out of a
//! namespace's reach), so requiring them added nothing to the proof; it only made an
//! administrator's or a labelling tool's edit of a label leave the binding refused for
//! good. When the proof above holds, the labels are restored by the next apply, like any
//! other drift of kleym's output. Labels alone never prove anything: an object without
//! kleym's annotation, applied by kleym's field manager, is foreign whatever it carries.
//!
//! **Migration.** Objects written before this rule carry the annotation
//! [`LEGACY_BINDING_UID_ANNOTATION`] (the binding's UID alone) instead. Such an object is
//! adopted when kleym's field manager wrote that annotation, its value is the binding's
//! UID, and its name and labels are the ones the compiler gives the binding (the labels
//! are the only place such an object names its binding); the next apply replaces the
//! legacy annotation with [`OWNER_ANNOTATION`] ([`Proof::Legacy`]).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::labels;
use kube::ResourceExt;

use crate::compiler::output::{cluster_spiffe_id_name, output_labels};

/// Annotation naming the binding that owns a ClusterSPIFFEID: `<namespace>/<name>/<uid>`.
pub const OWNER_ANNOTATION: &str = "kleym.io/owner";
/// Annotation earlier kleym versions put on their ClusterSPIFFEIDs: the binding's UID.
/// Read only to adopt those objects (see the module documentation), never written.
pub const LEGACY_BINDING_UID_ANNOTATION: &str = "kleym.io/binding-uid";

/// Annotations whose writer `managedFields` records and the caches keep (see
/// [`prune_managed_fields`]).
pub const PROOF_ANNOTATIONS: [&str; 2] = [OWNER_ANNOTATION, LEGACY_BINDING_UID_ANNOTATION];

/// `managedFields` operation of a server-side apply.
const APPLY: &str = "Apply";

/// The binding a ClusterSPIFFEID belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// Namespace of the binding.
    pub namespace: String,
    /// Name of the binding.
    pub name: String,
    /// UID of the binding.
    pub uid: String,
}

impl Owner {
    /// The owner identity of `binding`: `None` without a name, namespace or UID (objects
    /// read from the API always have them; without a UID nothing can be proven).
    pub fn of(binding: &InferenceIdentityBinding) -> Option<Self> {
        Some(Owner {
            namespace: binding.namespace().filter(|s| !s.is_empty())?,
            name: binding.metadata.name.clone().filter(|s| !s.is_empty())?,
            uid: binding.uid().filter(|s| !s.is_empty())?,
        })
    }

    /// The value of [`OWNER_ANNOTATION`] for this owner.
    pub fn annotation_value(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.name, self.uid)
    }

    /// Parses a [`OWNER_ANNOTATION`] value. Namespaces, names and UIDs cannot contain `/`,
    /// so exactly three non-empty parts are required.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split('/');
        let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [namespace, name, uid].iter().any(|p| p.is_empty()) {
            return None;
        }
        Some(Owner {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        })
    }

    /// The name the compiler gives this binding's ClusterSPIFFEID.
    pub fn object_name(&self) -> String {
        cluster_spiffe_id_name(&self.namespace, &self.name)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (UID {})", self.namespace, self.name, self.uid)
    }
}

/// How an owned object proved its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// By [`OWNER_ANNOTATION`].
    Annotated,
    /// By [`LEGACY_BINDING_UID_ANNOTATION`] (written before [`OWNER_ANNOTATION`] existed):
    /// the next apply adds the owner annotation.
    Legacy,
}

/// The object is not the output of the binding: never modify or delete it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ClusterSPIFFEID {object} is not kleym's output for this binding: {why}")]
pub struct Foreign {
    /// Name of the object.
    pub object: String,
    /// Why the proof failed.
    pub why: String,
}

impl Foreign {
    fn new(obj: &(impl ProofSubject + ?Sized), why: impl Into<String>) -> Self {
        Foreign {
            object: obj.object_name().to_string(),
            why: why.into(),
        }
    }
}

/// What the proof reads of a ClusterSPIFFEID: its name, UID, labels, annotations and field
/// managers, nothing of its spec or status. Implemented by the API object and by the form
/// the reconciler's cache keeps it in (`reconciler::observed_output::ObservedOutput`), so
/// both are proven by the same code.
pub trait ProofSubject {
    /// `metadata.name`.
    fn object_name(&self) -> &str;
    /// `metadata.uid`.
    fn object_uid(&self) -> Option<&str>;
    /// The label `key`.
    fn label(&self, key: &str) -> Option<&str>;
    /// The annotation `key`.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// `metadata.managedFields`, as returned or as [`prune_managed_fields`] left them.
    fn managed_fields(&self) -> &[ManagedFieldsEntry];
}

impl ProofSubject for ClusterSPIFFEID {
    fn object_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn object_uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    fn managed_fields(&self) -> &[ManagedFieldsEntry] {
        self.metadata.managed_fields.as_deref().unwrap_or_default()
    }
}

/// Who the object says created it, before checking that this is consistent with its name
/// and labels.
enum Claim {
    Annotated(Owner),
    Legacy { uid: String },
}

/// Reads the owner annotation and checks that `field_manager` applied it.
fn claim(obj: &(impl ProofSubject + ?Sized), field_manager: &str) -> Result<Claim, Foreign> {
    let (key, claim) = if let Some(v) = obj.annotation(OWNER_ANNOTATION) {
        let owner = Owner::parse(v).ok_or_else(|| {
            Foreign::new(
                obj,
                format!("its {OWNER_ANNOTATION} annotation {v:?} is not <namespace>/<name>/<uid>"),
            )
        })?;
        (OWNER_ANNOTATION, Claim::Annotated(owner))
    } else if let Some(uid) = obj.annotation(LEGACY_BINDING_UID_ANNOTATION) {
        (
            LEGACY_BINDING_UID_ANNOTATION,
            Claim::Legacy {
                uid: uid.to_string(),
            },
        )
    } else {
        return Err(Foreign::new(
            obj,
            format!("it has no {OWNER_ANNOTATION} annotation"),
        ));
    };
    if !applied_by(obj, field_manager, key) {
        return Err(Foreign::new(
            obj,
            format!(
                "its {key} annotation was not applied by kleym's field manager {field_manager:?}"
            ),
        ));
    }
    Ok(claim)
}

/// Did `field_manager` server-side apply the annotation `key` (`managedFields`)? Reads
/// both the entry as the API server returns it and the compact record the caches keep
/// ([`prune_managed_fields`]).
fn applied_by(obj: &(impl ProofSubject + ?Sized), field_manager: &str, key: &str) -> bool {
    let field = format!("f:{key}");
    obj.managed_fields().iter().any(|e| {
        e.manager.as_deref() == Some(field_manager)
            && e.operation.as_deref() == Some(APPLY)
            && e.subresource.as_deref().is_none_or(str::is_empty)
            && e.fields_v1.as_ref().is_some_and(|f| match &f.0 {
                serde_json::Value::String(pruned) => *pruned == field,
                tree => tree
                    .get("f:metadata")
                    .and_then(|m| m.get("f:annotations")?.get(&field))
                    .is_some(),
            })
    })
}

/// Proves that `obj` is the output of the binding `owner` (see the module documentation).
/// `field_manager` is kleym's (`kleym`). Pure: this is the check before every apply over an
/// existing object, adoption, delete and cleanup.
pub fn verify(
    obj: &(impl ProofSubject + ?Sized),
    field_manager: &str,
    owner: &Owner,
) -> Result<Proof, Foreign> {
    let proof = match claim(obj, field_manager)? {
        Claim::Annotated(claimed) if claimed == *owner => Proof::Annotated,
        Claim::Annotated(claimed) => {
            return Err(Foreign::new(
                obj,
                format!("its {OWNER_ANNOTATION} annotation names binding {claimed}"),
            ));
        }
        Claim::Legacy { uid } if uid == owner.uid => Proof::Legacy,
        Claim::Legacy { uid } => {
            return Err(Foreign::new(
                obj,
                format!(
                    "its {LEGACY_BINDING_UID_ANNOTATION} annotation names binding UID {uid}, not {}",
                    owner.uid
                ),
            ));
        }
    };
    if obj.object_uid().is_none_or(str::is_empty) {
        return Err(Foreign::new(obj, "it has no UID"));
    }
    let expected = owner.object_name();
    if obj.object_name() != expected {
        return Err(Foreign::new(
            obj,
            format!("binding {owner} names its ClusterSPIFFEID {expected}"),
        ));
    }
    if proof == Proof::Annotated {
        // The labels are output, restored by the next apply (module documentation).
        return Ok(proof);
    }
    let want = output_labels(&owner.namespace, &owner.name);
    if let Some((k, v)) = want.iter().find(|(k, v)| obj.label(k) != Some(*v)) {
        return Err(Foreign::new(
            obj,
            format!(
                "its label {k} is {:?}, not {v:?}",
                obj.label(k).unwrap_or_default()
            ),
        ));
    }
    Ok(proof)
}

/// The binding `obj` is proven to be the output of, whichever it is (the same proof as
/// [`verify`], against the owner the object names): what "kleym's own object" means for
/// the overlap warning and the watch that maps an object back to its binding. Legacy
/// objects name their owner by labels, which are only usable when not shortened.
pub fn proven_owner(
    obj: &(impl ProofSubject + ?Sized),
    field_manager: &str,
) -> Result<Owner, Foreign> {
    let owner = match claim(obj, field_manager)? {
        Claim::Annotated(owner) => owner,
        Claim::Legacy { uid } => {
            let (Some(namespace), Some(name)) = (
                obj.label(labels::BINDING_NAMESPACE),
                obj.label(labels::BINDING_NAME),
            ) else {
                return Err(Foreign::new(obj, "it has no binding labels"));
            };
            Owner {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid,
            }
        }
    };
    verify(obj, field_manager, &owner)?;
    Ok(owner)
}

/// Reduces `managedFields` to what [`verify`] reads, for the caches: one compact record per
/// proof annotation that a manager server-side applied (manager, operation, and the field
/// `f:<annotation>` as a JSON string in place of the `FieldsV1` tree). Everything else of
/// `managedFields` (the largest part of most objects) is dropped; `None` when nothing is
/// left.
///
/// Why a string: a `FieldsV1` tree is three nested JSON maps, about 3 KB of B-tree nodes per
/// cached ClusterSPIFFEID, the largest single cost of a hub's caches at 100 bindings per
/// spoke. The string cannot be mistaken for something an API server returns: kube-apiserver
/// only stores `fieldsV1` it can decode as a field set (a JSON object) and resets
/// `managedFields` it cannot decode, so the compact form only ever comes from this function.
pub fn prune_managed_fields(
    entries: Option<Vec<ManagedFieldsEntry>>,
) -> Option<Vec<ManagedFieldsEntry>> {
    let mut kept: Vec<ManagedFieldsEntry> = entries
        .into_iter()
        .flatten()
        .filter(|e| {
            e.operation.as_deref() == Some(APPLY)
                && e.subresource.as_deref().is_none_or(str::is_empty)
        })
        .flat_map(|e| {
            let annotations = e
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata")?.get("f:annotations")?.as_object());
            PROOF_ANNOTATIONS
                .iter()
                .map(|k| format!("f:{k}"))
                .filter(|k| annotations.is_some_and(|a| a.contains_key(k)))
                .map(|k| ManagedFieldsEntry {
                    manager: e.manager.clone(),
                    operation: Some(APPLY.to_string()),
                    fields_v1: Some(FieldsV1(serde_json::Value::String(k))),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Collecting a `flat_map` starts at four entries, nearly always for one: the rest would
    // stay allocated for as long as the object is cached.
    kept.shrink_to_fit();
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::external::spiffeid::ClusterSPIFFEIDSpec;
    use std::collections::BTreeMap;

    const FM: &str = "kleym";

    fn owner(ns: &str, name: &str, uid: &str) -> Owner {
        Owner {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn entry(manager: &str, operation: &str, annotation: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": {
                    "f:annotations": {format!("f:{annotation}"): {}},
                    "f:labels": {"f:kleym.io/managed-by": {}}
                },
                "f:spec": {"f:spiffeIDTemplate": {}}
            }))),
            ..Default::default()
        }
    }

    /// The object kleym applies for `o`, as the apiserver returns it.
    fn applied(o: &Owner) -> ClusterSPIFFEID {
        let mut obj = ClusterSPIFFEID::new(&o.object_name(), ClusterSPIFFEIDSpec::default());
        obj.metadata.uid = Some("csid-uid".into());
        obj.metadata.labels = Some(output_labels(&o.namespace, &o.name).to_btree_map());
        obj.metadata.annotations = Some(BTreeMap::from([(
            OWNER_ANNOTATION.to_string(),
            o.annotation_value(),
        )]));
        obj.metadata.managed_fields = Some(vec![entry(FM, "Apply", OWNER_ANNOTATION)]);
        obj
    }

    #[test]
    fn kleyms_own_output_is_proven() {
        let o = owner("t5", "chat", "u1");
        assert_eq!(verify(&applied(&o), FM, &o), Ok(Proof::Annotated));
        assert_eq!(proven_owner(&applied(&o), FM), Ok(o));
    }

    #[test]
    fn another_bindings_output_is_foreign() {
        let victim = owner("t1", "chat", "u1");
        let obj = applied(&victim);
        // Another namespace, another name, or the same name re-created (new UID).
        for forger in [
            owner("t5", "chat", "u1"),
            owner("t1", "other", "u1"),
            owner("t1", "chat", "u2"),
        ] {
            let err = verify(&obj, FM, &forger).unwrap_err();
            assert_eq!(err.object, victim.object_name());
            assert!(err.why.contains("t1/chat (UID u1)"), "{}", err.why);
        }
    }

    #[test]
    fn an_object_without_kleyms_annotation_is_foreign_whatever_its_labels() {
        let o = owner("t5", "forger", "u5");
        let mut obj = applied(&o);
        obj.metadata.name = Some("platform-default".into());
        obj.metadata.annotations = None;
        let err = verify(&obj, FM, &o).unwrap_err();
        assert_eq!(err.object, "platform-default");
        assert!(err.why.contains("no kleym.io/owner"), "{}", err.why);
        assert!(proven_owner(&obj, FM).is_err());
    }

    #[test]
    fn the_annotation_must_be_applied_by_kleyms_field_manager() {
        let o = owner("t5", "chat", "u1");
        for entries in [
            None,
            Some(vec![entry("kubectl", "Apply", OWNER_ANNOTATION)]),
            Some(vec![entry(FM, "Update", OWNER_ANNOTATION)]),
            Some(vec![entry(FM, "Apply", "kleym.io/other")]),
            Some(vec![ManagedFieldsEntry {
                subresource: Some("status".into()),
                ..entry(FM, "Apply", OWNER_ANNOTATION)
            }]),
        ] {
            let mut obj = applied(&o);
            obj.metadata.managed_fields = entries.clone();
            let err = verify(&obj, FM, &o).unwrap_err();
            assert!(
                err.why.contains("field manager"),
                "{entries:?}: {}",
                err.why
            );
        }
        // Another manager besides kleym does not matter (SPIRE writes the status).
        let mut obj = applied(&o);
        obj.metadata
            .managed_fields
            .as_mut()
            .unwrap()
            .insert(0, entry("spire-controller-manager", "Update", "x"));
        assert_eq!(verify(&obj, FM, &o), Ok(Proof::Annotated));
        assert!(verify(&obj, "other-manager", &o).is_err());
    }

    #[test]
    fn the_name_must_be_the_bindings_and_labels_prove_nothing() {
        let o = owner("t5", "chat", "u1");
        let mut renamed = applied(&o);
        renamed.metadata.name = Some("platform-default".into());
        assert!(
            verify(&renamed, FM, &o)
                .unwrap_err()
                .why
                .contains("names its")
        );
        // Labels changed or stripped by someone else: still kleym's (they are output, and
        // the apply restores them).
        let mut relabelled = applied(&o);
        let l = relabelled.metadata.labels.as_mut().unwrap();
        l.insert(labels::BINDING_NAME.into(), "other".into());
        l.remove(labels::MANAGED_BY);
        assert_eq!(verify(&relabelled, FM, &o), Ok(Proof::Annotated));
        assert_eq!(proven_owner(&relabelled, FM), Ok(o.clone()));
        relabelled.metadata.labels = None;
        assert_eq!(verify(&relabelled, FM, &o), Ok(Proof::Annotated));
        // A legacy object names its binding only by its labels: they must still match.
        let mut legacy_relabelled = legacy(&o);
        legacy_relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::BINDING_NAME.into(), "other".into());
        assert!(
            verify(&legacy_relabelled, FM, &o)
                .unwrap_err()
                .why
                .contains(labels::BINDING_NAME)
        );
        let mut no_uid = applied(&o);
        no_uid.metadata.uid = None;
        assert!(verify(&no_uid, FM, &o).is_err());
    }

    #[test]
    fn malformed_owner_annotations_are_foreign() {
        let o = owner("t5", "chat", "u1");
        for v in ["", "t5/chat", "t5/chat/u1/x", "t5//u1", "/chat/u1"] {
            let mut obj = applied(&o);
            obj.metadata.annotations = Some(BTreeMap::from([(
                OWNER_ANNOTATION.to_string(),
                v.to_string(),
            )]));
            assert!(verify(&obj, FM, &o).is_err(), "{v:?}");
        }
        assert_eq!(Owner::parse(&o.annotation_value()), Some(o));
    }

    /// An object an earlier kleym wrote: legacy UID annotation, kleym's labels and name.
    fn legacy(o: &Owner) -> ClusterSPIFFEID {
        let mut obj = applied(o);
        obj.metadata.annotations = Some(BTreeMap::from([(
            LEGACY_BINDING_UID_ANNOTATION.to_string(),
            o.uid.clone(),
        )]));
        obj.metadata.managed_fields = Some(vec![entry(FM, "Apply", LEGACY_BINDING_UID_ANNOTATION)]);
        obj
    }

    #[test]
    fn legacy_objects_are_adopted_only_with_everything_matching() {
        let o = owner("t5", "chat", "u1");
        assert_eq!(verify(&legacy(&o), FM, &o), Ok(Proof::Legacy));
        assert_eq!(proven_owner(&legacy(&o), FM), Ok(o.clone()));
        // Another binding's UID, name or labels, or another writer: foreign.
        assert!(verify(&legacy(&o), FM, &owner("t5", "chat", "u2")).is_err());
        assert!(verify(&legacy(&o), FM, &owner("t5", "other", "u1")).is_err());
        let mut by_hand = legacy(&o);
        by_hand.metadata.managed_fields = Some(vec![entry(
            "kubectl",
            "Apply",
            LEGACY_BINDING_UID_ANNOTATION,
        )]);
        assert!(verify(&by_hand, FM, &o).is_err());
        // Once migrated, the owner annotation decides (the legacy one no longer counts).
        let mut both = applied(&o);
        both.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(LEGACY_BINDING_UID_ANNOTATION.into(), "u1".into());
        both.metadata.annotations.as_mut().unwrap().insert(
            OWNER_ANNOTATION.into(),
            owner("x", "y", "u9").annotation_value(),
        );
        assert!(verify(&both, FM, &o).is_err());
    }

    #[test]
    fn pruning_keeps_exactly_the_proof() {
        let o = owner("t5", "chat", "u1");
        let obj = applied(&o);
        let mut spire = entry("spire-controller-manager", "Update", "x");
        spire.fields_v1 = Some(FieldsV1(serde_json::json!({"f:status": {}})));
        let pruned =
            prune_managed_fields(Some(vec![spire, entry(FM, "Apply", OWNER_ANNOTATION)])).unwrap();
        assert_eq!(pruned.len(), 1);
        // No room kept for entries that are gone: the record is cached.
        assert_eq!(pruned.capacity(), 1);
        assert_eq!(pruned[0].manager.as_deref(), Some(FM));
        assert_eq!(
            pruned[0].fields_v1.as_ref().unwrap().0,
            serde_json::json!("f:kleym.io/owner")
        );
        let mut cached = obj.clone();
        cached.metadata.managed_fields = Some(pruned);
        assert_eq!(verify(&cached, FM, &o), Ok(Proof::Annotated));
        assert_eq!(prune_managed_fields(None), None);
        assert_eq!(
            prune_managed_fields(Some(vec![entry(FM, "Apply", "kleym.io/other")])),
            None
        );
        // Only server-side applies of the main resource are proof; the rest is dropped.
        assert_eq!(
            prune_managed_fields(Some(vec![entry(FM, "Update", OWNER_ANNOTATION)])),
            None
        );
        let mut status_apply = entry(FM, "Apply", OWNER_ANNOTATION);
        status_apply.subresource = Some("status".into());
        assert_eq!(prune_managed_fields(Some(vec![status_apply])), None);
    }

    #[test]
    fn the_compact_record_proves_only_for_its_manager_and_annotation() {
        let o = owner("t5", "chat", "u1");
        let mut cached = applied(&o);
        cached.metadata.managed_fields =
            prune_managed_fields(Some(vec![entry("kubectl", "Apply", OWNER_ANNOTATION)]));
        assert_eq!(
            cached.metadata.managed_fields.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(verify(&cached, FM, &o).is_err(), "another manager's record");

        let mut legacy_only = applied(&o);
        legacy_only.metadata.managed_fields = prune_managed_fields(Some(vec![entry(
            FM,
            "Apply",
            LEGACY_BINDING_UID_ANNOTATION,
        )]));
        assert!(
            verify(&legacy_only, FM, &o).is_err(),
            "a record of the legacy annotation does not prove the owner annotation"
        );

        // Both proof annotations in one entry give two records, each proving its own.
        let mut both = entry(FM, "Apply", OWNER_ANNOTATION);
        if let Some(FieldsV1(tree)) = both.fields_v1.as_mut() {
            tree["f:metadata"]["f:annotations"][format!("f:{LEGACY_BINDING_UID_ANNOTATION}")] =
                serde_json::json!({});
        }
        let records = prune_managed_fields(Some(vec![both])).unwrap();
        assert_eq!(records.len(), 2);
        let mut cached = applied(&o);
        cached.metadata.managed_fields = Some(records);
        assert_eq!(verify(&cached, FM, &o), Ok(Proof::Annotated));
    }
}
