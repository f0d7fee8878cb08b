//! kube-apiserver's structured authentication in kubesim: a cluster started with an
//! `AuthenticationConfiguration` trusts another cluster's ServiceAccount issuer through OIDC
//! discovery, maps the user with a prefix and refuses tokens for other audiences; an invalid
//! configuration is refused with the field named and keeps the previous one.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use std::time::Duration;

fn authn_config(issuer: &ClusterHandle, audience: &str) -> String {
    let ca = issuer.ca_pem().replace('\n', "\n          ");
    format!(
        r#"apiVersion: apiserver.config.k8s.io/v1beta1
kind: AuthenticationConfiguration
jwt:
  - issuer:
      url: {url}
      audiences: ["{audience}"]
      certificateAuthority: |
          {ca}
    claimValidationRules:
      - expression: "claims.sub == 'system:serviceaccount:kleym:hub'"
        message: sub must be the hub
    claimMappings:
      username:
        claim: sub
        prefix: "kleym:"
    userValidationRules:
      - expression: "!user.username.startsWith('system:')"
        message: no system users
"#,
        url = issuer.url(),
    )
}

async fn hub_token(hub: &ClusterHandle, sa: &str, audience: &str) -> String {
    let client = hub.kube_client().await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client, "kleym");
    let _ = sas
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await;
    hub.issue_sa_token(
        "kleym",
        sa,
        &[audience.to_string()],
        Duration::from_secs(600),
        None,
    )
    .await
    .unwrap()
}

