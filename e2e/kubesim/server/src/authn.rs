//! Authentication, in kube-apiserver's order: a verified client certificate (x509), then the
//! bearer token: static tokens, this cluster's ServiceAccount JWTs, external JWT issuers.
//! Anything else is 401 (anonymous requests are only served on the public paths).

use crate::server::ClusterServer;
use chrono::{DateTime, Duration, Utc};
use futures::future::BoxFuture;
use http::HeaderMap;
use kubesim_auth::UserInfo;
use kubesim_auth::jwt::{self, SaClaims};

/// The outcome of authenticating a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authenticated {
    /// An authenticated user.
    User(UserInfo),
    /// No valid credentials (401).
    Rejected,
}

/// A verifier for JWTs of another issuer (how a spoke trusts its hub's ServiceAccount
/// tokens, like kube-apiserver's structured `AuthenticationConfiguration` JWT authenticators).
pub trait ExternalAuthenticator: Send + Sync {
    /// The issuer URL (`iss`) this authenticator is responsible for.
    fn issuer(&self) -> &str;
    /// Verify a token as of `now`; the error message must never contain the token.
    fn verify<'a>(
        &'a self,
        token: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<UserInfo, String>>;
    /// Whether it came from an `AuthenticationConfiguration` (replaced as a whole when the
    /// configuration is reloaded).
    fn is_from_authentication_config(&self) -> bool {
        false
    }
}

/// A successfully authenticated token.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    /// The user.
    pub user: UserInfo,
    /// The audiences the token is valid for (of those requested).
    pub audiences: Vec<String>,
}

/// The bearer token of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Authenticate a request.
pub async fn authenticate(
    server: &ClusterServer,
    headers: &HeaderMap,
    peer_user: Option<UserInfo>,
) -> Authenticated {
    if let Some(u) = peer_user {
        return Authenticated::User(u);
    }
    let Some(token) = bearer(headers) else {
        return Authenticated::Rejected;
    };
    match authenticate_token(server, token, &server.api_audiences()).await {
        Ok(t) => Authenticated::User(t.user),
        Err(reason) => {
            tracing::debug!(
                cluster = %server.name,
                token = %kubesim_auth::token_hash(token),
                %reason,
                "bearer token rejected"
            );
            Authenticated::Rejected
        }
    }
}

/// The clock token verification uses (shifted by the `tokenClockSkewSeconds` fault).
fn verification_now(server: &ClusterServer) -> DateTime<Utc> {
    Utc::now() + Duration::seconds(server.faults.token_clock_skew_seconds())
}

/// Authenticate a bearer token for `audiences` (a request's API audiences, or a
/// TokenReview's `spec.audiences`). The error is safe to show (never contains the token).
pub async fn authenticate_token(
    server: &ClusterServer,
    token: &str,
    audiences: &[String],
) -> Result<TokenAuth, String> {
    if server.faults.is_token_revoked(token) {
        return Err("token has been revoked".into());
    }
    let static_user = server
        .static_tokens
        .read()
        .ok()
        .and_then(|m| m.get(token).cloned());
    if let Some(user) = static_user {
        return Ok(TokenAuth {
            user,
            audiences: audiences.to_vec(),
        });
    }
    let Some(issuer) = jwt::peek_issuer(token) else {
        return Err("token is neither a known static token nor a JWT".into());
    };
    let now = verification_now(server);
    if issuer == server.url {
        let sa = server.sa_issuer().await.map_err(|e| e.message)?;
        let claims = sa
            .verify(token, audiences, now)
            .map_err(|e| e.to_string())?;
        check_sa_token_still_valid(server, &claims)?;
        let accepted: Vec<String> = claims
            .aud
            .iter()
            .filter(|a| audiences.contains(a))
            .cloned()
            .collect();
        return Ok(TokenAuth {
            user: jwt::user_from_claims(&claims),
            audiences: if audiences.is_empty() {
                claims.aud.clone()
            } else {
                accepted
            },
        });
    }
    let externals: Vec<_> = server
        .external_issuers
        .read()
        .map(|v| v.clone())
        .unwrap_or_default();
    match externals.iter().find(|e| e.issuer() == issuer) {
        Some(ext) => Ok(TokenAuth {
            user: ext.verify(token, now).await?,
            audiences: audiences.to_vec(),
        }),
        None => Err(format!("no authenticator for issuer {issuer:?}")),
    }
}

