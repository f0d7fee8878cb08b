use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use chrono::TimeZone;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::pki::ClusterPki;

const SPOKE_A: &str = "https://spoke-a.example:6443";
const SPOKE_B: &str = "https://spoke-b.example:6443";
const HUB_ID: &str = "spiffe://example.org/kleym/hub";

fn pki() -> &'static ClusterPki {
    static PKI: OnceLock<ClusterPki> = OnceLock::new();
    PKI.get_or_init(|| ClusterPki::generate("issuer").unwrap())
}

fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap()
}

/// An HTTPS server on 127.0.0.1 answering GETs from a path → body table.
struct DocServer {
    base: String,
    docs: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DocServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve() -> DocServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let docs: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let acceptor = TlsAcceptor::from(pki().server_config(false).unwrap());
    let table = docs.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, table) = (acceptor.clone(), table.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let doc = table.lock().unwrap().get(req.uri().path()).cloned();
                    async move {
                        let (status, body) = doc.map_or((404, String::new()), |d| (200, d));
                        http::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(Bytes::from(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    DocServer { base, docs, task }
}

/// An ES256 key: its encoding key, kid, and public JWK.
struct Es256 {
    key: jsonwebtoken::EncodingKey,
    kid: String,
    jwk: Value,
}

fn es256(kid: &str) -> Es256 {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    assert_eq!(raw.len(), 65);
    let jwk = json!({
        "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&raw[33..]),
    });
    Es256 {
        key: jsonwebtoken::EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap(),
        kid: kid.into(),
        jwk,
    }
}

impl Es256 {
    fn sign(&self, claims: Value) -> String {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, &claims, &self.key).unwrap()
    }
}

fn publish(server: &DocServer, issuer: &str, keys: &[&Es256]) {
    let mut docs = server.docs.lock().unwrap();
    docs.insert(
        "/.well-known/openid-configuration".into(),
        json!({"issuer": issuer, "jwks_uri": format!("{}/keys", server.base)}).to_string(),
    );
    docs.insert(
        "/keys".into(),
        json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string(),
    );
}

/// The configuration `kleym trust-config` prints, for one spoke.
fn config(issuer: &str, audience: &str) -> Value {
    json!({
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {
                "url": issuer,
                "audiences": [audience],
                "certificateAuthority": pki().ca_cert_pem(),
            },
            "claimValidationRules": [
                {"expression": format!("claims.sub == '{HUB_ID}'"), "message": "sub must be the hub"},
            ],
            "claimMappings": {"username": {"claim": "sub", "prefix": "kleym:"}},
            "userValidationRules": [
                {"expression": "!user.username.startsWith('system:')", "message": "no system users"},
            ],
        }],
    })
}

fn claims(issuer: &str, aud: &str, sub: &str) -> Value {
    let t = now().timestamp();
    json!({"iss": issuer, "sub": sub, "aud": [aud], "iat": t, "nbf": t, "exp": t + 600, "jti": "j1"})
}

