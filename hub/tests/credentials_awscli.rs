//! A real third-party exec plugin, `aws eks get-token` (awscli), run unchanged through kleym's
//! exec runtime with dummy static AWS credentials: it signs an STS URL locally (no network)
//! and prints an ExecCredential with an expiry. `scripts/ensure-tools` installs the CLI.
//!
//! The developer's own AWS setup cannot change the outcome: the plugin runs through
//! `env -u` without `AWS_PROFILE`, `AWS_DEFAULT_PROFILE` and the other variables that select
//! credentials, with `AWS_CONFIG_FILE` and `AWS_SHARED_CREDENTIALS_FILE` pointing at a file that
//! does not exist (unset, they would fall back to `~/.aws`), and `HOME` in a temporary
//! directory.
//!
//! `aws` is found as every tool is (`test_tools`: PATH first, then the project's tool cache);
//! when it is missing the test fails with a message naming the command that installs it.

use std::path::PathBuf;
use std::time::Duration;

use kleym_hub::access::{ClusterAccess, EffectiveAccess, EnvVar, ExecApiVersion, ExecConfig};
use kleym_hub::credentials::{ExecOptions, run_plugin};

/// Variables of the developer's environment that would make `aws` pick other credentials, a
/// profile that does not exist here, or another endpoint; removed from the plugin's env.
const CLEARED: &[&str] = &[
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CA_BUNDLE",
];

fn access(aws: PathBuf, api: ExecApiVersion, dir: &std::path::Path) -> EffectiveAccess {
    let missing = dir.join("none").display().to_string();
    let home = dir.display().to_string();
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIAKLEYMTESTEXAMPLE"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "kleym/test/secret/key/not/real/EXAMPLEKEY",
        ),
        ("AWS_CONFIG_FILE", missing.as_str()),
        ("AWS_SHARED_CREDENTIALS_FILE", missing.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", home.as_str()),
    ];
    // `env -u NAME … aws …`: the exec runtime passes the hub's environment through (as
    // client-go does), so unsetting needs a wrapper; aws itself runs unchanged.
    let mut args: Vec<String> = CLEARED
        .iter()
        .flat_map(|name| ["-u".to_string(), name.to_string()])
        .collect();
    args.push(aws.display().to_string());
    args.extend(
        [
            "eks",
            "get-token",
            "--cluster-name",
            "x",
            "--region",
            "us-east-1",
        ]
        .map(String::from),
    );
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
            command: "env".into(),
            args,
            env: env
                .iter()
                .map(|(n, v)| EnvVar {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            provide_cluster_info: true,
            install_hint: Some("run scripts/ensure-tools".into()),
        },
        audience: "kleym.io/clusterprofile/fleet/eks".into(),
    }
}

#[tokio::test]
async fn aws_eks_get_token_works_unchanged() {
    let aws = test_tools::require(test_tools::Tool::Aws);
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
