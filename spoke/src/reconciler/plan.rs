//! The pure "what must be written" decision for a binding's ClusterSPIFFEID, from the
//! desired output and the cached objects. A binding whose output is already in place
//! plans [`OutputAction::None`]: nothing is sent to the apiserver.
//!
//! Ownership: the cached object with our name is ours only if its UID is the one recorded
//! in the binding's status, or (crash recovery: the object was created but the status
//! write never happened) the object carries the [`OWNER_UID_ANNOTATION`] with this
//! binding's UID. Anything else is foreign and is never
//! modified or deleted. (Copying a binding's UID into an annotation requires write access
//! to ClusterSPIFFEIDs, i.e. the power to register identities anyway.)

use std::collections::BTreeMap;

use kleym_api::OwnedClusterSpiffeId;
use kleym_api::external::spiffeid::{ClusterSPIFFEID, ClusterSPIFFEIDSpec};
use kube::ResourceExt;

/// Annotation recording the UID of the binding that created a ClusterSPIFFEID.
pub const OWNER_UID_ANNOTATION: &str = "kleym.io/binding-uid";

/// What the binding's ClusterSPIFFEID should be.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredOutput {
    /// Deterministic object name.
    pub name: String,
    /// The spec.
    pub spec: ClusterSPIFFEIDSpec,
    /// Labels kleym sets (`kleym.io/managed-by`, binding namespace and name).
    pub labels: BTreeMap<String, String>,
}

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
    /// An object we do not own holds the desired name: refuse, touch nothing.
    Foreign,
}

/// The full plan: the action on the desired object, plus objects of ours to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputPlan {
    /// Action on the desired object (None when no output is desired).
    pub action: OutputAction,
    /// Our objects no longer wanted (withdrawn output, or renamed): delete with a UID
    /// precondition.
    pub delete: Vec<OwnedClusterSpiffeId>,
    /// The ownership record after the plan succeeds (before an apply that creates, the
    /// UID is unknown: the apply result supplies it).
    pub owned_after: Option<OwnedClusterSpiffeId>,
}

/// Is `obj` ours, given the recorded ownership and the binding UID?
pub fn is_ours(
    obj: &ClusterSPIFFEID,
    recorded: Option<&OwnedClusterSpiffeId>,
    binding_uid: Option<&str>,
) -> bool {
    let Some(uid) = obj.metadata.uid.as_deref() else {
        return false;
    };
    let by_record = recorded.is_some_and(|rec| rec.name == obj.name_any() && rec.uid == uid);
    // Crash recovery: created by us (apply succeeded) but the status write never happened.
    let by_annotation = binding_uid.is_some()
        && obj
            .annotations()
            .get(OWNER_UID_ANNOTATION)
            .map(String::as_str)
            == binding_uid;
    by_record || by_annotation
}

/// Does the cached object already match the desired output?
pub fn is_up_to_date(
    obj: &ClusterSPIFFEID,
    desired: &DesiredOutput,
    binding_uid: Option<&str>,
) -> bool {
    let labels = obj.labels();
    let labels_ok = desired.labels.iter().all(|(k, v)| labels.get(k) == Some(v));
    let annotation_ok = match binding_uid {
        Some(uid) => {
            obj.annotations()
                .get(OWNER_UID_ANNOTATION)
                .map(String::as_str)
                == Some(uid)
        }
        None => true,
    };
    labels_ok && annotation_ok && obj.spec == desired.spec
}

/// Decides what to write. `lookup` reads the ClusterSPIFFEID cache by name.
pub fn plan_output<'a>(
    desired: Option<&DesiredOutput>,
    recorded: Option<&OwnedClusterSpiffeId>,
    binding_uid: Option<&str>,
    lookup: impl Fn(&str) -> Option<&'a ClusterSPIFFEID>,
) -> OutputPlan {
    let mut delete = Vec::new();
    // Our recorded object, if it still exists under the recorded UID.
    let recorded_live = recorded.and_then(|rec| {
        lookup(&rec.name)
            .filter(|o| o.metadata.uid.as_deref() == Some(rec.uid.as_str()))
            .map(|_| rec.clone())
    });
    let Some(d) = desired else {
        delete.extend(recorded_live);
        return OutputPlan {
            action: OutputAction::None,
            delete,
            owned_after: None,
        };
    };
    if let Some(live) = &recorded_live
        && live.name != d.name
    {
        delete.push(live.clone());
    }
    let recorded_for_name = recorded.filter(|r| r.name == d.name);
    match lookup(&d.name) {
        None => OutputPlan {
            action: OutputAction::Apply { uid: None },
            delete,
            owned_after: None,
        },
        Some(obj) => {
            if !is_ours(obj, recorded_for_name, binding_uid) {
                return OutputPlan {
                    action: OutputAction::Foreign,
                    delete,
                    owned_after: None,
                };
            }
            let owned = OwnedClusterSpiffeId {
                name: d.name.clone(),
                uid: obj.metadata.uid.clone().unwrap_or_default(),
            };
            let action = if is_up_to_date(obj, d, binding_uid) {
                OutputAction::None
            } else {
                OutputAction::Apply {
                    uid: Some(owned.uid.clone()),
                }
            };
            OutputPlan {
                action,
                delete,
                owned_after: Some(owned),
            }
        }
    }
}

