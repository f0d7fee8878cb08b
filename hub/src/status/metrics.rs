//! Status-loop metrics: `kleym_hub_status_passes_total{role}`, one per pass of the loop, as
//! the leader (a rebuild and flush) or as a follower (nothing written). A stuck loop shows as
//! a counter that stops; tests use it to prove a follower had the chance to write and did
//! not.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// `role` label: `leader` or `follower`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// `leader` or `follower`.
    pub role: &'static str,
}

/// Counters of the status loop (clones share them; the default is unregistered).
#[derive(Clone, Debug, Default)]
pub struct StatusMetrics {
    passes: Family<RoleLabels, Counter>,
}

fn role(leading: bool) -> RoleLabels {
    RoleLabels {
        role: if leading { "leader" } else { "follower" },
    }
}

impl StatusMetrics {
    /// Registers the counters under `kleym_hub_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.sub_registry_with_prefix("kleym_hub").register(
            "status_passes",
            "Passes of the status loop by role: a leader rebuilds and writes what changed, \
             a follower writes nothing",
            m.passes.clone(),
        );
        m
    }

    /// Counts one pass.
    pub(crate) fn pass(&self, leading: bool) {
        self.passes.get_or_create(&role(leading)).inc();
    }

    /// Passes so far as leader (`true`) or follower (`false`).
    pub fn passes(&self, leading: bool) -> u64 {
        self.passes.get_or_create(&role(leading)).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_are_counted_by_role_and_exported() {
        let mut registry = Registry::default();
        let m = StatusMetrics::register(&mut registry);
        m.pass(false);
        m.pass(false);
        m.pass(true);
        assert_eq!((m.clone().passes(true), m.passes(false)), (1, 2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kleym_hub_status_passes_total{role=\"follower\"} 2"),
            "{text}"
        );
    }
}
