//! End to end, issue 14: the hub's JWT signing key rotates twice under load. Two kubesim
//! spokes trust the hub's issuer through the `AuthenticationConfiguration` that the real
//! `kleym trust-config` printed; the hub reaches them with `kleym credential spiffe-jwt`
//! (60 s JWT-SVIDs, so the credential cache re-execs every ~48 s) while bindings keep being
//! created on both spokes. The issuer's leader rotates on its own, with the real
//! `--issuer-key-rotation`/`--issuer-key-publish-ahead` flags shortened for the test (80 s,
//! 20 s) and a retirement delay shortened to the test's token lifetime plus 10 s of skew (the
//! production value is the 15 min maximum lifetime plus 5 min).
//!
//! Checked: three keys sign in turn (A, then B, then C); no spoke answers any request with 401;
//! the plugin runs at the cache's refresh rate (bounded by the elapsed time, not once per
//! request); every binding created converges; once A is retired and a spoke has refetched the
//! JWKS (on C's new `kid`), a fresh, unexpired JWT-SVID signed with A is refused while the same
//! claims signed with B (retired later) are accepted.

use kleym_e2e::fixtures::keyless::{register_credentialless, trust_config};
use kleym_test_support::authn::{apply_rbac, whoami};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_hub::access::audience::derived_audience;
use kleym_hub::issuer::keys::SigningKey;
use kleym_spoke::reconciler::CancellationToken;
use kube::api::Api;
use kubesim::ClusterHandle;
use serde_json::json;

const SPOKES: [&str; 2] = ["spoke-a", "spoke-b"];
const HUB_ID: &str = "spiffe://example.org/kleym/hub";
const PROVIDER: &str = "kleym-spiffe-jwt";
/// JWT-SVID lifetime given to the plugin (its minimum).
const LIFETIME: i64 = 60;
/// Rotation period and publish-ahead, as flags.
const ROTATION: &str = "80s";
const PUBLISH_AHEAD: &str = "20s";
/// A replaced key stays published this long after its successor signs.
const RETIRE_AFTER: i64 = LIFETIME + 10;
/// Bindings seeded per spoke (created two at start, then one every two seconds).
const TOTAL: usize = 120;
const LIMIT: Duration = Duration::from_secs(120);

/// A fresh JWT-SVID for `audience`, signed by `key`, exactly as the plugin builds it.
fn sign(key: &SigningKey, issuer_url: &str, audience: &str) -> String {
    let (claims, _) = kleym_hub::credentials::plugins::spiffe_jwt::claims(
        issuer_url,
        HUB_ID,
        audience,
        LIFETIME,
        chrono::Utc::now(),
        "e2e-rotation",
    );
    key.sign_jwt(&claims).unwrap()
}

