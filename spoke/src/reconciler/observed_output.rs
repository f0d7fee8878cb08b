//! A ClusterSPIFFEID as the reconciler keeps it ([`ObservedOutput`]): what the ownership
//! proof, the up-to-date check, the overlap analysis and the binding's status read of it,
//! and its spec only as a digest.
//!
//! Why not the API object: the cache holds one ClusterSPIFFEID per binding, and most of
//! each was read by nobody. Its spec (about 1 KB with its strings and selectors) is only
//! ever compared with the spec kleym wants, which a digest answers as well; its labels and
//! annotations, two `BTreeMap`s in `ObjectMeta`, took an 11-entry node each (about 560
//! bytes) to hold three labels and one annotation. At 100 spokes × 100 bindings that was
//! about 2.5 KB of heap per ClusterSPIFFEID (heaptrack; docs/benchmarks.md).
//!
//! Objects that are not proven kleym's keep the view the overlap analysis reads
//! ([`ForeignSpiffeId`]), taken from the full spec when the object arrives.
//!
//! `kleym explain` through the hub rebuilds the API object from this form
//! ([`ObservedOutput::with_spec`]): for a foreign object from its view, for kleym's own from
//! the spec the compiler gives its binding, used only when the digest says it is the spec the
//! object has (see [`super::explain_view`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kleym_api::external::spiffeid::{
    ClusterSPIFFEID, ClusterSPIFFEIDSpec, ClusterSPIFFEIDStats, ClusterSPIFFEIDStatus,
};
use kleym_api::label_map::LabelMap;
use kleym_api::labels;
use kube::Resource;
use sha2::{Digest, Sha256};

use super::trim::{CacheForm, strip_unread_metadata};
use crate::compiler::ForeignSpiffeId;
use crate::ownership::{PROOF_ANNOTATIONS, ProofSubject};

/// Whether the cache keeps annotation `key`: only those the ownership proof reads (SPIRE
/// Controller Manager reads no annotation). Objects without them keep no annotation at all.
fn kept_annotation(key: &str) -> bool {
    PROOF_ANNOTATIONS.contains(&key)
}

/// SHA-256 of a ClusterSPIFFEID spec's JSON: equal digests mean equal specs (the JSON of
/// a spec is a function of its value, and differs for different values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecDigest([u8; 32]);

impl SpecDigest {
    /// The digest of `spec`.
    pub fn of(spec: &ClusterSPIFFEIDSpec) -> Self {
        // Serialising strings, booleans and lists into memory cannot fail; an empty body
        // would only make the spec read as changed (one extra apply), never as unchanged.
        let json = serde_json::to_vec(spec).unwrap_or_default();
        Self(Sha256::digest(json).into())
    }
}

/// The values of kleym's own labels ([`kleym_api::labels`]) on a ClusterSPIFFEID: the
/// only labels anything reads of a cached one (the plan's up-to-date check, which restores
/// them, and the ownership proof of objects an earlier kleym wrote ask for these three
/// keys). Kept as three values rather than a label
/// map: the map held each key's text too, about 270 bytes of heap per ClusterSPIFFEID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct KleymLabels {
    managed_by: Option<Box<str>>,
    binding_namespace: Option<Box<str>>,
    binding_name: Option<Box<str>>,
}

impl KleymLabels {
    fn of(labels: std::collections::BTreeMap<String, String>) -> Self {
        let mut kept = Self::default();
        for (key, value) in labels {
            if let Some(slot) = kept.slot(&key) {
                *slot = Some(value.into_boxed_str());
            }
        }
        kept
    }

    fn slot(&mut self, key: &str) -> Option<&mut Option<Box<str>>> {
        match key {
            labels::MANAGED_BY => Some(&mut self.managed_by),
            labels::BINDING_NAMESPACE => Some(&mut self.binding_namespace),
            labels::BINDING_NAME => Some(&mut self.binding_name),
            _ => None,
        }
    }

    /// The label `key`; `None` for any key but kleym's three.
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            labels::MANAGED_BY => self.managed_by.as_deref(),
            labels::BINDING_NAMESPACE => self.binding_namespace.as_deref(),
            labels::BINDING_NAME => self.binding_name.as_deref(),
            _ => None,
        }
    }
}

