//! Fleet metrics: spokes per phase, engagements.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::state::{FleetState, Phase};

/// `phase` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Phase name.
    pub phase: String,
}

/// Fleet gauges, refreshed from [`FleetState`] by [`FleetMetrics::follow`].
#[derive(Clone, Debug, Default)]
pub struct FleetMetrics {
    /// `kleym_hub_spokes{phase}`.
    pub spokes: Family<PhaseLabels, Gauge>,
    /// `kleym_hub_leader` (1 while leading).
    pub leader: Gauge,
    /// `kleym_hub_state_changes_total`.
    pub changes: Counter,
}

impl FleetMetrics {
    /// Registers the metrics under `kleym_hub_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let sub = registry.sub_registry_with_prefix("kleym_hub");
        sub.register("spokes", "Spokes by phase", m.spokes.clone());
        sub.register("leader", "1 while this replica leads", m.leader.clone());
        sub.register(
            "state_changes",
            "Changes of the published fleet state",
            m.changes.clone(),
        );
        m
    }

    /// Registers `state`'s engage-latency histogram as
    /// `kleym_hub_spoke_engage_duration_seconds` (from the start of an engagement attempt
    /// (connect, preflight, initial cache sync) to the spoke being `Engaged`) and its removal
    /// counter as `kleym_hub_spoke_removals_total{outcome}`.
    pub fn register_engage(registry: &mut Registry, state: &FleetState) {
        registry.sub_registry_with_prefix("kleym_hub").register(
            "spoke_engage_duration_seconds",
            "Seconds from the start of an engagement attempt to the spoke being Engaged",
            state.engage_duration().clone(),
        );
        registry.sub_registry_with_prefix("kleym_hub").register(
            "spoke_removals",
            "Removal jobs (profile deleted or deselected) that ran to their end, by outcome",
            state.removals().clone(),
        );
    }

    /// Recomputes the gauges from `state`.
    pub fn refresh(&self, state: &FleetState) {
        let counts = state.phase_counts();
        for p in Phase::ALL {
            let n = counts.get(&p).copied().unwrap_or(0);
            self.spokes
                .get_or_create(&PhaseLabels {
                    phase: p.as_str().to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.leader.set(i64::from(state.is_leader()));
    }

    /// Keeps the gauges current until the state is dropped (at most one refresh per
    /// `min_interval`, so a large fleet's churn costs little).
    pub async fn follow(self, state: FleetState, min_interval: std::time::Duration) {
        let mut rx = state.subscribe();
        self.refresh(&state);
        while rx.changed().await.is_ok() {
            self.changes.inc();
            tokio::time::sleep(min_interval).await;
            rx.borrow_and_update();
            self.refresh(&state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    /// The gauges count each phase of the fleet's spokes, read back from the text format.
    #[test]
    fn spokes_are_counted_per_phase() {
        let state = FleetState::new();
        let phases = [
            ("fleet/a", Phase::Engaged),
            ("fleet/b", Phase::Engaged),
            ("fleet/c", Phase::Standby),
            ("fleet/d", Phase::Refused),
        ];
        for (name, phase) in phases {
            state.update(name, |s| s.phase = phase);
        }
        let mut registry = Registry::default();
        let metrics = FleetMetrics::register(&mut registry);
        metrics.refresh(&state);
        state.update("fleet/b", |s| s.phase = Phase::Standby);
        metrics.refresh(&state);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for (phase, n) in [
            ("Engaged", 1),
            ("Standby", 2),
            ("Refused", 1),
            ("Syncing", 0),
        ] {
            let line = format!("kleym_hub_spokes{{phase=\"{phase}\"}} {n}");
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }
}
