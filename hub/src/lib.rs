//! kleym hub: ClusterProfile inventory, KEP-5339 credential plugins, the fleet supervisor,
//! status aggregation and the fleet report.

pub mod access;
pub mod backoff;
pub mod credentials;
pub mod flags;
pub mod fleet;
pub mod http;
pub mod hub_view;
pub mod inventory;
pub mod leader;
pub mod report;
pub mod status;
