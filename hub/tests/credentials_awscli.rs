//! A real third-party exec plugin, `aws eks get-token` (awscli), run unchanged through kleym's
//! exec runtime with dummy static AWS credentials: it signs an STS URL locally (no network)
//! and prints an ExecCredential with an expiry. `.ci/ensure-awscli` installs the CLI.
//!
//! Skips with a loud message only when `aws` is absent *and* `CI` is unset; under CI a missing
//! binary fails the test.

use std::path::PathBuf;
use std::time::Duration;

use kleym_hub::access::{ClusterAccess, EffectiveAccess, EnvVar, ExecApiVersion, ExecConfig};
use kleym_hub::credentials::{ExecOptions, run_plugin};

fn find_aws() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("aws"))
        .find(|p| p.is_file())
}

fn access(aws: PathBuf, api: ExecApiVersion, dir: &std::path::Path) -> EffectiveAccess {
    let missing = dir.join("none").display().to_string();
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIAKLEYMTESTEXAMPLE"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "kleym/test/secret/key/not/real/EXAMPLEKEY",
        ),
        ("AWS_CONFIG_FILE", missing.as_str()),
        ("AWS_SHARED_CREDENTIALS_FILE", missing.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    EffectiveAccess {
        spoke: "fleet/eks-1".into(),
        provider: "eks".into(),
        cluster: ClusterAccess {
            server: "https://ABCDEF.gr7.us-east-1.eks.amazonaws.com".into(),
            certificate_authority_pem: None,
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            proxy_url: None,
            disable_compression: false,
            exec_extension: None,
        },
        exec: ExecConfig {
            api_version: api,
            command: aws.display().to_string(),
            args: [
                "eks",
                "get-token",
                "--cluster-name",
                "x",
                "--region",
                "us-east-1",
            ]
            .map(String::from)
            .to_vec(),
            env: env
                .iter()
                .map(|(n, v)| EnvVar {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            provide_cluster_info: true,
            install_hint: Some("run .ci/ensure-awscli".into()),
        },
    }
}

#[tokio::test]
async fn aws_eks_get_token_works_unchanged() {
    let Some(aws) = find_aws() else {
        let ci = std::env::var("CI")
            .map(|v| !v.is_empty() && v != "false")
            .unwrap_or(false);
        assert!(!ci, "`aws` is not on PATH under CI: run .ci/ensure-awscli");
        eprintln!(
            "\n!!!!! SKIPPED aws_eks_get_token_works_unchanged: `aws` not on PATH (run .ci/ensure-awscli) !!!!!\n"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = ExecOptions {
        timeout: Duration::from_secs(120),
        ..ExecOptions::default()
    };
    let c = run_plugin(
        &access(aws.clone(), ExecApiVersion::V1Beta1, dir.path()),
        &opts,
    )
    .await
    .unwrap();
    let token = c.token.expect("aws returned no token");
    assert!(
        token.expose().starts_with("k8s-aws-v1."),
        "unexpected token format (hash {})",
        token.short_hash()
    );
    let exp = c.expires_at.expect("aws returned no expirationTimestamp");
    let now = chrono::Utc::now();
    assert!(
        exp > now - chrono::Duration::minutes(1) && exp < now + chrono::Duration::hours(1),
        "expiry {exp}"
    );
    // It honours the apiVersion requested through KUBERNETES_EXEC_INFO.
    let c = run_plugin(&access(aws, ExecApiVersion::V1, dir.path()), &opts)
        .await
        .unwrap();
    assert!(c.token.is_some());
}
