//! Secret values (tokens, private keys) that must never reach logs or error messages.

use sha2::{Digest, Sha256};

/// A secret string. `Debug` prints only a short hash, and there is no `Display`: the value is
/// reachable only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that must send it (a header, a TLS identity).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A short, non-reversible identifier safe to log: the first 8 hex digits of SHA-256.
    pub fn short_hash(&self) -> String {
        short_hash(self.0.as_bytes())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(sha256:{})", self.short_hash())
    }
}

/// First 8 hex digits of SHA-256 over `bytes`.
pub fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..4])
}

/// Replaces token-like words with `[REDACTED]`, so a plugin that echoes a token on stderr
/// cannot leak it through our error messages. A word (a run of base64/base64url/JWT/hex
/// characters) is token-like when one of its `.`- or `/`-separated segments is 20 characters
/// or longer: JWT parts, opaque tokens and keys are; prose, paths and dotted API names
/// (`ExecCredential.Spec.Cluster.Config`) are not.
pub fn redact_token_like(text: &str) -> String {
    const MIN_SEGMENT: usize = 20;
    let is_tokenish =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '/' | '=' | '%');
    let flush = |run: &mut String, out: &mut String| {
        if run.split(['.', '/']).any(|seg| seg.len() >= MIN_SEGMENT) {
            out.push_str("[REDACTED]");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    for c in text.chars() {
        if is_tokenish(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_value() {
        let s = Secret::new("super-secret-token-value");
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("super-secret"), "{dbg}");
        assert!(dbg.starts_with("Secret(sha256:"));
        assert_eq!(s.short_hash().len(), 8);
    }

    #[test]
    fn redacts_long_runs_only() {
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl";
        let out = redact_token_like(&format!("error: bad token {jwt} for user bob"));
        assert_eq!(out, "error: bad token [REDACTED] for user bob");
        let plain =
            "missing ExecCredential.Spec.Cluster.Config for client.authentication.k8s.io/exec";
        assert_eq!(redact_token_like(plain), plain);
        assert_eq!(
            redact_token_like("t=0123456789abcdef0123456789"),
            "[REDACTED]"
        );
    }
}
