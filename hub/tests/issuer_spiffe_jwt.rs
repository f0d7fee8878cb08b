//! The hub as an issuer against kubesim: the issuer Secret is created once and
//! reused, a malformed one is refused and left alone; the discovery listener serves what
//! kube-apiserver's structured authentication fetches; `kleym credential spiffe-jwt`, run
//! through the hub's exec runtime, mints a JWT-SVID that the spoke it names accepts as the
//! mapped user and that another spoke refuses.

use crate::https_get;
use crate::hub_sim;
use https_get::https_get;

use kleym_test_support::authn::whoami;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kleym_hub::access::audience::derived_audience;
use kleym_hub::access::{ClusterAccess, EffectiveAccess, ExecApiVersion, ExecConfig};
use kleym_hub::credentials::{ExecOptions, run_plugin};
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::secret::{SecretRef, load_or_create};
use kleym_hub::issuer::serve::{CACHE_CONTROL, IssuerDocuments, router};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};

const HUB_ID: &str = "spiffe://example.org/kleym/hub";

fn secret_ref(name: &str) -> SecretRef {
    SecretRef {
        namespace: "kleym".into(),
        name: name.into(),
    }
}

/// A CA and a serving certificate for 127.0.0.1, written to `dir`: (CA PEM, cert, key).
fn tls_files(dir: &std::path::Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(vec!["issuer-ca".to_string()]).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (c, k) = (dir.join("issuer.crt"), dir.join("issuer.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (ca.pem(), c, k)
}

/// Serves `docs` over TLS on 127.0.0.1; returns the issuer URL.
async fn serve_issuer(
    docs: IssuerDocuments,
    listener: tokio::net::TcpListener,
    cert: &std::path::Path,
    key: &std::path::Path,
    stop: CancellationToken,
) {
    let tls = kleym_hub::http::load_tls_config(cert, key).unwrap();
    tokio::spawn(kleym_hub::http::serve(
        listener,
        router(docs),
        Some(tls),
        async move { stop.cancelled().await },
    ));
}

fn authn_config(issuer: &str, ca_pem: &str, audience: &str) -> String {
    serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {"url": issuer, "audiences": [audience], "certificateAuthority": ca_pem},
            "claimValidationRules": [{"expression": format!("claims.sub == '{HUB_ID}'"), "message": "sub must be the hub"}],
            "claimMappings": {"username": {"claim": "sub", "prefix": "kleym:"}},
            "userValidationRules": [{"expression": "!user.username.startsWith('system:')", "message": "no system users"}],
        }],
    })
    .to_string()
}

/// The access the hub would use for ClusterProfile `fleet/<profile>` at `server`.
fn access(profile: &str, server: &str, args: Vec<String>) -> EffectiveAccess {
    EffectiveAccess {
        spoke: format!("fleet/{profile}"),
        provider: "kleym-spiffe-jwt".into(),
        cluster: ClusterAccess {
            server: server.into(),
            certificate_authority_pem: None,
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            proxy_url: None,
            disable_compression: false,
            exec_extension: None,
        },
        exec: ExecConfig {
            api_version: ExecApiVersion::V1,
            command: env!("CARGO_BIN_EXE_kleym").into(),
            args,
            env: vec![],
            provide_cluster_info: true,
            install_hint: None,
        },
        audience: derived_audience("fleet", profile),
    }
}

