//! The inventory: which ClusterProfiles the hub engages and with what configuration.
//!
//! [`evaluate`] is a pure function from one ClusterProfile (plus the hub's providers and
//! flags) to a [`Decision`]: engage with a [`SpokeSpec`], wait (not healthy), or refuse with
//! a clear reason. [`watch`] streams ClusterProfile changes from the hub cluster as
//! [`InventoryEvent`]s for the fleet supervisor.

pub mod decide;
pub mod watch;

pub use decide::{
    Decision, InventoryOptions, SPIRE_CLASS_PROPERTY, SpokeSettings, SpokeSpec,
    TRUST_DOMAIN_PROPERTY, evaluate,
};
pub use watch::{InventoryEvent, WatchOptions, watch};
