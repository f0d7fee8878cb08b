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

/// Makes plugin stderr safe to show in errors and logs (it may echo a token, a key or a
/// password). Two rules, applied line by line:
///
/// 1. Everything after a secret-looking *label* is replaced by `[REDACTED]`: a word ending in
///    `token`, `secret`, `key`, `password`, `passwd`, `credential` or `authorization` (plural
///    too, any case, so `AWS_SECRET_ACCESS_KEY`, `apiKey`, `"token"` count) followed by `=` or
///    `:`, or the word `bearer` followed by a space. Over-redacting the rest of such a line is
///    the price of never printing a short or plain-looking value.
/// 2. Token-like words are replaced by `[REDACTED]`. A word is a run of
///    base64/base64url/JWT/hex/URL characters; it is token-like when one of its `.`- or
///    `/`-separated segments has 8 or more characters and is not a plain word. Plain words are
///    letters (with `-`, `_` or `=` between parts of at most 31 letters each) without random-looking
///    case (more than a third of the letters after the first in upper case, unless all are):
///    prose, flags, paths and dotted API names (`ExecCredential.Spec.Cluster.Config`,
///    `--service-account`) stay readable; anything with digits or `+%~`, such as JWTs, opaque
///    tokens, keys and long numbers, does not.
pub fn redact_token_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        redact_words(redact_after_label(line), &mut out);
    }
    out
}

const REDACTED: &str = "[REDACTED]";

/// Rule 1: cuts `line` after the first secret-looking label, appending the marker.
fn redact_after_label(line: &str) -> std::borrow::Cow<'_, str> {
    const LABELS: &[&str] = &[
        "token",
        "secret",
        "key",
        "password",
        "passwd",
        "credential",
        "authorization",
    ];
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let bytes = line.as_bytes();
    let mut start = None;
    for (i, c) in line
        .char_indices()
        .chain(std::iter::once((line.len(), ' ')))
    {
        match (is_word(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                start = None;
                let word = line[s..i].to_ascii_lowercase();
                let base = word.strip_suffix('s').unwrap_or(&word);
                let labelled = LABELS.iter().any(|l| base.ends_with(l));
                let rest = &line[i..];
                // Optional closing quote and spaces, then the separator.
                let after = rest.trim_start_matches(['"', '\'', ' ', '\t']);
                let cut = if labelled && after.starts_with(['=', ':']) {
                    Some(line.len() - after.len() + 1)
                } else if word == "bearer" && bytes.get(i).is_some_and(|b| *b == b' ') {
                    Some(i + 1)
                } else {
                    None
                };
                if let Some(cut) = cut {
                    if line[cut..].trim().is_empty() {
                        return line.into();
                    }
                    return format!("{} {REDACTED}", line[..cut].trim_end()).into();
                }
            }
            _ => {}
        }
    }
    line.into()
}

/// Rule 2: replaces token-like words.
fn redact_words(text: std::borrow::Cow<'_, str>, out: &mut String) {
    let is_tokenish = |c: char| {
        c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '/' | '=' | '%' | '~')
    };
    let flush = |run: &mut String, out: &mut String| {
        if run.split(['.', '/']).any(is_token_like_segment) {
            out.push_str(REDACTED);
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    let mut run = String::new();
    for c in text.chars() {
        if is_tokenish(c) {
            run.push(c);
        } else {
            flush(&mut run, out);
            out.push(c);
        }
    }
    flush(&mut run, out);
}

fn is_token_like_segment(seg: &str) -> bool {
    const MIN_LEN: usize = 8;
    const MAX_PLAIN_PART: usize = 31;
    if seg.len() < MIN_LEN {
        return false;
    }
    let plain_part = |part: &str| {
        if part.len() > MAX_PLAIN_PART || !part.chars().all(|c| c.is_ascii_alphabetic()) {
            return false;
        }
        let rest: Vec<char> = part.chars().skip(1).collect();
        let upper = rest.iter().filter(|c| c.is_ascii_uppercase()).count();
        // camelCase and ALLCAPS are words; aBcDeFgH is not.
        upper == rest.len() || upper * 3 <= rest.len()
    };
    let plain = seg.chars().any(|c| c.is_ascii_alphabetic())
        && seg
            .split(['-', '_', '='])
            .all(|p| p.is_empty() || plain_part(p));
    !plain
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
    fn redacts_short_tokens_that_are_not_plain_words() {
        for (input, want) in [
            ("bad token Ab3dE9xQ here", "bad token [REDACTED] here"),
            ("opaque 0a1b2c3d4e", "opaque [REDACTED]"),
            ("random AbCdEfGhIj", "random [REDACTED]"),
            ("b64 Zm9vYmFyYmF6", "b64 [REDACTED]"),
            ("pin 12345678", "pin [REDACTED]"),
            ("flag --audience=Ab3dE9xQ", "flag [REDACTED]"),
            // Seven characters: below the threshold.
            ("short Ab3dE9x ok", "short Ab3dE9x ok"),
        ] {
            assert_eq!(redact_token_like(input), want, "{input}");
        }
        for plain in [
            "failed to get secret fleet/spoke-1: NotFound",
            "missing \"token\" key in secret default/kube-apiserver",
            "use --service-account and --expiration-seconds=default",
            "ExecCredential.Spec.Cluster.Config is missing (in-cluster, AWS_REGION unset)",
            "clientCertificateData without a PEM certificate; exit code 3",
            "https://spoke.example:6443/apis/authentication.k8s.io/v1/tokenreviews",
        ] {
            assert_eq!(redact_token_like(plain), plain);
        }
    }

    #[test]
    fn redacts_values_after_secret_labels() {
        for (input, want) in [
            (
                "login failed: token=hunter",
                "login failed: token= [REDACTED]",
            ),
            ("password: correcthorse battery", "password: [REDACTED]"),
            (
                "AWS_SECRET_ACCESS_KEY=abcdefgh",
                "AWS_SECRET_ACCESS_KEY= [REDACTED]",
            ),
            (r#"{"token":"plainword"}"#, r#"{"token": [REDACTED]"#),
            ("apiKey : letmein", "apiKey : [REDACTED]"),
            ("Authorization: Bearer abc", "Authorization: [REDACTED]"),
            ("sent Bearer abc to server", "sent Bearer [REDACTED]"),
            // Only the labelled line is cut.
            (
                "first line\nsecret: s\nlast line",
                "first line\nsecret: [REDACTED]\nlast line",
            ),
        ] {
            assert_eq!(redact_token_like(input), want, "{input}");
        }
        // A label without a value, or followed by prose, stays.
        for plain in [
            "secret default/x missing \"token\" key",
            "no token:",
            "token was rejected",
        ] {
            assert_eq!(redact_token_like(plain), plain);
        }
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
