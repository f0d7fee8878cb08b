//! kubesim's integration tests, in one test binary.
//!
//! Each file beside this one is a module of its own (its tests are named `file::test`), as
//! it would be as a test target of its own; they are linked once instead of once per file,
//! which saves linking time and disk on every cold build.
//!
//! Run one file's tests: `cargo test -p kubesim --test server kubesim_http::`; with nextest:
//! `cargo nextest run -p kubesim -E 'test(/^kubesim_http::/)'`.

mod kubesim_bench;
mod kubesim_cli;
mod kubesim_crd_versions;
mod kubesim_faults;
mod kubesim_fleet;
mod kubesim_http;
mod kubesim_kube;
mod kubesim_kubectl;
mod kubesim_structured_authn;

/// With autotests off, a file added to `tests/` is compiled and run only once it is
/// declared above: this fails naming every file that is not.
#[test]
fn every_test_file_is_declared() {
    test_tools::test_targets::assert_every_test_file_declared(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        "server",
    );
}
