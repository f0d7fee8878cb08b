//! Every end-to-end test of kleym-e2e, in one test binary.
//!
//! Each file beside this one is a module of its own (its tests are named `file::test`), as
//! it would be as a test target of its own; they are linked once instead of once per file,
//! because every one of them links the hub, the spoke and kubesim: one binary instead of
//! forty-odd saves minutes of linking and gigabytes of disk on every cold build.
//!
//! Run one file's tests: `cargo test -p kleym-e2e --test e2e spoke_ownership::`; with
//! nextest: `cargo nextest run -p kleym-e2e -E 'test(/^spoke_ownership::/)'`.

/// Helpers shared by the chart and deployment tests.
mod deploy_support;

mod chaos_sharded_short;
mod chaos_short;
mod demo_run;
mod deploy_chart;
mod deploy_examples;
mod deploy_helm;
mod deploy_tenant_access;
mod docs_install_walkthrough;
mod explain_bench;
mod explain_binding;
mod explain_fleet;
mod explain_pod;
mod fleet_bench_run;
mod hub_api_auth;
mod hub_audience;
mod hub_binary;
mod hub_clusterprofile_versions;
mod hub_e2e;
mod hub_failure_status;
mod hub_hostile_spoke;
mod hub_inventory;
mod hub_isolation;
mod hub_issuer_rotation;
mod hub_keyless;
mod hub_leader;
mod hub_members;
mod hub_removal;
mod hub_sharded;
mod hub_transport;
mod hub_user_agent;
mod hub_wired_binary;
mod hub_wired_leader;
mod hub_workload_api;
mod repo_hygiene;
mod repo_module_cycles;
mod report_fleet;
mod report_oracle;
mod report_writer;
mod spoke_binary;
mod spoke_edit_during_write;
mod spoke_list_watch;
mod spoke_long_names;
mod spoke_ownership;
mod spoke_write_bench;

/// With autotests off, a file added to `e2e/tests/` is compiled and run only once it is
/// declared above: this fails naming every file (or folder with a `mod.rs`) that is not.
#[test]
fn every_test_file_is_declared_in_e2e_rs() {
    test_tools::test_targets::assert_every_test_file_declared(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        "e2e",
    );
}
