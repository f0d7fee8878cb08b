//! A spoke's inference environment and its bindings, written straight into the spoke's
//! store: `kleym_test_support::env`, with the spoke compiler's ClusterSPIFFEID naming filled
//! in.

pub use kleym_test_support::env::*;

use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kubesim_store::Cluster;

/// The ClusterSPIFFEID name binding `i` compiles to.
pub fn csid_name(i: usize) -> String {
    csid_name_with(cluster_spiffe_id_name, i)
}

/// Whether bindings `0..n` all have their ClusterSPIFFEID.
pub fn converged(store: &Cluster, n: usize) -> bool {
    converged_with(store, n, cluster_spiffe_id_name)
}
