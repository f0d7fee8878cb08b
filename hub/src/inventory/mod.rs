//! The inventory: which ClusterProfiles the hub engages and with what configuration.
//!
//! [`evaluate`] is a pure function from one ClusterProfile (plus the hub's providers and
//! flags) to a [`Decision`]: engage with a [`SpokeSpec`], wait (not healthy), or refuse with
//! a clear reason (including a profile whose content does not decode). It reads only the
//! profile's [`DecisionInputs`]. [`version`] picks the ClusterProfile API version the hub
//! reads (v1alpha2 when served). [`watch`] streams ClusterProfile changes from the hub
//! cluster as [`InventoryEvent`]s for the fleet supervisor, forwarding a profile only when
//! its decision inputs change. [`InventorySynced`] records the first full listing.

pub mod audiences;
pub mod decide;
pub mod members;
pub mod selector;
pub mod synced;
pub mod version;
pub mod watch;

pub use decide::{
    DEFAULT_MAX_OFFERED_PROVIDERS, Decision, DecisionInputs, InventoryOptions,
    SPIRE_CLASS_PROPERTY, SpokeSettings, SpokeSpec, TRUST_DOMAIN_PROPERTY, evaluate,
    evaluate_inputs, valid_trust_domain,
};
pub use selector::validate_label_selector;
pub use synced::InventorySynced;
pub use version::{InventoryVersion, VersionPolicy};
pub use watch::{InventoryEvent, InventoryFilter, WatchOptions, spoke_name, watch};
