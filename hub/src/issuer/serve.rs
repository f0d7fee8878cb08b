//! The issuer's public listener: the OIDC discovery document and the JWKS, without
//! authentication, with `Cache-Control`, on a listener of its own. Every replica serves them
//! and re-reads the Secret periodically, so every replica publishes the same keys.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use kleym_spoke::reconciler::CancellationToken;

use super::keys::{Algorithm, SigningKey, discovery_document, jwks};
use super::metrics::IssuerMetrics;
use super::rotation::{KeyRing, RotationPolicy};
use super::secret::{SecretRef, load_or_create};
use super::{DISCOVERY_PATH, IssuerError, IssuerSettings, JWKS_PATH};

/// `Cache-Control` of both documents: short, so verifiers see a new key soon after it is
/// published (a verifier also refetches on an unknown `kid`).
pub const CACHE_CONTROL: &str = "public, max-age=60";

/// The documents served (rendered once per key change).
#[derive(Debug, Default)]
struct Documents {
    discovery: String,
    jwks: String,
    kids: Vec<String>,
    /// When each published key stops being published (unix seconds; `None`: not planned),
    /// so a replica that can no longer read the Secret still drops keys on time.
    retires: Vec<Option<i64>>,
    /// The public JWKs published, in order (to re-render without the retired ones).
    jwks_keys: Vec<serde_json::Value>,
    /// Why the last refresh failed (`None`: it succeeded).
    refresh_error: Option<String>,
}

/// What the issuer listener serves; cheap to clone.
#[derive(Debug, Clone)]
pub struct IssuerDocuments {
    issuer_url: String,
    docs: Arc<RwLock<Documents>>,
    metrics: IssuerMetrics,
}

impl IssuerDocuments {
    /// Documents for `issuer_url` publishing what `ring` publishes now.
    pub fn from_ring(issuer_url: &str, ring: &KeyRing) -> Self {
        let d = Self::new(issuer_url, &[]);
        d.update_from_ring(ring);
        d
    }

