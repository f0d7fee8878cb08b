//! kleym-hub's integration tests, in one test binary.
//!
//! Each file beside this one is a module of its own (its tests are named `file::test`), as
//! it would be as a test target of its own; they are linked once instead of once per file,
//! which saves linking time and disk on every cold build. Two files stay test targets of
//! their own (`Cargo.toml`): `allocator.rs` sets the process's global allocator, and
//! `credentials_proxy.rs` sets proxy variables in the process environment, which is sound
//! only while no other test runs in the process.
//!
//! Run one file's tests: `cargo test -p kleym-hub --test hub http_api::`; with nextest:
//! `cargo nextest run -p kleym-hub -E 'test(/^http_api::/)'`.

#[path = "fixtures/connect_proxy.rs"]
mod connect_proxy;
#[path = "fixtures/http401.rs"]
mod http401;
#[path = "fixtures/https_get.rs"]
mod https_get;
#[path = "fixtures/hub_sim.rs"]
mod hub_sim;
#[path = "fixtures/support.rs"]
mod support;
#[path = "fixtures/tls_spoke.rs"]
mod tls_spoke;

mod access_profile;
mod access_select;
mod credentials_awscli;
mod credentials_cache;
mod credentials_exec;
mod credentials_logs;
mod credentials_plugins;
mod credentials_tls;
mod credentials_transport;
mod dependency_policy;
mod docs_flags;
mod explain_model;
mod http_api;
mod http_auth_default;
mod http_cost;
mod http_tls;
mod inventory_examples;
mod inventory_flags;
mod issuer_ca_rotation;
mod issuer_fail_closed;
mod issuer_replicas;
mod issuer_spiffe_jwt;
mod kleym_client_config;
mod report_cli;
mod report_published;
mod report_size;
mod spoke_flags;

/// With autotests off, a file added to `hub/tests/` is compiled and run only once it is
/// declared above or in `Cargo.toml`: this fails naming every file that is neither.
#[test]
fn every_test_file_is_declared() {
    test_tools::test_targets::assert_every_test_file_declared(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        "hub",
    );
}
