//! The reconciler's context: its configuration, pure [`SpokeState`], [`Effects`], work
//! queue and readiness flag, owned by one reconciler instance (the hub runs many side by
//! side in one process). Only the top of the reconciler (the run loop, the watch handlers,
//! the reconcile sequence and the hub's snapshot view) takes the whole context; each step
//! takes the pieces it uses.

use std::sync::Arc;

pub use super::config::{CachesSynced, DEFAULT_FIELD_MANAGER, SpokeConfig};
use super::effects::{ClusterClient, Effects};
pub use super::finalizer::FINALIZER;
use super::metrics::SpokeMetrics;
use super::queue::WorkQueue;
use super::state::SpokeState;

/// Everything one reconciler owns.
pub struct Context {
    /// Configuration.
    pub config: SpokeConfig,
    /// What the reconciler knows (caches, index, overlays, memos).
    pub state: SpokeState,
    /// Client, events and metrics.
    pub effects: Effects,
    /// Work queue of binding keys.
    pub queue: WorkQueue,
    /// Set once the caches have synced.
    pub readiness: CachesSynced,
}

impl Context {
    /// Builds a context.
    pub fn new(
        client: impl Into<ClusterClient>,
        config: SpokeConfig,
        metrics: Arc<SpokeMetrics>,
    ) -> Self {
        let effects = Effects::new(client.into(), &config, metrics);
        Self {
            config,
            state: SpokeState::default(),
            effects,
            queue: WorkQueue::new(),
            readiness: CachesSynced::default(),
        }
    }
}