#[tokio::test]
async fn verifies_through_discovery_and_maps_the_user() {
    let server = serve().await;
    let issuer = server.base.clone();
    let key = es256("k1");
    publish(&server, &issuer, &[&key]);
    let cfg = AuthenticationConfiguration::from_value(&config(&issuer, SPOKE_A)).unwrap();
    let a = &cfg.jwt[0];
    let user = a
        .verify(&key.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
        .await
        .unwrap();
    assert_eq!(user.username, format!("kleym:{HUB_ID}"));
    assert!(user.in_group(crate::GROUP_AUTHENTICATED));

    // Audience confinement: a token for spoke B is refused by spoke A's authenticator.
    let err = a
        .verify(&key.sign(claims(&issuer, SPOKE_B, HUB_ID)), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("audiences"), "{err}");
    // The claim validation rule pins sub.
    let err = a
        .verify(
            &key.sign(claims(&issuer, SPOKE_A, "spiffe://example.org/other")),
            now(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sub must be the hub"), "{err}");
    // exp and nbf.
    let mut c = claims(&issuer, SPOKE_A, HUB_ID);
    c["exp"] = json!(now().timestamp() - 1);
    assert!(a.verify(&key.sign(c), now()).await.is_err());
    let mut c = claims(&issuer, SPOKE_A, HUB_ID);
    c["nbf"] = json!(now().timestamp() + 3600);
    assert!(a.verify(&key.sign(c), now()).await.is_err());
    // A key the issuer does not publish.
    let forged = es256("k1");
    assert!(
        a.verify(&forged.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn user_validation_rule_refuses_system_users() {
    let server = serve().await;
    let issuer = server.base.clone();
    let key = es256("k1");
    publish(&server, &issuer, &[&key]);
    let mut cfg = config(&issuer, SPOKE_A);
    cfg["jwt"][0]["claimValidationRules"] = json!([]);
    cfg["jwt"][0]["claimMappings"]["username"] = json!({"claim": "sub", "prefix": ""});
    let cfg = AuthenticationConfiguration::from_value(&cfg).unwrap();
    let err = cfg.jwt[0]
        .verify(&key.sign(claims(&issuer, SPOKE_A, "system:admin")), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no system users"), "{err}");
    let ok = cfg.jwt[0]
        .verify(&key.sign(claims(&issuer, SPOKE_A, "alice")), now())
        .await
        .unwrap();
    assert_eq!(ok.username, "alice");
}

#[tokio::test]
async fn unknown_kid_refetches_discovery_and_keys_rate_limited() {
    let server = serve().await;
    let issuer = server.base.clone();
    let (k1, k2) = (es256("k1"), es256("k2"));
    publish(&server, &issuer, &[&k1]);
    let cfg = AuthenticationConfiguration::from_value_with(
        &config(&issuer, SPOKE_A),
        Duration::from_secs(3600),
    )
    .unwrap();
    let a = &cfg.jwt[0];
    a.verify(&k1.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
        .await
        .unwrap();
    assert_eq!(a.fetch_count(), 1);
    publish(&server, &issuer, &[&k1, &k2]);
    // Rate limited: the new kid is not fetched within the interval, so the token fails …
    assert!(
        a.verify(&k2.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
            .await
            .is_err()
    );
    assert_eq!(a.fetch_count(), 1);
    // … while with no limit it is fetched once and accepted.
    let cfg =
        AuthenticationConfiguration::from_value_with(&config(&issuer, SPOKE_A), Duration::ZERO)
            .unwrap();
    let b = &cfg.jwt[0];
    publish(&server, &issuer, &[&k1]);
    b.verify(&k1.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
        .await
        .unwrap();
    publish(&server, &issuer, &[&k1, &k2]);
    b.verify(&k2.sign(claims(&issuer, SPOKE_A, HUB_ID)), now())
        .await
        .unwrap();
    assert_eq!(b.fetch_count(), 2);
}

#[tokio::test]
async fn discovery_issuer_must_match() {
    let server = serve().await;
    let key = es256("k1");
    publish(&server, "https://someone-else.example", &[&key]);
    let cfg = AuthenticationConfiguration::from_value(&config(&server.base, SPOKE_A)).unwrap();
    let err = cfg.jwt[0]
        .verify(&key.sign(claims(&server.base, SPOKE_A, HUB_ID)), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn refuses_invalid_and_unsupported_configuration_naming_the_field() {
    let base = config("https://issuer.example", SPOKE_A);
    let refused = |edit: &dyn Fn(&mut Value), field: &str| {
        let mut c = base.clone();
        edit(&mut c);
        let err = AuthenticationConfiguration::from_value(&c)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "expected {field:?} in {err:?}");
    };
    assert!(AuthenticationConfiguration::from_value(&base).is_ok());
    refused(
        &|c| c["jwt"][0]["issuer"]["url"] = json!("http://issuer.example"),
        "jwt[0].issuer.url",
    );
    refused(
        &|c| c["jwt"][0]["issuer"]["url"] = json!("https://issuer.example?x=1"),
        "jwt[0].issuer.url",
    );
    refused(
        &|c| c["jwt"][0]["issuer"]["audiences"] = json!([]),
        "jwt[0].issuer.audiences",
    );
    refused(
        &|c| c["jwt"][0]["issuer"]["audiences"] = json!([SPOKE_A, SPOKE_B]),
        "jwt[0].issuer.audienceMatchPolicy",
    );
    refused(
        &|c| c["jwt"][0]["issuer"]["egressSelectorType"] = json!("cluster"),
        "jwt[0].issuer.egressSelectorType",
    );
    refused(
        &|c| c["jwt"][0]["issuer"]["certificateAuthority"] = json!("not a pem"),
        "jwt[0].issuer.certificateAuthority",
    );
    refused(
        &|c| c["jwt"][0]["claimMappings"]["username"] = json!({"claim": "sub"}),
        "jwt[0].claimMappings.username.prefix",
    );
    refused(
        &|c| {
            c["jwt"][0]["claimMappings"]["username"] =
                json!({"claim": "sub", "expression": "claims.sub", "prefix": ""})
        },
        "jwt[0].claimMappings.username",
    );
    refused(
        &|c| c["jwt"][0]["claimMappings"]["extra"] = json!([]),
        "jwt[0].claimMappings.extra",
    );
    refused(
        &|c| c["jwt"][0]["claimValidationRules"] = json!([{"claim": "sub", "expression": "true"}]),
        "jwt[0].claimValidationRules[0]",
    );
    refused(
        &|c| c["jwt"][0]["claimValidationRules"] = json!([{"expression": "claims.sub =="}]),
        "jwt[0].claimValidationRules[0].expression",
    );
    refused(
        &|c| c["jwt"][0]["userValidationRules"] = json!([{"expression": "claims.sub == 'x'"}]),
        "jwt[0].userValidationRules[0].expression",
    );
    refused(&|c| c["jwt"][0]["issuer"]["bogus"] = json!(1), "bogus");
    refused(&|c| c["anonymous"] = json!({"enabled": true}), "anonymous");
    refused(&|c| c["apiVersion"] = json!("v1"), "apiVersion");
    // kubesim is Kubernetes 1.33, which serves v1alpha1 and v1beta1; v1 arrives in 1.34.
    refused(
        &|c| c["apiVersion"] = json!("apiserver.config.k8s.io/v1"),
        "apiVersion",
    );
    for accepted in [
        "apiserver.config.k8s.io/v1alpha1",
        "apiserver.config.k8s.io/v1beta1",
    ] {
        let mut c = config("https://issuer.example", "https://spoke.example");
        c["apiVersion"] = json!(accepted);
        assert!(
            AuthenticationConfiguration::from_value(&c).is_ok(),
            "{accepted} must load"
        );
    }
    refused(
        &|c| {
            let j = c["jwt"][0].clone();
            c["jwt"] = json!([j.clone(), j]);
        },
        "jwt[1].issuer.url",
    );
}

#[tokio::test]
async fn claim_rule_with_required_value_and_expression_mappings() {
    let server = serve().await;
    let issuer = server.base.clone();
    let key = es256("k1");
    publish(&server, &issuer, &[&key]);
    let mut cfg = config(&issuer, SPOKE_A);
    cfg["jwt"][0]["claimValidationRules"] = json!([{"claim": "tenant", "requiredValue": "t1"}]);
    cfg["jwt"][0]["claimMappings"] = json!({
        "username": {"expression": "'x:' + claims.sub"},
        "groups": {"claim": "groups", "prefix": "g:"},
        "uid": {"claim": "jti"},
    });
    let cfg = AuthenticationConfiguration::from_value(&cfg).unwrap();
    let mut c = claims(&issuer, SPOKE_A, "bob");
    assert!(
        cfg.jwt[0]
            .verify(&key.sign(c.clone()), now())
            .await
            .is_err(),
        "tenant missing"
    );
    c["tenant"] = json!("t1");
    c["groups"] = json!(["a", "b"]);
    let u = cfg.jwt[0].verify(&key.sign(c), now()).await.unwrap();
    assert_eq!(u.username, "x:bob");
    assert_eq!(u.uid, "j1");
    assert_eq!(u.groups, vec!["g:a", "g:b", crate::GROUP_AUTHENTICATED]);
}
