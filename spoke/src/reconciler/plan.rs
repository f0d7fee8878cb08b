//! The pure "what must be written" decision for a binding's ClusterSPIFFEID, from the
//! desired output and the cached object at the binding's name. A binding whose output is
//! already in place plans [`OutputAction::None`]: nothing is sent to the apiserver.
//!
//! Ownership: the object at the name the compiler gives the binding is acted on only when
//! [`ownership::verify`] proves it is this binding's output. The binding's status is never
//! read here: it is kleym's output, writable by the binding's tenant, so a name or UID it
//! records proves nothing (see [`crate::ownership`]). An object at another name is never
//! considered at all, whatever the status says.

use std::collections::BTreeMap;

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{ComputedSpiffeId, ConflictPeer, IdentityWarning, OwnedClusterSpiffeId};
use kube::ResourceExt;

use super::api_availability::ApiKind;
use super::evaluation::BindingDecision;
pub use super::evaluation::DesiredOutput;
use super::observed_output::ObservedOutput;
use crate::compiler::{Reason, Refusal};
use crate::ownership::{self, Foreign, OWNER_ANNOTATION, Owner, Proof, ProofSubject};

/// The decision for the ClusterSPIFFEID.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputAction {
    /// Nothing to write.
    None,
    /// Server-side apply the desired object; `uid` is `Some` to update the object we own
    /// (sent as a precondition), `None` to create.
    Apply {
        /// UID precondition of the object being updated.
        uid: Option<String>,
    },
    /// An object that is not proven to be ours holds the desired name: refuse, touch
    /// nothing.
    Foreign(Foreign),
}

/// The full plan: the action on the desired object, plus our object to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputPlan {
    /// Action on the desired object (None when no output is desired).
    pub action: OutputAction,
    /// Our object, no longer wanted (withdrawn output): delete with a UID precondition.
    pub delete: Option<OwnedClusterSpiffeId>,
    /// The ownership record after the plan succeeds (before an apply that creates, the
    /// UID is unknown: the apply result supplies it).
    pub owned_after: Option<OwnedClusterSpiffeId>,
}

/// Does the cached object already match the desired output (our labels, our owner
/// annotation, the spec)?
pub fn is_up_to_date(obj: &ObservedOutput, desired: &DesiredOutput, owner: &Owner) -> bool {
    let labels_ok = desired.labels.iter().all(|(k, v)| obj.label(k) == Some(v));
    let annotation_ok = obj.annotation(OWNER_ANNOTATION) == Some(owner.annotation_value().as_str());
    labels_ok && annotation_ok && obj.has_spec(&desired.spec)
}

/// Decides what to write. `existing` is the cached object at the name the compiler gives
/// the binding (`owner.object_name()`, which is also `desired.name`); `field_manager` is
/// kleym's.
pub fn plan_output(
    desired: Option<&DesiredOutput>,
    existing: Option<&ObservedOutput>,
    owner: &Owner,
    field_manager: &str,
) -> OutputPlan {
    let proven = existing.map(|obj| {
        ownership::verify(obj, field_manager, owner).map(|proof| {
            let owned = OwnedClusterSpiffeId {
                name: obj.name_any(),
                uid: obj.uid().unwrap_or_default(),
            };
            (obj, owned, proof)
        })
    });
    match (desired, proven) {
        (None, Some(Ok((_, owned, _)))) => OutputPlan {
            action: OutputAction::None,
            delete: Some(owned),
            owned_after: None,
        },
        // Nothing wanted and nothing of ours: a foreign object is left alone.
        (None, _) => OutputPlan {
            action: OutputAction::None,
            delete: None,
            owned_after: None,
        },
        (Some(_), None) => OutputPlan {
            action: OutputAction::Apply { uid: None },
            delete: None,
            owned_after: None,
        },
        (Some(_), Some(Err(foreign))) => OutputPlan {
            action: OutputAction::Foreign(foreign),
            delete: None,
            owned_after: None,
        },
        (Some(d), Some(Ok((obj, owned, proof)))) => {
            // A legacy object is re-applied: that adds the owner annotation.
            let action = if proof == Proof::Annotated && is_up_to_date(obj, d, owner) {
                OutputAction::None
            } else {
                OutputAction::Apply {
                    uid: Some(owned.uid.clone()),
                }
            };
            OutputPlan {
                action,
                delete: None,
                owned_after: Some(owned),
            }
        }
    }
}

