//! `kleym spoke` refuses a flag value that would parse but make every reconcile fail or
//! withdraw identities — above all an invalid `--trust-domain`, which refused every binding
//! (`InvalidTrustDomain`) and deleted every ClusterSPIFFEID — before it connects (no
//! cluster needed), with exit code 2 naming the flag, as `kleym hub` does. Both commands
//! share the check, which is the identity compiler's own rule.

use std::process::Command;

/// `kleym spoke` with `args` and the environment variables its flags read set to `env`
/// (all others removed), against a kubeconfig that does not exist.
fn kleym_spoke(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kleym"));
    cmd.arg("spoke")
        .args(args)
        // No cluster: a check that passed would fail later on the missing kubeconfig.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KLEYM_TRUST_DOMAIN")
        .env_remove("KLEYM_SPIRE_CLASS_NAME")
        .env_remove("KLEYM_LOG")
        .env_remove("POD_NAME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running kleym")
}

#[test]
fn invalid_trust_domain_fails_start_up_naming_the_flag() {
    for (args, env, needle) in [
        (
            vec!["--trust-domain", "Fleet.Example"],
            vec![],
            "not a SPIFFE trust domain",
        ),
        (
            vec!["--trust-domain", "spiffe://example.org"],
            vec![],
            "without spiffe://",
        ),
        (
            vec!["--trust-domain", "example.org:8443"],
            vec![],
            "not a SPIFFE trust domain",
        ),
        (
            vec!["--trust-domain", ""],
            vec![],
            "a SPIFFE trust domain is required",
        ),
        (
            vec![],
            vec![("KLEYM_TRUST_DOMAIN", "Fleet.Example")],
            "not a SPIFFE trust domain",
        ),
        (
            vec![],
            vec![("KLEYM_TRUST_DOMAIN", "")],
            "a SPIFFE trust domain is required",
        ),
    ] {
        let out = kleym_spoke(&args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("--trust-domain") && stderr.contains(needle),
            "{args:?} {env:?}: {stderr}"
        );
    }
    // A 256-character trust domain is too long for SPIFFE.
    let long = "a".repeat(256);
    let out = kleym_spoke(&["--trust-domain", &long], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn other_values_that_would_break_every_reconcile_fail_start_up() {
    let td = ["--trust-domain", "example.org"];
    let long_instance = "i".repeat(129);
    for (args, flag, needle) in [
        (
            vec!["--spire-class-name", "spire\na"],
            "--spire-class-name",
            "control characters",
        ),
        (
            vec!["--instance", long_instance.as_str()],
            "--instance",
            "at most 128 characters",
        ),
        (
            vec!["--log-level", "info,kleym_spoke=loud"],
            "--log-level",
            "not a log filter",
        ),
        (
            vec!["--concurrency", "0"],
            "--concurrency",
            "not in 1..=256",
        ),
        (
            vec!["--discovery-interval-seconds", "0"],
            "--discovery-interval-seconds",
            "not in 1..=3600",
        ),
    ] {
        let mut all = td.to_vec();
        all.extend(&args);
        let out = kleym_spoke(&all, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn valid_values_get_past_flag_checks() {
    // Valid flags reach the next step, which fails on the missing kubeconfig instead.
    for (args, env) in [
        (
            vec![
                "--trust-domain",
                " td_1.example-x ",
                "--spire-class-name",
                " spire-a ",
                "--instance",
                "",
                "--log-level",
                "info,kleym_spoke=debug",
            ],
            vec![],
        ),
        // Blank optional variables mean unset.
        (
            vec![],
            vec![
                ("KLEYM_TRUST_DOMAIN", "prod.example.org"),
                ("KLEYM_SPIRE_CLASS_NAME", ""),
                ("POD_NAME", ""),
            ],
        ),
    ] {
        let out = kleym_spoke(&args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("no kubeconfig"),
            "{args:?} {env:?}: {stderr}"
        );
        assert!(!stderr.contains("invalid value"), "{stderr}");
    }
}
