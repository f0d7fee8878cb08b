//! kleym end-to-end support: `kubesim`, an in-process Kubernetes API simulator that serves
//! many simulated clusters at once, plus the end-to-end tests, benchmarks and demo built on it.

pub mod fleet;
#[warn(missing_docs)]
pub mod kubesim;