    /// Records into `metrics` from now on.
    pub fn with_metrics(mut self, metrics: IssuerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Publishes what `ring` publishes now, with each key's retirement time, and marks the
    /// refresh as succeeded.
    pub fn update_from_ring(&self, ring: &KeyRing) {
        let now = chrono::Utc::now().timestamp();
        let keys: Vec<&SigningKey> = ring.published(now);
        let retires = ring
            .entries()
            .iter()
            .filter(|e| e.times.retires.is_none_or(|r| r > now))
            .map(|e| e.times.retires)
            .collect();
        self.update_refs(&keys, retires);
        self.metrics
            .signing_key_age_seconds
            .set(ring.signing_since(now).map_or(0, |t| (now - t).max(0)));
    }

    /// Documents for `issuer_url` publishing `keys`.
    pub fn new(issuer_url: &str, keys: &[SigningKey]) -> Self {
        let d = IssuerDocuments {
            issuer_url: issuer_url.to_string(),
            docs: Arc::default(),
            metrics: IssuerMetrics::default(),
        };
        d.update(keys);
        d
    }

    /// Publishes `keys` (logs the key IDs when they change), none of them with a planned
    /// retirement.
    pub fn update(&self, keys: &[SigningKey]) {
        let refs: Vec<&SigningKey> = keys.iter().collect();
        self.update_refs(&refs, vec![None; refs.len()]);
    }

    fn update_refs(&self, keys: &[&SigningKey], retires: Vec<Option<i64>>) {
        let kids: Vec<String> = keys.iter().map(|k| k.kid().to_string()).collect();
        self.metrics
            .keys_published
            .set(i64::try_from(kids.len()).unwrap_or(i64::MAX));
        let mut docs = self.docs.write().unwrap_or_else(|p| p.into_inner());
        docs.refresh_error = None;
        docs.retires = retires;
        if docs.kids == kids && !docs.jwks.is_empty() && !kids.is_empty() {
            return;
        }
        tracing::info!(issuer = %self.issuer_url, ?kids, "issuer keys published");
        docs.discovery = discovery_document(&self.issuer_url, keys).to_string();
        docs.jwks = jwks(keys).to_string();
        docs.jwks_keys = keys.iter().map(|k| k.public_jwk().clone()).collect();
        docs.kids = kids;
    }

    /// A refresh failed with `error` at `now`: this replica is no longer ready (see
    /// [`Self::refresh_error`]) and stops publishing every key whose retirement time has
    /// passed, as it would have had the refresh succeeded. A revoked or retired key must not
    /// stay published because the Secret became unreadable. Returns the `kid`s dropped.
    pub fn refresh_failed(&self, error: &str, now: i64) -> Vec<String> {
        let mut docs = self.docs.write().unwrap_or_else(|p| p.into_inner());
        docs.refresh_error = Some(error.to_string());
        if docs.retires.len() != docs.kids.len() || docs.jwks_keys.len() != docs.kids.len() {
            // Mirror mode (verbatim documents): nothing to drop.
            return Vec::new();
        }
        let live: Vec<bool> = docs
            .retires
            .iter()
            .map(|r| r.is_none_or(|r| r > now))
            .collect();
        if live.iter().all(|l| *l) {
            return Vec::new();
        }
        let mut dropped = Vec::new();
        let (mut kids, mut keys, mut retires) = (Vec::new(), Vec::new(), Vec::new());
        for (i, keep) in live.iter().enumerate() {
            if *keep {
                kids.push(docs.kids[i].clone());
                keys.push(docs.jwks_keys[i].clone());
                retires.push(docs.retires[i]);
            } else {
                dropped.push(docs.kids[i].clone());
            }
        }
        let mut algs: Vec<&str> = keys
            .iter()
            .filter_map(|k| k.get("alg").and_then(serde_json::Value::as_str))
            .collect();
        algs.sort_unstable();
        algs.dedup();
        let mut discovery: serde_json::Value =
            serde_json::from_str(&docs.discovery).unwrap_or_default();
        discovery["id_token_signing_alg_values_supported"] = algs.into();
        docs.discovery = discovery.to_string();
        docs.jwks = serde_json::json!({ "keys": keys }).to_string();
        docs.jwks_keys = keys;
        docs.kids = kids;
        docs.retires = retires;
        self.metrics
            .keys_published
            .set(i64::try_from(docs.kids.len()).unwrap_or(i64::MAX));
        dropped
    }

    /// Why the last refresh failed, while it does (the hub's `/readyz` then fails).
    pub fn refresh_error(&self) -> Option<String> {
        self.docs.read().ok().and_then(|d| d.refresh_error.clone())
    }

    /// Serves `discovery` and `jwks` verbatim (mirror mode), marking the refresh as
    /// succeeded.
    pub fn set_raw(&self, discovery: String, jwks: String) {
        let mut docs = self.docs.write().unwrap_or_else(|p| p.into_inner());
        docs.discovery = discovery;
        docs.jwks = jwks;
        docs.refresh_error = None;
        docs.retires.clear();
        docs.jwks_keys.clear();
        docs.kids.clear();
    }

    /// The discovery document as served.
    pub fn discovery_json(&self) -> String {
        self.docs
            .read()
            .map(|d| d.discovery.clone())
            .unwrap_or_default()
    }

    /// The key IDs published.
    pub fn kids(&self) -> Vec<String> {
        self.docs.read().map(|d| d.kids.clone()).unwrap_or_default()
    }

    /// The JWKS as served.
    pub fn jwks_json(&self) -> String {
        self.docs.read().map(|d| d.jwks.clone()).unwrap_or_default()
    }
}

async fn discovery(State(d): State<IssuerDocuments>) -> impl IntoResponse {
    let body = d
        .docs
        .read()
        .map(|d| d.discovery.clone())
        .unwrap_or_default();
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, CACHE_CONTROL),
        ],
        body,
    )
}

async fn keys(State(d): State<IssuerDocuments>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/jwk-set+json"),
            (header::CACHE_CONTROL, CACHE_CONTROL),
        ],
        d.jwks_json(),
    )
}