/// The keys of the issuer Secret (public and private parts; never printed).
async fn secret_keys(client: &kube::Client) -> Vec<SigningKey> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), HUB_NS)
        .get("kleym-issuer")
        .await
        .unwrap();
    let data = secret.data.unwrap();
    SigningKey::all_from_pem(&data["signing-keys.pem"].0, "issuer Secret").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_key_rotates_twice_under_load_without_a_401() {
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&SPOKES, dir.path()).await.unwrap();
    let spokes: Vec<ClusterHandle> = SPOKES.iter().map(|s| f.spoke(s)).collect();
    let hub_kc = f.hub_kubeconfig().display().to_string();
    let secret_ref = format!("{HUB_NS}/kleym-issuer");

    // The issuer, started as the hub's runtime starts it, from the real flags.
    let pki = kubesim_auth::pki::ClusterPki::generate("issuer").unwrap();
    let (cert, key, ca) = (
        dir.path().join("issuer.crt"),
        dir.path().join("issuer.key"),
        dir.path().join("issuer-ca.crt"),
    );
    std::fs::write(&cert, pki.serving_cert_pem()).unwrap();
    std::fs::write(&key, pki.serving_key_pem()).unwrap();
    std::fs::write(&ca, pki.ca_cert_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer_url = format!("https://{}", listener.local_addr().unwrap());
    let issuer_flags: Vec<String> = [
        "--issuer-url",
        &issuer_url,
        "--issuer-key-secret",
        &secret_ref,
        "--issuer-tls-cert-file",
        cert.to_str().unwrap(),
        "--issuer-tls-key-file",
        key.to_str().unwrap(),
        "--issuer-key-rotation",
        ROTATION,
        "--issuer-key-publish-ahead",
        PUBLISH_AHEAD,
        "--trust-domain",
        "example.org",
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut settings = parse_hub_args(&issuer_flags)
        .unwrap()
        .issuer
        .settings()
        .unwrap()
        .unwrap();
    let policy = settings.rotation.as_mut().expect("rotation on");
    assert_eq!(
        (policy.period_seconds, policy.publish_ahead_seconds),
        (80, 20)
    );
    policy.retire_after_seconds = RETIRE_AFTER;
    // Re-read the Secret (and step the rotation) every second instead of every 30 s.
    settings.refresh_period = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let (docs, _) = kleym_hub::issuer::serve::start(
        &settings,
        listener,
        f.hub.kube_client().await.unwrap(),
        Arc::new(|| true),
        stop.clone(),
    )
    .await
    .unwrap();
    let kid_a = docs.kids();
    assert_eq!(kid_a.len(), 1, "one key at start");
    let kid_a = kid_a[0].clone();

    register_credentialless(&f.hub_client, &spokes, PROVIDER, TOTAL, 2)
        .await
        .unwrap();

    // The spoke side, exactly as `kleym trust-config` prints it.
    let trust = dir.path().join("trust");
    let printed = trust_config(
        Path::new(&kleym),
        &hub_kc,
        [
            OsStr::new("--issuer-url"),
            OsStr::new(&issuer_url),
            OsStr::new("--issuer-ca-file"),
            ca.as_os_str(),
            OsStr::new("--trust-domain"),
            OsStr::new("example.org"),
            OsStr::new("--output-dir"),
            trust.as_os_str(),
        ],
    )
    .unwrap();
    for s in &spokes {
        let entry = printed
            .iter()
            .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
            .unwrap();
        let file = dir
            .path()
            .join("trust")
            .join(format!("fleet_{}", s.name()))
            .join("authentication-config.yaml");
        s.set_authentication_config(&std::fs::read_to_string(file).unwrap())
            .unwrap();
        for doc in entry["rbac"].as_array().unwrap() {
            apply_rbac(s, doc).await;
        }
        // And the admission policy it prints for the hub's user.
        assert!(kleym_e2e::fixtures::admission::apply_printed_policy(s, entry).unwrap());
    }

    let pf = dir.path().join("providers.json");
    let args: Vec<String> = [
        "credential",
        "spiffe-jwt",
        "--issuer-url",
        &issuer_url,
        "--issuer-key-secret",
        &secret_ref,
        "--trust-domain",
        "example.org",
        "--lifetime-seconds",
        &LIFETIME.to_string(),
        "--kubeconfig",
        &hub_kc,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    std::fs::write(
        &pf,
        json!({"providers": [{"name": PROVIDER, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
            "args": args, "provideClusterInfo": true, "interactiveMode": "Never"}}]})
        .to_string(),
    )
    .unwrap();
    let started = Instant::now();
    let hub = f
        .start_hub(
            &[
                "--clusterprofile-provider-file",
                pf.to_str().unwrap(),
                "--trust-domain",
                "example.org",
                "--leader-elect=false",
            ]
            .map(String::from),
        )
        .await
        .unwrap();
    let execs = || {
        hub.handle
            .credentials
            .metrics()
            .exec_total
            .get_or_create(&kleym_hub::credentials::metrics::ExecResultLabels {
                provider: PROVIDER.into(),
                result: "success".into(),
            })
            .get()
    };
    for s in &spokes {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, 2).then_some(()) }
        })
        .await
        .unwrap();
    }

    // Load: one more binding on every spoke every two seconds until the rotations are done.
    let created = Arc::new(AtomicUsize::new(2));
    let loading = Arc::new(AtomicBool::new(true));
    let load = {
        let stores: Vec<_> = spokes.iter().map(|s| s.store()).collect();
        let (created, loading) = (created.clone(), loading.clone());
        tokio::spawn(async move {
            while loading.load(Ordering::SeqCst) {
                let n = created.load(Ordering::SeqCst);
                if n >= TOTAL {
                    break;
                }
                for store in &stores {
                    env::create_bindings(store, n..n + 1).unwrap();
                }
                created.store(n + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };

    // Wait for two automatic rotations (A -> B -> C) and for A's retirement, recording every
    // key the issuer published meanwhile.
    let hub_client = f.hub.kube_client().await.unwrap();
    let mut published = BTreeSet::new();
    let mut signing = Vec::<String>::new();
    let mut keys_at_b: Vec<SigningKey> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let execs_at_c = loop {
        assert!(
            Instant::now() < deadline,
            "two rotations and a retirement within 300 s (signing so far: {signing:?})"
        );
        published.extend(docs.kids());
        let (_, ring) = kleym_hub::issuer::secret::read(
            hub_client.clone(),
            &settings.secret,
            settings.algorithm,
        )
        .await
        .unwrap();
        let now = chrono::Utc::now().timestamp();
        let kid = ring.signing(now).unwrap().kid().to_string();
        if signing.last() != Some(&kid) {
            signing.push(kid);
            if signing.len() == 2 {
                // A and B, with private parts: A's to sign a token after A retires.
                keys_at_b = secret_keys(&hub_client).await;
            }
        }
        let a_gone = !docs.kids().contains(&kid_a);
        if signing.len() >= 3 && a_gone {
            break execs();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(signing.len(), 3, "A, B, C signed in turn: {signing:?}");
    assert_eq!(signing[0], kid_a);
    assert_eq!(published.len(), 3, "every key published: {published:?}");
    let key_a = keys_at_b.iter().find(|k| k.kid() == signing[0]).unwrap();
    let key_b = keys_at_b.iter().find(|k| k.kid() == signing[1]).unwrap();
    let keys_at_c = secret_keys(&hub_client).await;
    let key_c = keys_at_c.iter().find(|k| k.kid() == signing[2]).unwrap();

    // At once after A's retirement (B stays published for RETIRE_AFTER after C signs): each
    // spoke accepts C's and B's tokens and, having refetched the JWKS on C's kid (the probe
    // retries while the spoke's refetch rate limit holds), refuses a fresh token signed with A.
    for s in &spokes {
        let mapped = format!("kleym:{HUB_ID}");
        let mut seen = None;
        for _ in 0..150 {
            let c_token = sign(key_c, &issuer_url, &derived_audience("fleet", s.name()));
            seen = whoami(s, &c_token).await;
            if seen.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            seen.as_deref(),
            Some(mapped.as_str()),
            "{} accepts C",
            s.name()
        );
        assert_eq!(
            whoami(
                s,
                &sign(key_b, &issuer_url, &derived_audience("fleet", s.name()))
            )
            .await
            .as_deref(),
            Some(mapped.as_str()),
            "{} accepts B, published until C has signed for {RETIRE_AFTER} s",
            s.name()
        );
        assert_eq!(
            whoami(
                s,
                &sign(key_a, &issuer_url, &derived_audience("fleet", s.name()))
            )
            .await,
            None,
            "{} refuses a token signed by the retired key",
            s.name()
        );
    }
    // The hub moves on to C at its next refresh; bindings keep converging meanwhile.
    wait_for("the hub re-ran the plugin after C signs", LIMIT, || {
        let n = execs();
        async move { (n > execs_at_c).then_some(()) }
    })
    .await
    .unwrap();
    loading.store(false, Ordering::SeqCst);
    load.await.unwrap();
    let total = created.load(Ordering::SeqCst);
    let elapsed = started.elapsed();
    for s in &spokes {
        let store = s.store();
        wait_for(
            &format!("{} converged ({total} bindings)", s.name()),
            LIMIT,
            || {
                let store = store.clone();
                async move { env::converged(&store, total).then_some(()) }
            },
        )
        .await
        .unwrap();
    }
    assert!(total > 20, "bindings were created during the rotations");

    // Not one request refused for its credential, on any spoke.
    for s in &spokes {
        let log = s.requests().entries();
        assert!(
            log.len() < kubesim::server::request_log::CAPACITY,
            "request log not truncated"
        );
        let refused: Vec<_> = log.iter().filter(|r| r.status == 401).collect();
        assert!(refused.is_empty(), "{}: 401s {refused:?}", s.name());
    }

    // Execs at the refresh rate: a 60 s token is refreshed 10% early, so about one exec per
    // spoke per 54 s, never one per request (hundreds were made).
    let n = execs();
    let per_spoke_bound = elapsed.as_secs() / 45 + 2;
    assert!(
        n <= SPOKES.len() as u64 * per_spoke_bound,
        "{n} execs in {elapsed:?} for {} spokes",
        SPOKES.len()
    );
    assert!(n >= 2 * SPOKES.len() as u64, "tokens were refreshed: {n}");
    let requests: usize = spokes.iter().map(|s| s.requests().entries().len()).sum();
    eprintln!(
        "rotation under load: {n} execs for {} spokes in {elapsed:?}, {total} bindings per spoke, {requests} spoke requests, no 401",
        SPOKES.len()
    );

    hub.stop().await.unwrap();
    stop.cancel();
}
