//! The issuer fails closed against kubesim: when a replica can no longer read its key Secret
//! (deleted, or made unreadable), it is not ready and still stops publishing every key whose
//! retirement time has passed, so a retired or revoked key never stays in the JWKS because
//! the Secret became unreadable; and `kleym issuer rotate` refuses, before writing anything,
//! a flag combination that would leave the hub unable to read the Secret.

use crate::hub_sim;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kleym_hub::issuer::IssuerSettings;
use kleym_hub::issuer::JWKS_PATH;
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::metrics::IssuerMetrics;
use kleym_hub::issuer::rotation::{KeyRing, RotationPolicy};
use kleym_hub::issuer::secret::SecretRef;
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

/// The `kid`s of the JWKS served at `base`.
async fn served_kids(base: &str) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET {JWKS_PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let jwks: serde_json::Value = serde_json::from_str(body).unwrap();
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_secret_makes_the_replica_unready_and_retired_keys_still_leave() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = SecretRef {
        namespace: "kleym".into(),
        name: "issuer".into(),
    };
    // Key A signed until now and retires in 3 s; key B signs from now.
    let now = chrono::Utc::now().timestamp();
    let mut ring = KeyRing::generate(now - 600).unwrap();
    let kid_a = ring.entries()[0].key.kid().to_string();
    let policy = RotationPolicy {
        retire_after_seconds: 3,
        ..RotationPolicy::default()
    };
    let kid_b = ring.rotate_now(now, &policy, false).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kleym");
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("issuer".into()),
                    ..Default::default()
                },
                data: Some(ring.to_data()),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let settings = IssuerSettings {
        url: base.clone(),
        secret: at.clone(),
        x509_ca_secret: None,
        algorithm: Algorithm::Es256,
        listen_addr: listener.local_addr().unwrap(),
        tls: None,
        // No leader step: only the refresh of every replica is under test.
        rotation: None,
        refresh_period: Duration::from_millis(100),
        publish_configmap: None,
        metrics: IssuerMetrics::default(),
    };
    let stop = CancellationToken::new();
    let (docs, _task) = kleym_hub::issuer::serve::start(
        &settings,
        listener,
        client.clone(),
        Arc::new(|| false),
        stop.clone(),
    )
    .await
    .unwrap();
    let mut both = served_kids(&base).await;
    both.sort();
    let mut want = vec![kid_a.clone(), kid_b.clone()];
    want.sort();
    assert_eq!(both, want, "both keys published while A retires");
    assert_eq!(docs.refresh_error(), None);

    // The Secret goes away (deleted by mistake, or RBAC revoked).
    secrets
        .delete("issuer", &DeleteParams::default())
        .await
        .unwrap();
    // The next refresh fails: the replica says it is not ready, naming the Secret.
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        if let Some(e) = docs.refresh_error() {
            break e;
        }
        assert!(Instant::now() < deadline, "the refresh never failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(error.contains("kleym/issuer"), "{error}");
    // Key A still leaves the JWKS once its retirement time has passed; B stays.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kids = served_kids(&base).await;
        if !kids.contains(&kid_a) {
            assert_eq!(kids, vec![kid_b.clone()]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "retired key {kid_a} still published: {kids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        chrono::Utc::now().timestamp() >= now + 3,
        "not before it retired"
    );
    assert!(docs.refresh_error().is_some(), "still not ready");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_refuses_rs256_before_writing_anything() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let at = SecretRef {
        namespace: "kleym".into(),
        name: "issuer".into(),
    };
    kleym_hub::issuer::secret::load_or_create(client.clone(), &at, Algorithm::Es256, true)
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kleym");
    let before = secrets.get("issuer").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
    for extra in [&["--revoke-old"][..], &[][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
            .args(["issuer", "rotate", "--issuer-key-secret", "kleym/issuer"])
            .args(["--issuer-key-algorithm", "RS256"])
            .args(extra)
            .arg("--kubeconfig")
            .arg(&kc)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}: refused");
        assert!(
            stderr.contains("--issuer-key-algorithm RS256")
                && stderr.contains("ES256 keys only")
                && stderr.contains("kleym/issuer"),
            "{stderr}"
        );
        for flag in extra {
            assert!(stderr.contains(flag), "names {flag}: {stderr}");
        }
    }
    let after = secrets.get("issuer").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "nothing written"
    );
}
