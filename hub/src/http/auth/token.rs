//! Bearer tokens: extraction from a request, the SHA-256 cache key, and the unverified
//! `exp` claim that bounds how long a positive review may be cached.

use base64::Engine;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// SHA-256 of a bearer token: the only form in which a token is kept (cache keys) or shown.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// Hash `token`.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// The first 12 hex digits: enough to correlate log lines, useless to an attacker.
    pub fn prefix(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenHash({}…)", self.prefix())
    }
}

/// Why a request carries no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BearerError {
    /// No `Authorization` header.
    #[error("no bearer token: send 'Authorization: Bearer <ServiceAccount token>'")]
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    #[error("malformed Authorization header: expected 'Bearer <ServiceAccount token>'")]
    Malformed,
}

/// The bearer token of `headers` (scheme matched case-insensitively, as RFC 7235 says).
pub fn bearer_token(headers: &http::HeaderMap) -> Result<&str, BearerError> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next().ok_or(BearerError::Missing)?;
    if values.next().is_some() {
        return Err(BearerError::Malformed);
    }
    let value = value.to_str().map_err(|_| BearerError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(BearerError::Malformed)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(' ') {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// The `exp` claim of a JWT, read WITHOUT verifying the signature: it only ever shortens a
/// cache lifetime, never grants anything. `None` for opaque tokens or a missing/invalid claim.
pub fn jwt_expiry(token: &str) -> Option<SystemTime> {
    let mut parts = token.split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?;
    let secs = exp
        .as_u64()
        .or_else(|| exp.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(br#"{"alg":"RS256"}"#),
            e.encode(claims.to_string())
        )
    }

    #[test]
    fn reads_exp_without_verifying() {
        let t = jwt(serde_json::json!({"exp": 2_000_000_000u64, "sub": "x"}));
        assert_eq!(
            jwt_expiry(&t),
            Some(UNIX_EPOCH + Duration::from_secs(2_000_000_000))
        );
        assert_eq!(jwt_expiry(&jwt(serde_json::json!({"sub": "x"}))), None);
        assert_eq!(jwt_expiry(&jwt(serde_json::json!({"exp": "soon"}))), None);
        assert_eq!(jwt_expiry("opaque-static-token"), None);
        assert_eq!(jwt_expiry("a.b.c.d"), None);
        assert_eq!(jwt_expiry("a.!!!.c"), None);
    }

    #[test]
    fn bearer_extraction() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer_token(&h), Err(BearerError::Missing));
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&h), Ok("abc"));
        h.insert(http::header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer_token(&h), Ok("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer ", "Bearer a b", "abc"] {
            h.insert(http::header::AUTHORIZATION, bad.parse().unwrap());
            assert_eq!(bearer_token(&h), Err(BearerError::Malformed), "{bad}");
        }
        h.insert(http::header::AUTHORIZATION, "Bearer a".parse().unwrap());
        h.append(http::header::AUTHORIZATION, "Bearer b".parse().unwrap());
        assert_eq!(bearer_token(&h), Err(BearerError::Malformed));
    }

    #[test]
    fn hash_prefix_is_not_the_token() {
        let h = TokenHash::of("secret-token");
        assert_eq!(h.prefix().len(), 12);
        assert!(!format!("{h:?}").contains("secret"));
        assert_ne!(TokenHash::of("a"), TokenHash::of("b"));
    }
}
