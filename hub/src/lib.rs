//! kleym hub: ClusterProfile inventory, credential plugins (KEP-4322, formerly KEP-5339), the
//! fleet supervisor, status aggregation and the fleet report. [`runtime`] assembles them into the hub process;
//! [`observe`], [`backoff`], [`flags`] and [`kubeconfig`] are shared by the `kleym` commands.

pub mod access;
pub mod api_client;
pub mod backoff;
pub mod credentials;
pub mod explain;
pub mod explain_binding;
pub mod explain_source;
pub mod explain_targets;
pub mod flags;
pub mod fleet;
pub mod http;
pub mod init;
pub mod inventory;
pub mod issuer;
pub mod kubeconfig;
pub mod leader;
pub mod observe;
pub mod report;
pub mod runtime;
pub mod shard;
pub mod status;
