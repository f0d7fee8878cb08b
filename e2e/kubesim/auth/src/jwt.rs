//! ServiceAccount token issuer (RS256 JWTs, OIDC discovery, JWKS, rotation) and verification
//! of tokens from external issuers.
//!
//! [`SaIssuer`] plays kube-apiserver's `--service-account-issuer` /
//! `--service-account-signing-key-file`: it signs bound ServiceAccount tokens (TokenRequest),
//! verifies them, and serves the OIDC discovery document and JWKS. Claims are exactly those of
//! kube-apiserver's bound tokens (`iss`, `sub`, `aud` list, `exp`, `iat`, `nbf`, `jti` and the
//! `kubernetes.io` object).
//!
//! **Rotation**: [`SaIssuer::rotate`] makes a new key current; the JWKS keeps the current key
//! and the [`PREVIOUS_KEYS_KEPT`] most recent previous keys, so tokens signed before a
//! rotation stay valid until they expire or their key falls out of the JWKS.
//!
//! RSA-2048 generation costs tens to hundreds of milliseconds; tests should generate keys once
//! ([`RsaSigningKey::generate`]) and reuse them with [`SaIssuer::with_key`] and
//! [`SaIssuer::rotate_to`].

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, TimeZone, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{AuthError, GROUP_SERVICEACCOUNTS, Result, UserInfo};

/// How many previous signing keys stay published in the JWKS after [`SaIssuer::rotate`].
pub const PREVIOUS_KEYS_KEPT: usize = 2;
/// Smallest `expirationSeconds` kube-apiserver accepts in a TokenRequest (10 minutes).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// Largest `expirationSeconds` kube-apiserver accepts in a TokenRequest (2^32 seconds).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// Tolerated clock skew for `nbf`/`iat` (go-jose's default leeway). `exp` is strict.
pub const NOT_BEFORE_LEEWAY_SECONDS: i64 = 60;
/// Path of the JWKS kube-apiserver serves.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// Path of the OIDC discovery document.
pub const OPENID_CONFIGURATION_PATH: &str = "/.well-known/openid-configuration";

/// User extra key: name of the pod a token is bound to.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// User extra key: UID of the pod a token is bound to.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// User extra key: name of the node a token is bound to.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// User extra key: UID of the node a token is bound to.
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
/// User extra key: the credential ID (`JTI=<jti>`).
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// An RSA-2048 signing key with its `kid`. Cloning is cheap (shared).
#[derive(Clone)]
pub struct RsaSigningKey(Arc<KeyMaterial>);

struct KeyMaterial {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    jwk: Value,
}

impl std::fmt::Debug for RsaSigningKey {
    // The private key stays out of Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsaSigningKey")
            .field("kid", &self.0.kid)
            .finish_non_exhaustive()
    }
}

