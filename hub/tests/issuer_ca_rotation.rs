//! The hub's X.509-SVID CA rotates with an overlap, through the real
//! `kleym issuer rotate-ca` and `kleym credential spiffe-x509` against kubesim: after the
//! first step the bundle spokes trust (`x509-ca-bundle.crt`) holds the current and the next
//! CA while the current one keeps signing; after `--finish` the new CA signs and the replaced
//! one stays in the bundle, so a spoke given the bundle accepts SVIDs of both CAs throughout,
//! while a spoke that never got the new bundle refuses the new CA's SVIDs.

#[path = "fixtures/hub_sim.rs"]
mod hub_sim;

use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::secret::{SecretRef, load_or_create};
use kleym_hub::issuer::x509::CA_BUNDLE_KEY;
use kube::api::Api;
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
    let exec_info = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {"server": spoke.url()}},
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args([
            "credential",
            "spiffe-x509",
            "--issuer-key-secret",
            "kleym/issuer",
        ])
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
    let s = Api::<Secret>::namespaced(client.clone(), "kleym")
        .get("issuer")
        .await
        .unwrap();
    String::from_utf8(s.data.unwrap()[CA_BUNDLE_KEY].0.clone()).unwrap()
}

fn count(bundle: &str) -> usize {
    bundle.matches("-----BEGIN CERTIFICATE-----").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_rotates_with_both_cas_trusted_throughout() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = SecretRef {
        namespace: "kleym".into(),
        name: "issuer".into(),
    };
    let ring = load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    let old_ca = ring.ca().unwrap().cert_pem.clone();
    assert_eq!(count(&bundle(&client).await), 1);
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    let kc_s = kc.to_str().unwrap();
    let rotate = |finish: bool| {
        let mut args = vec![
            "issuer",
            "rotate-ca",
            "--issuer-key-secret",
            "kleym/issuer",
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
        String::from_utf8_lossy(&finish_early.stderr).contains("kleym/issuer"),
        "the error names the Secret"
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
        kleym_hub::issuer::rotation::KeyRing::from_data(
            &Api::<Secret>::namespaced(client.clone(), "kleym")
                .get("issuer")
                .await
                .unwrap()
                .data
                .unwrap(),
            "issuer"
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
