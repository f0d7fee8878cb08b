//! kleym spoke: the identity compiler (pure, no I/O) that turns `InferenceIdentityBinding`s
//! into SPIRE `ClusterSPIFFEID`s, and the per-cluster reconciler built on it.

pub mod admission_policy;
pub mod compiler;
pub mod explain;
pub mod ownership;
pub mod reconciler;