async fn whoami(cluster: &ClusterHandle, token: &str) -> Option<String> {
    let reviews: Api<TokenReview> = Api::all(cluster.kube_client().await.unwrap());
    let review = reviews
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let status = review.status.unwrap_or_default();
    status
        .authenticated
        .unwrap_or(false)
        .then(|| status.user.and_then(|u| u.username).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoke_trusts_the_issuer_of_its_authentication_configuration() {
    let sim = Kubesim::start(&["hub", "spoke-a", "spoke-b"], KubesimOptions::default())
        .await
        .unwrap();
    let (hub, a, b) = (
        sim.cluster("hub").unwrap(),
        sim.cluster("spoke-a").unwrap(),
        sim.cluster("spoke-b").unwrap(),
    );
    let hub_client = hub.kube_client().await.unwrap();
    Api::<Namespace>::all(hub_client)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("kleym".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    a.set_authentication_config(&authn_config(&hub, &a.url()))
        .unwrap();
    b.set_authentication_config(&authn_config(&hub, &b.url()))
        .unwrap();

    let for_a = hub_token(&hub, "hub", &a.url()).await;
    assert_eq!(
        whoami(&a, &for_a).await.as_deref(),
        Some("kleym:system:serviceaccount:kleym:hub")
    );
    // Audience confinement: spoke B refuses the token minted for spoke A.
    assert_eq!(whoami(&b, &for_a).await, None);
    // The mapped user is authenticated (403 without RBAC, not 401).
    let as_hub = a.client_for_token(&for_a).await.unwrap();
    let err = Api::<Namespace>::all(as_hub)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );
    // The claim validation rule: another ServiceAccount of the hub is refused.
    let other = hub_token(&hub, "other", &a.url()).await;
    assert_eq!(whoami(&a, &other).await, None);

    // An invalid configuration is refused, named, and the previous one stays.
    let bad = authn_config(&hub, &a.url()).replace("prefix: \"kleym:\"", "");
    let err = a.set_authentication_config(&bad).unwrap_err().to_string();
    assert!(
        err.contains("jwt[0].claimMappings.username.prefix"),
        "{err}"
    );
    assert!(whoami(&a, &for_a).await.is_some());
    // Start-up from options refuses the same way.
    let mut options = KubesimOptions::default();
    options.authentication_configs.insert("x".into(), bad);
    let err = Kubesim::start(&["x"], options)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("prefix"), "{err}");
}

async fn client_with_cert(c: &ClusterHandle, cert_pem: String, key_pem: String) -> kube::Client {
    let yaml =
        c.kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::ClientCert { cert_pem, key_pem });
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_adds_a_certificate_authority() {
    let outside = kubesim_auth::pki::ClusterPki::generate("outside").unwrap();
    let stranger = kubesim_auth::pki::ClusterPki::generate("stranger").unwrap();
    let mut options = KubesimOptions::default();
    options
        .client_cas
        .insert("a".into(), outside.ca_cert_pem().to_string());
    let sim = Kubesim::start(&["a"], options).await.unwrap();
    let a = sim.cluster("a").unwrap();
    let groups = ["system:masters".to_string()];
    let (cert, key) = outside
        .issue_client_cert("hub", &groups, Duration::from_secs(600))
        .unwrap();
    Api::<Namespace>::all(client_with_cert(&a, cert, key).await)
        .list(&ListParams::default())
        .await
        .expect("a certificate of the added CA authenticates");
    let (cert, key) = stranger
        .issue_client_cert("hub", &groups, Duration::from_secs(600))
        .unwrap();
    let refused = Api::<Namespace>::all(client_with_cert(&a, cert, key).await)
        .list(&ListParams::default())
        .await;
    assert!(refused.is_err(), "a certificate of another CA is refused");
}

/// A kube client from a kubeconfig file the `kubesim` command wrote.
async fn client_from_file(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The `kubesim` command: `--authentication-config` refuses a bad file at start-up naming the
/// field, and reloads a changed file, keeping the previous configuration when the new one is
/// invalid (as kube-apiserver does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubesim_command_loads_and_reloads_the_authentication_config() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    // Refused at start-up, field named.
    std::fs::write(
        &file,
        "apiVersion: apiserver.config.k8s.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n  - issuer: {url: 'http://x', audiences: [a]}\n    claimMappings: {username: {claim: sub, prefix: ''}}\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .args(["--clusters", "hub,spoke", "--state-dir"])
        .arg(dir.path().join("refused"))
        .arg("--authentication-config")
        .arg(format!("spoke={}", file.display()))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("jwt[0].issuer.url"), "{err}");

    // Start with a valid file trusting nobody we know yet.
    let unrelated = kubesim_auth::pki::ClusterPki::generate("unrelated").unwrap();
    let placeholder = authn_yaml(
        "https://nobody.example",
        unrelated.ca_cert_pem(),
        "https://spoke",
    );
    std::fs::write(&file, placeholder).unwrap();
    let state = dir.path().join("state");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .args(["--clusters", "hub,spoke", "--state-dir"])
        .arg(&state)
        .arg("--authentication-config")
        .arg(format!("spoke={}", file.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // kubesim's log lines (warnings and errors), as they come.
    let (log_tx, mut log_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            if log_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
        .await
        .expect("ready in time")
        .unwrap();
    assert_eq!(ready.as_deref(), Some("ready"));

    // Trust the hub cluster's ServiceAccount issuer: the file changes, kubesim reloads it.
    let read = |c: &str, f: &str| std::fs::read_to_string(state.join(c).join(f)).unwrap();
    let (hub_url, hub_ca, spoke_url) = (
        read("hub", "server"),
        read("hub", "ca.crt"),
        read("spoke", "server"),
    );
    std::fs::write(&file, authn_yaml(hub_url.trim(), &hub_ca, spoke_url.trim())).unwrap();
    let hub = client_from_file(&state.join("hub").join("kubeconfig")).await;
    let spoke = client_from_file(&state.join("spoke").join("kubeconfig")).await;
    Api::<ServiceAccount>::namespaced(hub.clone(), "default")
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("probe".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [spoke_url.trim()], "expirationSeconds": 3600},
        }))
        .unwrap();
    let issued: k8s_openapi::api::authentication::v1::TokenRequest =
        Api::<ServiceAccount>::namespaced(hub, "default")
            .create_subresource("token", "probe", &PostParams::default(), &request)
            .await
            .unwrap();
    let token = issued.status.unwrap().token;
    let review = |spoke: kube::Client, token: String| async move {
        let r = Api::<TokenReview>::all(spoke)
            .create(
                &PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: Some(token),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        r.status.and_then(|s| {
            s.authenticated
                .unwrap_or(false)
                .then_some(s.user?.username?)
        })
    };
    // kubesim reads the file once a second; the first review after the reload fetches the
    // hub's discovery document and keys. A deadline, not a count of tries: on a loaded
    // machine each review takes longer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut user = None;
    while tokio::time::Instant::now() < deadline {
        user = review(spoke.clone(), token.clone()).await;
        if user.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if user.is_none() {
        let mut logged = Vec::new();
        while let Ok(line) = log_rx.try_recv() {
            logged.push(line);
        }
        panic!(
            "the reloaded configuration never authenticated the token; kubesim logged: {logged:#?}"
        );
    }
    assert_eq!(
        user.as_deref(),
        Some("kleym:system:serviceaccount:default:probe")
    );

    // An invalid new file is refused; the previous configuration stays in force.
    std::fs::write(&file, "apiVersion: apiserver.config.k8s.io/v1beta1\nkind: AuthenticationConfiguration\njwt: [{issuer: {url: 'http://x'}}]\n").unwrap();
    // Seen, not waited for: kubesim read the new file and logged that it keeps the previous
    // configuration.
    let refused_line = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = log_rx.recv().await {
            if line.contains("invalid authentication configuration") {
                return Some(line);
            }
        }
        None
    })
    .await
    .expect("kubesim logged the refused file in time")
    .expect("kubesim's log ended before it refused the file");
    assert!(
        refused_line.contains("keeping the previous one"),
        "{refused_line}"
    );
    assert!(review(spoke.clone(), token.clone()).await.is_some());
    // And the file is still watched: a valid file that no longer trusts the hub takes effect.
    let unrelated_again = authn_yaml(
        "https://nobody.example",
        unrelated.ca_cert_pem(),
        "https://spoke",
    );
    std::fs::write(&file, unrelated_again).unwrap();
    let mut refused = false;
    for _ in 0..100 {
        if review(spoke.clone(), token.clone()).await.is_none() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused,
        "the reloaded configuration no longer trusts the hub"
    );
    child.kill().await.unwrap();
}

fn authn_yaml(url: &str, ca: &str, audience: &str) -> String {
    serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{"issuer": {"url": url, "audiences": [audience], "certificateAuthority": ca},
                 "claimMappings": {"username": {"claim": "sub", "prefix": "kleym:"}}}],
    })
    .to_string()
}