/// kube-apiserver's checks beyond the signature: the ServiceAccount (same UID) and the bound
/// pod (same UID) still exist; plus kubesim's revocation fault.
fn check_sa_token_still_valid(server: &ClusterServer, claims: &SaClaims) -> Result<(), String> {
    if let Some(cutoff) = server.faults.sa_tokens_revoked_before_ms() {
        let issued_ms = server
            .issued_tokens
            .read()
            .ok()
            .and_then(|m| m.get(claims.jti()).copied())
            .unwrap_or(claims.iat.saturating_mul(1000));
        if issued_ms <= cutoff {
            return Err("service account token has been revoked".into());
        }
    }
    let ns = claims.namespace();
    let sa = server
        .store
        .resolve("", "v1", "serviceaccounts")
        .ok_or("serviceaccounts are not served")?;
    let obj = server
        .store
        .get(&sa, Some(ns), claims.sa_name())
        .map_err(|_| format!("service account {ns}/{} has been deleted", claims.sa_name()))?;
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if !claims.sa_uid().is_empty() && uid != claims.sa_uid() {
        return Err(format!(
            "service account UID ({}) does not match claim ({})",
            uid,
            claims.sa_uid()
        ));
    }
    if let Some(pod) = claims.pod() {
        let pods = server
            .store
            .resolve("", "v1", "pods")
            .ok_or("pods are not served")?;
        let obj = server
            .store
            .get(&pods, Some(ns), &pod.name)
            .map_err(|_| format!("pod {ns}/{} has been deleted", pod.name))?;
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if uid != pod.uid {
            return Err(format!(
                "pod UID ({uid}) does not match claim ({})",
                pod.uid
            ));
        }
    }
    Ok(())
}

/// Adapter: `kubesim_auth`'s external issuer as an [`ExternalAuthenticator`].
struct External(kubesim_auth::external::ExternalIssuer);

impl ExternalAuthenticator for External {
    fn issuer(&self) -> &str {
        &self.0.config().issuer
    }

    fn verify<'a>(
        &'a self,
        token: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<UserInfo, String>> {
        Box::pin(async move { self.0.verify(token, now).await.map_err(|e| e.to_string()) })
    }
}

/// An authenticator for `issuer_url`'s tokens with an audience in `audiences`, verified
/// against the JWKS fetched over HTTPS from `<issuer_url>/openid/v1/jwks` (trusting only
/// `ca_pem`). Usernames are the `sub` claim, unprefixed (so a hub ServiceAccount is
/// `system:serviceaccount:<ns>:<name>` on the spoke too). An unknown `kid` triggers a JWKS
/// refetch at most every 200 ms.
pub fn external_issuer(
    issuer_url: &str,
    ca_pem: &str,
    audiences: &[String],
) -> Result<std::sync::Arc<dyn ExternalAuthenticator>, crate::KubesimError> {
    let config = kubesim_auth::external::ExternalIssuerConfig::new(
        issuer_url,
        audiences.to_vec(),
        &format!("{}{}", issuer_url.trim_end_matches('/'), jwt::JWKS_PATH),
        ca_pem,
    );
    // A short refetch interval: tests rotate keys and should not wait 10 s for the JWKS.
    let ext = kubesim_auth::external::ExternalIssuer::new(config)?
        .with_min_refetch_interval(std::time::Duration::from_millis(200));
    Ok(std::sync::Arc::new(External(ext)))
}

/// Adapter: one `jwt` authenticator of a structured `AuthenticationConfiguration`.
struct Structured(kubesim_auth::structured::JwtAuthenticator);

impl ExternalAuthenticator for Structured {
    fn issuer(&self) -> &str {
        self.0.issuer_url()
    }

    fn verify<'a>(
        &'a self,
        token: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<UserInfo, String>> {
        Box::pin(async move { self.0.verify(token, now).await.map_err(|e| e.to_string()) })
    }

    fn is_from_authentication_config(&self) -> bool {
        true
    }
}

