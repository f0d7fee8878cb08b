//! One `GET` against the hub's HTTP API, as `kleym report --server` and `kleym explain
//! --hub-url` send it: a bearer token, an optional CA bundle, and the retry rule below.
//!
//! **Any HTTP answer is final.** kube's default client retries `429`, `503` and `504` for
//! minutes. From the hub API a `503` is an answer, not a transient fault: this replica does
//! not engage the spoke asked about (a follower, another shard's cluster, a spoke backing
//! off) or has not read the published status yet, and its body says which and why. An
//! operator asking once wants that message at once, so no answer is retried; the caller
//! decides whether to ask again (the Service may route the next request to another replica).
//!
//! **A request that got no answer is retried, a bounded number of times**: a refused or
//! reset connection (a replica restarting behind the Service) is the one failure asking again
//! can fix.

use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// How many times a request that got no answer is sent in all.
pub const CONNECT_ATTEMPTS: u32 = 3;

/// The pause before the second attempt; doubled before each further one.
const FIRST_PAUSE: Duration = Duration::from_millis(200);

/// Why a request to the hub API failed.
#[derive(Debug, thiserror::Error)]
pub enum HubApiError {
    /// The URL is not an http(s) URL.
    #[error("invalid URL {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The CA file holds no usable certificate.
    #[error("--ca-file: {0}")]
    BadCa(String),
    /// The client could not be built, or the request could not be.
    #[error("{what}: {reason}")]
    Setup {
        /// The request.
        what: String,
        /// Why.
        reason: String,
    },
    /// No answer after [`CONNECT_ATTEMPTS`] attempts.
    #[error("{what}: no answer after {attempts} attempts: {source}")]
    Unreachable {
        /// The request.
        what: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        source: kube::Error,
    },
    /// The hub answered with a status other than 2xx.
    #[error("{what}: the hub answered {status}{}: {message}", reason_suffix(*.status, reason))]
    Answered {
        /// The request.
        what: String,
        /// The HTTP status.
        status: http::StatusCode,
        /// The answer's `reason` (e.g. `SpokeNotReachable`), empty when it has none.
        reason: String,
        /// The answer's `message` (the body when it is not a JSON error).
        message: String,
    },
    /// The answer's body could not be read.
    #[error("{what}: reading the answer: {reason}")]
    Body {
        /// The request.
        what: String,
        /// Why.
        reason: String,
    },
}

/// ` (Reason)` when the answer's reason says more than the status line (`403 Forbidden`
/// needs no `(Forbidden)`; `503 Service Unavailable` does need `(SpokeNotReachable)`).
fn reason_suffix(status: http::StatusCode, reason: &str) -> String {
    let canonical: String = status
        .canonical_reason()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if reason.is_empty() || reason == canonical {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

/// `GET <url><path>` (path and query) with `token` as bearer token and `ca_pem` as the only
/// trusted CAs when given; the body of a 2xx answer. `what` in errors is `GET <url><path>`
/// without the query.
pub async fn get(
    url: &str,
    path: &str,
    token: Option<&str>,
    ca_pem: Option<&[u8]>,
) -> Result<String, HubApiError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| HubApiError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    if !matches!(uri.scheme_str(), Some("https" | "http")) {
        return Err(HubApiError::BadUrl {
            url: url.to_string(),
            reason: "the scheme must be https or http".into(),
        });
    }
    let what = format!(
        "GET {}{}",
        url.trim_end_matches('/'),
        path.split('?').next().unwrap_or(path)
    );
    let mut config = kube::Config::new(uri);
    config.default_retry = false;
    if let Some(pem) = ca_pem {
        let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem)
            .map(|c| c.map(|c| c.to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| HubApiError::BadCa(e.to_string()))?;
        if certs.is_empty() {
            return Err(HubApiError::BadCa("no PEM certificate found".into()));
        }
        config.root_cert = Some(certs);
    }
    let client = kube::Client::try_from(config).map_err(|e| HubApiError::Setup {
        what: what.clone(),
        reason: e.to_string(),
    })?;
    let mut attempt = 1;
    let mut pause = FIRST_PAUSE;
    let response = loop {
        let mut request = http::Request::get(path).header(http::header::ACCEPT, "application/json");
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request =
            request
                .body(kube::client::Body::empty())
                .map_err(|e| HubApiError::Setup {
                    what: what.clone(),
                    reason: e.to_string(),
                })?;
        match client.send(request).await {
            Ok(response) => break response,
            Err(source) if attempt >= CONNECT_ATTEMPTS => {
                return Err(HubApiError::Unreachable {
                    what,
                    attempts: attempt,
                    source,
                });
            }
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
        }
    };
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| HubApiError::Body {
            what: what.clone(),
            reason: e.to_string(),
        })?
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if status.is_success() {
        return Ok(text);
    }
    let body = serde_json::from_str::<serde_json::Value>(&text).ok();
    let field = |k: &str| {
        body.as_ref()
            .and_then(|v| v[k].as_str())
            .map(str::to_string)
    };
    Err(HubApiError::Answered {
        what,
        status,
        reason: field("reason").unwrap_or_default(),
        message: field("message").unwrap_or(text),
    })
}
