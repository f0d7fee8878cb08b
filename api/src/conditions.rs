//! Condition types carried by every `InferenceIdentityBinding` status.
//!
//! All five are always present (each with `observedGeneration`), so `kubectl wait` and
//! dashboards never have to distinguish "absent" from "False".

/// `Ready`: True when the binding's ClusterSPIFFEID is applied and no refusal holds.
pub const READY: &str = "Ready";
/// `Conflict`: True when the binding collides with another binding (reason
/// `IdentityCollision` or `DuplicateSPIFFEID`).
pub const CONFLICT: &str = "Conflict";
/// `InvalidRef`: True when the target objective/model or its pool cannot be resolved.
pub const INVALID_REF: &str = "InvalidRef";
/// `UnsafeSelector`: True when selection cannot be proven confined to the namespace.
pub const UNSAFE_SELECTOR: &str = "UnsafeSelector";
/// `RenderFailure`: True when templates, the SPIFFE ID or the output object fail.
pub const RENDER_FAILURE: &str = "RenderFailure";

/// Every condition type, in the order kleym writes them.
pub const ALL: [&str; 5] = [
    READY,
    CONFLICT,
    INVALID_REF,
    UNSAFE_SELECTOR,
    RENDER_FAILURE,
];

/// The Kubernetes condition type kleym uses (`metav1.Condition`).
pub type Condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