/// The authenticators of an `apiserver.config.k8s.io` `AuthenticationConfiguration` (YAML or
/// JSON text), validated as kube-apiserver validates it: any error, or any field kubesim does
/// not implement, is refused with the field named. `min_refetch_interval` bounds JWKS
/// refetches on unknown key IDs.
pub fn authentication_config(
    text: &str,
    min_refetch_interval: std::time::Duration,
) -> Result<Vec<std::sync::Arc<dyn ExternalAuthenticator>>, crate::KubesimError> {
    let value: serde_json::Value = crate::yaml::from_str(text).map_err(|e| {
        kubesim_auth::AuthError::InvalidRequest(format!("AuthenticationConfiguration: {e}"))
    })?;
    let config = kubesim_auth::structured::AuthenticationConfiguration::from_value_with(
        &value,
        min_refetch_interval,
    )?;
    Ok(config
        .jwt
        .into_iter()
        .map(|a| std::sync::Arc::new(Structured(a)) as std::sync::Arc<dyn ExternalAuthenticator>)
        .collect())
}

/// kube-apiserver's impersonation headers: `Impersonate-User`, `Impersonate-Group`
/// (repeatable), `Impersonate-Uid`, `Impersonate-Extra-<key>`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Impersonation {
    /// The user to act as.
    pub user: String,
    /// Groups to act as (empty: derived like kube-apiserver does).
    pub groups: Vec<String>,
    /// UID.
    pub uid: String,
    /// Extra attributes.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The impersonation requested by `headers`, if any. `Err` for groups/extra without a user.
pub fn impersonation(headers: &HeaderMap) -> Result<Option<Impersonation>, String> {
    let get = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let user = get("impersonate-user")
        .into_iter()
        .next()
        .unwrap_or_default();
    let groups = get("impersonate-group");
    let uid = get("impersonate-uid")
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut extra = std::collections::BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-")
            && let Ok(v) = value.to_str()
        {
            let key = crate::server::request::percent_decode(key);
            extra
                .entry(key)
                .or_insert_with(Vec::new)
                .push(v.to_string());
        }
    }
    if user.is_empty() {
        if !groups.is_empty() || !extra.is_empty() || !uid.is_empty() {
            return Err("requested impersonation of groups, uid or extra without a user".into());
        }
        return Ok(None);
    }
    Ok(Some(Impersonation {
        user,
        groups,
        uid,
        extra,
    }))
}

/// The user an impersonation resolves to (kube-apiserver's rules: ServiceAccount users get
/// their ServiceAccount groups when no groups are given; everyone but `system:anonymous`
/// gets `system:authenticated`).
pub fn impersonated_user(imp: &Impersonation) -> UserInfo {
    let mut groups = imp.groups.clone();
    if groups.is_empty()
        && let Some((ns, _)) = jwt::parse_service_account_username(&imp.user)
    {
        groups.push(kubesim_auth::GROUP_SERVICEACCOUNTS.to_string());
        groups.push(format!("{}:{ns}", kubesim_auth::GROUP_SERVICEACCOUNTS));
    }
    let user = UserInfo {
        username: imp.user.clone(),
        uid: imp.uid.clone(),
        groups,
        extra: imp.extra.clone(),
    };
    if imp.user == kubesim_auth::USER_ANONYMOUS {
        user
    } else {
        user.with_authenticated_group()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(http::header::AUTHORIZATION, "bearer  xyz ".parse().unwrap());
        assert_eq!(bearer(&h), Some("xyz"));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn impersonation_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(impersonation(&h), Ok(None));
        h.append("Impersonate-Group", "devs".parse().unwrap());
        assert!(impersonation(&h).is_err(), "groups without a user");
        h.insert(
            "Impersonate-User",
            "system:serviceaccount:ns1:bot".parse().unwrap(),
        );
        h.insert("Impersonate-Extra-scopes%2Fa", "x".parse().unwrap());
        let imp = impersonation(&h).unwrap().unwrap();
        assert_eq!(imp.groups, vec!["devs"]);
        assert_eq!(imp.extra["scopes/a"], vec!["x"]);
        let u = impersonated_user(&imp);
        assert_eq!(u.groups, vec!["devs", "system:authenticated"]);
        let sa = impersonated_user(&Impersonation {
            user: "system:serviceaccount:ns1:bot".into(),
            ..Default::default()
        });
        assert_eq!(
            sa.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:ns1",
                "system:authenticated"
            ]
        );
    }
}
