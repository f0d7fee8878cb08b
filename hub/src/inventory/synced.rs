//! Whether the ClusterProfile inventory has been listed once: one input of the hub's
//! `/readyz` (a hub that has not listed its inventory does not know its fleet yet).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the inventory watch delivered its first full listing; clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct InventorySynced(Arc<AtomicBool>);

impl InventorySynced {
    /// Whether the inventory has been listed once.
    pub fn is_synced(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Records the first full listing (the hub's start-up does, on
    /// [`InventoryEvent::Resynced`](super::InventoryEvent::Resynced)).
    pub(crate) fn mark_synced(&self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let synced = InventorySynced::default();
        let seen = synced.clone();
        assert!(!seen.is_synced());
        synced.mark_synced();
        assert!(seen.is_synced());
    }
}
