use std::sync::OnceLock;

use chrono::Duration;

use super::*;

/// RSA keys shared by every test of this binary (generation is slow).
pub(crate) fn test_keys() -> &'static [RsaSigningKey] {
    static KEYS: OnceLock<Vec<RsaSigningKey>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| RsaSigningKey::generate().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

const ISS: &str = "https://127.0.0.1:6443";

fn issuer() -> SaIssuer {
    SaIssuer::with_key(ISS, test_keys()[0].clone())
}

fn request() -> SaTokenRequest {
    SaTokenRequest {
        namespace: "kleym".into(),
        sa_name: "hub".into(),
        sa_uid: "uid-sa".into(),
        audiences: vec!["https://spoke-a:6443".into()],
        expiration_seconds: 3600,
        pod: Some(ObjectRef {
            name: "hub-0".into(),
            uid: "uid-pod".into(),
        }),
        node: None,
    }
}

fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap()
}

#[test]
fn issued_token_has_kube_apiserver_claims() {
    let iss = issuer();
    let (token, exp) = iss.issue_at(&request(), now()).unwrap();
    assert_eq!(exp, now() + Duration::seconds(3600));
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.alg, Algorithm::RS256);
    assert_eq!(header.kid.as_deref(), Some(test_keys()[0].kid()));
    let raw: Value = jsonwebtoken::dangerous::insecure_decode_claims(&token).unwrap();
    assert_eq!(raw["iss"], ISS);
    assert_eq!(raw["sub"], "system:serviceaccount:kleym:hub");
    assert_eq!(raw["aud"], json!(["https://spoke-a:6443"]));
    assert_eq!(raw["iat"], 1_800_000_000);
    assert_eq!(raw["nbf"], 1_800_000_000);
    assert_eq!(raw["exp"], 1_800_003_600);
    assert_eq!(raw["jti"].as_str().unwrap().len(), 36);
    assert_eq!(
        raw["kubernetes.io"],
        json!({"namespace": "kleym", "serviceaccount": {"name": "hub", "uid": "uid-sa"},
               "pod": {"name": "hub-0", "uid": "uid-pod"}})
    );
    assert_eq!(peek_issuer(&token).as_deref(), Some(ISS));
    assert_eq!(peek_issuer("not-a-jwt"), None);
}

#[test]
fn kid_is_sha256_of_spki() {
    let kid = test_keys()[0].kid();
    assert_eq!(URL_SAFE_NO_PAD.decode(kid).unwrap().len(), 32);
    assert_ne!(kid, test_keys()[1].kid());
}

#[test]
fn verify_round_trip_and_user() {
    let iss = issuer();
    let (token, _) = iss.issue_at(&request(), now()).unwrap();
    let claims = iss
        .verify(
            &token,
            &["other".into(), "https://spoke-a:6443".into()],
            now(),
        )
        .unwrap();
    assert_eq!(claims.sa_uid(), "uid-sa");
    assert_eq!(claims.pod().unwrap().uid, "uid-pod");
    let user = user_from_claims(&claims);
    assert_eq!(user.username, "system:serviceaccount:kleym:hub");
    assert_eq!(user.uid, "uid-sa");
    assert_eq!(
        user.groups,
        vec![
            "system:serviceaccounts",
            "system:serviceaccounts:kleym",
            "system:authenticated"
        ]
    );
    assert_eq!(user.extra[EXTRA_POD_NAME], vec!["hub-0"]);
    assert_eq!(user.extra[EXTRA_POD_UID], vec!["uid-pod"]);
    assert_eq!(
        user.extra[EXTRA_CREDENTIAL_ID],
        vec![format!("JTI={}", claims.jti())]
    );
}

#[test]
fn verify_rejects_bad_tokens() {
    let iss = issuer();
    let aud = vec!["https://spoke-a:6443".to_string()];
    let (token, exp) = iss.issue_at(&request(), now()).unwrap();
    // Expiry is strict; one second before is fine.
    assert!(iss.verify(&token, &aud, exp - Duration::seconds(1)).is_ok());
    let err = iss.verify(&token, &aud, exp).unwrap_err().to_string();
    assert!(err.contains("expired"), "{err}");
    // Not yet valid (beyond the leeway).
    assert!(
        iss.verify(&token, &aud, now() - Duration::seconds(30))
            .is_ok()
    );
    assert!(
        iss.verify(&token, &aud, now() - Duration::seconds(120))
            .is_err()
    );
    // Wrong audience; default audience is the issuer.
    let err = iss
        .verify(&token, &["x".into()], now())
        .unwrap_err()
        .to_string();
    assert!(err.contains("audiences"), "{err}");
    assert!(iss.verify(&token, &[], now()).is_err());
    let mut no_aud = request();
    no_aud.audiences.clear();
    let (t2, _) = iss.issue_at(&no_aud, now()).unwrap();
    assert!(iss.verify(&t2, &[], now()).is_ok());
    // Another issuer URL with the same key: wrong iss.
    let other = SaIssuer::with_key("https://other", test_keys()[0].clone());
    let err = other.verify(&token, &aud, now()).unwrap_err().to_string();
    assert!(err.contains("issuer"), "{err}");
    // Same URL, different key: signature.
    let forged = SaIssuer::with_key(ISS, test_keys()[1].clone());
    assert!(forged.verify(&token, &aud, now()).is_err());
    // Tampered payload.
    let mut parts: Vec<&str> = token.split('.').collect();
    let payload = URL_SAFE_NO_PAD.encode(
        String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap())
            .unwrap()
            .replace("\"hub\"", "\"admin\""),
    );
    parts[1] = &payload;
    let err = iss.verify(&parts.join("."), &aud, now()).unwrap_err();
    assert!(matches!(err, AuthError::InvalidToken(_)));
    assert!(iss.verify("garbage", &aud, now()).is_err());
    // Error messages never echo the token.
    assert!(!err.to_string().contains(&token[..20]));
}