/// A ClusterSPIFFEID as the reconciler's cache and write overlay keep it (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedOutput {
    /// The object's metadata without labels, annotations (both below) and with
    /// `managedFields` reduced to the ownership record ([`strip_unread_metadata`]).
    metadata: ObjectMeta,
    /// kleym's own labels, the only ones read.
    labels: KleymLabels,
    /// Only the annotations the ownership proof reads ([`kept_annotation`]).
    proof_annotations: LabelMap,
    /// The spec's digest.
    spec_digest: SpecDigest,
    /// The overlap analysis' view, for an object not proven kleym's.
    foreign: Option<Box<ForeignSpiffeId>>,
    /// `status.stats`, as SPIRE Controller Manager reports them.
    stats: Option<ClusterSPIFFEIDStats>,
}

impl ObservedOutput {
    /// `obj` as the cache keeps it. `field_manager` is kleym's: it decides whether `obj`
    /// is proven kleym's, and so whether its overlap view is kept.
    pub fn observe(mut obj: ClusterSPIFFEID, field_manager: &str) -> Self {
        strip_unread_metadata(&mut obj);
        let foreign = ForeignSpiffeId::from_object(&obj, field_manager).map(Box::new);
        let spec_digest = SpecDigest::of(&obj.spec);
        let mut metadata = obj.metadata;
        let labels = KleymLabels::of(metadata.labels.take().unwrap_or_default());
        let proof_annotations = metadata
            .annotations
            .take()
            .into_iter()
            .flatten()
            .filter(|(k, _)| kept_annotation(k))
            .collect();
        Self {
            metadata,
            labels,
            proof_annotations,
            spec_digest,
            foreign,
            stats: obj.status.and_then(|s| s.stats),
        }
    }

    /// Is the spec `spec`?
    pub fn has_spec(&self, spec: &ClusterSPIFFEIDSpec) -> bool {
        self.spec_digest == SpecDigest::of(spec)
    }

    /// The overlap analysis' view of the object, `None` when it is proven kleym's.
    pub fn foreign(&self) -> Option<&ForeignSpiffeId> {
        self.foreign.as_deref()
    }

    /// `status.stats`.
    pub fn stats(&self) -> Option<ClusterSPIFFEIDStats> {
        self.stats
    }

    /// The spec of an object not proven kleym's, from its overlap view: every field SPIRE
    /// Controller Manager reads to select pods and render their entries (template,
    /// selectors, workload selectors, DNS names, class, fallback); the SVID's TTLs,
    /// federation, hint and flags are not kept. `None` for kleym's own objects.
    pub fn foreign_spec(&self) -> Option<ClusterSPIFFEIDSpec> {
        let f = self.foreign.as_deref()?;
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        Some(ClusterSPIFFEIDSpec {
            spiffe_id_template: f.spiffe_id_template.clone(),
            namespace_selector: f.namespace_selector.clone(),
            pod_selector: f.pod_selector.clone(),
            workload_selector_templates: list(&f.workload_selector_templates),
            dns_name_templates: list(&f.dns_name_templates),
            class_name: f.class_name.clone(),
            fallback: f.fallback.then_some(true),
            ..ClusterSPIFFEIDSpec::default()
        })
    }

    /// The API object with spec `spec`: the cached metadata (name, UID, timestamps, the
    /// ownership record of `managedFields`), kleym's labels, the kept annotations and the
    /// stats. Everything the ownership proof and `kleym explain`'s model read of an object
    /// is there, so both answer for it as for the object on the server, given its spec.
    pub fn with_spec(&self, spec: ClusterSPIFFEIDSpec) -> ClusterSPIFFEID {
        let mut metadata = self.metadata.clone();
        let labels: std::collections::BTreeMap<String, String> = [
            labels::MANAGED_BY,
            labels::BINDING_NAMESPACE,
            labels::BINDING_NAME,
        ]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), self.labels.get(k)?.to_string())))
        .collect();
        metadata.labels = (!labels.is_empty()).then_some(labels);
        let annotations: std::collections::BTreeMap<String, String> = self
            .proof_annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        metadata.annotations = (!annotations.is_empty()).then_some(annotations);
        ClusterSPIFFEID {
            metadata,
            spec,
            status: self
                .stats
                .map(|stats| ClusterSPIFFEIDStatus { stats: Some(stats) }),
        }
    }
}

impl ProofSubject for ObservedOutput {
    fn object_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn object_uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.proof_annotations.get(key)
    }

    fn managed_fields(&self) -> &[ManagedFieldsEntry] {
        self.metadata.managed_fields.as_deref().unwrap_or_default()
    }
}

impl CacheForm for ClusterSPIFFEID {
    type Cached = ObservedOutput;

