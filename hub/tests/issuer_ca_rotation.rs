//! The hub's X.509-SVID CA against kubesim, through the real `kleym issuer rotate-ca` and
//! `kleym credential spiffe-x509`:
//!
//! - it lives in a Secret of its own, apart from the JWT signing keys, and exists only when
//!   X.509 is enabled;
//! - a key Secret written before the split (the CA inside) keeps its CA untouched until X.509
//!   is enabled, then the CA moves, byte for byte, and spokes trusting it keep accepting the
//!   hub's certificates, also from a plugin still given the old `--issuer-key-secret` flag;
//! - it rotates with an overlap: after the first step the bundle spokes trust
//!   (`x509-ca-bundle.crt`) holds the current and the next CA while the current one keeps
//!   signing; after `--finish` the new CA signs and the replaced one stays in the bundle, so
//!   a spoke given the bundle accepts SVIDs of both CAs throughout, while a spoke that never
//!   got the new bundle refuses the new CA's SVIDs.

use crate::hub_sim;

use std::path::Path;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kleym_hub::issuer::IssuerSettings;
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::metrics::IssuerMetrics;
use kleym_hub::issuer::rotation::KeyRing;
use kleym_hub::issuer::secret::{SecretRef, load_or_create};
use kleym_hub::issuer::x509::{CA_BUNDLE_KEY, CA_CERT_KEY, CA_KEY_KEY, HubCa};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};

const USER: &str = "kleym:spiffe://example.org/kleym/hub";

/// Runs the kleym binary; panics with its stderr on failure; returns stdout.
fn kleym(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kleym {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// An X.509-SVID for `spoke` from `kleym credential spiffe-x509`: (certificate, key) PEM.
fn svid(kc: &Path, spoke: &ClusterHandle) -> (String, String) {
    svid_with(
        kc,
        spoke,
        &["--issuer-x509-ca-secret", "kleym/issuer-x509-ca"],
    )
}

/// As [`svid`], with `secret_flags` naming the CA Secret.
fn svid_with(kc: &Path, spoke: &ClusterHandle, secret_flags: &[&str]) -> (String, String) {
    let exec_info = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {"server": spoke.url()}},
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(["credential", "spiffe-x509"])
        .args(secret_flags)
        .args(["--trust-domain", "example.org", "--kubeconfig"])
        .arg(kc)
        .env("KUBERNETES_EXEC_INFO", exec_info.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cred: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let field = |k: &str| cred["status"][k].as_str().unwrap().to_string();
    (field("clientCertificateData"), field("clientKeyData"))
}

/// Whether `spoke` authenticates the SVID as the mapped user (a 403 naming the user: no RBAC
/// is granted here) rather than refusing it (401, or a refused TLS handshake).
async fn authenticated(spoke: &ClusterHandle, (cert_pem, key_pem): &(String, String)) -> bool {
    let yaml = spoke.kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::ClientCert {
        cert_pem: cert_pem.clone(),
        key_pem: key_pem.clone(),
    });
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    match Api::<Namespace>::all(client)
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert!(s.message.contains(USER), "{}", s.message);
            true
        }
        Ok(_) => panic!("no RBAC was granted"),
        Err(_) => false,
    }
}

async fn bundle(client: &kube::Client) -> String {
    String::from_utf8(
        data(client, "issuer-x509-ca").await[CA_BUNDLE_KEY]
            .0
            .clone(),
    )
    .unwrap()
}

/// The data of Secret `kleym/<name>`.
async fn data(client: &kube::Client, name: &str) -> BTreeMap<String, ByteString> {
    Api::<Secret>::namespaced(client.clone(), "kleym")
        .get(name)
        .await
        .unwrap()
        .data
        .unwrap_or_default()
}

