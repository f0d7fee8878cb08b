//! `fleet-bench` itself, on a tiny fleet: both hub modes converge, and the figures the docs quote
//! (convergence, latency, requests and execs per spoke, per-process RSS/CPU) are printed. The
//! figures' values are not asserted (they are measurements), only that the bench produces them
//! and that every binding got its ClusterSPIFFEID (the bench exits non-zero otherwise).

use std::process::Command;

use kleym_e2e::fleet::plugins::kleym_binary;

fn run_bench(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
        .args([
            "--spokes",
            "2",
            "--bindings",
            "3",
            "--timeout-seconds",
            "120",
        ])
        .args(extra)
        .output()
        .expect("fleet-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fleet-bench {extra:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for figure in [
        "time to engage 2 spokes",
        "time to converge",
        "binding -> ClusterSPIFFEID latency: p50",
        "API requests per spoke",
        // One static-token plugin exec per spoke: the credential cache works across reconciles.
        "credential execs per spoke: 1.00 (2 total)",
        "bench process (",
    ] {
        assert!(stdout.contains(figure), "missing {figure:?} in:\n{stdout}");
    }
    stdout
}

#[test]
fn bench_with_the_real_hub_binary_in_a_child_process() {
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().expect("utf-8 path");
    let stdout = run_bench(&["--hub", "process", "--kleym-bin", kleym]);
    assert!(
        stdout.contains("hub process (kleym, pid"),
        "the child hub's own figures are missing:\n{stdout}"
    );
}

#[test]
fn bench_with_the_hub_in_process() {
    let stdout = run_bench(&["--hub", "in-process"]);
    assert!(
        !stdout.contains("hub process (kleym"),
        "no child hub expected in-process:\n{stdout}"
    );
}

#[test]
fn bench_refuses_a_missing_hub_binary_with_the_build_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
        .args([
            "--spokes",
            "1",
            "--bindings",
            "1",
            "--kleym-bin",
            "/nonexistent/kleym",
        ])
        .output()
        .expect("fleet-bench runs");
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("/nonexistent/kleym"), "{all}");
}