    fn into_cached(self, field_manager: &str) -> ObservedOutput {
        ObservedOutput::observe(self, field_manager)
    }
}

impl Resource for ObservedOutput {
    type DynamicType = ();
    type Scope = <ClusterSPIFFEID as Resource>::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        ClusterSPIFFEID::kind(dt)
    }

    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        ClusterSPIFFEID::group(dt)
    }

    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        ClusterSPIFFEID::version(dt)
    }

    fn api_version(dt: &()) -> std::borrow::Cow<'_, str> {
        ClusterSPIFFEID::api_version(dt)
    }

    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        ClusterSPIFFEID::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::{self, OWNER_ANNOTATION, Owner};
    use kleym_api::external::spiffeid::LabelSelector;

    const FM: &str = "kleym";

    fn owner() -> Owner {
        Owner {
            namespace: "ns".into(),
            name: "b".into(),
            uid: "u-b".into(),
        }
    }

    /// A ClusterSPIFFEID as an API server returns it after kleym applied it for `owner`,
    /// decoded from text as a watch event is.
    fn applied(o: &Owner, manager: &str) -> ClusterSPIFFEID {
        let labels: serde_json::Map<String, serde_json::Value> =
            crate::compiler::output::output_labels(&o.namespace, &o.name)
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
                .collect();
        let text = serde_json::json!({
            "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
            "metadata": {
                "name": o.object_name(), "uid": "u-c", "resourceVersion": "7", "generation": 2,
                "labels": labels,
                "annotations": {
                    OWNER_ANNOTATION: o.annotation_value(),
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "example.com/other": "x"
                },
                "managedFields": [{
                    "manager": manager, "operation": "Apply",
                    "apiVersion": "spire.spiffe.io/v1alpha1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {
                        format!("f:{OWNER_ANNOTATION}"): {}
                    }}, "f:spec": {"f:spiffeIDTemplate": {}}}
                }]
            },
            "spec": {
                "spiffeIDTemplate": "spiffe://td/ns/ns/sa/s",
                "podSelector": {"matchLabels": {"app": "a"}},
                "workloadSelectorTemplates": ["k8s:ns:ns", "k8s:sa:s"]
            },
            "status": {"stats": {"namespacesSelected": 1, "podsSelected": 3}}
        });
        serde_json::from_str(&text.to_string()).unwrap()
    }

    #[test]
    fn keeps_what_the_proof_reads_and_the_spec_as_a_digest() {
        let full = applied(&owner(), FM);
        let observed = ObservedOutput::observe(full.clone(), FM);
        // Proven the same way as the API object.
        assert_eq!(
            ownership::verify(&observed, FM, &owner()),
            ownership::verify(&full, FM, &owner())
        );
        assert!(ownership::verify(&observed, FM, &owner()).is_ok());
        assert_eq!(ownership::proven_owner(&observed, FM), Ok(owner()));
        // kleym's own: no overlap view.
        assert!(observed.foreign().is_none());
        // The spec is recognised, and any change of it is seen.
        assert!(observed.has_spec(&full.spec));
        let mut changed = full.spec.clone();
        changed.pod_selector = Some(LabelSelector {
            match_labels: Some([("app", "b")].into_iter().collect()),
            match_expressions: None,
        });
        assert!(!observed.has_spec(&changed));
        let mut fallback = full.spec.clone();
        fallback.fallback = Some(false);
        assert!(!observed.has_spec(&fallback), "unset and false differ");
        // Metadata the reconciler reads stays; the rest is gone.
        assert_eq!(observed.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(observed.meta().generation, Some(2));
        assert!(observed.meta().labels.is_none());
        assert!(observed.meta().annotations.is_none());
        assert_eq!(observed.annotation("example.com/other"), None);
        assert_eq!(
            observed.annotation(OWNER_ANNOTATION),
            Some(owner().annotation_value().as_str())
        );
        assert_eq!(observed.stats().map(|s| s.pods_selected), Some(3));
    }

    #[test]
    fn keeps_the_values_of_kleyms_labels_and_no_other_label() {
        let mut full = applied(&owner(), FM);
        let labels = full.metadata.labels.get_or_insert_default();
        labels.insert("example.com/team".into(), "a".into());
        let observed = ObservedOutput::observe(full.clone(), FM);
        for key in [
            labels::MANAGED_BY,
            labels::BINDING_NAMESPACE,
            labels::BINDING_NAME,
        ] {
            assert_eq!(observed.label(key), full.label(key), "{key}");
            assert!(observed.label(key).is_some(), "{key}");
        }
        assert_eq!(observed.label("example.com/team"), None);

        // A changed value of kleym's label is seen as it is, as is a missing one.
        let mut tampered = full.clone();
        let labels = tampered.metadata.labels.get_or_insert_default();
        labels.insert(labels::BINDING_NAME.into(), "other".into());
        labels.remove(labels::MANAGED_BY);
        let observed = ObservedOutput::observe(tampered, FM);
        assert_eq!(observed.label(labels::BINDING_NAME), Some("other"));
        assert_eq!(observed.label(labels::MANAGED_BY), None);
        // Labels are output, not proof: the object is still kleym's (the next apply puts
        // the labels back), and so has no overlap view.
        assert!(ownership::verify(&observed, FM, &owner()).is_ok());
        assert!(observed.foreign().is_none());
    }

    #[test]
    fn an_object_not_proven_keeps_its_overlap_view() {
        // The same object, but the annotation was applied by another manager: a forgery
        // must stay visible to the overlap analysis.
        let forged = applied(&owner(), "someone-else");
        let observed = ObservedOutput::observe(forged.clone(), FM);
        assert!(ownership::proven_owner(&observed, FM).is_err());
        let view = observed.foreign().expect("overlap view kept");
        assert_eq!(
            Some(view),
            ForeignSpiffeId::from_object(&forged, FM).as_ref()
        );
        assert_eq!(view.workload_selector_templates, ["k8s:ns:ns", "k8s:sa:s"]);
    }

    #[test]
    fn rebuilt_objects_answer_as_the_originals() {
        use crate::explain::{ManagerConfig, PodInputs, Precedence, explain_pod, ownership_of};
        use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

        // kleym's own object: the spec comes from elsewhere, the rest from the cache.
        let full = applied(&owner(), FM);
        let observed = ObservedOutput::observe(full.clone(), FM);
        assert_eq!(observed.foreign_spec(), None);
        let rebuilt = observed.with_spec(full.spec.clone());
        assert_eq!(ownership_of(&rebuilt, FM), ownership_of(&full, FM));
        assert_eq!(Precedence::of(&rebuilt), Precedence::of(&full));

        // A forged one (not proven kleym's), with DNS names, a class and a
        // creation time: rebuilt from its cached view alone.
        let mut forged = applied(&owner(), "someone-else");
        forged.metadata.name = Some("a-forged".into());
        forged.metadata.uid = Some("u-forged".into());
        forged.metadata.creation_timestamp =
            serde_json::from_value(serde_json::json!("2026-01-02T03:04:05Z")).unwrap();
        forged.spec.dns_name_templates = Some(vec!["{{ .PodMeta.Name }}.example".into()]);
        forged.spec.class_name = Some("c".into());
        let observed = ObservedOutput::observe(forged.clone(), FM);
        let rebuilt = observed.with_spec(observed.foreign_spec().expect("a foreign view"));
        assert!(matches!(
            ownership_of(&rebuilt, FM),
            crate::explain::Ownership::Claimed { .. }
        ));
        assert_eq!(ownership_of(&rebuilt, FM), ownership_of(&forged, FM));
        assert_eq!(Precedence::of(&rebuilt), Precedence::of(&forged));

        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-p", "labels": {"app": "a"}},
            "spec": {"nodeName": "n", "serviceAccountName": "s",
                "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "ns"}})).unwrap();
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n", "uid": "u-n"}}))
                .unwrap();
        let config = ManagerConfig {
            trust_domain: "td".into(),
            cluster_name: "k".into(),
            cluster_domain: "cluster.local".into(),
            class_name: "c".into(),
            watch_classless: true,
            ignore_namespaces: Vec::new(),
            parent_id_template: String::new(),
        };
        let inputs = PodInputs {
            pod: &pod,
            namespace: &namespace,
            node: Some(&node),
        };
        let original = explain_pod(inputs, &[forged, full.clone()], &config, FM).unwrap();
        let from_cache = explain_pod(inputs, &[rebuilt, full], &config, FM).unwrap();
        assert_eq!(from_cache, original);
        let forged = &original.candidates[0];
        assert_eq!(forged.name, "a-forged", "{forged:?}");
        assert_eq!(
            forged.entry.as_ref().map(|e| e.dns_names.clone()),
            Some(vec!["p.example".to_string()])
        );
    }
}
