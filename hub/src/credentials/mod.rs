//! The credential runtime: exec'ing client-go exec plugins as KEP-4322 (formerly KEP-5339) configures them, caching their
//! credentials per spoke, and building spoke clients that use them. Token, certificate and
//! key values never reach logs or error messages; at most a short SHA-256 prefix is logged.

pub mod cache;
pub mod client;
pub mod credential;
pub mod exec;
pub mod exec_output;
pub mod metrics;
pub mod plugins;
pub mod proxy;
pub mod secret;
pub mod transport;

pub use cache::{
    CacheOptions, CachedCredential, CredentialCache, CredentialError, SpokeCredentials,
};
pub use client::{ClientOptions, SpokeClient, build_spoke_client, spoke_user_agent};
pub use credential::{ClientCertificate, Credential};
pub use exec::{ExecError, ExecOptions, exec_info, run_plugin};
pub use metrics::CredentialMetrics;
pub use secret::Secret;
pub use transport::{Keepalive, TransportError};
