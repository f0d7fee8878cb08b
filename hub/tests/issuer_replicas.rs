//! Two hub replicas as issuers against kubesim: both serve byte-equal JWKS built
//! from the one issuer Secret (once both have re-read it), created once even when both start
//! together; leader changes while keys rotate neither add a key (no second pending key, no
//! rotation before its period) nor drop one (no key leaves the Secret before its retirement
//! time).

use crate::https_get;
use crate::hub_sim;
use https_get::https_get;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::metrics::IssuerMetrics;
use kleym_hub::issuer::rotation::{KeyTimes, RotationPolicy};
use kleym_hub::issuer::secret::SecretRef;
use kleym_hub::issuer::{IssuerSettings, JWKS_PATH};
use kleym_spoke::reconciler::CancellationToken;

/// Rotation fast enough for a test: a key signs 8 s, is published 4 s ahead, and a replaced key
/// stays published 3 s.
const POLICY: RotationPolicy = RotationPolicy {
    period_seconds: 8,
    publish_ahead_seconds: 4,
    retire_after_seconds: 3,
};
/// Every replica re-reads the Secret (and the leader steps the rotation) this often.
const REFRESH: Duration = Duration::from_millis(200);

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

/// The keys of the issuer Secret with their times, and its resourceVersion.
async fn secret_state(
    client: &kube::Client,
    at: &SecretRef,
) -> (String, BTreeMap<String, KeyTimes>) {
    let (secret, ring) = kleym_hub::issuer::secret::read(client.clone(), at, Algorithm::Es256)
        .await
        .unwrap();
    let keys = ring
        .entries()
        .iter()
        .map(|e| (e.key.kid().to_string(), e.times))
        .collect();
    (secret.metadata.resource_version.unwrap_or_default(), keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_identical_jwks_across_leader_changes() {
    let hub = hub_sim::start("unused").await;
    let client = hub.cluster.in_process_client();
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = tls_files(dir.path());
    let at = SecretRef {
        namespace: "kleym".into(),
        name: "kleym-issuer".into(),
    };
    let leader = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut urls = Vec::new();
    let mut metrics = Vec::new();
    let mut starts = Vec::new();
    for i in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let settings = IssuerSettings {
            // The same --issuer-url on both, as behind one Service.
            url: "https://issuer.example.org".into(),
            secret: at.clone(),
            x509_ca_secret: None,
            algorithm: Algorithm::Es256,
            listen_addr: listener.local_addr().unwrap(),
            tls: Some((cert.clone(), key.clone())),
            rotation: Some(POLICY),
            refresh_period: REFRESH,
            publish_configmap: None,
            metrics: IssuerMetrics::default(),
        };
        metrics.push(settings.metrics.clone());
        urls.push(url);
        let leader = leader.clone();
        let (client, stop) = (client.clone(), stop.clone());
        starts.push(async move {
            kleym_hub::issuer::serve::start(
                &settings,
                listener,
                client,
                Arc::new(move || leader.load(Ordering::SeqCst) == i),
                stop,
            )
            .await
            .unwrap()
        });
    }
    // Both start at once: the Secret is created once, and both serve its one key.
    let second = starts.pop().unwrap();
    let first = starts.pop().unwrap();
    let (_r0, _r1) = tokio::join!(first, second);
    let jwks = |i: usize| {
        let (url, ca) = (urls[i].clone(), ca_pem.clone());
        async move { https_get(&url, JWKS_PATH, &ca).await.1 }
    };
    let (_, keys) = secret_state(&client, &at).await;
    assert_eq!(
        keys.len(),
        1,
        "one key created by two replicas starting together"
    );
    let at_start = jwks(0).await;
    assert_eq!(at_start, jwks(1).await, "byte-equal JWKS at start");
    assert!(at_start.contains(keys.keys().next().unwrap().as_str()));

    // Keys rotate for 30 s while the lead moves between the replicas every 5 s. Whenever the
    // Secret has not changed for 1 s (five refreshes), both replicas serve the same bytes.
    let started = Instant::now();
    let mut last_flip = Instant::now();
    let mut flips = 0;
    let mut history: BTreeMap<String, KeyTimes> = BTreeMap::new();
    let mut removed: BTreeMap<String, i64> = BTreeMap::new();
    let (mut rv, mut rv_since) = (String::new(), Instant::now());
    let mut compared = 0;
    while started.elapsed() < Duration::from_secs(30) {
        if last_flip.elapsed() >= Duration::from_secs(5) {
            leader.store((leader.load(Ordering::SeqCst) + 1) % 2, Ordering::SeqCst);
            last_flip = Instant::now();
            flips += 1;
        }
        let now = chrono::Utc::now().timestamp();
        let (v, keys) = secret_state(&client, &at).await;
        if v != rv {
            (rv, rv_since) = (v, Instant::now());
        }
        let pending = keys.values().filter(|t| t.activates > now).count();
        assert!(pending <= 1, "one key published ahead at most: {keys:?}");
        for kid in history.keys() {
            if !keys.contains_key(kid) {
                removed.entry(kid.clone()).or_insert(now);
            }
        }
        for (kid, t) in &keys {
            assert!(!removed.contains_key(kid), "key {kid} came back");
            history.insert(kid.clone(), *t);
        }
        // A key past its retirement time leaves every replica's JWKS at that replica's next
        // refresh (and the Secret at the leader's next step): at that instant they may differ
        // for one refresh period, so windows around a retirement are not compared.
        let retiring = |keys: &BTreeMap<String, KeyTimes>| {
            let now = chrono::Utc::now().timestamp();
            keys.values()
                .any(|t| t.retires.is_some_and(|r| r <= now + 1))
        };
        if rv_since.elapsed() >= Duration::from_secs(1) && !retiring(&keys) {
            let (a, b) = (jwks(0).await, jwks(1).await);
            // The Secret may have changed while fetching: compare only a stable window.
            let (v, keys) = secret_state(&client, &at).await;
            if v == rv && !retiring(&keys) {
                assert_eq!(a, b, "both replicas serve the same JWKS");
                compared += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();

    assert!(flips >= 5, "the lead moved {flips} times");
    assert!(compared > 10, "JWKS compared in {compared} stable windows");
    let rotations: Vec<u64> = metrics.iter().map(|m| m.rotations.get()).collect();
    assert!(
        rotations.iter().all(|r| *r > 0),
        "both replicas rotated while leading: {rotations:?}"
    );
    // No key dropped early: every key that left the Secret had retired.
    for (kid, at_removal) in &removed {
        let retires = history[kid]
            .retires
            .expect("a removed key had a retirement time");
        assert!(
            *at_removal >= retires,
            "key {kid} removed at {at_removal}, retires {retires}"
        );
    }
    // No key added early: successive keys activate a period apart (the first two: the new
    // key activates `period` after the first one signed, which is its creation).
    let mut activations: Vec<i64> = history.values().map(|t| t.activates).collect();
    activations.sort();
    assert!(activations.len() >= 4, "keys rotated: {history:?}");
    for w in activations.windows(2) {
        assert!(
            w[1] - w[0] >= POLICY.period_seconds,
            "keys activate a period apart: {activations:?}"
        );
    }
    assert!(!removed.is_empty(), "old keys were retired and removed");
    eprintln!(
        "replicas: {flips} leader changes, {} keys, {} removed, rotations per replica {rotations:?}, {compared} byte-equal JWKS comparisons",
        history.len(),
        removed.len()
    );
}