impl RsaSigningKey {
    /// Generates a fresh RSA-2048 key (slow: reuse keys in tests).
    pub fn generate() -> Result<Self> {
        let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048)
            .map_err(|e| AuthError::Pki(format!("generate RSA key: {e}")))?;
        Self::from_private_key(&key)
    }

    /// Loads a key from PEM (`RSA PRIVATE KEY` / PKCS#1 or `PRIVATE KEY` / PKCS#8), like
    /// `--service-account-signing-key-file`.
    pub fn from_pem(pem: &str) -> Result<Self> {
        let key = RsaPrivateKey::from_pkcs1_pem(pem)
            .or_else(|_| RsaPrivateKey::from_pkcs8_pem(pem))
            .map_err(|e| AuthError::Pki(format!("RSA private key PEM: {e}")))?;
        Self::from_private_key(&key)
    }

    fn from_private_key(key: &RsaPrivateKey) -> Result<Self> {
        let der = key
            .to_pkcs1_der()
            .map_err(|e| AuthError::Pki(format!("encode RSA key: {e}")))?;
        let public = RsaPublicKey::from(key);
        let kid = key_id(&public)?;
        let n = URL_SAFE_NO_PAD.encode(public.n().to_bytes_be());
        let e = URL_SAFE_NO_PAD.encode(public.e().to_bytes_be());
        let decoding = DecodingKey::from_rsa_components(&n, &e)
            .map_err(|e| AuthError::Pki(format!("RSA public key: {e}")))?;
        let jwk = json!({"use": "sig", "kty": "RSA", "kid": kid, "alg": "RS256", "n": n, "e": e});
        Ok(RsaSigningKey(Arc::new(KeyMaterial {
            kid,
            encoding: EncodingKey::from_rsa_der(der.as_bytes()),
            decoding,
            jwk,
        })))
    }

    /// The key ID: base64url(SHA-256(DER SubjectPublicKeyInfo)), as kube-apiserver derives it.
    pub fn kid(&self) -> &str {
        &self.0.kid
    }

    /// The public key as a JWK (`use`, `kty`, `kid`, `alg`, `n`, `e`).
    pub fn public_jwk(&self) -> &Value {
        &self.0.jwk
    }

    /// Signs `claims` as an RS256 JWT with this key's `kid`. Used by [`SaIssuer`]; also lets
    /// tests mint tokens for external issuers.
    pub fn sign<T: Serialize>(&self, claims: &T) -> Result<String> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.0.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.0.encoding)
            .map_err(|e| AuthError::Pki(format!("sign JWT: {e}")))
    }
}

fn key_id(public: &RsaPublicKey) -> Result<String> {
    let der = public
        .to_public_key_der()
        .map_err(|e| AuthError::Pki(format!("encode RSA public key: {e}")))?;
    Ok(URL_SAFE_NO_PAD.encode(Sha256::digest(der.as_bytes())))
}

/// A `{name, uid}` reference (bound pod, node, ServiceAccount).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Object name.
    pub name: String,
    /// Object UID.
    pub uid: String,
}

/// A TokenRequest, as the HTTP layer extracts it from `serviceaccounts/<name>/token`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaTokenRequest {
    /// ServiceAccount namespace.
    pub namespace: String,
    /// ServiceAccount name.
    pub sa_name: String,
    /// ServiceAccount UID (must be the stored object's UID).
    pub sa_uid: String,
    /// `spec.audiences`; empty means the issuer's default audience (the issuer URL, like
    /// kube-apiserver's default `--api-audiences`).
    pub audiences: Vec<String>,
    /// `spec.expirationSeconds` (kube-apiserver's default is 3600; range 600..=2^32).
    pub expiration_seconds: i64,
    /// `spec.boundObjectRef` when it is a Pod.
    pub pod: Option<ObjectRef>,
    /// The node of the bound pod, if known.
    pub node: Option<ObjectRef>,
}

/// The `kubernetes.io` claim object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    /// ServiceAccount namespace.
    pub namespace: String,
    /// The ServiceAccount.
    pub serviceaccount: ObjectRef,
    /// The bound pod, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    /// The bound pod's node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
}

/// The claims of a bound ServiceAccount token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaClaims {
    /// Audiences (always serialized as a list, as kube-apiserver does).
    #[serde(deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    /// Expiry (Unix seconds).
    pub exp: i64,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Issuer URL.
    pub iss: String,
    /// Token ID (a UUID); the HTTP layer may keep a revocation list keyed by it.
    pub jti: String,
    /// The Kubernetes-specific claims.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
    /// Not before (Unix seconds).
    pub nbf: i64,
    /// `system:serviceaccount:<namespace>:<name>`.
    pub sub: String,
}

impl SaClaims {
    /// The ServiceAccount UID the token was issued for (the HTTP layer checks it still exists).
    pub fn sa_uid(&self) -> &str {
        &self.kubernetes.serviceaccount.uid
    }

    /// The ServiceAccount name.
    pub fn sa_name(&self) -> &str {
        &self.kubernetes.serviceaccount.name
    }

    /// The ServiceAccount namespace.
    pub fn namespace(&self) -> &str {
        &self.kubernetes.namespace
    }