/// The object to server-side apply for `desired`.
pub fn apply_object(
    desired: &DesiredOutput,
    binding_uid: Option<&str>,
    uid_precondition: Option<&str>,
) -> ClusterSPIFFEID {
    let mut obj = ClusterSPIFFEID::new(&desired.name, desired.spec.clone());
    obj.metadata.labels = Some(desired.labels.clone());
    if let Some(uid) = binding_uid {
        obj.metadata.annotations = Some(BTreeMap::from([(
            OWNER_UID_ANNOTATION.to_string(),
            uid.to_string(),
        )]));
    }
    // A UID in an apply body is a precondition: the apiserver refuses the write (409)
    // if the object was replaced by another incarnation since we read it.
    obj.metadata.uid = uid_precondition.map(str::to_string);
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(name: &str, id: &str) -> DesiredOutput {
        DesiredOutput {
            name: name.into(),
            spec: ClusterSPIFFEIDSpec {
                spiffe_id_template: id.into(),
                fallback: Some(false),
                ..Default::default()
            },
            labels: BTreeMap::from([("kleym.io/managed-by".into(), "kleym".into())]),
        }
    }

    fn live(d: &DesiredOutput, uid: &str, binding_uid: Option<&str>) -> ClusterSPIFFEID {
        let mut o = apply_object(d, binding_uid, None);
        o.metadata.uid = Some(uid.into());
        o
    }

    fn owned(name: &str, uid: &str) -> OwnedClusterSpiffeId {
        OwnedClusterSpiffeId {
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn absent_output_is_created() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let plan = plan_output(Some(&d), None, Some("b"), |_| None);
        assert_eq!(plan.action, OutputAction::Apply { uid: None });
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn unchanged_owned_output_writes_nothing() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let obj = live(&d, "u1", Some("b"));
        let rec = owned("x", "u1");
        let plan = plan_output(Some(&d), Some(&rec), Some("b"), |n| {
            (n == "x").then_some(&obj)
        });
        assert_eq!(plan.action, OutputAction::None);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.owned_after, Some(rec));
    }

    #[test]
    fn drifted_owned_output_is_applied_with_uid_precondition() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let mut obj = live(&d, "u1", Some("b"));
        obj.spec.fallback = Some(true);
        let rec = owned("x", "u1");
        let plan = plan_output(Some(&d), Some(&rec), Some("b"), |n| {
            (n == "x").then_some(&obj)
        });
        assert_eq!(
            plan.action,
            OutputAction::Apply {
                uid: Some("u1".into())
            }
        );
    }

    #[test]
    fn same_name_object_with_other_uid_is_foreign_and_untouched() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let obj = live(&d, "other", None);
        for rec in [None, Some(owned("x", "u1"))] {
            let plan = plan_output(Some(&d), rec.as_ref(), Some("b"), |n| {
                (n == "x").then_some(&obj)
            });
            assert_eq!(plan.action, OutputAction::Foreign);
            assert!(plan.delete.is_empty(), "a foreign object is never deleted");
        }
    }

    #[test]
    fn annotation_adopts_only_without_a_record_and_with_our_binding_uid() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let obj = live(&d, "u9", Some("b"));
        let plan = plan_output(Some(&d), None, Some("b"), |n| (n == "x").then_some(&obj));
        assert_eq!(plan.owned_after, Some(owned("x", "u9")));
        assert_eq!(plan.action, OutputAction::None);
        let other_binding = plan_output(Some(&d), None, Some("c"), |n| (n == "x").then_some(&obj));
        assert_eq!(other_binding.action, OutputAction::Foreign);
    }

    #[test]
    fn withdrawn_output_deletes_only_the_recorded_incarnation() {
        let d = desired("x", "spiffe://td/ns/a/o");
        let obj = live(&d, "u1", Some("b"));
        let rec = owned("x", "u1");
        let plan = plan_output(None, Some(&rec), Some("b"), |n| (n == "x").then_some(&obj));
        assert_eq!(plan.delete, vec![rec.clone()]);
        let replaced = live(&d, "u2", Some("b"));
        let plan = plan_output(None, Some(&rec), Some("b"), |n| {
            (n == "x").then_some(&replaced)
        });
        assert!(plan.delete.is_empty(), "another incarnation is not ours");
    }

    #[test]
    fn renamed_output_deletes_the_old_and_creates_the_new() {
        let old = desired("x", "spiffe://td/ns/a/o");
        let obj = live(&old, "u1", Some("b"));
        let rec = owned("x", "u1");
        let new = desired("y", "spiffe://td/ns/a/p");
        let plan = plan_output(Some(&new), Some(&rec), Some("b"), |n| {
            (n == "x").then_some(&obj)
        });
        assert_eq!(plan.action, OutputAction::Apply { uid: None });
        assert_eq!(plan.delete, vec![rec]);
    }
}
