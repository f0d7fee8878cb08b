//! kleym API types: our CRDs (group `kleym.io`, version `v1alpha1`) and the external
//! types kleym reads (ClusterProfile, InferencePool, InferenceObjective, InferenceModel)
//! or writes (ClusterSPIFFEID).
//!
//! - [`binding`]: `InferenceIdentityBinding`, the namespaced identity intent.
//! - [`conditions`]: the condition types every binding status carries.
//! - [`external`]: upstream kinds, modelled field-for-field from their CRDs.
//! - [`hub_status`]: `ClusterIdentityStatus` and `FleetIdentityReport`, written by the hub.
//! - [`label_map`]: the compact label map kleym holds per binding.
//! - [`crds`]: the CustomResourceDefinitions kleym installs (`kleym crds`).
//! - [`yaml`]: how kleym reads and writes YAML.
#![warn(missing_docs)]

pub mod binding;
pub mod conditions;
pub mod crds;
pub mod external;
mod go_duration;
pub mod hub_status;
pub mod label_map;
mod schema;
pub mod yaml;

pub use binding::{
    ComputedSpiffeId, ConflictPeer, ContainerDiscriminator, DiscriminatorType, IdentityMode,
    IdentityWarning, InferenceIdentityBinding, InferenceIdentityBindingSpec,
    InferenceIdentityBindingStatus, OwnedClusterSpiffeId, SelectorSource, SpireStats, SvidOptions,
    TargetKind, TargetRef,
};

pub use hub_status::ErrorCategory;

/// Our API group.
pub const GROUP: &str = "kleym.io";
/// Our API version.
pub const VERSION: &str = "v1alpha1";

/// Label keys kleym puts on every object it creates.
pub mod labels {
    /// `kleym.io/managed-by`; value [`MANAGED_BY_VALUE`].
    pub const MANAGED_BY: &str = "kleym.io/managed-by";
    /// The value of [`MANAGED_BY`].
    pub const MANAGED_BY_VALUE: &str = "kleym";
    /// Namespace of the binding that produced the object.
    pub const BINDING_NAMESPACE: &str = "kleym.io/binding-namespace";
    /// Name of the binding that produced the object.
    pub const BINDING_NAME: &str = "kleym.io/binding-name";
}