/// The router: `GET /.well-known/openid-configuration` and `GET /openid/v1/jwks` below the
/// issuer URL's path, nothing else.
pub fn router(docs: IssuerDocuments) -> Router {
    let prefix = docs
        .issuer_url
        .parse::<http::Uri>()
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    Router::new()
        .route(&format!("{prefix}{DISCOVERY_PATH}"), get(discovery))
        .route(&format!("{prefix}{JWKS_PATH}"), get(keys))
        .with_state(docs)
}

/// Whether this replica may rotate keys (the leader).
pub type IsLeader = Arc<dyn Fn() -> bool + Send + Sync>;

/// What [`refresh_loop`] does besides re-reading the Secret.
#[derive(Clone)]
pub struct RefreshOptions {
    /// How often.
    pub period: Duration,
    /// Rotate keys (leader only).
    pub rotation: Option<RotationPolicy>,
    /// Publish the documents to this ConfigMap (leader only).
    pub configmap: Option<SecretRef>,
    /// Whether this replica leads.
    pub is_leader: IsLeader,
    /// The X.509 CA Secret (`--issuer-x509`): the leader steps its rotation too.
    pub x509_ca: Option<SecretRef>,
}

/// Re-reads the Secret every `period` until `shutdown`, publishing what it holds. A read or
/// parse failure is logged (never the key material), makes this replica unready
/// ([`IssuerDocuments::refresh_error`]) and still drops every key whose retirement time has
/// passed ([`IssuerDocuments::refresh_failed`]): revocation and retirement never wait for
/// the Secret to be readable again. While `is_leader()`: first one rotation step when
/// `rotation` is set (the Secret is written with its resourceVersion, so a concurrent writer
/// wins and the step is retried next period), and one CA step with `x509_ca`, then the
/// documents are written to the ConfigMap when set and changed.
pub async fn refresh_loop(
    client: kube::Client,
    at: SecretRef,
    alg: Algorithm,
    docs: IssuerDocuments,
    options: RefreshOptions,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(options.period) => {}
        }
        let leading = (options.is_leader)();
        if let Some(policy) = &options.rotation
            && leading
        {
            match rotate_once(client.clone(), &at, alg, policy).await {
                Ok(true) => {
                    docs.metrics.rotations.inc();
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(secret = %at, error = %e, "issuer key rotation step failed; retrying next period");
                }
            }
        }
        if let Some(ca_at) = &options.x509_ca
            && options.rotation.is_some()
            && leading
        {
            match rotate_ca_once(client.clone(), ca_at, &at).await {
                Ok(true) => {
                    docs.metrics.rotations.inc();
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(secret = %ca_at, error = %e, "issuer X.509 CA step failed; retrying next period");
                }
            }
        }
        match load_or_create(client.clone(), &at, alg, false).await {
            Ok(ring) => {
                if ring.has_legacy_ca() && options.x509_ca.is_none() && leading {
                    tracing::warn!("{}", super::ca::legacy_ca_warning(&at));
                }
                docs.update_from_ring(&ring);
            }
            Err(e) => {
                let dropped = docs.refresh_failed(&e.to_string(), chrono::Utc::now().timestamp());
                tracing::warn!(secret = %at, error = %e, ?dropped, "issuer keys not refreshed: this replica is not ready; keys past their retirement time are no longer published");
            }
        }
        if let Some(cm) = &options.configmap
            && leading
            && let Err(e) = publish_configmap(client.clone(), cm, &docs).await
        {
            tracing::warn!(configmap = %cm, error = %e, "issuer documents not published to the ConfigMap; retrying next period");
        }
    }
}

/// ConfigMap data key of the discovery document.
pub const CONFIGMAP_DISCOVERY_KEY: &str = "openid-configuration.json";
/// ConfigMap data key of the JWKS.
pub const CONFIGMAP_JWKS_KEY: &str = "jwks.json";

