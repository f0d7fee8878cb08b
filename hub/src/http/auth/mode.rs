//! `--api-auth-mode`: what the API does with the result of authentication and authorization.

/// How `/v1/*` requests are authenticated and authorized.
///
/// | mode | reviews sent | a request that fails auth |
/// |---|---|---|
/// | `off` | none | served (there is nothing to fail) |
/// | `permissive` | TokenReview + SubjectAccessReview | served, with a `Warning` header, a log line (token hash prefix only) and `kleym_hub_api_auth_permissive_allowed_total` |
/// | `enforce` | TokenReview + SubjectAccessReview | refused: 401, 403 or 503 (see `docs/http-api.md`) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: every `/v1` request is served.
    Off,
    /// Verify and authorize every request, log and count failures, never block.
    Permissive,
    /// Verify and authorize every request and refuse those that fail.
    Enforce,
}

impl AuthMode {
    /// The default whenever the API listens: `enforce`. Whether a ServiceAccount token is
    /// mounted says nothing about who can reach the API (a pod with
    /// `automountServiceAccountToken: false` is as reachable as any other), so a weaker mode
    /// is only ever what the operator asked for.
    pub const DEFAULT: Self = Self::Enforce;

    /// The mode's flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Permissive => "permissive",
            Self::Enforce => "enforce",
        }
    }
}

impl std::fmt::Display for AuthMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        assert_eq!(AuthMode::DEFAULT, AuthMode::Enforce);
        assert_eq!(AuthMode::Off.to_string(), "off");
    }
}
