//! Shared fixtures for fleet (hub + many spokes) tests and `fleet-bench`: kubesim clusters
//! with the real CRDs, ClusterProfiles pointing at spokes, credential plugin scripts,
//! spoke environments with N bindings, convergence checks read straight from the spokes'
//! stores (and, from store watches, when each binding converged), each spoke's engagement
//! moment from the hub's log, request-counting and request-recording authenticators, the
//! real `kleym hub` binary as a child process and `/proc` resource figures.

pub mod convergence;
pub mod counting;
pub mod engagement;
pub mod env;
pub mod harness;
pub mod hub_process;
pub mod plugins;
pub mod procstat;
pub mod profiles;

// The single-cluster helpers, shared with `kleym-spoke`'s tests, live in
// `kleym-test-support`; re-exported here under their old paths.
pub use kleym_test_support::recording;
pub use kleym_test_support::{all_crds, upstream_crds};

#[cfg(test)]
mod tests {
    use kubesim::parse_crds;

    #[test]
    fn parse_crds_reads_kleym_chart_crds() {
        // kleym's own chart CRDs and `kleym crds` output, concatenated with `---` as
        // `kubectl apply -f dir/` or a pipe would see them (moved here from kubesim, which
        // depends on no kleym crate).
        let chart = kleym_api::crds::to_yaml().unwrap();
        let text = format!("# leading comment\n---\n{chart}---\n# an empty document\n---\n");
        let crds = parse_crds("kleym crds", &text).unwrap();
        let names: Vec<&str> = crds
            .iter()
            .filter_map(|c| c["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            vec![
                "inferenceidentitybindings.kleym.io",
                "clusteridentitystatuses.kleym.io",
                "fleetidentityreports.kleym.io",
            ]
        );
    }
}