/// Writes the documents to the ConfigMap `at` (server-side apply, field manager
/// `kleym-issuer`) for mirroring to object storage or a CDN, when they differ from what it
/// holds. Returns whether it wrote.
pub async fn publish_configmap(
    client: kube::Client,
    at: &SecretRef,
    docs: &IssuerDocuments,
) -> Result<bool, IssuerError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let (discovery, jwks) = docs
        .docs
        .read()
        .map(|d| (d.discovery.clone(), d.jwks.clone()))
        .unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client, &at.namespace);
    let api_err = |what: String| move |source| IssuerError::Api { what, source };
    let current = api
        .get_opt(&at.name)
        .await
        .map_err(api_err(format!("reading ConfigMap {at}")))?;
    let data = current.as_ref().and_then(|c| c.data.as_ref());
    let same = |k: &str, v: &str| data.and_then(|d| d.get(k)).map(String::as_str) == Some(v);
    if same(CONFIGMAP_DISCOVERY_KEY, &discovery) && same(CONFIGMAP_JWKS_KEY, &jwks) {
        return Ok(false);
    }
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": at.name,
            "namespace": at.namespace,
            "labels": {"app.kubernetes.io/managed-by": "kleym"},
        },
        "data": {CONFIGMAP_DISCOVERY_KEY: discovery, CONFIGMAP_JWKS_KEY: jwks},
    });
    api.patch(
        &at.name,
        &PatchParams::apply("kleym-issuer").force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(api_err(format!("writing ConfigMap {at}")))?;
    tracing::info!(configmap = %at, kids = ?docs.kids(), "issuer documents published to the ConfigMap");
    Ok(true)
}

/// One rotation step on the Secret (read, step, write if changed).
pub async fn rotate_once(
    client: kube::Client,
    at: &SecretRef,
    alg: Algorithm,
    policy: &RotationPolicy,
) -> Result<bool, IssuerError> {
    let (secret, mut ring) = super::secret::read(client.clone(), at, alg).await?;
    let now = chrono::Utc::now().timestamp();
    if !ring.rotate_step(now, policy)? {
        return Ok(false);
    }
    super::secret::write(client, at, secret, &ring).await?;
    let kids: Vec<&str> = ring.published(now).iter().map(|k| k.kid()).collect();
    tracing::info!(secret = %at, ?kids, signing = ?ring.signing(now).ok().map(|k| k.kid()), "issuer keys rotated");
    Ok(true)
}

/// One X.509 CA step (the leader): finishes an interrupted move of the CA out of the key
/// Secret `key_at`, then steps the CA rotation ([`super::ca::CaRing::step`]) and writes the
/// CA Secret if it changed.
pub async fn rotate_ca_once(
    client: kube::Client,
    ca_at: &SecretRef,
    key_at: &SecretRef,
) -> Result<bool, IssuerError> {
    super::ca::load_or_create(client.clone(), ca_at, key_at, true).await?;
    let (secret, mut ring) = super::ca::read(client.clone(), ca_at).await?;
    if !ring.step(chrono::Utc::now().timestamp())? {
        return Ok(false);
    }
    super::ca::write(client, ca_at, secret, &ring).await?;
    Ok(true)
}

/// Starts the issuer on `listener`: reads (or creates) the Secret, serves the documents over
/// TLS (or plain HTTP with `--issuer-insecure-http`) until `shutdown`, and re-reads the Secret
/// every 30 s. Returns the published documents and the server task.
pub async fn start(
    settings: &IssuerSettings,
    listener: tokio::net::TcpListener,
    client: kube::Client,
    is_leader: IsLeader,
    shutdown: CancellationToken,
) -> Result<(IssuerDocuments, tokio::task::JoinHandle<()>), IssuerError> {
    let ring = load_or_create(client.clone(), &settings.secret, settings.algorithm, true).await?;
    match &settings.x509_ca_secret {
        Some(ca_at) => {
            super::ca::load_or_create(client.clone(), ca_at, &settings.secret, true).await?;
        }
        None if ring.has_legacy_ca() => {
            tracing::warn!("{}", super::ca::legacy_ca_warning(&settings.secret));
        }
        None => {}
    }
    let docs = IssuerDocuments::new(&settings.url, &[]).with_metrics(settings.metrics.clone());
    docs.update_from_ring(&ring);
    let tls = match &settings.tls {
        Some((cert, key)) => Some(
            crate::http::load_tls_config(cert, key)
                .map_err(|e| IssuerError::Config(format!("issuer listener TLS: {e}")))?,
        ),
        None => None,
    };
    tracing::info!(
        issuer = %settings.url,
        addr = ?listener.local_addr().ok(),
        secret = %settings.secret,
        kids = ?docs.kids(),
        tls = tls.is_some(),
        "issuer listener starting"
    );
    tokio::spawn(refresh_loop(
        client,
        settings.secret.clone(),
        settings.algorithm,
        docs.clone(),
        RefreshOptions {
            period: settings.refresh_period,
            rotation: settings.rotation,
            configmap: settings.publish_configmap.clone(),
            is_leader,
            x509_ca: settings.x509_ca_secret.clone(),
        },
        shutdown.clone(),
    ));
    let app = router(docs.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = crate::http::serve(
            listener,
            app,
            tls,
            async move { shutdown.cancelled().await },
        )
        .await
        {
            tracing::warn!(error = %e, "issuer listener failed");
        }
    });
    Ok((docs, task))
}

