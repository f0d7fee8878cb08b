//! The hub process assembled from its subsystems, as a library so that `kleym hub`, the
//! end-to-end tests, the demo and `fleet-bench` run the same code:
//!
//! - [`args`]: the flags ([`HubArgs`]) and the settings of each subsystem they describe;
//! - [`start`]: [`start_hub_with`] starts credential cache, supervisor, leader election,
//!   inventory watch, status loop and metrics, returning a [`HubHandle`];
//! - [`routers`]: the hub API ([`api_router`], on `--api-addr`) and the health routers
//!   ([`health_router`] on `--metrics-addr`, [`probe_router`] on `--health-addr`);
//! - [`run`]: [`run_hub`], all of it from flags until shutdown;
//! - [`coordination`]: the Lease work's own thread and client ([`Coordination`]);
//! - [`view`]: what the HTTP API serves, over the fleet state ([`FleetHubView`]);
//! - [`published`]: what a follower serves instead, the published status objects
//!   ([`PublishedStatus`]).
//!
//! This is the top of the hub's dependency graph: it imports the domain modules, and none
//! of them (nor its own children) imports it back.

pub mod args;
pub mod coordination;
pub mod published;
pub mod routers;
pub mod run;
pub mod start;
pub mod view;

pub use args::{HubArgs, ShardMode, hub_client};
pub use coordination::Coordination;
pub use published::PublishedStatus;
pub use routers::{
    api_router, health_router, probe_router, ready_check, ready_check_with_issuer, serve_health,
};
pub use run::run_hub;
pub use start::{HubHandle, HubStartOptions, start_hub, start_hub_with};
pub use view::{FleetCollector, FleetHubView, LeaderInfo, observe_lease};