    /// The token ID.
    pub fn jti(&self) -> &str {
        &self.jti
    }

    /// The bound pod, if any (the HTTP layer checks it still exists with this UID).
    pub fn pod(&self) -> Option<&ObjectRef> {
        self.kubernetes.pod.as_ref()
    }

    /// Expiry as a timestamp.
    pub fn expires_at(&self) -> DateTime<Utc> {
        timestamp(self.exp)
    }
}

/// Accepts an audience as a string or a list of strings (RFC 7519 allows both).
pub(crate) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

fn timestamp(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

/// `system:serviceaccount:<namespace>:<name>`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Splits `system:serviceaccount:<namespace>:<name>` into `(namespace, name)`.
pub fn parse_service_account_username(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The user a verified ServiceAccount token authenticates, as kube-apiserver builds it:
/// username `system:serviceaccount:<ns>:<name>`, UID the ServiceAccount UID, groups
/// `system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`, and
/// extras for the bound pod/node and the credential ID (`JTI=<jti>`).
pub fn user_from_claims(claims: &SaClaims) -> UserInfo {
    let ns = claims.namespace();
    let mut extra = std::collections::BTreeMap::new();
    if let Some(pod) = &claims.kubernetes.pod {
        extra.insert(EXTRA_POD_NAME.to_string(), vec![pod.name.clone()]);
        extra.insert(EXTRA_POD_UID.to_string(), vec![pod.uid.clone()]);
    }
    if let Some(node) = &claims.kubernetes.node {
        extra.insert(EXTRA_NODE_NAME.to_string(), vec![node.name.clone()]);
        extra.insert(EXTRA_NODE_UID.to_string(), vec![node.uid.clone()]);
    }
    if !claims.jti.is_empty() {
        extra.insert(
            EXTRA_CREDENTIAL_ID.to_string(),
            vec![format!("JTI={}", claims.jti)],
        );
    }
    UserInfo {
        username: service_account_username(ns, claims.sa_name()),
        uid: claims.sa_uid().to_string(),
        groups: vec![
            GROUP_SERVICEACCOUNTS.to_string(),
            format!("{GROUP_SERVICEACCOUNTS}:{ns}"),
        ],
        extra,
    }
    .with_authenticated_group()
}

/// The `iss` claim of a JWT, read **without** verifying anything — only to route a token to
/// the verifier responsible for it. `None` if the token is not a JWT.
pub fn peek_issuer(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Iss {
        iss: Option<String>,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Iss>(token)
        .ok()
        .and_then(|c| c.iss)
}

/// Verifies an RS256 signature against `keys` (by `kid` when the header has one, else each key)
/// and returns the decoded claims. Does not check any claim.
pub(crate) fn verify_signature<T: serde::de::DeserializeOwned>(
    token: &str,
    keys: &[(Option<String>, DecodingKey, Algorithm)],
) -> Result<T> {
    let header = jsonwebtoken::decode_header(token)
        .map_err(|_| AuthError::InvalidToken("malformed JWT".into()))?;
    let candidates: Vec<_> = keys
        .iter()
        .filter(|(kid, _, alg)| {
            *alg == header.alg
                && match (&header.kid, kid) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                }
        })
        .collect();
    if candidates.is_empty() {
        return Err(AuthError::InvalidToken(match &header.kid {
            Some(kid) => format!("no {:?} signing key with kid {kid:?}", header.alg),
            None => format!("no {:?} signing key", header.alg),
        }));
    }
    let mut validation = Validation::new(header.alg);
    // Claims are checked by the caller against an explicit `now`.
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    for (_, key, _) in candidates {
        if let Ok(data) = jsonwebtoken::decode::<T>(token, key, &validation) {
            return Ok(data.claims);
        }
    }
    Err(AuthError::InvalidToken(
        "signature verification failed".into(),
    ))
}

/// Checks `exp` (strict) and `nbf`/`iat` (with [`NOT_BEFORE_LEEWAY_SECONDS`]) against `now`.
pub(crate) fn check_times(exp: i64, nbf: Option<i64>, iat: Option<i64>, now: i64) -> Result<()> {
    if now >= exp {
        return Err(AuthError::InvalidToken("token has expired".into()));
    }
    for (claim, value) in [("nbf", nbf), ("iat", iat)] {
        if value.is_some_and(|v| v > now + NOT_BEFORE_LEEWAY_SECONDS) {
            return Err(AuthError::InvalidToken(format!(
                "token is not valid yet ({claim} in the future)"
            )));
        }
    }
    Ok(())
}

/// Checks that `aud` intersects `accepted`.
pub(crate) fn check_audience(aud: &[String], accepted: &[String]) -> Result<()> {
    if aud.iter().any(|a| accepted.contains(a)) {
        Ok(())
    } else {
        Err(AuthError::InvalidToken(format!(
            "token audiences {aud:?} are invalid for the target audiences {accepted:?}"
        )))
    }
}

struct KeyRing {
    current: RsaSigningKey,
    /// Most recent first.
    previous: VecDeque<RsaSigningKey>,
}

/// A cluster's ServiceAccount token issuer.
pub struct SaIssuer {
    issuer: String,
    jwks_uri: String,
    keys: RwLock<KeyRing>,
}

impl std::fmt::Debug for SaIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaIssuer")
            .field("issuer", &self.issuer)
            .field("jwks_uri", &self.jwks_uri)
            .finish_non_exhaustive()
    }
}