/// [`whoami`], retried for a few seconds until authenticated: a spoke refetches the JWKS for
/// an unknown kid at most every 200 ms (kubesim's interval), as kube-apiserver rate-limits it.
async fn whoami_eventually(cluster: &ClusterHandle, token: &str) -> Option<String> {
    for _ in 0..50 {
        if let Some(u) = whoami(cluster, token).await {
            return Some(u);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_jwt_reaches_the_spoke_it_names_and_no_other() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = secret_ref("issuer");
    let ring = load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    // Created once: a second start (another replica, a restart) reads the same key.
    let again = load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    assert_eq!(
        ring.signing(now).unwrap().kid(),
        again.signing(now).unwrap().kid()
    );
    assert_eq!(again.entries().len(), 1);
    // Two replicas publish identical documents.
    assert_eq!(
        IssuerDocuments::from_ring("https://x.example", &ring).jwks_json(),
        IssuerDocuments::from_ring("https://x.example", &again).jwks_json()
    );

    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = tls_files(dir.path());
    let client = client.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer_url = format!("https://{}", listener.local_addr().unwrap());
    let docs = IssuerDocuments::from_ring(&issuer_url, &ring);
    let stop = CancellationToken::new();
    serve_issuer(docs.clone(), listener, &cert, &key, stop.clone()).await;

    // The discovery document as verifiers read it, with Cache-Control.
    let https = https_get(&issuer_url, "/.well-known/openid-configuration", &ca_pem).await;
    assert_eq!(https.0.as_deref(), Some(CACHE_CONTROL));
    let discovery: serde_json::Value = serde_json::from_str(&https.1).unwrap();
    assert_eq!(discovery["issuer"], issuer_url.as_str());
    assert_eq!(
        discovery["jwks_uri"],
        format!("{issuer_url}/openid/v1/jwks")
    );

    let spokes = Kubesim::start(&["spoke-a", "spoke-b"], KubesimOptions::default())
        .await
        .unwrap();
    let (a, b) = (
        spokes.cluster("spoke-a").unwrap(),
        spokes.cluster("spoke-b").unwrap(),
    );
    for s in [&a, &b] {
        let audience = derived_audience("fleet", s.name());
        s.set_authentication_config(&authn_config(&issuer_url, &ca_pem, &audience))
            .unwrap();
    }

    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let args = vec![
        "credential".to_string(),
        "spiffe-jwt".into(),
        "--issuer-url".into(),
        issuer_url.clone(),
        "--issuer-key-secret".into(),
        "kleym/issuer".into(),
        "--trust-domain".into(),
        "example.org".into(),
        "--kubeconfig".into(),
        kc.display().to_string(),
    ];
    let opts = ExecOptions {
        timeout: Duration::from_secs(30),
        ..ExecOptions::default()
    };
    let credential = run_plugin(&access(a.name(), &a.url(), args.clone()), &opts)
        .await
        .unwrap();
    let expires = credential.expires_at.expect("an expiry");
    let lifetime = expires - chrono::Utc::now();
    assert!(lifetime <= chrono::Duration::minutes(10), "{lifetime}");
    let token = credential.token.unwrap().expose().to_string();
    assert_eq!(
        whoami(&a, &token).await.as_deref(),
        Some(format!("kleym:{HUB_ID}").as_str())
    );
    // Audience confinement.
    assert_eq!(whoami(&b, &token).await, None);
    // And spoke B accepts its own.
    let for_b = run_plugin(&access(b.name(), &b.url(), args.clone()), &opts)
        .await
        .unwrap();
    assert!(whoami(&b, for_b.token.unwrap().expose()).await.is_some());

    // `kleym issuer rotate`: the plugin signs with a new key at once; once the listener
    // publishes it, the spoke refetches on the unknown kid and accepts it; the old token stays
    // valid (the old key is retiring, still published).
    let old_kid = ring.signing(now).unwrap().kid().to_string();
    let rotate = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
            .args(["issuer", "rotate", "--kubeconfig", kc.to_str().unwrap()])
            .args(["--issuer-key-secret", "kleym/issuer"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let said = rotate(&[]);
    assert!(said.contains(&old_kid), "{said}");
    let reread = |client: kube::Client| async move {
        load_or_create(client, &secret_ref("issuer"), Algorithm::Es256, false)
            .await
            .unwrap()
    };
    docs.update_from_ring(&reread(client.clone()).await);
    assert_eq!(docs.kids().len(), 2);
    assert!(docs.kids().contains(&old_kid));
    let after = run_plugin(&access(a.name(), &a.url(), args.clone()), &opts)
        .await
        .unwrap();
    let after = after.token.unwrap().expose().to_string();
    assert!(!after.is_empty());
    assert_eq!(
        whoami_eventually(&a, &after).await.as_deref(),
        Some(format!("kleym:{HUB_ID}").as_str())
    );
    assert!(
        whoami(&a, &token).await.is_some(),
        "the retiring key still verifies"
    );

    // --revoke-old: only the newest key is published; a token of the revoked keys fails once
    // the spoke refetched the JWKS (here: on the next unknown kid).
    rotate(&["--revoke-old"]);
    docs.update_from_ring(&reread(client.clone()).await);
    assert_eq!(docs.kids().len(), 1);
    let newest = run_plugin(&access(a.name(), &a.url(), args), &opts)
        .await
        .unwrap();
    let newest = newest.token.unwrap().expose().to_string();
    assert!(whoami_eventually(&a, &newest).await.is_some());
    assert_eq!(
        whoami(&a, &token).await,
        None,
        "revoked key's token refused"
    );
    assert_eq!(
        whoami(&a, &after).await,
        None,
        "revoked key's token refused"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_or_foreign_secret_is_refused_and_left_alone() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kleym");
    for (name, data) in [
        (
            "garbage",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ),
        ("empty", ""),
    ] {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "kleym"},
            "stringData": {"signing-keys.pem": data},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        let before = secrets.get(name).await.unwrap();
        let err = load_or_create(client.clone(), &secret_ref(name), Algorithm::Es256, true)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("kleym/{name}")), "{err}");
        assert!(err.contains("signing-keys.pem"), "{err}");
        let after = secrets.get(name).await.unwrap();
        assert_eq!(
            before.metadata.resource_version, after.metadata.resource_version,
            "never overwritten"
        );
    }
    // A Secret without the data key is refused too, and RS256 is never generated.
    let err = load_or_create(
        client.clone(),
        &secret_ref("absent"),
        Algorithm::Rs256,
        true,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("RS256"), "{err}");
    assert!(secrets.get_opt("absent").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_rotation_step_writes_the_secret_once() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = secret_ref("rotating");
    load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    // A policy whose period is already over: one new key is published ahead.
    let policy = kleym_hub::issuer::rotation::RotationPolicy {
        period_seconds: 3600,
        publish_ahead_seconds: 3600,
        retire_after_seconds: 1200,
    };
    let step = |client: kube::Client| {
        let at = at.clone();
        async move {
            kleym_hub::issuer::serve::rotate_once(client, &at, Algorithm::Es256, &policy)
                .await
                .unwrap()
        }
    };
    assert!(step(client.clone()).await);
    // A second step (another period, a restarted leader) adds nothing.
    assert!(!step(client.clone()).await);
    let ring = load_or_create(client, &at, Algorithm::Es256, false)
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    assert_eq!(ring.entries().len(), 2);
    assert_eq!(ring.published(now).len(), 2, "published ahead");
    assert_eq!(
        ring.signing(now).unwrap().kid(),
        ring.entries()[0].key.kid(),
        "the new key does not sign yet"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_are_published_to_a_configmap_when_they_change() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kleym_hub::issuer::serve::{CONFIGMAP_JWKS_KEY, publish_configmap};
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let ring = load_or_create(
        client.clone(),
        &secret_ref("issuer"),
        Algorithm::Es256,
        true,
    )
    .await
    .unwrap();
    let docs = IssuerDocuments::from_ring("https://issuer.example.org", &ring);
    let cm = secret_ref("issuer-documents");
    assert!(publish_configmap(client.clone(), &cm, &docs).await.unwrap());
    // Unchanged: no write.
    assert!(!publish_configmap(client.clone(), &cm, &docs).await.unwrap());
    let got = Api::<ConfigMap>::namespaced(client.clone(), "kleym")
        .get("issuer-documents")
        .await
        .unwrap();
    let data = got.data.unwrap();
    assert_eq!(data[CONFIGMAP_JWKS_KEY], docs.jwks_json());
    let discovery: serde_json::Value =
        serde_json::from_str(&data["openid-configuration.json"]).unwrap();
    assert_eq!(discovery["issuer"], "https://issuer.example.org");
    // A new key changes the documents: written again.
    let (secret, mut ring) =
        kleym_hub::issuer::secret::read(client.clone(), &secret_ref("issuer"), Algorithm::Es256)
            .await
            .unwrap();
    ring.rotate_now(chrono::Utc::now().timestamp(), &Default::default(), false)
        .unwrap();
    kleym_hub::issuer::secret::write(client.clone(), &secret_ref("issuer"), secret, &ring)
        .await
        .unwrap();
    docs.update_from_ring(&ring);
    assert!(publish_configmap(client.clone(), &cm, &docs).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_x509_authenticates_as_the_mapped_user_on_a_spoke_trusting_the_hub_ca() {
    use k8s_openapi::api::core::v1::Namespace;
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    // The hub with --issuer-x509 keeps the CA in a Secret of its own.
    let ring = kleym_hub::issuer::ca::load_or_create(
        client.clone(),
        &secret_ref("issuer-x509-ca"),
        &secret_ref("issuer"),
        true,
    )
    .await
    .unwrap();
    let ca = ring.ca().cert_pem.clone();
    let mut options = KubesimOptions::default();
    options.client_cas.insert("spoke".into(), ca);
    let spokes = Kubesim::start(&["spoke"], options).await.unwrap();
    let spoke = spokes.cluster("spoke").unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let exec_info = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {"server": spoke.url()}},
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args([
            "credential",
            "spiffe-x509",
            "--issuer-x509-ca-secret",
            "kleym/issuer-x509-ca",
        ])
        .args([
            "--trust-domain",
            "example.org",
            "--kubeconfig",
            kc.to_str().unwrap(),
        ])
        .env("KUBERNETES_EXEC_INFO", exec_info.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cred: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cert_pem = cred["status"]["clientCertificateData"]
        .as_str()
        .unwrap()
        .to_string();
    let key_pem = cred["status"]["clientKeyData"]
        .as_str()
        .unwrap()
        .to_string();
    let yaml = spoke
        .kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::ClientCert { cert_pem, key_pem });
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let as_hub = kube::Client::try_from(config).unwrap();
    let user = format!("kleym:{HUB_ID}");
    // Authenticated as the mapped user, not yet authorized.
    let err = Api::<Namespace>::all(as_hub.clone())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403 && s.message.contains(&user)),
        "{err:?}"
    );
    // The ClusterRoleBinding of that user authorizes it.
    let admin = spoke.kube_client().await.unwrap();
    let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kleym-hub"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    let mut ok = false;
    for _ in 0..50 {
        if Api::<Namespace>::all(as_hub.clone())
            .list(&Default::default())
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the bound user lists namespaces");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_rotating_at_once_add_one_key_not_two() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = secret_ref("contended");
    load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    let policy = kleym_hub::issuer::rotation::RotationPolicy {
        period_seconds: 3600,
        publish_ahead_seconds: 3600,
        retire_after_seconds: 1200,
    };
    // An old leader and a new one both take a step on the same Secret version.
    let (a, b) = tokio::join!(
        kleym_hub::issuer::serve::rotate_once(client.clone(), &at, Algorithm::Es256, &policy),
        kleym_hub::issuer::serve::rotate_once(client.clone(), &at, Algorithm::Es256, &policy),
    );
    let wrote = [&a, &b].iter().filter(|r| matches!(r, Ok(true))).count();
    assert!(wrote >= 1, "{a:?} {b:?}");
    let ring = load_or_create(client, &at, Algorithm::Es256, false)
        .await
        .unwrap();
    assert_eq!(
        ring.entries().len(),
        2,
        "exactly one key added ({a:?} {b:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_cluster_issuer_mirrors_the_hub_clusters_documents() {
    use kleym_hub::issuer::MirrorSettings;
    use kleym_hub::issuer::serve::{fetch_cluster_issuer, start_mirror};
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.kube_client().await.unwrap();
    // The issuer-field constraint: a different --issuer-url is refused, both named.
    let err = fetch_cluster_issuer(&client, "https://kleym-mirror.example")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("https://kleym-mirror.example") && err.contains(&hub.cluster.url()),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (mirror_ca, cert, key) = tls_files(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mirror_url = format!("https://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let settings = MirrorSettings {
        url: hub.cluster.url(),
        listen_addr: listener.local_addr().unwrap(),
        tls: Some((cert, key)),
        refresh_period: Duration::from_millis(100),
    };
    start_mirror(&settings, listener, client.clone(), stop.clone())
        .await
        .unwrap();
    let (cc, body) = https_get(&mirror_url, "/.well-known/openid-configuration", &mirror_ca).await;
    assert_eq!(cc.as_deref(), Some(CACHE_CONTROL));
    let (discovery, jwks) = fetch_cluster_issuer(&client, &hub.cluster.url())
        .await
        .unwrap();
    assert_eq!(body, discovery, "served verbatim");
    let (_, served_jwks) = https_get(&mirror_url, "/openid/v1/jwks", &mirror_ca).await;
    assert_eq!(served_jwks, jwks);

    // A spoke verifying the hub cluster's ServiceAccount tokens through the mirror's discovery.
    let spokes = Kubesim::start(&["spoke"], KubesimOptions::default())
        .await
        .unwrap();
    let spoke = spokes.cluster("spoke").unwrap();
    spoke
        .set_authentication_config(
            &serde_json::json!({
                "apiVersion": "apiserver.config.k8s.io/v1beta1",
                "kind": "AuthenticationConfiguration",
                "jwt": [{"issuer": {
                            "url": hub.cluster.url(),
                            "discoveryURL": format!("{mirror_url}/.well-known/openid-configuration"),
                            "audiences": [spoke.url()],
                            "certificateAuthority": format!("{mirror_ca}{}", hub.cluster.ca_pem())},
                         "claimMappings": {"username": {"claim": "sub", "prefix": "kleym:"}}}],
            })
            .to_string(),
        )
        .unwrap();
    let token = hub
        .cluster
        .issue_sa_token(
            "kleym",
            "hub",
            &[spoke.url()],
            Duration::from_secs(600),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        whoami(&spoke, &token).await.as_deref(),
        Some("kleym:system:serviceaccount:kleym:hub")
    );
    stop.cancel();
}
