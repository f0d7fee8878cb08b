//! The bundled plugins (`kleym credential secret-reader|token-request`) run through the hub's
//! own exec runtime, against a hub API server (kubesim).

use crate::hub_sim;

use std::time::Duration;

use base64::Engine as _;

use kleym_hub::access::{ClusterAccess, EffectiveAccess, ExecApiVersion, ExecConfig};
use kleym_hub::credentials::{ExecError, ExecOptions, run_plugin};

const TOKEN: &str = "plugin-issued-token-0123456789abcdef";

fn access(args: Vec<String>, api: ExecApiVersion, exec_extension: Option<&str>) -> EffectiveAccess {
    EffectiveAccess {
        spoke: "fleet/spoke-1".into(),
        provider: "bundled".into(),
        cluster: ClusterAccess {
            server: "https://spoke-1.example:6443".into(),
            certificate_authority_pem: None,
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            proxy_url: None,
            disable_compression: false,
            exec_extension: exec_extension.map(str::to_string),
        },
        exec: ExecConfig {
            api_version: api,
            command: env!("CARGO_BIN_EXE_kleym").into(),
            args,
            env: vec![],
            provide_cluster_info: true,
            install_hint: None,
        },
        audience: "kleym.io/clusterprofile/fleet/spoke-1".into(),
    }
}

fn opts() -> ExecOptions {
    ExecOptions {
        timeout: Duration::from_secs(30),
        ..ExecOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_reader_reads_the_token_named_by_cluster_name() {
    let hub = hub_sim::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let args = vec![
        "credential".into(),
        "secret-reader".into(),
        "--kubeconfig".into(),
        kc.display().to_string(),
    ];
    for api in [ExecApiVersion::V1, ExecApiVersion::V1Beta1] {
        let c = run_plugin(
            &access(args.clone(), api, Some(r#"{"clusterName":"spoke-1"}"#)),
            &opts(),
        )
        .await
        .unwrap();
        assert_eq!(c.token.unwrap().expose(), TOKEN);
        assert!(c.expires_at.is_none());
    }
    assert_eq!(
        hub.cluster.requests().entries()[0].path,
        hub_sim::SECRET_PATH
    );

    // No clusterName: exit 1 with a clear message.
    let err = run_plugin(&access(args.clone(), ExecApiVersion::V1, None), &opts())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ExecError::Failed { .. }), "{msg}");
    assert!(msg.contains("exit code 1"), "{msg}");
    // The plugin's message is in the stderr excerpt kept for the log, not in the error.
    let excerpt = err.stderr().unwrap().log_excerpt();
    assert!(
        excerpt.contains("[secret-reader]") && excerpt.contains("Spec.Cluster.Config"),
        "{excerpt}"
    );

    // The profile names another spoke's Secret: refused, the other token never read out.
    let err = run_plugin(
        &access(
            args.clone(),
            ExecApiVersion::V1,
            Some(r#"{"clusterName":"spoke-2"}"#),
        ),
        &opts(),
    )
    .await
    .unwrap_err();
    let excerpt = err.stderr().unwrap().log_excerpt();
    assert!(
        excerpt.contains("not for ClusterProfile fleet/spoke-1")
            && excerpt.contains("kleym.io/cluster-profiles"),
        "{excerpt}"
    );
    assert!(
        !err.to_string().contains(hub_sim::OTHER_TOKEN) && !excerpt.contains(hub_sim::OTHER_TOKEN)
    );

    // Unknown Secret: the API error, never a token.
    let err = run_plugin(
        &access(args, ExecApiVersion::V1, Some(r#"{"clusterName":"other"}"#)),
        &opts(),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    let excerpt = err.stderr().unwrap().log_excerpt();
    assert!(
        excerpt.contains("failed to get secret hubns/other"),
        "{excerpt}"
    );
    assert!(!msg.contains(TOKEN) && !excerpt.contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_request_uses_the_hubs_audience_never_the_server() {
    let hub = hub_sim::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let args = vec![
        "credential".into(),
        "token-request".into(),
        "--service-account".into(),
        "kleym/hub".into(),
        "--kubeconfig".into(),
        kc.display().to_string(),
    ];
    let c = run_plugin(&access(args.clone(), ExecApiVersion::V1, None), &opts())
        .await
        .unwrap();
    let first = hub.cluster.requests().entries()[0].clone();
    assert_eq!(
        (first.method.as_str(), first.path.as_str(), first.status),
        ("POST", hub_sim::TOKEN_PATH, 201)
    );
    // The hub issued a ServiceAccount token for what the plugin asked: the audience the hub
    // derived from the profile (not the server URL), valid one hour; the plugin reports the
    // hub's expiry.
    let token = c.token.unwrap();
    let payload = token.expose().split('.').nth(1).unwrap();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        claims["aud"],
        serde_json::json!(["kleym.io/clusterprofile/fleet/spoke-1"])
    );
    assert_eq!(claims["sub"], "system:serviceaccount:kleym:hub");
    let exp = claims["exp"].as_i64().unwrap();
    assert_eq!(exp - claims["iat"].as_i64().unwrap(), 3600);
    assert_eq!(c.expires_at.unwrap().timestamp(), exp);

    let mut bad = args;
    bad[3] = "no-slash".into();
    let err = run_plugin(&access(bad, ExecApiVersion::V1, None), &opts())
        .await
        .unwrap_err();
    let excerpt = err.stderr().unwrap().log_excerpt();
    assert!(
        excerpt.contains("--service-account must be <namespace>/<name>"),
        "{err}: {excerpt}"
    );
}

fn help(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_explains_the_exec_protocol_rbac_and_a_provider_entry() {
    let top = help(&["credential", "--help"]);
    for want in [
        "client-go exec plugins",
        "KUBERNETES_EXEC_INFO",
        "provideClusterInfo: true",
        "get on secrets",
        "create on serviceaccounts/token",
    ] {
        assert!(
            top.contains(want),
            "credential --help lacks {want:?}:\n{top}"
        );
    }
    for (plugin, rbac, args) in [
        (
            "secret-reader",
            "resources: [secrets], verbs: [get]",
            "args: [credential, secret-reader",
        ),
        (
            "token-request",
            "resources: [serviceaccounts/token]",
            "args: [credential, token-request",
        ),
    ] {
        let text = help(&["credential", plugin, "--help"]);
        for want in [
            "client-go exec plugin",
            "KUBERNETES_EXEC_INFO",
            "provideClusterInfo: true",
            rbac,
            "apiVersion: client.authentication.k8s.io/v1",
            args,
        ] {
            assert!(
                text.contains(want),
                "{plugin} --help lacks {want:?}:\n{text}"
            );
        }
    }
}