/// Fetches the hub cluster's ServiceAccount issuer documents with `client` (authenticated)
/// and checks that the discovery document's `issuer` is `url` byte for byte (the issuer-field
/// constraint: otherwise every verifier refuses them). Returns (discovery, JWKS), verbatim.
pub async fn fetch_cluster_issuer(
    client: &kube::Client,
    url: &str,
) -> Result<(String, String), IssuerError> {
    let get = |path: &'static str| async move {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| IssuerError::Config(format!("{path}: {e}")))?;
        client
            .request_text(req)
            .await
            .map_err(|source| IssuerError::Api {
                what: format!("fetching the hub cluster's {path}"),
                source,
            })
    };
    let discovery = get(DISCOVERY_PATH).await?;
    let issuer = serde_json::from_str::<serde_json::Value>(&discovery)
        .ok()
        .and_then(|d| d.get("issuer").and_then(|i| i.as_str()).map(str::to_string))
        .ok_or_else(|| {
            IssuerError::Config("the hub cluster's discovery document has no issuer".into())
        })?;
    if issuer != url {
        return Err(IssuerError::Config(format!(
            "--publish-cluster-issuer: the hub cluster's ServiceAccount issuer is {issuer:?}, not --issuer-url {url:?}; they must be equal byte for byte (set the API server's --service-account-issuer to the public URL)"
        )));
    }
    let jwks = get(JWKS_PATH).await?;
    Ok((discovery, jwks))
}

/// Mirror mode: serves the hub cluster's issuer documents (see [`fetch_cluster_issuer`]) on
/// `listener` until `shutdown`, fetching them again every `refresh_period` (a failed fetch
/// keeps the previous documents and is logged). The first fetch must succeed.
pub async fn start_mirror(
    settings: &super::MirrorSettings,
    listener: tokio::net::TcpListener,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<(IssuerDocuments, tokio::task::JoinHandle<()>), IssuerError> {
    let (discovery, jwks) = fetch_cluster_issuer(&client, &settings.url).await?;
    let docs = IssuerDocuments::new(&settings.url, &[]);
    docs.set_raw(discovery, jwks);
    let tls = match &settings.tls {
        Some((cert, key)) => Some(
            crate::http::load_tls_config(cert, key)
                .map_err(|e| IssuerError::Config(format!("issuer listener TLS: {e}")))?,
        ),
        None => None,
    };
    tracing::info!(issuer = %settings.url, addr = ?listener.local_addr().ok(), "mirroring the hub cluster's ServiceAccount issuer");
    let (refresh_docs, url, period, stop) = (
        docs.clone(),
        settings.url.clone(),
        settings.refresh_period,
        shutdown.clone(),
    );
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            match fetch_cluster_issuer(&client, &url).await {
                Ok((d, j)) => refresh_docs.set_raw(d, j),
                Err(e) => {
                    refresh_docs.refresh_failed(&e.to_string(), chrono::Utc::now().timestamp());
                    tracing::warn!(error = %e, "hub cluster issuer documents not refreshed: this replica is not ready; serving the previous ones")
                }
            }
        }
    });
    let app = router(docs.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = crate::http::serve(
            listener,
            app,
            tls,
            async move { shutdown.cancelled().await },
        )
        .await
        {
            tracing::warn!(error = %e, "issuer listener failed");
        }
    });
    Ok((docs, task))
}
