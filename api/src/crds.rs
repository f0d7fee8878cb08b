//! The CustomResourceDefinitions kleym installs, and their YAML form (`kleym crds`, and the
//! Helm chart copy under `charts/kleym/crds/`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::binding::InferenceIdentityBinding;

/// Errors producing CRD YAML.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD could not be serialized.
    #[error("serializing CRD {name}: {source}")]
    Serialize {
        /// Name of the CRD.
        name: String,
        /// Underlying error.
        #[source]
        source: crate::yaml::EmitError,
    },
}

/// Every CRD kleym owns, in a stable order. Install these rather than the raw
/// `CustomResourceExt::crd()` output, which lacks the post-processing below.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        inference_identity_binding(),
        crate::hub_status::ClusterIdentityStatus::crd(),
        crate::hub_status::FleetIdentityReport::crd(),
        crate::hub_status::ClusterIdentityObservation::crd(),
    ]
}

/// The `InferenceIdentityBinding` CRD, with `nullable` removed from the spec schema so the
/// apiserver prunes `null`s before the CEL rules run.
pub fn inference_identity_binding() -> CustomResourceDefinition {
    let mut crd = InferenceIdentityBinding::crd();
    for version in &mut crd.spec.versions {
        if let Some(spec) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|props| props.get_mut("spec"))
        {
            crate::schema::strip_nullable(spec);
        }
    }
    crd
}

/// File name of a CRD in the chart (`<group>_<plural>.yaml`, the controller-gen convention).
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// One CRD as a YAML document (no leading `---`).
pub fn crd_to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    crate::yaml::to_string(crd).map_err(|source| CrdError::Serialize {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// All CRDs as multi-document YAML, each document starting with `---`.
pub fn to_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&crd_to_yaml(&crd)?);
    }
    Ok(out)
}
