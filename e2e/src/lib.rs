//! kleym end-to-end support: the fleet fixtures, end-to-end tests, benchmarks and demo, built
//! on `kubesim` (the Kubernetes API simulator in `e2e/kubesim`).

pub mod chaos;
pub mod demo;
pub mod failover;
pub mod fixtures;
pub mod report_oracle;
pub mod share_alone;

/// Single-cluster helpers (polling, creating objects and manifests, conditions), from
/// `kleym-test-support`, which `kleym-spoke`'s tests share.
pub use kleym_test_support::single;
