//! The `kleym` binary allocates with jemalloc (`src/main.rs`), not the platform's malloc: its
//! footprint figures (docs/benchmarks.md) depend on it. jemalloc reads its options from
//! `_RJEM_MALLOC_CONF` (tikv's build prefixes its symbols and variables); asked to, it prints
//! its statistics at exit, which the platform's malloc never does.

#![cfg(not(target_env = "msvc"))]

use std::process::Command;

/// `kleym --version` with jemalloc's options set to `conf`: (stdout, stderr).
fn kleym_version_with(conf: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kleym"));
    cmd.arg("--version").env_remove("_RJEM_MALLOC_CONF");
    if let Some(conf) = conf {
        cmd.env("_RJEM_MALLOC_CONF", conf);
    }
    let out = cmd.output().expect("running kleym");
    assert!(out.status.success(), "kleym --version failed: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn kleym_allocates_with_jemalloc() {
    let (stdout, stderr) = kleym_version_with(Some("stats_print:true"));
    assert!(stdout.starts_with("kleym "), "unexpected output: {stdout}");
    assert!(
        stderr.contains("Begin jemalloc statistics"),
        "kleym did not print jemalloc's statistics, so jemalloc is not its allocator; \
         stderr: {stderr}"
    );
}

#[test]
fn without_options_jemalloc_prints_nothing() {
    let (stdout, stderr) = kleym_version_with(None);
    assert!(stdout.starts_with("kleym "), "unexpected output: {stdout}");
    assert!(
        !stderr.contains("jemalloc"),
        "kleym wrote allocator output unasked: {stderr}"
    );
}
