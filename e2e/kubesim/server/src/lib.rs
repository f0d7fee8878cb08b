//! kubesim: a Kubernetes API simulator serving many simulated clusters from one process.
//!
//! Start clusters with [`Kubesim::start`]; each [`ClusterHandle`] gives its URL, CA, admin
//! token, a `kube::Client`, the in-process store and the fault switches. The `kubesim`
//! binary wraps the same library (see `kubesim --help` and `e2e/kubesim/README.md`).

#![warn(missing_docs)]

pub mod authn;
pub mod authz;
pub mod cli;
pub mod clusters;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod kubeconfig;
pub mod openapi;
pub mod server;
pub mod testing;
pub mod virtual_resources;
mod yaml;

pub use clusters::{ClusterHandle, Kubesim, KubesimOptions, install_crd, load_crds, parse_crds};
pub use error::KubesimError;
pub use faults::{ErrorRule, FaultHandle, FaultRequest, FaultState};
pub use server::request_log::{LoggedRequest, PendingRequest, RequestLog};
