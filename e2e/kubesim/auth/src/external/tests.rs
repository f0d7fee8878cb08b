use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use chrono::TimeZone;
use hyper::service::service_fn;
use serde_json::json;
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::jwt::tests::test_keys;
use crate::jwt::{SaIssuer, SaTokenRequest};
use crate::pki::ClusterPki;

const HUB_ISSUER: &str = "https://hub.example:6443";
const SPOKE_AUD: &str = "https://127.0.0.1:7443";

fn hub_pki() -> &'static ClusterPki {
    static PKI: OnceLock<ClusterPki> = OnceLock::new();
    PKI.get_or_init(|| ClusterPki::generate("hub").unwrap())
}

fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap()
}

/// A tiny HTTPS server (127.0.0.1 only) serving the hub issuer's current JWKS; counts requests.
struct JwksServer {
    url: String,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_jwks(hub: Arc<SaIssuer>) -> JwksServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/openid/v1/jwks", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let acceptor = TlsAcceptor::from(hub_pki().server_config(false).unwrap());
    let counter = hits.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, hub, counter) = (acceptor.clone(), hub.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = if req.uri().path() == "/openid/v1/jwks" {
                        (200, hub.jwks().to_string())
                    } else {
                        (404, "{}".to_string())
                    };
                    async move {
                        http::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(Bytes::from(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    JwksServer { url, hits, task }
}

fn hub() -> Arc<SaIssuer> {
    Arc::new(SaIssuer::with_key(HUB_ISSUER, test_keys()[0].clone()))
}

fn token(hub: &SaIssuer, audience: &str) -> String {
    let req = SaTokenRequest {
        namespace: "kleym".into(),
        sa_name: "hub".into(),
        sa_uid: "uid-1".into(),
        audiences: vec![audience.into()],
        expiration_seconds: 3600,
        ..Default::default()
    };
    hub.issue_at(&req, now()).unwrap().0
}

fn config(url: &str) -> ExternalIssuerConfig {
    let mut c = ExternalIssuerConfig::new(
        HUB_ISSUER,
        vec![SPOKE_AUD.into()],
        url,
        hub_pki().ca_cert_pem(),
    );
    c.username_prefix = "hub:".into();
    c
}

#[tokio::test]
async fn verifies_hub_tokens_and_caches_the_jwks() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let ext = ExternalIssuer::new(config(&server.url)).unwrap();
    let t = token(&hub, SPOKE_AUD);
    for _ in 0..3 {
        let user = ext.verify(&t, now()).await.unwrap();
        assert_eq!(user.username, "hub:system:serviceaccount:kleym:hub");
        assert_eq!(user.groups, vec!["system:authenticated"]);
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
    assert_eq!(ext.fetch_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_verifications_share_one_fetch() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let ext = Arc::new(ExternalIssuer::new(config(&server.url)).unwrap());
    let t = token(&hub, SPOKE_AUD);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (ext, t) = (ext.clone(), t.clone());
            tokio::spawn(async move { ext.verify(&t, now()).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rotation_triggers_one_refetch_and_old_tokens_stay_valid() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let ext = ExternalIssuer::new(config(&server.url))
        .unwrap()
        .with_min_refetch_interval(Duration::ZERO);
    let old = token(&hub, SPOKE_AUD);
    ext.verify(&old, now()).await.unwrap();
    hub.rotate_to(test_keys()[1].clone());
    let new = token(&hub, SPOKE_AUD);
    ext.verify(&new, now()).await.unwrap();
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
    ext.verify(&old, now()).await.unwrap();
    ext.verify(&new, now()).await.unwrap();
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unknown_kid_refetch_is_rate_limited() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let ext = ExternalIssuer::new(config(&server.url))
        .unwrap()
        .with_min_refetch_interval(Duration::from_secs(3600));
    ext.verify(&token(&hub, SPOKE_AUD), now()).await.unwrap();
    // A token signed by a key the hub never published: one refetch is allowed at most per
    // interval, and the first fetch just happened, so none now.
    let stranger = SaIssuer::with_key(HUB_ISSUER, test_keys()[2].clone());
    for _ in 0..3 {
        let err = ext
            .verify(&token(&stranger, SPOKE_AUD), now())
            .await
            .unwrap_err();
        assert!(matches!(err, AuthError::InvalidToken(_)), "{err}");
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rejects_wrong_audience_issuer_expired_and_forged() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let ext = ExternalIssuer::new(config(&server.url)).unwrap();
    let good = token(&hub, SPOKE_AUD);
    ext.verify(&good, now()).await.unwrap();

    let err = ext
        .verify(&token(&hub, "https://other-spoke"), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("audiences"), "{err}");

    let expired_at = now() + chrono::Duration::seconds(3600);
    let err = ext.verify(&good, expired_at).await.unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    // Another issuer, same key: rejected before any fetch.
    let other = SaIssuer::with_key("https://evil", test_keys()[0].clone());
    let err = ext
        .verify(&token(&other, SPOKE_AUD), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("issuer"), "{err}");

    // Right issuer name, wrong key, reusing a known kid: signature fails.
    let mut claims: serde_json::Map<String, Value> =
        jsonwebtoken::dangerous::insecure_decode_claims(&good).unwrap();
    claims.insert(
        "sub".into(),
        json!("system:serviceaccount:kube-system:admin"),
    );
    // Signed by a key the hub never had, but claiming the hub key's kid.
    let forged = test_keys()[3].sign(&claims).unwrap();
    let mut parts: Vec<&str> = forged.split('.').collect();
    let good_header = good.split('.').next().unwrap();
    parts[0] = good_header;
    let err = ext.verify(&parts.join("."), now()).await.unwrap_err();
    assert!(err.to_string().contains("signature"), "{err}");
    assert!(ext.verify("garbage", now()).await.is_err());
}

#[tokio::test]
async fn claim_mappings() {
    let hub = hub();
    let server = serve_jwks(hub.clone()).await;
    let mut c = config(&server.url);
    c.username_claim = "email".into();
    c.username_prefix = String::new();
    c.groups_claim = Some("groups".into());
    c.groups_prefix = "oidc:".into();
    let ext = ExternalIssuer::new(c).unwrap();
    let base = json!({"iss": HUB_ISSUER, "aud": SPOKE_AUD, "exp": now().timestamp() + 60,
                      "sub": "1234", "email": "ann@example.com"});
    let with = |extra: Value| {
        let mut v = base.clone();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        test_keys()[0].sign(&v).unwrap()
    };
    let user = ext
        .verify(
            &with(json!({"groups": ["dev", "ops"], "email_verified": true})),
            now(),
        )
        .await
        .unwrap();
    assert_eq!(user.username, "ann@example.com");
    assert_eq!(
        user.groups,
        vec!["oidc:dev", "oidc:ops", "system:authenticated"]
    );
    let user = ext
        .verify(&with(json!({"groups": "solo"})), now())
        .await
        .unwrap();
    assert_eq!(user.groups, vec!["oidc:solo", "system:authenticated"]);
    assert!(
        ext.verify(&with(json!({"email_verified": false})), now())
            .await
            .is_err()
    );
    assert!(
        ext.verify(&with(json!({"groups": [1]})), now())
            .await
            .is_err()
    );
    assert!(
        ext.verify(&with(json!({"email": ""})), now())
            .await
            .is_err()
    );
    assert!(
        ext.verify(&with(json!({"exp": null})), now())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn fails_closed_when_jwks_unreachable_or_untrusted() {
    let hub = hub();
    let t = token(&hub, SPOKE_AUD);
    // Nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ext =
        ExternalIssuer::new(config(&format!("https://127.0.0.1:{port}/openid/v1/jwks"))).unwrap();
    let err = ext.verify(&t, now()).await.unwrap_err();
    assert!(matches!(err, AuthError::Jwks(_)), "{err}");
    assert!(err.to_string().contains("connect"), "{err}");
    // Within the refetch interval, no new attempt is made; still rejected.
    let err = ext.verify(&t, now()).await.unwrap_err();
    assert!(matches!(err, AuthError::Jwks(_)), "{err}");
    assert_eq!(ext.fetch_count(), 1);
    // Served, but by a certificate the configured CA does not vouch for.
    let server = serve_jwks(hub.clone()).await;
    let other_ca = ClusterPki::generate("other").unwrap();
    let mut c = config(&server.url);
    c.ca_pem = other_ca.ca_cert_pem().to_string();
    let ext = ExternalIssuer::new(c).unwrap();
    let err = ext.verify(&t, now()).await.unwrap_err();
    assert!(matches!(err, AuthError::Jwks(_)), "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    // Wrong path: HTTP 404.
    let ext = ExternalIssuer::new(config(&server.url.replace("jwks", "nope"))).unwrap();
    let err = ext.verify(&t, now()).await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}

#[test]
fn config_validation() {
    let ca = hub_pki().ca_cert_pem();
    let mk = |url: &str, aud: Vec<String>| {
        ExternalIssuer::new(ExternalIssuerConfig::new(HUB_ISSUER, aud, url, ca))
    };
    assert!(mk("http://127.0.0.1/jwks", vec!["a".into()]).is_err());
    assert!(mk("https://127.0.0.1/jwks", vec![]).is_err());
    assert!(mk("not a url", vec!["a".into()]).is_err());
    assert!(mk("https://127.0.0.1/jwks", vec!["a".into()]).is_ok());
    let mut bad_ca = ExternalIssuerConfig::new(HUB_ISSUER, vec!["a".into()], "https://x/j", "nope");
    assert!(ExternalIssuer::new(bad_ca.clone()).is_err());
    bad_ca.ca_pem = ca.to_string();
    let parsed: ExternalIssuerConfig = serde_json::from_value(json!({
        "issuer": HUB_ISSUER, "audiences": ["a"], "jwksUrl": "https://x/j", "caPem": ca
    }))
    .unwrap();
    assert_eq!(parsed.username_claim, "sub");
    assert_eq!(parsed, bad_ca);
}