/// The object to server-side apply for `desired`, owned by `owner`.
pub fn apply_object(
    desired: &DesiredOutput,
    owner: &Owner,
    uid_precondition: Option<&str>,
) -> ClusterSPIFFEID {
    let mut obj = ClusterSPIFFEID::new(&desired.name, desired.spec.clone());
    obj.metadata.labels = Some(desired.labels.to_btree_map());
    // The legacy UID annotation is not in the applied configuration any more: applying
    // without it removes it from objects that still carry it (kleym was its only manager).
    obj.metadata.annotations = Some(BTreeMap::from([(
        OWNER_ANNOTATION.to_string(),
        owner.annotation_value(),
    )]));
    // A UID in an apply body is a precondition: the apiserver refuses the write (409)
    // if the object was replaced by another incarnation since we read it.
    obj.metadata.uid = uid_precondition.map(str::to_string);
    obj
}

/// Everything one reconcile of a binding will do and show, decided before any write.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingPlan {
    /// The refusal the status shows: the compiler's, or the cluster's (CRD not served, a
    /// foreign object holds the name).
    pub refusal: Option<Refusal>,
    /// Our object, no longer wanted: delete it with a UID precondition.
    pub delete: Option<OwnedClusterSpiffeId>,
    /// The ClusterSPIFFEID to server-side apply, if it differs from the cluster's.
    pub write: Option<OutputWrite>,
    /// The ownership record if every write succeeds (a create learns its UID from the
    /// apply).
    pub owned: Option<OwnedClusterSpiffeId>,
    /// Computed SPIFFE IDs (status).
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// Rendered selectors (status).
    pub rendered_selectors: Vec<String>,
    /// Conflict peers (status).
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings (status).
    pub warnings: Vec<IdentityWarning>,
    /// What the status recorded when it names another object than this binding's output:
    /// reported, never acted on.
    pub ignored_record: Option<OwnedClusterSpiffeId>,
}

/// A ClusterSPIFFEID server-side apply.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputWrite {
    /// The applied configuration.
    pub object: ClusterSPIFFEID,
    /// True when no object of ours exists yet: the apply must not take over fields of an
    /// object that appeared meanwhile (no force), and a conflict means the name is taken.
    pub creates: bool,
}

/// Plans one binding from its verdict. `existing` is the object at the binding's output
/// name as last known (ignored when ClusterSPIFFEIDs are not served); `recorded` is what
/// the binding's status records, only compared with the output name (see
/// [`crate::ownership`]).
pub fn plan_binding(
    verdict: BindingDecision,
    owner: &Owner,
    cluster_spiffe_ids_served: bool,
    existing: Option<&ObservedOutput>,
    recorded: Option<OwnedClusterSpiffeId>,
    field_manager: &str,
) -> BindingPlan {
    // Owned: its parts move into the plan instead of being cloned.
    let BindingDecision {
        output: desired,
        mut refusal,
        computed_spiffe_ids,
        rendered_selectors,
        conflict_peers,
        warnings,
    } = verdict;
    // The only object this binding can own: the name the compiler gives it (`desired.name`
    // is the same name).
    let output_name = owner.object_name();
    let mut delete = None;
    let mut write = None;
    let mut owned = None;
    if !cluster_spiffe_ids_served {
        if desired.is_some() {
            refusal = Some(Refusal::new(
                Reason::ClusterSPIFFEIDCRDMissing,
                format!(
                    "the ClusterSPIFFEID CRD ({}) is not served by this cluster; install SPIRE Controller Manager",
                    ApiKind::ClusterSpiffeIds.crd_name()
                ),
            ));
        }
    } else {
        let output = plan_output(desired.as_deref(), existing, owner, field_manager);
        owned = output.owned_after;
        delete = output.delete;
        match (output.action, &desired) {
            (OutputAction::Foreign(foreign), Some(_)) => {
                refusal = Some(name_taken(&foreign));
                owned = None;
            }
            (OutputAction::Apply { uid }, Some(d)) => {
                write = Some(OutputWrite {
                    object: apply_object(d, owner, uid.as_deref()),
                    creates: uid.is_none(),
                });
            }
            _ => {}
        }
    }
    BindingPlan {
        refusal,
        delete,
        write,
        owned,
        computed_spiffe_ids,
        rendered_selectors,
        conflict_peers,
        warnings,
        ignored_record: recorded.filter(|r| r.name != output_name),
    }
}

