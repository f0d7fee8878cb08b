//! SPIFFE ID and trust domain parsing per the SPIFFE standard (SPIFFE-ID.md §2):
//!
//! - scheme exactly `spiffe://` (lowercase);
//! - trust domain: 1–255 characters of `[a-z0-9._-]` (no uppercase, port, userinfo);
//! - path: empty or `/`-separated segments, each non-empty, of `[a-zA-Z0-9._-]`, and never
//!   `.` or `..`; no trailing `/`;
//! - no query, fragment or percent-encoding (`?`, `#`, `%` are not allowed characters);
//! - at most 2048 bytes in total.

use std::fmt;

/// Longest SPIFFE ID accepted (the standard's URI limit).
pub const MAX_ID_LEN: usize = 2048;
/// Longest trust domain name.
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;
const SCHEME: &str = "spiffe://";

/// Why a string is not a SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeIdError {
    /// Does not start with `spiffe://`.
    #[error("scheme must be \"spiffe://\"")]
    Scheme,
    /// Empty trust domain.
    #[error("trust domain is empty")]
    EmptyTrustDomain,
    /// Trust domain longer than 255 characters.
    #[error("trust domain is longer than {MAX_TRUST_DOMAIN_LEN} characters")]
    TrustDomainTooLong,
    /// A character outside `[a-z0-9._-]` in the trust domain.
    #[error("trust domain contains {0:?}; only a-z, 0-9, '.', '-', '_' are allowed")]
    TrustDomainChar(char),
    /// An empty path segment (`//` or a trailing `/`).
    #[error("path has an empty segment (\"//\" or a trailing \"/\")")]
    EmptySegment,
    /// A `.` or `..` segment.
    #[error("path segment {0:?} is not allowed")]
    DotSegment(String),
    /// A character outside `[a-zA-Z0-9._-]` in the path.
    #[error("path contains {0:?}; only a-z, A-Z, 0-9, '.', '-', '_' are allowed")]
    PathChar(char),
    /// Longer than 2048 bytes.
    #[error("SPIFFE ID is longer than {MAX_ID_LEN} bytes")]
    TooLong,
}

/// A validated trust domain name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(String);

impl TrustDomain {
    /// Parse a bare trust domain name (`example.org`).
    pub fn parse(name: &str) -> Result<Self, SpiffeIdError> {
        if name.is_empty() {
            return Err(SpiffeIdError::EmptyTrustDomain);
        }
        if name.len() > MAX_TRUST_DOMAIN_LEN {
            return Err(SpiffeIdError::TrustDomainTooLong);
        }
        if let Some(c) = name
            .chars()
            .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'))
        {
            return Err(SpiffeIdError::TrustDomainChar(c));
        }
        Ok(TrustDomain(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: TrustDomain,
    path: String,
}

impl SpiffeId {
    /// Parse `spiffe://<trust-domain><path>`.
    pub fn parse(id: &str) -> Result<Self, SpiffeIdError> {
        if id.len() > MAX_ID_LEN {
            return Err(SpiffeIdError::TooLong);
        }
        let rest = id.strip_prefix(SCHEME).ok_or(SpiffeIdError::Scheme)?;
        let (td, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let trust_domain = TrustDomain::parse(td)?;
        if !path.is_empty() {
            for segment in path[1..].split('/') {
                validate_segment(segment)?;
            }
        }
        Ok(SpiffeId {
            trust_domain,
            path: path.to_string(),
        })
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The path (empty or starting with `/`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path segments.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').skip(1)
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}{}", self.trust_domain, self.path)
    }
}

/// Validate one path segment.
pub fn validate_segment(segment: &str) -> Result<(), SpiffeIdError> {
    if segment.is_empty() {
        return Err(SpiffeIdError::EmptySegment);
    }
    if segment == "." || segment == ".." {
        return Err(SpiffeIdError::DotSegment(segment.to_string()));
    }
    if let Some(c) = segment
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_'))
    {
        return Err(SpiffeIdError::PathChar(c));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids() {
        for id in [
            "spiffe://example.org",
            "spiffe://example.org/ns/a/objective/chat",
            "spiffe://td_1-x.y/A.b-c_D/..x/x..",
        ] {
            let parsed = SpiffeId::parse(id).unwrap();
            assert_eq!(parsed.to_string(), id);
        }
        let p = SpiffeId::parse("spiffe://td/ns/a/pool/p").unwrap();
        assert_eq!(p.trust_domain().as_str(), "td");
        assert_eq!(p.segments().collect::<Vec<_>>(), ["ns", "a", "pool", "p"]);
    }

    #[test]
    fn invalid_ids() {
        use SpiffeIdError::*;
        let cases: &[(&str, SpiffeIdError)] = &[
            ("https://td/x", Scheme),
            ("SPIFFE://td/x", Scheme),
            ("spiffe:/td/x", Scheme),
            ("spiffe:///x", EmptyTrustDomain),
            ("spiffe://TD/x", TrustDomainChar('T')),
            ("spiffe://td:8080/x", TrustDomainChar(':')),
            ("spiffe://user@td/x", TrustDomainChar('@')),
            ("spiffe://td/", EmptySegment),
            ("spiffe://td/a//b", EmptySegment),
            ("spiffe://td/a/", EmptySegment),
            ("spiffe://td/a/./b", DotSegment(".".into())),
            ("spiffe://td/a/../b", DotSegment("..".into())),
            ("spiffe://td/a/%2e%2e/b", PathChar('%')),
            ("spiffe://td/a?x=1", PathChar('?')),
            ("spiffe://td/a#frag", PathChar('#')),
            ("spiffe://td/a b", PathChar(' ')),
            ("spiffe://td/a/{{x}}", PathChar('{')),
            ("spiffe://td/ünï", PathChar('ü')),
        ];
        for (id, want) in cases {
            assert_eq!(SpiffeId::parse(id).as_ref(), Err(want), "{id}");
        }
        let long = format!("spiffe://td/{}", "a".repeat(MAX_ID_LEN));
        assert_eq!(SpiffeId::parse(&long), Err(TooLong));
        let long_td = format!("spiffe://{}", "a".repeat(256));
        assert_eq!(SpiffeId::parse(&long_td), Err(TrustDomainTooLong));
    }
}
