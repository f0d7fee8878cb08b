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
    /// The default: `enforce` inside a cluster (where the API is reachable by other
    /// workloads), `permissive` elsewhere (a developer's machine).
    pub fn default_for(in_cluster: bool) -> Self {
        if in_cluster {
            Self::Enforce
        } else {
            Self::Permissive
        }
    }

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

/// Whether this process runs in a Kubernetes pod: `KUBERNETES_SERVICE_HOST` is set and the
/// ServiceAccount token is mounted (the same signals client-go's in-cluster config uses).
pub fn running_in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty())
        && std::path::Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        assert_eq!(AuthMode::default_for(true), AuthMode::Enforce);
        assert_eq!(AuthMode::default_for(false), AuthMode::Permissive);
        assert_eq!(AuthMode::Off.to_string(), "off");
    }
}
