//! kleym end-to-end support: the fleet fixtures, end-to-end tests, benchmarks and demo, built
//! on `kubesim` (the Kubernetes API simulator in `e2e/kubesim`).

pub mod demo;
pub mod fleet;
pub mod single;