async fn exists(client: &kube::Client, name: &str) -> bool {
    Api::<Secret>::namespaced(client.clone(), "kleym")
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

fn key_at() -> SecretRef {
    SecretRef {
        namespace: "kleym".into(),
        name: "issuer".into(),
    }
}

/// Starts the issuer as `kleym hub` does (`--issuer-x509` when `x509`), on a listener of
/// its own, until `stop`.
async fn start_issuer(client: &kube::Client, x509: bool, stop: &CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let settings = IssuerSettings {
        url: "https://issuer.example.org".into(),
        secret: key_at(),
        x509_ca_secret: x509.then(|| kleym_hub::issuer::ca::default_ca_secret(&key_at())),
        algorithm: Algorithm::Es256,
        listen_addr: listener.local_addr().unwrap(),
        tls: None,
        rotation: None,
        refresh_period: std::time::Duration::from_secs(3600),
        publish_configmap: None,
        metrics: IssuerMetrics::default(),
    };
    kleym_hub::issuer::serve::start(
        &settings,
        listener,
        client.clone(),
        Arc::new(|| true),
        stop.clone(),
    )
    .await
    .unwrap();
}

fn x509_data_keys(data: &BTreeMap<String, ByteString>) -> Vec<&String> {
    data.keys().filter(|k| k.starts_with("x509-ca")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_lives_in_its_own_secret_and_only_with_x509() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let stop = CancellationToken::new();
    // The key Secret the hub creates holds signing keys only.
    load_or_create(client.clone(), &key_at(), Algorithm::Es256, true)
        .await
        .unwrap();
    let keys = data(&client, "issuer").await;
    assert!(keys.contains_key(kleym_hub::issuer::SECRET_KEY));
    assert_eq!(
        x509_data_keys(&keys),
        Vec::<&String>::new(),
        "no CA beside the keys"
    );
    // Without --issuer-x509 the issuer makes no CA anywhere.
    start_issuer(&client, false, &stop).await;
    assert!(x509_data_keys(&data(&client, "issuer").await).is_empty());
    assert!(!exists(&client, "issuer-x509-ca").await, "no CA Secret");
    // With it, the CA gets a Secret of its own; the key Secret stays as it was.
    start_issuer(&client, true, &stop).await;
    let ca = data(&client, "issuer-x509-ca").await;
    assert!(ca.contains_key(CA_KEY_KEY) && ca.contains_key(CA_BUNDLE_KEY));
    assert!(
        !ca.contains_key(kleym_hub::issuer::SECRET_KEY),
        "no JWT key beside the CA"
    );
    assert_eq!(data(&client, "issuer").await, keys);
    let secret = Api::<Secret>::namespaced(client.clone(), "kleym")
        .get("issuer-x509-ca")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kleym.io/issuer-x509-ca"));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_in_an_older_key_secret_moves_out_and_spokes_keep_trusting_it() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let stop = CancellationToken::new();
    // A key Secret as older releases wrote it: keys and the CA together.
    let ring = KeyRing::generate(chrono::Utc::now().timestamp()).unwrap();
    let old_ca = HubCa::generate(chrono::Utc::now()).unwrap();
    let mut legacy = ring.to_data();
    for (k, v) in [
        (CA_CERT_KEY, old_ca.cert_pem.as_str()),
        (CA_KEY_KEY, old_ca.key_pem()),
        (CA_BUNDLE_KEY, old_ca.cert_pem.as_str()),
    ] {
        legacy.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("issuer".into()),
            namespace: Some("kleym".into()),
            ..Default::default()
        },
        data: Some(legacy.clone()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), "kleym")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // Without --issuer-x509 nothing moves and nothing is lost.
    start_issuer(&client, false, &stop).await;
    assert_eq!(data(&client, "issuer").await, legacy);
    assert!(!exists(&client, "issuer-x509-ca").await);

    // With it, the CA moves byte for byte; the signing keys stay.
    start_issuer(&client, true, &stop).await;
    let ca = data(&client, "issuer-x509-ca").await;
    assert_eq!(ca[CA_CERT_KEY], legacy[CA_CERT_KEY]);
    assert_eq!(ca[CA_KEY_KEY], legacy[CA_KEY_KEY]);
    let keys = data(&client, "issuer").await;
    assert!(x509_data_keys(&keys).is_empty(), "{:?}", keys.keys());
    let sk = kleym_hub::issuer::SECRET_KEY;
    assert_eq!(keys[sk], legacy[sk]);
    // A restart finds it moved and changes nothing.
    start_issuer(&client, true, &stop).await;
    assert_eq!(data(&client, "issuer-x509-ca").await, ca);

    // A spoke trusting the old CA accepts the hub's certificate, from a provider entry still
    // written with the old flag as from one with the new flag.
    let mut options = KubesimOptions::default();
    options
        .client_cas
        .insert("spoke".into(), old_ca.cert_pem.clone());
    let spokes = Kubesim::start(&["spoke"], options).await.unwrap();
    let spoke = spokes.cluster("spoke").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let old_flag = svid_with(&kc, &spoke, &["--issuer-key-secret", "kleym/issuer"]);
    assert!(authenticated(&spoke, &old_flag).await, "old flag");
    assert!(authenticated(&spoke, &svid(&kc, &spoke)).await, "new flag");
    stop.cancel();
}

fn count(bundle: &str) -> usize {
    bundle.matches("-----BEGIN CERTIFICATE-----").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_rotates_with_both_cas_trusted_throughout() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let ca_at = kleym_hub::issuer::ca::default_ca_secret(&key_at());
    let ring = kleym_hub::issuer::ca::load_or_create(client.clone(), &ca_at, &key_at(), true)
        .await
        .unwrap();
    let old_ca = ring.ca().cert_pem.clone();
    assert_eq!(count(&bundle(&client).await), 1);
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let kc_s = kc.to_str().unwrap();
    let rotate = |finish: bool| {
        let mut args = vec![
            "issuer",
            "rotate-ca",
            "--issuer-x509-ca-secret",
            "kleym/issuer-x509-ca",
            "--kubeconfig",
            kc_s,
        ];
        if finish {
            args.push("--finish");
        }
        kleym(&args)
    };
    let finish_early = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(["issuer", "rotate-ca", "--issuer-key-secret", "kleym/issuer"])
        .args(["--kubeconfig", kc_s, "--finish"])
        .output()
        .unwrap();
    assert!(
        !finish_early.status.success(),
        "--finish with nothing begun"
    );
    assert!(
        String::from_utf8_lossy(&finish_early.stderr).contains("kleym/issuer-x509-ca"),
        "the error names the CA Secret"
    );

    // Step 1: the bundle holds both CAs; spokes get it (here: at start).
    assert!(rotate(false).contains(CA_BUNDLE_KEY));
    let during = bundle(&client).await;
    assert_eq!(count(&during), 2);
    let mut options = KubesimOptions::default();
    options.client_cas.insert("updated".into(), during.clone());
    options.client_cas.insert("stale".into(), old_ca.clone());
    let spokes = Kubesim::start(&["updated", "stale"], options)
        .await
        .unwrap();
    let updated = spokes.cluster("updated").unwrap();
    let stale = spokes.cluster("stale").unwrap();
    let old_svid = svid(&kc, &updated);
    assert!(authenticated(&updated, &old_svid).await, "old CA trusted");
    assert!(
        authenticated(&stale, &svid(&kc, &stale)).await,
        "old CA still signs"
    );

    // Step 2: the new CA signs; the old one stays in the bundle for the overlap.
    rotate(true);
    let after = bundle(&client).await;
    assert_eq!(count(&after), 2);
    assert_eq!(
        kleym_hub::issuer::ca::CaRing::from_data(
            &data(&client, "issuer-x509-ca").await,
            None,
            "issuer-x509-ca"
        )
        .unwrap()
        .previous_cas()[0]
            .cert,
        old_ca
    );
    let new_svid = svid(&kc, &updated);
    assert_ne!(new_svid.0, old_svid.0);
    assert!(authenticated(&updated, &new_svid).await, "new CA trusted");
    assert!(
        authenticated(&updated, &old_svid).await,
        "the old CA's SVID still works during the overlap"
    );
    // A spoke that never got the new bundle refuses the new CA's SVIDs.
    assert!(!authenticated(&stale, &svid(&kc, &stale)).await);
    // A second --finish has nothing to finish.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(["issuer", "rotate-ca", "--issuer-key-secret", "kleym/issuer"])
        .args(["--kubeconfig", kc_s, "--finish"])
        .output()
        .unwrap();
    assert!(!again.status.success());
}
