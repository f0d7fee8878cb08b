//! The hub's read-only view of one running reconciler: its bindings' snapshot (see
//! [`super::binding_snapshot`]), whether its caches synced, why not, and whether it is idle.
//! No I/O, no writes, no effect on reconciling.

use std::sync::Arc;

pub use super::binding_snapshot::BindingSnapshot;
use super::context::Context;
pub use super::watch_failures::WatchFailure;

/// Every cached binding's snapshot, sorted by namespace and name; shared (same `Arc`)
/// while the binding cache is unchanged, and each entry while its binding is.
pub fn bindings(ctx: &Context) -> Arc<Vec<Arc<BindingSnapshot>>> {
    ctx.state
        .binding_snapshot
        .latest(&ctx.state.caches.bindings)
}

/// Whether every active cache has completed its first list (same rule as readiness).
pub fn synced(ctx: &Context) -> bool {
    ctx.state.all_synced()
}

/// Why the initial sync cannot complete right now: a watch whose cache has not completed its
/// first list failed (the watcher keeps retrying; the caller may give up at once).
pub fn sync_failure(ctx: &Context) -> Option<WatchFailure> {
    ctx.state.watch_failures.first()
}

/// Whether the work queue has nothing pending or running.
pub fn idle(ctx: &Context) -> bool {
    ctx.queue.is_idle()
}
