//! Sharded mode (`--shard-mode sharded`): every hub replica engages a share of the spokes.
//!
//! - [`rendezvous`]: weighted rendezvous hashing, which replica owns a key (pure);
//! - [`view`]: views of the live replicas, the hand-over barrier and the [`Ownership`]
//!   published to the rest of the hub (pure);
//! - [`membership`]: each replica's own Lease, the live set read from the others', and the
//!   task that turns them into [`Ownership`].
//!
//! The guarantee (at most one replica runs a spoke's reconciler) rests on release before
//! take: a replica announces a view only after it stopped every spoke it does not own under
//! it, and takes a spoke only when every member announced the view.

pub mod membership;
pub mod metrics;
pub mod rendezvous;
pub mod view;

pub use membership::{MembershipOptions, ShardHandle, spawn};
pub use metrics::ShardMetrics;
pub use rendezvous::Member;
pub use view::{Ownership, View, ownership_key};
