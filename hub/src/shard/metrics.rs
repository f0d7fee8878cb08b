//! Sharded-mode metrics of one replica (`kleym_hub_shard_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `direction` label of hand-overs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `gained` or `released`.
    pub direction: String,
}

/// The metrics; cheap to clone (shared handles). Unregistered (default) ones count
/// nowhere.
#[derive(Clone, Debug)]
pub struct ShardMetrics {
    /// `kleym_hub_shard_spokes_owned`: spokes this replica owns and may engage.
    pub owned: Gauge,
    /// `kleym_hub_shard_live_replicas`: members of this replica's current view.
    pub live: Gauge,
    /// `kleym_hub_shard_view_changes_total`.
    pub view_changes: Counter,
    /// `kleym_hub_shard_handovers_total{direction}`: spokes gained or released.
    pub handovers: Family<DirectionLabels, Counter>,
    /// `kleym_hub_shard_barrier_wait_seconds`: a view change to every member showing it.
    pub barrier_wait: Histogram,
    /// `kleym_hub_shard_takeover_seconds`: a view change to this replica engaging the
    /// spokes it gained under it.
    pub takeover: Histogram,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        Self {
            owned: Gauge::default(),
            live: Gauge::default(),
            view_changes: Counter::default(),
            handovers: Family::default(),
            barrier_wait: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            takeover: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
        }
    }
}

impl ShardMetrics {
    /// Registers the metrics under `kleym_hub_shard_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let sub = registry.sub_registry_with_prefix("kleym_hub_shard");
        sub.register(
            "spokes_owned",
            "Spokes this replica owns under its current view",
            m.owned.clone(),
        );
        sub.register(
            "live_replicas",
            "Replicas in this replica's current view",
            m.live.clone(),
        );
        sub.register(
            "view_changes",
            "Changes of this replica's view of the live replicas",
            m.view_changes.clone(),
        );
        sub.register(
            "handovers",
            "Spokes gained (engaged after a view change) or released (stopped because another replica owns them)",
            m.handovers.clone(),
        );
        sub.register(
            "barrier_wait_seconds",
            "Seconds from a view change to every member of the view showing it",
            m.barrier_wait.clone(),
        );
        sub.register(
            "takeover_seconds",
            "Seconds from a view change to this replica engaging the spokes it gained",
            m.takeover.clone(),
        );
        m
    }

    /// Counts `n` spokes gained or released.
    pub fn handed_over(&self, gained: bool, n: u64) {
        if n == 0 {
            return;
        }
        let direction = if gained { "gained" } else { "released" };
        self.handovers
            .get_or_create(&DirectionLabels {
                direction: direction.into(),
            })
            .inc_by(n);
    }
}
