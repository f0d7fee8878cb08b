//! `kleym hub` refuses a bad `--trust-domain` or `--clusterprofile-selector` before it does
//! anything else (no cluster needed), naming the flag; and its `--help` describes the
//! access-provider flags as the code behaves.

use std::process::Command;

fn kleym_hub(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kleym"))
        .arg("hub")
        .args(args)
        // No cluster: a check that passed would fail later on the missing kubeconfig.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KLEYM_TRUST_DOMAIN")
        .output()
        .expect("running kleym")
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
        "--trust-domain",
        "example.org",
        "--clusterprofile-selector",
        "env=prod,tier in (a,b)",
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