#[test]
fn token_signed_with_sub_mismatch_is_not_a_service_account_token() {
    let iss = issuer();
    let mut claims = iss
        .verify(
            &iss.issue_at(&request(), now()).unwrap().0,
            &["https://spoke-a:6443".into()],
            now(),
        )
        .unwrap();
    claims.sub = "system:serviceaccount:kube-system:admin".into();
    let token = test_keys()[0].sign(&claims).unwrap();
    let err = iss
        .verify(&token, &["https://spoke-a:6443".into()], now())
        .unwrap_err();
    assert!(
        err.to_string().contains("not a valid ServiceAccount token"),
        "{err}"
    );
}

#[test]
fn expiration_bounds_follow_kube_apiserver() {
    let iss = issuer();
    let mut req = request();
    req.expiration_seconds = 599;
    let err = iss.issue_at(&req, now()).unwrap_err().to_string();
    assert_eq!(
        err,
        "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
    );
    req.expiration_seconds = MAX_EXPIRATION_SECONDS + 1;
    assert!(iss.issue_at(&req, now()).is_err());
    req.expiration_seconds = 600;
    assert!(iss.issue_at(&req, now()).is_ok());
}

#[test]
fn rotation_keeps_previous_keys_published() {
    let keys = test_keys();
    let iss = issuer();
    let aud = vec!["https://spoke-a:6443".to_string()];
    let (t0, _) = iss.issue_at(&request(), now()).unwrap();
    iss.rotate_to(keys[1].clone());
    assert_eq!(iss.current_kid(), keys[1].kid());
    let (t1, _) = iss.issue_at(&request(), now()).unwrap();
    assert_eq!(
        jsonwebtoken::decode_header(&t1).unwrap().kid.as_deref(),
        Some(keys[1].kid())
    );
    // Both old and new tokens verify.
    assert!(iss.verify(&t0, &aud, now()).is_ok());
    assert!(iss.verify(&t1, &aud, now()).is_ok());
    let kids = |iss: &SaIssuer| -> Vec<String> {
        iss.jwks()["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kids(&iss), vec![keys[1].kid(), keys[0].kid()]);
    iss.rotate_to(keys[2].clone());
    iss.rotate_to(keys[3].clone());
    // current + PREVIOUS_KEYS_KEPT; the oldest key is gone and its tokens stop verifying.
    assert_eq!(
        kids(&iss),
        vec![keys[3].kid(), keys[2].kid(), keys[1].kid()]
    );
    assert!(iss.verify(&t0, &aud, now()).is_err());
    assert!(iss.verify(&t1, &aud, now()).is_ok());
}

#[test]
fn jwks_and_discovery_documents() {
    let iss = issuer();
    let jwks = iss.jwks();
    let key = &jwks["keys"][0];
    assert_eq!(key["kty"], "RSA");
    assert_eq!(key["alg"], "RS256");
    assert_eq!(key["use"], "sig");
    assert_eq!(key["e"], "AQAB");
    assert_eq!(
        URL_SAFE_NO_PAD
            .decode(key["n"].as_str().unwrap())
            .unwrap()
            .len(),
        256
    );
    // The JWKS parses as jsonwebtoken's JwkSet (what external verifiers use).
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks.clone()).unwrap();
    assert!(set.find(test_keys()[0].kid()).is_some());
    let conf = iss.openid_configuration();
    assert_eq!(conf["issuer"], ISS);
    assert_eq!(conf["jwks_uri"], format!("{ISS}/openid/v1/jwks"));
    assert_eq!(conf["response_types_supported"], json!(["id_token"]));
    assert_eq!(conf["subject_types_supported"], json!(["public"]));
    assert_eq!(
        conf["id_token_signing_alg_values_supported"],
        json!(["RS256"])
    );
    let custom = issuer().with_jwks_uri("https://x/keys");
    assert_eq!(custom.openid_configuration()["jwks_uri"], "https://x/keys");
}

#[test]
fn pem_keys_load() {
    let key = RsaPrivateKey::new(&mut rand::thread_rng(), 1024).unwrap();
    let pem = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    let loaded = RsaSigningKey::from_pem(&pem).unwrap();
    assert_eq!(loaded.kid(), key_id(&RsaPublicKey::from(&key)).unwrap());
    assert!(RsaSigningKey::from_pem("nope").is_err());
}

#[test]
fn service_account_usernames() {
    assert_eq!(
        parse_service_account_username("system:serviceaccount:a:b"),
        Some(("a", "b"))
    );
    assert_eq!(
        parse_service_account_username("system:serviceaccount:a"),
        None
    );
    assert_eq!(
        parse_service_account_username("system:serviceaccount:a:b:c"),
        None
    );
    assert_eq!(parse_service_account_username("bob"), None);
}