impl SaIssuer {
    /// An issuer for `issuer_url` (e.g. `https://127.0.0.1:6443`) with a freshly generated
    /// RSA-2048 key. The JWKS URI is `<issuer_url>/openid/v1/jwks`.
    pub fn new(issuer_url: &str) -> Result<Self> {
        Ok(Self::with_key(issuer_url, RsaSigningKey::generate()?))
    }

    /// An issuer with a given signing key (no key generation).
    pub fn with_key(issuer_url: &str, key: RsaSigningKey) -> Self {
        let issuer = issuer_url.trim_end_matches('/').to_string();
        SaIssuer {
            jwks_uri: format!("{issuer}{JWKS_PATH}"),
            issuer,
            keys: RwLock::new(KeyRing {
                current: key,
                previous: VecDeque::new(),
            }),
        }
    }

    /// Overrides the JWKS URI advertised in discovery (kube-apiserver's
    /// `--service-account-jwks-uri`).
    pub fn with_jwks_uri(mut self, jwks_uri: &str) -> Self {
        self.jwks_uri = jwks_uri.to_string();
        self
    }

    /// The issuer URL (`iss`).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The current signing key's `kid`.
    pub fn current_kid(&self) -> String {
        self.read_keys().current.kid().to_string()
    }

    fn read_keys(&self) -> std::sync::RwLockReadGuard<'_, KeyRing> {
        // A panic while holding the lock cannot leave the ring inconsistent (every write is a
        // single assignment), so a poisoned lock is still usable.
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Generates a new signing key and makes it current; the previous key stays published
    /// (up to [`PREVIOUS_KEYS_KEPT`] previous keys).
    pub fn rotate(&self) -> Result<()> {
        self.rotate_to(RsaSigningKey::generate()?);
        Ok(())
    }

    /// Makes `key` the current signing key (see [`SaIssuer::rotate`]).
    pub fn rotate_to(&self, key: RsaSigningKey) {
        let mut ring = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(&mut ring.current, key);
        ring.previous.push_front(old);
        ring.previous.truncate(PREVIOUS_KEYS_KEPT);
    }

    /// Every published key, current first.
    fn published(&self) -> Vec<RsaSigningKey> {
        let ring = self.read_keys();
        std::iter::once(ring.current.clone())
            .chain(ring.previous.iter().cloned())
            .collect()
    }

    /// Issues a token now. See [`SaIssuer::issue_at`].
    pub fn issue(&self, req: &SaTokenRequest) -> Result<(String, DateTime<Utc>)> {
        self.issue_at(req, Utc::now())
    }

