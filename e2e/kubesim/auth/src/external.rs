//! External JWT issuers: how a cluster trusts tokens from another issuer (e.g. a spoke
//! trusting the hub cluster's ServiceAccount issuer), like a kube-apiserver structured
//! `AuthenticationConfiguration` `jwt` authenticator.
//!
//! The JWKS is fetched over HTTPS (only), trusting only the configured CA, cached, and
//! refetched when a token names a `kid` the cache does not know — at most once per
//! [`ExternalIssuer::min_refetch_interval`], so a stream of tokens with made-up key IDs
//! cannot turn into a stream of fetches. Tokens whose `iss` is not this issuer are rejected
//! before any fetch. Every failure rejects the token (fail closed).

use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::Uri;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::Algorithm;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_rustls::TlsConnector;

use crate::jwt::{check_audience, check_times, verify_signature};
use crate::{AuthError, Result, UserInfo};

/// Default minimum time between two JWKS fetches triggered by unknown key IDs.
pub const DEFAULT_MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// Default bound on one JWKS fetch (connect, TLS, request, body).
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JWKS body accepted.
const MAX_JWKS_BYTES: usize = 1 << 20;

fn default_username_claim() -> String {
    "sub".to_string()
}

/// Configuration of one external issuer (one `jwt` authenticator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalIssuerConfig {
    /// Expected `iss` (exact match).
    pub issuer: String,
    /// Accepted audiences; a token must carry at least one of them.
    pub audiences: Vec<String>,
    /// HTTPS URL of the issuer's JWKS (e.g. `https://127.0.0.1:6443/openid/v1/jwks`).
    pub jwks_url: String,
    /// PEM CA bundle trusted for the JWKS endpoint (nothing else is trusted).
    pub ca_pem: String,
    /// Claim holding the username (default `sub`).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// Prefix prepended to the username (e.g. `hub:`); empty for none.
    #[serde(default)]
    pub username_prefix: String,
    /// Claim holding groups (a string or a list of strings), if any.
    #[serde(default)]
    pub groups_claim: Option<String>,
    /// Prefix prepended to every group.
    #[serde(default)]
    pub groups_prefix: String,
    /// When set, the JWKS URL is not `jwks_url` but the `jwks_uri` named by the OIDC
    /// discovery document fetched from this HTTPS URL (usually
    /// `<issuer>/.well-known/openid-configuration`), whose `issuer` must equal [`Self::issuer`]
    /// byte for byte, as kube-apiserver's structured authentication does.
    #[serde(default)]
    pub discovery_url: Option<String>,
}

impl ExternalIssuerConfig {
    /// A config with the defaults (`sub` as username, no prefixes, no groups claim).
    pub fn new(issuer: &str, audiences: Vec<String>, jwks_url: &str, ca_pem: &str) -> Self {
        ExternalIssuerConfig {
            issuer: issuer.to_string(),
            audiences,
            jwks_url: jwks_url.to_string(),
            ca_pem: ca_pem.to_string(),
            username_claim: default_username_claim(),
            username_prefix: String::new(),
            groups_claim: None,
            groups_prefix: String::new(),
            discovery_url: None,
        }
    }

    /// A config that finds its JWKS through OIDC discovery at `discovery_url`.
    pub fn with_discovery(
        issuer: &str,
        audiences: Vec<String>,
        discovery_url: &str,
        ca_pem: &str,
    ) -> Self {
        let mut c = Self::new(issuer, audiences, discovery_url, ca_pem);
        c.discovery_url = Some(discovery_url.to_string());
        c
    }
}

type VerificationKeys = Vec<(Option<String>, jsonwebtoken::DecodingKey, Algorithm)>;

#[derive(Default)]
struct JwksCache {
    keys: VerificationKeys,
    last_fetch: Option<Instant>,
    fetch_count: u64,
}

/// A trusted external issuer with its cached JWKS. Share it (`Arc`) across requests.
pub struct ExternalIssuer {
    config: ExternalIssuerConfig,
    jwks_uri: Uri,
    tls: std::sync::Arc<rustls::ClientConfig>,
    min_refetch_interval: Duration,
    fetch_timeout: Duration,
    /// Held only briefly, never across I/O: verifications with known keys never wait.
    cache: std::sync::Mutex<JwksCache>,
    /// Single flight: tokens with unknown keys wait for one in-flight fetch instead of each
    /// fetching.
    fetch_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ExternalIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalIssuer")
            .field("issuer", &self.config.issuer)
            .field("jwks_url", &self.config.jwks_url)
            .finish_non_exhaustive()
    }
}

