//! Prometheus metrics of the hub API (registered on the hub's shared registry).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of `kleym_hub_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route template (`/v1/clusters/{namespace}/{name}`), never the raw path, so
    /// cardinality stays bounded; `other` for unknown paths.
    pub route: String,
    /// HTTP status code.
    pub code: u16,
}

/// A single `outcome`/`decision`/`cache` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The outcome.
    pub outcome: String,
}

/// Labels of `kleym_hub_api_auth_reviews_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `token` (TokenReview) or `access` (SubjectAccessReview).
    pub kind: String,
    /// `ok` (an answer, positive or negative) or `error` (no answer).
    pub result: String,
}

/// Labels of `kleym_hub_api_auth_cache_hits_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `token_positive`, `token_negative`, `token_inflight` (joined a review already under
    /// way), `access` or `access_inflight`.
    pub cache: String,
}

/// The API's metric families. Cloning shares the series.
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    /// `kleym_hub_api_requests_total{route,code}`.
    pub requests: Family<RequestLabels, Counter>,
    /// `kleym_hub_api_authn_total{outcome}`: per `/v1` request, `authenticated`, `rejected`,
    /// `wrong_audience`, `no_token`, `error` (no answer from the apiserver) or `skipped`
    /// (mode `off`).
    pub authn: Family<OutcomeLabels, Counter>,
    /// `kleym_hub_api_authz_total{outcome}`: `allowed`, `denied`, `error`.
    pub authz: Family<OutcomeLabels, Counter>,
    /// `kleym_hub_api_auth_cache_hits_total{cache}`.
    pub cache_hits: Family<CacheLabels, Counter>,
    /// `kleym_hub_api_auth_reviews_total{kind,result}`: reviews actually sent.
    pub reviews: Family<ReviewLabels, Counter>,
    /// `kleym_hub_api_auth_permissive_allowed_total`: requests that failed authentication or
    /// authorization and were let through because the mode is `permissive`.
    pub permissive_allowed: Counter,
}

impl ApiMetrics {
    /// Create the metrics and register them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kleym_hub_api_requests",
            "Hub API requests by route and HTTP status code",
            m.requests.clone(),
        );
        registry.register(
            "kleym_hub_api_authn",
            "Hub API authentication results by outcome",
            m.authn.clone(),
        );
        registry.register(
            "kleym_hub_api_authz",
            "Hub API authorization (SubjectAccessReview) results by outcome",
            m.authz.clone(),
        );
        registry.register(
            "kleym_hub_api_auth_cache_hits",
            "Hub API auth decisions answered without a review, by cache",
            m.cache_hits.clone(),
        );
        registry.register(
            "kleym_hub_api_auth_reviews",
            "TokenReviews and SubjectAccessReviews sent by the hub API, by result",
            m.reviews.clone(),
        );
        registry.register(
            "kleym_hub_api_auth_permissive_allowed",
            "Requests that failed auth but were served because the auth mode is permissive",
            m.permissive_allowed.clone(),
        );
        m
    }

    pub(crate) fn request(&self, route: &str, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                code,
            })
            .inc();
    }

    pub(crate) fn authn(&self, outcome: &str) {
        self.authn
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub(crate) fn authz(&self, outcome: &str) {
        self.authz
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub(crate) fn cache_hit(&self, cache: &str) {
        self.cache_hits
            .get_or_create(&CacheLabels {
                cache: cache.to_string(),
            })
            .inc();
    }

    pub(crate) fn review(&self, kind: &str, ok: bool) {
        self.reviews
            .get_or_create(&ReviewLabels {
                kind: kind.to_string(),
                result: if ok { "ok" } else { "error" }.to_string(),
            })
            .inc();
    }
}

/// The Prometheus text exposition (OpenMetrics) of `registry` as an HTTP response: what every
/// kleym `/metrics` endpoint (hub API, hub health port, `kleym spoke`) answers.
pub fn metrics_response(registry: &Registry) -> axum::response::Response {
    encode_response(registry)
}

/// [`metrics_response`] built on a blocking thread: encoding walks every spoke's series,
/// which at 1000 spokes is too long for an async worker. `Err` only if the build panicked.
pub async fn metrics_response_blocking(
    registry: std::sync::Arc<Registry>,
) -> Result<axum::response::Response, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || encode_response(&registry)).await
}

fn encode_response(registry: &Registry) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
            .into_response(),
    }
}