    /// Issues a bound ServiceAccount token as of `now`; returns the token and its expiry.
    /// Rejects `expiration_seconds` outside 600..=2^32 with kube-apiserver's field error.
    pub fn issue_at(
        &self,
        req: &SaTokenRequest,
        now: DateTime<Utc>,
    ) -> Result<(String, DateTime<Utc>)> {
        let secs = req.expiration_seconds;
        if secs < MIN_EXPIRATION_SECONDS {
            return Err(AuthError::InvalidRequest(format!(
                "spec.expirationSeconds: Invalid value: {secs}: may not specify a duration less than 10 minutes"
            )));
        }
        if secs > MAX_EXPIRATION_SECONDS {
            return Err(AuthError::InvalidRequest(format!(
                "spec.expirationSeconds: Invalid value: {secs}: may not specify a duration larger than 2^32 seconds"
            )));
        }
        if req.namespace.is_empty() || req.sa_name.is_empty() {
            return Err(AuthError::InvalidRequest(
                "ServiceAccount namespace and name are required".into(),
            ));
        }
        let iat = now.timestamp();
        let claims = SaClaims {
            aud: if req.audiences.is_empty() {
                vec![self.issuer.clone()]
            } else {
                req.audiences.clone()
            },
            exp: iat + secs,
            iat,
            iss: self.issuer.clone(),
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: KubernetesClaims {
                namespace: req.namespace.clone(),
                serviceaccount: ObjectRef {
                    name: req.sa_name.clone(),
                    uid: req.sa_uid.clone(),
                },
                pod: req.pod.clone(),
                node: req.node.clone(),
            },
            nbf: iat,
            sub: service_account_username(&req.namespace, &req.sa_name),
        };
        let key = self.read_keys().current.clone();
        let token = key.sign(&claims)?;
        Ok((token, timestamp(claims.exp)))
    }

    /// Verifies a ServiceAccount token: RS256 signature by a published key, `iss`, `exp`
    /// (strict) and `nbf` against `now`, an `aud` intersecting `expected_audiences` (empty
    /// means the issuer's default audience, the issuer URL), and a well-formed
    /// `kubernetes.io` claim matching `sub`.
    ///
    /// Existence of the ServiceAccount/pod and revocation are the caller's checks.
    pub fn verify(
        &self,
        token: &str,
        expected_audiences: &[String],
        now: DateTime<Utc>,
    ) -> Result<SaClaims> {
        let keys: Vec<_> = self
            .published()
            .into_iter()
            .map(|k| {
                (
                    Some(k.0.kid.clone()),
                    k.0.decoding.clone(),
                    Algorithm::RS256,
                )
            })
            .collect();
        let claims: SaClaims = verify_signature(token, &keys)?;
        if claims.iss != self.issuer {
            return Err(AuthError::InvalidToken(format!(
                "token issuer {:?} is not {:?}",
                claims.iss, self.issuer
            )));
        }
        check_times(
            claims.exp,
            Some(claims.nbf),
            Some(claims.iat),
            now.timestamp(),
        )?;
        let default_audience = [self.issuer.clone()];
        let accepted = if expected_audiences.is_empty() {
            &default_audience[..]
        } else {
            expected_audiences
        };
        check_audience(&claims.aud, accepted)?;
        let k = &claims.kubernetes;
        if k.namespace.is_empty()
            || k.serviceaccount.name.is_empty()
            || claims.sub != service_account_username(&k.namespace, &k.serviceaccount.name)
        {
            return Err(AuthError::InvalidToken(
                "token is not a valid ServiceAccount token".into(),
            ));
        }
        Ok(claims)
    }

    /// The JWKS (`{"keys": [...]}`), current key first, as served at `/openid/v1/jwks`.
    pub fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .published()
            .iter()
            .map(|k| k.public_jwk().clone())
            .collect();
        json!({ "keys": keys })
    }

    /// The OIDC discovery document served at `/.well-known/openid-configuration`.
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": self.jwks_uri,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