impl ExternalIssuer {
    /// Validates the configuration (HTTPS JWKS URL with a host, a parseable CA, at least one
    /// audience, a username claim) and prepares the TLS client. No network I/O.
    pub fn new(config: ExternalIssuerConfig) -> Result<Self> {
        let invalid = |m: String| Err(AuthError::InvalidRequest(m));
        let jwks_uri: Uri = match config.jwks_url.parse() {
            Ok(u) => u,
            Err(e) => return invalid(format!("jwks url {:?}: {e}", config.jwks_url)),
        };
        if jwks_uri.scheme_str() != Some("https") || jwks_uri.host().is_none() {
            return invalid(format!(
                "jwks url {:?} must be an https URL with a host",
                config.jwks_url
            ));
        }
        if config.issuer.is_empty() {
            return invalid("issuer must not be empty".into());
        }
        if config.audiences.is_empty() {
            return invalid("at least one audience is required".into());
        }
        if config.username_claim.is_empty() {
            return invalid("username claim must not be empty".into());
        }
        let tls = crate::pki::client_config(&config.ca_pem, None)?;
        Ok(ExternalIssuer {
            config,
            jwks_uri,
            tls,
            min_refetch_interval: DEFAULT_MIN_REFETCH_INTERVAL,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            cache: std::sync::Mutex::new(JwksCache::default()),
            fetch_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Sets the minimum time between refetches caused by unknown key IDs.
    pub fn with_min_refetch_interval(mut self, interval: Duration) -> Self {
        self.min_refetch_interval = interval;
        self
    }

    /// Sets the bound on one JWKS fetch.
    pub fn with_fetch_timeout(mut self, timeout: Duration) -> Self {
        self.fetch_timeout = timeout;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ExternalIssuerConfig {
        &self.config
    }

    /// The minimum time between refetches caused by unknown key IDs.
    pub fn min_refetch_interval(&self) -> Duration {
        self.min_refetch_interval
    }

    /// How many JWKS fetches were attempted so far (for tests and metrics).
    pub fn fetch_count(&self) -> u64 {
        self.lock_cache().fetch_count
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, JwksCache> {
        // Every update is a plain assignment, so a poisoned cache is still consistent.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `token` claims to come from this issuer (unverified `iss`); for routing.
    pub fn claims_issuer(&self, token: &str) -> bool {
        crate::jwt::peek_issuer(token).as_deref() == Some(self.config.issuer.as_str())
    }

    /// Verifies `token` as of `now` and maps it to a user: signature by a JWKS key, `iss`,
    /// `exp` (required, strict), `nbf`/`iat`, an audience in the configured list, the username
    /// claim (`email` additionally requires `email_verified` not false), groups, plus
    /// `system:authenticated`.
    ///
    /// Errors: [`AuthError::InvalidToken`] for a bad token, [`AuthError::Jwks`] when the keys
    /// could not be fetched — both mean "not authenticated".
    pub async fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<UserInfo> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::InvalidToken("malformed JWT".into()))?;
        if !self.claims_issuer(token) {
            return Err(AuthError::InvalidToken(format!(
                "token issuer is not {:?}",
                self.config.issuer
            )));
        }
        let keys = self.keys_for(header.kid.as_deref()).await?;
        let claims: serde_json::Map<String, Value> = verify_signature(token, &keys)?;
        self.claims_to_user(&claims, now.timestamp())
    }

    /// Verifies `token` as of `now` — signature by a JWKS key, `iss`, `exp` (required,
    /// strict), `nbf`/`iat`, an audience in the configured list — and returns its claims
    /// without mapping them to a user (for structured authentication's own rules).
    pub async fn verify_claims(
        &self,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<serde_json::Map<String, Value>> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::InvalidToken("malformed JWT".into()))?;
        if !self.claims_issuer(token) {
            return Err(AuthError::InvalidToken(format!(
                "token issuer is not {:?}",
                self.config.issuer
            )));
        }
        let keys = self.keys_for(header.kid.as_deref()).await?;
        let claims: serde_json::Map<String, Value> = verify_signature(token, &keys)?;
        self.check_standard_claims(&claims, now.timestamp())?;
        Ok(claims)
    }

    /// The cached keys, fetching first if the cache is empty or does not know `kid` (and the
    /// rate limit allows).
    async fn keys_for(&self, kid: Option<&str>) -> Result<VerificationKeys> {
        let known = |c: &JwksCache| match kid {
            Some(kid) => c.keys.iter().any(|(k, _, _)| k.as_deref() == Some(kid)),
            None => !c.keys.is_empty(),
        };
        {
            let cache = self.lock_cache();
            if known(&cache) {
                return Ok(cache.keys.clone());
            }
        }
        let _single_flight = self.fetch_lock.lock().await;
        let may_fetch = {
            let mut cache = self.lock_cache();
            // Another task may have fetched while we waited.
            if known(&cache) {
                return Ok(cache.keys.clone());
            }
            let may = cache
                .last_fetch
                .is_none_or(|t| t.elapsed() >= self.min_refetch_interval);
            if may {
                cache.last_fetch = Some(Instant::now());
                cache.fetch_count += 1;
            }
            may
        };
        if may_fetch {
            let fetched = self.fetch().await;
            let mut cache = self.lock_cache();
            match fetched {
                Ok(keys) => cache.keys = keys,
                // With nothing cached we cannot verify anything: say why.
                Err(e) if cache.keys.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(issuer = %self.config.issuer, error = %e, "JWKS refetch failed; keeping cached keys");
                }
            }
        }
        let cache = self.lock_cache();
        if cache.keys.is_empty() {
            return Err(AuthError::Jwks(format!(
                "no keys for issuer {:?} (last fetch failed; next attempt allowed after {:?})",
                self.config.issuer, self.min_refetch_interval
            )));
        }
        Ok(cache.keys.clone())
    }

    async fn fetch(&self) -> Result<VerificationKeys> {
        let body = tokio::time::timeout(self.fetch_timeout, self.discover_and_get_jwks())
            .await
            .map_err(|_| {
                AuthError::Jwks(format!(
                    "fetching {} timed out after {:?}",
                    self.config.jwks_url, self.fetch_timeout
                ))
            })??;
        let set: JwkSet = serde_json::from_slice(&body)
            .map_err(|e| AuthError::Jwks(format!("{}: invalid JWKS: {e}", self.config.jwks_url)))?;
        Ok(set
            .keys
            .iter()
            .filter_map(|jwk| {
                let alg = jwk_algorithm(jwk)?;
                let key = jsonwebtoken::DecodingKey::from_jwk(jwk).ok()?;
                Some((jwk.common.key_id.clone(), key, alg))
            })
            .collect())
    }

    /// The JWKS body: from `jwks_url`, or from the `jwks_uri` the discovery document names.
    async fn discover_and_get_jwks(&self) -> Result<Bytes> {
        let Some(discovery_url) = &self.config.discovery_url else {
            return self.get_body(&self.jwks_uri, &self.config.jwks_url).await;
        };
        #[derive(Deserialize)]
        struct Discovery {
            issuer: Option<String>,
            jwks_uri: Option<String>,
        }
        let body = self.get_body(&self.jwks_uri, discovery_url).await?;
        let doc: Discovery = serde_json::from_slice(&body).map_err(|e| {
            AuthError::Jwks(format!("{discovery_url}: invalid discovery document: {e}"))
        })?;
        if doc.issuer.as_deref() != Some(self.config.issuer.as_str()) {
            return Err(AuthError::Jwks(format!(
                "{discovery_url}: discovery document issuer {:?} does not match {:?}",
                doc.issuer.unwrap_or_default(),
                self.config.issuer
            )));
        }
        let jwks_url = doc.jwks_uri.ok_or_else(|| {
            AuthError::Jwks(format!(
                "{discovery_url}: discovery document has no jwks_uri"
            ))
        })?;
        let jwks_uri: Uri = jwks_url
            .parse()
            .ok()
            .filter(|u: &Uri| u.scheme_str() == Some("https") && u.host().is_some())
            .ok_or_else(|| {
                AuthError::Jwks(format!(
                    "{discovery_url}: jwks_uri {jwks_url:?} is not an https URL with a host"
                ))
            })?;
        self.get_body(&jwks_uri, &jwks_url).await
    }

    async fn get_body(&self, uri: &Uri, url: &str) -> Result<Bytes> {
        let err =
            |what: &str, e: &dyn std::fmt::Display| AuthError::Jwks(format!("{url}: {what}: {e}"));
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| err("connect", &e))?;
        let name = ServerName::try_from(host.clone()).map_err(|e| err("server name", &e))?;
        let tls = TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| err("TLS", &e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| err("HTTP handshake", &e))?;
        let conn_task = tokio::spawn(conn);
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        let request = http::Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| err("request", &e))?;
        let result = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| err("request", &e))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map_err(|e| err("body", &e))?
                .to_bytes();
            if !status.is_success() {
                return Err(AuthError::Jwks(format!("{url}: HTTP {status}")));
            }
            Ok(body)
        }
        .await;
        conn_task.abort();
        result
    }

    fn claims_to_user(
        &self,
        claims: &serde_json::Map<String, Value>,
        now: i64,
    ) -> Result<UserInfo> {
        self.check_standard_claims(claims, now)?;
        self.map_claims(claims)
    }

    fn check_standard_claims(
        &self,
        claims: &serde_json::Map<String, Value>,
        now: i64,
    ) -> Result<()> {
        let int = |name: &str| claims.get(name).and_then(Value::as_i64);
        let exp = int("exp").ok_or_else(|| AuthError::InvalidToken("token has no exp".into()))?;
        check_times(exp, int("nbf"), int("iat"), now)?;
        if claims.get("iss").and_then(Value::as_str) != Some(self.config.issuer.as_str()) {
            return Err(AuthError::InvalidToken(format!(
                "token issuer is not {:?}",
                self.config.issuer
            )));
        }
        let aud = match claims.get("aud") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            _ => Vec::new(),
        };
        check_audience(&aud, &self.config.audiences)
    }

    fn map_claims(&self, claims: &serde_json::Map<String, Value>) -> Result<UserInfo> {
        let claim = &self.config.username_claim;
        let username = claims
            .get(claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                AuthError::InvalidToken(format!("username claim {claim:?} missing or not a string"))
            })?;
        if claim == "email"
            && claims
                .get("email_verified")
                .is_some_and(|v| v != &Value::Bool(true))
        {
            return Err(AuthError::InvalidToken("email not verified".into()));
        }
        let mut groups = Vec::new();
        if let Some(groups_claim) = &self.config.groups_claim {
            let values: Vec<&str> = match claims.get(groups_claim) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::String(s)) => vec![s.as_str()],
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_str().ok_or_else(|| {
                            AuthError::InvalidToken(format!(
                                "groups claim {groups_claim:?} has a non-string value"
                            ))
                        })
                    })
                    .collect::<Result<_>>()?,
                Some(_) => {
                    return Err(AuthError::InvalidToken(format!(
                        "groups claim {groups_claim:?} is not a string or list of strings"
                    )));
                }
            };
            groups = values
                .into_iter()
                .map(|g| format!("{}{g}", self.config.groups_prefix))
                .collect();
        }
        Ok(UserInfo {
            username: format!("{}{username}", self.config.username_prefix),
            groups,
            ..Default::default()
        }
        .with_authenticated_group())
    }
}

/// The signature algorithm a JWK is for (explicit `alg`, else inferred from the key type).
fn jwk_algorithm(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    match (&jwk.common.key_algorithm, &jwk.algorithm) {
        (Some(KeyAlgorithm::RS256), _) => Some(Algorithm::RS256),
        (Some(KeyAlgorithm::RS384), _) => Some(Algorithm::RS384),
        (Some(KeyAlgorithm::RS512), _) => Some(Algorithm::RS512),
        (Some(KeyAlgorithm::ES256), _) => Some(Algorithm::ES256),
        (Some(KeyAlgorithm::ES384), _) => Some(Algorithm::ES384),
        (Some(_), _) => None,
        (None, AlgorithmParameters::RSA(_)) => Some(Algorithm::RS256),
        (None, AlgorithmParameters::EllipticCurve(ec)) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        (None, _) => None,
    }
}

#[cfg(test)]
mod tests;
