//! `kleym hub` refuses a flag value that would parse but make every reconcile, watch or
//! request fail (a bad `--trust-domain`, `--clusterprofile-selector`, namespace, Lease name,
//! engage condition, …; no access provider at all) before it does anything else (no cluster
//! needed), with exit code 2 naming the flag; and its `--help` describes the access-provider
//! flags as the code behaves.

use std::process::Command;

fn kleym_hub(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kleym"))
        .arg("hub")
        .args(args)
        // No cluster: a check that passed would fail later on the missing kubeconfig.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KLEYM_TRUST_DOMAIN")
        .env_remove("KLEYM_SPIRE_CLASS_NAME")
        .env_remove("KLEYM_LOG")
        .env_remove("KLEYM_API_AUDIENCE")
        .env_remove("POD_NAME")
        .output()
        .expect("running kleym")
}

/// Each flag value that would parse as a string but break every reconcile, watch or
/// request: exit code 2, the flag named, and the reason.
#[test]
fn values_that_would_break_every_reconcile_fail_start_up() {
    let provider = ["--clusterprofile-access-provider", "tok=/bin/true"];
    for (args, flag, needle) in [
        (
            vec!["--clusterprofile-namespace", "Fleet"],
            "--clusterprofile-namespace",
            "not a namespace name",
        ),
        (
            vec!["--clusterprofile-namespace", ""],
            "--clusterprofile-namespace",
            "not a namespace name",
        ),
        (
            vec!["--namespace", "kleym.system"],
            "--namespace",
            "not a namespace name",
        ),
        (
            vec!["--lease-name", "Kleym_Hub"],
            "--lease-name",
            "not a Lease name",
        ),
        (
            vec!["--engage-condition", "ControlPlane Healthy"],
            "--engage-condition",
            "not a condition type",
        ),
        (
            vec!["--spire-class-name", "spire\na"],
            "--spire-class-name",
            "control characters",
        ),
        (
            vec!["--instance", &"i".repeat(129)],
            "--instance",
            "at most 128 characters",
        ),
        (
            vec!["--log-level", "info,kleym_hub=loud"],
            "--log-level",
            "not a log filter",
        ),
        (
            vec!["--api-audience", " "],
            "--api-audience",
            "an audience is required",
        ),
        (
            vec!["--api-token-cache-ttl-seconds", "18446744073709551615"],
            "--api-token-cache-ttl-seconds",
            "not in 0..=86400",
        ),
        (
            vec!["--api-access-cache-ttl-seconds", "86401"],
            "--api-access-cache-ttl-seconds",
            "not in 0..=86400",
        ),
    ] {
        let mut all: Vec<&str> = provider.to_vec();
        all.extend(&args);
        let out = kleym_hub(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
}

/// Without any access provider every ClusterProfile would be refused; a provider that does
/// not parse is named too. Both are usage errors, before any connection.
#[test]
fn missing_or_invalid_access_providers_fail_start_up() {
    for (args, needle) in [
        (vec![], "no access provider"),
        (
            vec!["--clusterprofile-access-provider", "no-equals-sign"],
            "invalid access providers",
        ),
        (
            vec![
                "--clusterprofile-provider-file",
                "/nonexistent/providers.yaml",
            ],
            "invalid access providers",
        ),
    ] {
        let out = kleym_hub(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle)
                && stderr.contains("--clusterprofile-provider-file")
                && stderr.contains("Usage: kleym hub"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn bad_trust_domain_or_selector_fails_start_up_naming_the_flag() {
    for (args, flag, needle) in [
        (
            vec!["--trust-domain", "Example.ORG"],
            "--trust-domain",
            "not a SPIFFE trust domain",
        ),
        (
            vec!["--trust-domain", "spiffe://example.org"],
            "--trust-domain",
            "without spiffe://",
        ),
        (
            vec!["--clusterprofile-selector", "env in prod"],
            "--clusterprofile-selector",
            "not a label selector",
        ),
    ] {
        let out = kleym_hub(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
    // The environment variable is checked the same way.
    let out = Command::new(env!("CARGO_BIN_EXE_kleym"))
        .arg("hub")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("KLEYM_TRUST_DOMAIN", "Bad Domain")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--trust-domain"), "{stderr}");
}

#[test]
fn valid_values_get_past_flag_checks() {
    // Valid flags reach the next step, which fails on the missing kubeconfig instead.
    let out = kleym_hub(&[
        "--clusterprofile-access-provider",
        "tok=/bin/true",
        "--trust-domain",
        "example.org",
        "--clusterprofile-selector",
        "env=prod,tier in (a,b)",
        "--clusterprofile-namespace",
        "fleet",
        "--engage-condition",
        "example.com/Ready",
        "--lease-name",
        "kleym-hub.fleet",
        "--namespace",
        "kleym-system",
        "--spire-class-name",
        " spire-a ",
        "--instance",
        "hub-0",
        "--api-audience",
        "kleym-hub",
        "--api-token-cache-ttl-seconds",
        "0",
        "--log-level",
        "info,kleym_hub=debug",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "{stderr}");
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("invalid value"), "{stderr}");
}

#[test]
fn help_describes_access_provider_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(["hub", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let section = help
        .split("--clusterprofile-access-provider <")
        .nth(1)
        .expect("flag documented");
    for needle in [
        "client.authentication.k8s.io/v1",
        "provideClusterInfo true",
        "Ignore policies",
        "docs/access-providers.md",
    ] {
        assert!(section.contains(needle), "{needle} missing:\n{help}");
    }
    for needle in [
        "profileSourcedCLIArgsPolicy",
        "AppendIfNotExists",
        "Replace",
        "Append",
    ] {
        assert!(help.contains(needle), "{needle} missing:\n{help}");
    }
}