/// The refusal when a ClusterSPIFFEID not proven to be the binding's holds its name.
pub fn name_taken(foreign: &Foreign) -> Refusal {
    Refusal::new(
        Reason::ForeignObjectHoldsName,
        format!(
            "ClusterSPIFFEID {} already exists and is not proven to be this binding's output ({}); kleym never modifies or deletes it: remove or rename it",
            foreign.object, foreign.why
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::output::output_labels;
    use crate::ownership::LEGACY_BINDING_UID_ANNOTATION;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use kleym_api::external::spiffeid::ClusterSPIFFEIDSpec;

    const FM: &str = "kleym";

    fn owner() -> Owner {
        Owner {
            namespace: "a".into(),
            name: "b".into(),
            uid: "binding-uid".into(),
        }
    }

    fn desired(id: &str) -> DesiredOutput {
        let o = owner();
        DesiredOutput {
            name: o.object_name(),
            spec: ClusterSPIFFEIDSpec {
                spiffe_id_template: id.into(),
                fallback: Some(false),
                ..Default::default()
            },
            labels: output_labels(&o.namespace, &o.name),
        }
    }

    fn applied_by(obj: &mut ClusterSPIFFEID, manager: &str, annotation: &str) {
        obj.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": {"f:annotations": {format!("f:{annotation}"): {}}}
            }))),
            ..Default::default()
        }]);
    }

    /// `obj` as the cache keeps it.
    fn observed(obj: ClusterSPIFFEID) -> ObservedOutput {
        ObservedOutput::observe(obj, FM)
    }

    /// Our object as kleym applied it for `o`, with `uid`.
    fn live(d: &DesiredOutput, o: &Owner, uid: &str) -> ClusterSPIFFEID {
        let mut obj = apply_object(d, o, None);
        obj.metadata.uid = Some(uid.into());
        applied_by(&mut obj, FM, OWNER_ANNOTATION);
        obj
    }

    fn owned(uid: &str) -> OwnedClusterSpiffeId {
        OwnedClusterSpiffeId {
            name: owner().object_name(),
            uid: uid.into(),
        }
    }

    fn verdict(output: Option<DesiredOutput>) -> BindingDecision {
        BindingDecision {
            output: output.map(Box::new),
            refusal: None,
            computed_spiffe_ids: Vec::new(),
            rendered_selectors: Vec::new(),
            conflict_peers: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn binding_plan_refuses_when_cluster_spiffe_ids_are_not_served() {
        let d = desired("spiffe://td/ns/a/o");
        let plan = plan_binding(verdict(Some(d)), &owner(), false, None, None, FM);
        assert_eq!(
            plan.refusal.map(|r| r.reason),
            Some(Reason::ClusterSPIFFEIDCRDMissing)
        );
        assert_eq!((plan.write, plan.delete, plan.owned), (None, None, None));
    }

    #[test]
    fn binding_plan_creates_without_force_and_reports_a_foreign_record() {
        let d = desired("spiffe://td/ns/a/o");
        let record = OwnedClusterSpiffeId {
            name: "someone-elses".into(),
            uid: "x".into(),
        };
        let plan = plan_binding(
            verdict(Some(d.clone())),
            &owner(),
            true,
            None,
            Some(record.clone()),
            FM,
        );
        assert_eq!(plan.refusal, None);
        assert_eq!(
            plan.write,
            Some(OutputWrite {
                object: apply_object(&d, &owner(), None),
                creates: true,
            })
        );
        assert_eq!(plan.ignored_record, Some(record));
        // Our own name in the status is no news.
        let plan = plan_binding(verdict(Some(d)), &owner(), true, None, Some(owned("u")), FM);
        assert_eq!(plan.ignored_record, None);
    }

    #[test]
    fn binding_plan_refuses_a_name_held_by_a_foreign_object() {
        let d = desired("spiffe://td/ns/a/o");
        let mut foreign = apply_object(&d, &owner(), None);
        foreign.metadata.uid = Some("f".into());
        applied_by(&mut foreign, "someone-else", OWNER_ANNOTATION);
        let foreign = observed(foreign);
        let plan = plan_binding(verdict(Some(d)), &owner(), true, Some(&foreign), None, FM);
        assert_eq!(
            plan.refusal.map(|r| r.reason),
            Some(Reason::ForeignObjectHoldsName)
        );
        assert_eq!((plan.write, plan.owned), (None, None));
    }

    #[test]
    fn absent_output_is_created() {
        let d = desired("spiffe://td/ns/a/o");
        let plan = plan_output(Some(&d), None, &owner(), FM);
        assert_eq!(plan.action, OutputAction::Apply { uid: None });
        assert_eq!(plan.delete, None);
    }

    #[test]
    fn unchanged_owned_output_writes_nothing() {
        let d = desired("spiffe://td/ns/a/o");
        let obj = observed(live(&d, &owner(), "u1"));
        let plan = plan_output(Some(&d), Some(&obj), &owner(), FM);
        assert_eq!(plan.action, OutputAction::None);
        assert_eq!(plan.delete, None);
        assert_eq!(plan.owned_after, Some(owned("u1")));
    }

    #[test]
    fn drifted_owned_output_is_applied_with_uid_precondition() {
        let d = desired("spiffe://td/ns/a/o");
        let mut obj = live(&d, &owner(), "u1");
        obj.spec.fallback = Some(true);
        let obj = observed(obj);
        let plan = plan_output(Some(&d), Some(&obj), &owner(), FM);
        assert_eq!(
            plan.action,
            OutputAction::Apply {
                uid: Some("u1".into())
            }
        );
    }

    #[test]
    fn owned_output_with_edited_labels_is_applied_back() {
        let d = desired("spiffe://td/ns/a/o");
        for edit in [
            |l: &mut BTreeMap<String, String>| {
                l.insert(kleym_api::labels::BINDING_NAME.into(), "other".into());
            },
            |l: &mut BTreeMap<String, String>| {
                l.remove(kleym_api::labels::MANAGED_BY);
            },
            |l: &mut BTreeMap<String, String>| l.clear(),
        ] {
            let mut obj = live(&d, &owner(), "u1");
            edit(obj.metadata.labels.get_or_insert_default());
            let plan = plan_binding(
                verdict(Some(d.clone())),
                &owner(),
                true,
                Some(&observed(obj)),
                None,
                FM,
            );
            assert_eq!(plan.refusal, None);
            assert_eq!(plan.owned, Some(owned("u1")));
            let write = plan.write.expect("the labels are applied back");
            assert!(!write.creates);
            assert_eq!(write.object.metadata.uid.as_deref(), Some("u1"));
            assert_eq!(
                write.object.metadata.labels,
                Some(d.labels.to_btree_map()),
                "kleym's labels, all three"
            );
        }
    }

    #[test]
    fn unproven_objects_at_our_name_are_foreign_and_untouched() {
        let d = desired("spiffe://td/ns/a/o");
        // Our labels but no owner annotation (labels can be copied by anyone).
        let mut labelled = live(&d, &owner(), "u1");
        labelled.metadata.annotations = None;
        // Our annotation, but applied by another field manager.
        let mut other_manager = live(&d, &owner(), "u1");
        applied_by(&mut other_manager, "kubectl", OWNER_ANNOTATION);
        // The output of a binding re-created under the same name (another UID).
        let previous = Owner {
            uid: "old-binding-uid".into(),
            ..owner()
        };
        let previous_incarnation = live(&d, &previous, "u1");
        for obj in [labelled, other_manager, previous_incarnation].map(observed) {
            let plan = plan_output(Some(&d), Some(&obj), &owner(), FM);
            assert!(
                matches!(&plan.action, OutputAction::Foreign(f) if f.object == d.name),
                "{plan:?}"
            );
            assert_eq!(plan.delete, None, "a foreign object is never deleted");
            assert_eq!(plan.owned_after, None);
            let withdrawn = plan_output(None, Some(&obj), &owner(), FM);
            assert_eq!(withdrawn.action, OutputAction::None);
            assert_eq!(withdrawn.delete, None, "a foreign object is never deleted");
        }
    }

    #[test]
    fn legacy_output_is_adopted_and_reapplied_with_the_owner_annotation() {
        let d = desired("spiffe://td/ns/a/o");
        let mut obj = live(&d, &owner(), "u1");
        obj.metadata.annotations = Some(BTreeMap::from([(
            LEGACY_BINDING_UID_ANNOTATION.to_string(),
            owner().uid,
        )]));
        applied_by(&mut obj, FM, LEGACY_BINDING_UID_ANNOTATION);
        let obj = observed(obj);
        let plan = plan_output(Some(&d), Some(&obj), &owner(), FM);
        assert_eq!(
            plan.action,
            OutputAction::Apply {
                uid: Some("u1".into())
            }
        );
        assert_eq!(plan.owned_after, Some(owned("u1")));
        let body = apply_object(&d, &owner(), Some("u1"));
        let annotations = body.metadata.annotations.unwrap();
        assert_eq!(
            annotations.get(OWNER_ANNOTATION),
            Some(&"a/b/binding-uid".to_string())
        );
        assert!(!annotations.contains_key(LEGACY_BINDING_UID_ANNOTATION));
    }

    #[test]
    fn withdrawn_output_deletes_only_our_proven_object() {
        let d = desired("spiffe://td/ns/a/o");
        let obj = observed(live(&d, &owner(), "u1"));
        let plan = plan_output(None, Some(&obj), &owner(), FM);
        assert_eq!(plan.delete, Some(owned("u1")));
        assert_eq!(plan_output(None, None, &owner(), FM).delete, None);
    }
}
