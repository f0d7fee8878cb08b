//! Command-line flags of the hub API, for `kleym hub` to `#[command(flatten)]`.

use crate::flags::parse_audience;
use crate::http::HttpError;
use crate::http::auth::{AuthConfig, AuthMode};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Longest cache TTL of the API's token and access caches, in seconds (a day). Without a
/// bound, a huge TTL would overflow `SystemTime + TTL` and panic on every authenticated
/// request.
pub const MAX_CACHE_TTL_SECONDS: u64 = 86_400;

/// Flags of the hub API server.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Address of the hub API (`/healthz`, `/readyz`, `/metrics`, `/v1/*`).
    #[arg(long, env = "KLEYM_API_ADDR", default_value = "0.0.0.0:8443")]
    pub api_addr: SocketAddr,

    /// Audience that callers' ServiceAccount tokens must be issued for (TokenReview
    /// `spec.audiences`; the review must return it in `status.audiences`). Not blank.
    #[arg(long, env = "KLEYM_API_AUDIENCE", default_value = "kleym-hub", value_parser = parse_audience)]
    pub api_audience: String,

    /// `/v1/*` authentication: `off`, `permissive` (verify, log and count failures, never
    /// block) or `enforce`. Default: `enforce` whenever the API listens, in a cluster or not;
    /// a weaker mode only when given here. With `enforce` the hub checks at start-up that it
    /// can create TokenReviews in the hub cluster and exits naming this flag if it cannot.
    #[arg(long, env = "KLEYM_API_AUTH_MODE", value_enum)]
    pub api_auth_mode: Option<AuthMode>,

    /// Longest time (seconds) an accepted token is trusted without a new TokenReview; never
    /// past the token's own expiry. This is also how long a revoked token stays accepted.
    /// 0 to 86400 (0: no caching).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECONDS))]
    pub api_token_cache_ttl_seconds: u64,

    /// How long (seconds) a rejected token is refused without a new TokenReview (0 to
    /// 86400).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECONDS))]
    pub api_negative_cache_ttl_seconds: u64,

    /// How long (seconds) a SubjectAccessReview decision is reused (0 to 86400).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECONDS))]
    pub api_access_cache_ttl_seconds: u64,

    /// Serving certificate chain (PEM). With --tls-key-file; required unless
    /// --api-insecure-http.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// Serving private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Serve plain HTTP (no TLS). Bearer tokens then cross the network in clear text: only
    /// for local development or behind a TLS-terminating proxy.
    #[arg(long, conflicts_with_all = ["tls_cert_file", "tls_key_file"])]
    pub api_insecure_http: bool,
}

impl ApiArgs {
    /// The effective auth mode: the flag, else [`AuthMode::DEFAULT`] (`enforce`).
    pub fn auth_mode(&self) -> AuthMode {
        self.api_auth_mode.unwrap_or(AuthMode::DEFAULT)
    }

    /// The authenticator settings these flags describe.
    pub fn auth_config(&self) -> AuthConfig {
        let mut c = AuthConfig::new(self.auth_mode(), self.api_audience.clone());
        c.positive_ttl = Duration::from_secs(self.api_token_cache_ttl_seconds);
        c.negative_ttl = Duration::from_secs(self.api_negative_cache_ttl_seconds);
        c.access_ttl = Duration::from_secs(self.api_access_cache_ttl_seconds);
        c
    }

    /// Whether these flags ask for the API listener at all (TLS files, or plain HTTP);
    /// [`Self::tls`] says whether they are usable.
    pub fn serves(&self) -> bool {
        self.api_insecure_http || (self.tls_cert_file.is_some() && self.tls_key_file.is_some())
    }

    /// The TLS configuration (`None` for `--api-insecure-http`); an error when neither TLS
    /// files nor `--api-insecure-http` were given.
    pub fn tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, HttpError> {
        match (
            &self.tls_cert_file,
            &self.tls_key_file,
            self.api_insecure_http,
        ) {
            (Some(cert), Some(key), false) => {
                crate::http::tls::load_tls_config(cert, key).map(Some)
            }
            (None, None, true) => Ok(None),
            _ => Err(HttpError::Config(
                "the hub API needs --tls-cert-file and --tls-key-file, or --api-insecure-http \
                 to serve plain HTTP"
                    .into(),
            )),
        }
    }
}
