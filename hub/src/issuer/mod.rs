//! The hub as a SPIFFE/OIDC JWT issuer: signing keys kept in a hub Secret
//! ([`secret`]), JWT signing and the public documents ([`keys`]: JWKS, RFC 7638 `kid`), and
//! the unauthenticated discovery listener every replica serves ([`serve`]).
//!
//! The Secret holds PKCS#8 PEM private keys under [`SECRET_KEY`]: the first one signs, every
//! one is published in the JWKS. The leader creates the Secret when it is absent; a Secret
//! whose keys are malformed or of an unsupported kind is refused with the Secret and data key
//! named, and never overwritten. The X.509-SVID CA, when enabled (`--issuer-x509`), lives in a
//! Secret of its own ([`ca`]).

pub mod ca;
pub mod keys;
pub mod metrics;
pub mod rotation;
pub mod secret;
pub mod serve;
pub mod trust;
pub mod x509;

use thiserror::Error;

/// Data key of the issuer Secret holding the PEM private keys (signing key first).
pub const SECRET_KEY: &str = "signing-keys.pem";
/// Path of the JWKS, below the issuer URL.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// Path of the OIDC discovery document, below the issuer URL.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Longest JWT-SVID lifetime kleym signs (seconds); also how long a retired key stays
/// published at least.
pub const MAX_TOKEN_LIFETIME_SECONDS: i64 = 900;

/// Errors of the issuer.
#[derive(Debug, Error)]
pub enum IssuerError {
    /// A flag value is invalid (the message names the flag).
    #[error("{0}")]
    Config(String),
    /// The key material in the Secret is malformed or not supported (names the Secret).
    #[error("{0}")]
    Key(String),
    /// Signing failed.
    #[error("signing: {0}")]
    Sign(String),
    /// A hub API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// kube's error.
        source: kube::Error,
    },
}

/// Checks an issuer URL: `https://host[:port][/path]`, no query, fragment or user info, no
/// trailing slash (the `iss` claim and the discovery `issuer` must equal it byte for byte).
/// `http://` only with `allow_http` (behind a TLS-terminating ingress).
pub fn validate_issuer_url(url: &str, allow_http: bool) -> Result<(), IssuerError> {
    let bad = |why: &str| Err(IssuerError::Config(format!("--issuer-url {url:?}: {why}")));
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return bad(&e.to_string()),
    };
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if allow_http => {}
        Some("http") => {
            return bad(
                "must be https (plain http only with --issuer-insecure-http, behind a TLS-terminating ingress; spokes fetch discovery over https)",
            );
        }
        _ => return bad("must be an https URL"),
    }
    if uri.host().is_none_or(str::is_empty) {
        return bad("has no host");
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return bad("must not contain user info");
    }
    if uri.query().is_some() || url.contains('#') {
        return bad("must not contain a query or fragment");
    }
    if url.ends_with('/') {
        return bad("must not end with '/' (it is compared byte for byte)");
    }
    Ok(())
}

/// The URL of the JWKS below `issuer_url`.
pub fn jwks_url(issuer_url: &str) -> String {
    format!("{issuer_url}{JWKS_PATH}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        issuer: IssuerArgs,
    }

    fn settings(args: &[&str]) -> Result<Option<IssuerSettings>, String> {
        let mut v = vec!["kleym"];
        v.extend_from_slice(args);
        let cli = Cli::try_parse_from(v).map_err(|e| e.to_string())?;
        cli.issuer.settings().map_err(|e| e.to_string())
    }

    #[test]
    fn issuer_flags() {
        assert!(settings(&[]).unwrap().is_none());
        let tls = [
            "--issuer-tls-cert-file",
            "c.pem",
            "--issuer-tls-key-file",
            "k.pem",
        ];
        let mut ok = vec![
            "--issuer-url",
            "https://hub.example.org",
            "--issuer-key-secret",
            "kleym/issuer",
        ];
        ok.extend_from_slice(&tls);
        let s = settings(&ok).unwrap().unwrap();
        assert_eq!(s.secret.to_string(), "kleym/issuer");
        assert_eq!(s.algorithm, keys::Algorithm::Es256);
        assert!(s.tls.is_some());
        // No X.509 CA unless asked for; then beside the key Secret unless named.
        assert_eq!(s.x509_ca_secret, None);
        let mut x509 = ok.clone();
        x509.push("--issuer-x509");
        let s = settings(&x509).unwrap().unwrap();
        assert_eq!(
            s.x509_ca_secret.unwrap().to_string(),
            "kleym/issuer-x509-ca"
        );
        let mut named = x509.clone();
        named.extend(["--issuer-x509-ca-secret", "kleym-ca/hub-ca"]);
        let s = settings(&named).unwrap().unwrap();
        assert_eq!(s.x509_ca_secret.unwrap().to_string(), "kleym-ca/hub-ca");
        let mut same = x509.clone();
        same.extend(["--issuer-x509-ca-secret", "kleym/issuer"]);
        assert!(settings(&same).unwrap_err().contains("must differ"));
        let mut name_only = ok.clone();
        name_only.extend(["--issuer-x509-ca-secret", "kleym-ca/hub-ca"]);
        assert!(settings(&name_only).unwrap_err().contains("--issuer-x509"));
        // Each flag needs the other; TLS files are required unless plain HTTP is explicit.
        assert!(settings(&["--issuer-url", "https://hub.example.org"]).is_err());
        assert!(settings(&["--issuer-key-secret", "kleym/issuer"]).is_err());
        let no_tls = settings(&[
            "--issuer-url",
            "https://h.org",
            "--issuer-key-secret",
            "a/b",
        ]);
        assert!(no_tls.unwrap_err().contains("--issuer-tls-cert-file"));
        let http = settings(&[
            "--issuer-url",
            "http://h.org",
            "--issuer-key-secret",
            "a/b",
            "--issuer-insecure-http",
        ]);
        assert!(http.unwrap().unwrap().tls.is_none());
        let mut http_with_tls = vec!["--issuer-url", "http://h.org", "--issuer-key-secret", "a/b"];
        http_with_tls.extend_from_slice(&tls);
        assert!(
            settings(&http_with_tls)
                .unwrap_err()
                .contains("--issuer-insecure-http")
        );
        assert!(
            settings(&[
                "--issuer-url",
                "https://h.org",
                "--issuer-key-secret",
                "nons"
            ])
            .is_err()
        );
        let rs = settings(&[
            "--issuer-url",
            "https://h.org",
            "--issuer-key-secret",
            "a/b",
            "--issuer-insecure-http",
            "--issuer-key-algorithm",
            "RS256",
        ]);
        assert_eq!(rs.unwrap().unwrap().algorithm, keys::Algorithm::Rs256);
    }

    #[test]
    fn issuer_url_rules() {
        assert!(validate_issuer_url("https://hub.example.org", false).is_ok());
        assert!(validate_issuer_url("https://hub.example.org:8443/kleym", false).is_ok());
        let err = validate_issuer_url("http://hub.example.org", false).unwrap_err();
        assert!(err.to_string().contains("--issuer-insecure-http"), "{err}");
        assert!(validate_issuer_url("http://hub.example.org", true).is_ok());
        for bad in [
            "https://hub.example.org/",
            "https://hub.example.org?x=1",
            "https://u@hub.example.org",
            "ftp://hub",
            "not a url",
        ] {
            assert!(validate_issuer_url(bad, true).is_err(), "{bad}");
        }
    }
}

/// The `kleym hub` flags that make the hub an issuer.
#[derive(Debug, Clone, clap::Args)]
pub struct IssuerArgs {
    /// Make the hub a JWT issuer with this URL (`https://host[:port][/path]`, no trailing
    /// slash): the `iss` of every JWT-SVID `kleym credential spiffe-jwt` signs and the
    /// `issuer` of the discovery document, byte for byte. Spokes fetch
    /// `<url>/.well-known/openid-configuration` and `<url>/openid/v1/jwks`, so it must reach
    /// `--issuer-listen-addr` (directly or through an ingress). Requires
    /// `--issuer-key-secret` (or `--publish-cluster-issuer`).
    #[arg(long, value_name = "URL")]
    pub issuer_url: Option<String>,

    /// `namespace/name` of the hub Secret holding the issuer's signing keys (PKCS#8 PEM under
    /// `signing-keys.pem`, the first one signs). The hub creates it with a new ES256 key if
    /// absent; an existing Secret with malformed or foreign keys is refused and never
    /// overwritten. RBAC: get, create and update on that Secret (update: the leader's key and
    /// CA rotation write it, with its resourceVersion).
    #[arg(long, value_name = "NS/NAME", value_parser = secret::parse_issuer_key_secret, requires = "issuer_url")]
    pub issuer_key_secret: Option<secret::SecretRef>,

    /// Also keep an X.509-SVID CA for `kleym credential spiffe-x509`, in a Secret of its own
    /// (`--issuer-x509-ca-secret`): created with a new CA when absent, or moved there from
    /// `--issuer-key-secret` when that Secret still holds one (written by an older kleym).
    /// Without this flag no CA exists and nothing is moved.
    #[arg(long, requires = "issuer_key_secret")]
    pub issuer_x509: bool,

    /// `namespace/name` of the Secret holding the X.509-SVID CA (with `--issuer-x509`)
    /// [default: `<--issuer-key-secret>-x509-ca`, in its namespace]. Whoever reads it can mint
    /// client certificates for every spoke trusting the CA: grant it to no one else. RBAC:
    /// get and update on that Secret (create, the first time).
    #[arg(long, value_name = "NS/NAME", value_parser = ca::parse_ca_secret, requires = "issuer_x509")]
    pub issuer_x509_ca_secret: Option<secret::SecretRef>,

    /// Signature algorithm of the issuer: `ES256` (generated by the hub) or `RS256` (the
    /// Secret must already hold a PKCS#8 RSA key of at least 2048 bits).
    #[arg(long, value_enum, default_value = "ES256", value_name = "ES256|RS256")]
    pub issuer_key_algorithm: keys::Algorithm,

    /// Address of the issuer's own listener serving the discovery document and the JWKS
    /// without authentication (TLS from `--issuer-tls-cert-file`/`--issuer-tls-key-file`).
    #[arg(long, default_value = "0.0.0.0:8444", value_name = "ADDR")]
    pub issuer_listen_addr: std::net::SocketAddr,

    /// PEM certificate chain of the issuer listener (reloaded when it changes).
    #[arg(long, value_name = "PATH", requires = "issuer_tls_key_file")]
    pub issuer_tls_cert_file: Option<std::path::PathBuf>,

    /// PEM private key of the issuer listener.
    #[arg(long, value_name = "PATH", requires = "issuer_tls_cert_file")]
    pub issuer_tls_key_file: Option<std::path::PathBuf>,

    /// Serve the issuer listener over plain HTTP and accept an `http://` `--issuer-url`: only
    /// behind an ingress or proxy that terminates TLS (spokes fetch discovery over HTTPS).
    #[arg(long)]
    pub issuer_insecure_http: bool,

    /// How long a signing key signs before the leader replaces it (`30m`, `12h`, `7d`;
    /// `off`: never rotate automatically). The replaced key stays published until every token
    /// it signed has expired (15 min + 5 min skew), then is removed from the Secret.
    #[arg(long, default_value = "7d", value_name = "DURATION|off")]
    pub issuer_key_rotation: String,

    /// How long a new key is published before it signs, so that verifiers caching the JWKS
    /// know it first (`1h`; less than --issuer-key-rotation).
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub issuer_key_publish_ahead: String,

    /// Also publish the discovery document and the JWKS to this ConfigMap
    /// (`openid-configuration.json`, `jwks.json`), written by the leader when they change, for
    /// mirroring to object storage or a CDN that serves `--issuer-url`. RBAC: get and patch on
    /// that ConfigMap (create, the first time).
    #[arg(long, value_name = "NS/NAME", value_parser = parse_configmap_ref)]
    pub issuer_publish_configmap: Option<secret::SecretRef>,

    /// Mirror mode, for `kleym credential token-request`: instead of keys of its own, the
    /// hub fetches the hub cluster's ServiceAccount issuer documents (its
    /// `/.well-known/openid-configuration` and `/openid/v1/jwks`, authenticated, in cluster)
    /// every 30 s and serves them verbatim on the issuer listener, so spokes can verify the hub
    /// cluster's tokens when its API server is not reachable from them. The cluster's
    /// `--service-account-issuer` must equal `--issuer-url` byte for byte (refused otherwise).
    #[arg(long, requires = "issuer_url", conflicts_with = "issuer_key_secret")]
    pub publish_cluster_issuer: bool,
}

/// Mirror mode settings (`--publish-cluster-issuer`).
#[derive(Debug, Clone)]
pub struct MirrorSettings {
    /// `--issuer-url`: what the cluster's discovery document must name.
    pub url: String,
    /// `--issuer-listen-addr`.
    pub listen_addr: std::net::SocketAddr,
    /// TLS files, `None` with `--issuer-insecure-http`.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// How often the documents are fetched again.
    pub refresh_period: std::time::Duration,
}

fn parse_configmap_ref(s: &str) -> Result<secret::SecretRef, String> {
    secret::parse_secret_ref(s, "--issuer-publish-configmap").map_err(|e| e.to_string())
}

/// A validated issuer configuration.
#[derive(Debug, Clone)]
pub struct IssuerSettings {
    /// `--issuer-url`.
    pub url: String,
    /// `--issuer-key-secret`.
    pub secret: secret::SecretRef,
    /// The X.509 CA Secret (`None` without `--issuer-x509`).
    pub x509_ca_secret: Option<secret::SecretRef>,
    /// `--issuer-key-algorithm`.
    pub algorithm: keys::Algorithm,
    /// `--issuer-listen-addr`.
    pub listen_addr: std::net::SocketAddr,
    /// TLS files, `None` with `--issuer-insecure-http`.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Automatic rotation (`None`: `--issuer-key-rotation off`).
    pub rotation: Option<rotation::RotationPolicy>,
    /// How often every replica re-reads the Secret (and the leader checks rotation).
    pub refresh_period: std::time::Duration,
    /// `--issuer-publish-configmap`.
    pub publish_configmap: Option<secret::SecretRef>,
    /// Where to record the issuer's metrics (set by the hub's runtime).
    pub metrics: metrics::IssuerMetrics,
}

impl IssuerArgs {
    fn tls(
        &self,
        url: &str,
    ) -> Result<Option<(std::path::PathBuf, std::path::PathBuf)>, IssuerError> {
        validate_issuer_url(url, self.issuer_insecure_http)?;
        match (
            &self.issuer_tls_cert_file,
            &self.issuer_tls_key_file,
            self.issuer_insecure_http,
        ) {
            (Some(c), Some(k), false) => Ok(Some((c.clone(), k.clone()))),
            (_, _, true) => Ok(None),
            _ => Err(IssuerError::Config(
                "--issuer-url needs --issuer-tls-cert-file and --issuer-tls-key-file (or --issuer-insecure-http behind a TLS-terminating ingress)".into(),
            )),
        }
    }

    /// With `--publish-cluster-issuer`: the mirror's checked settings.
    pub fn mirror_settings(&self) -> Result<Option<MirrorSettings>, IssuerError> {
        if !self.publish_cluster_issuer {
            return Ok(None);
        }
        let url = self.issuer_url.as_deref().ok_or_else(|| {
            IssuerError::Config("--publish-cluster-issuer needs --issuer-url".into())
        })?;
        Ok(Some(MirrorSettings {
            url: url.to_string(),
            listen_addr: self.issuer_listen_addr,
            tls: self.tls(url)?,
            refresh_period: std::time::Duration::from_secs(30),
        }))
    }

    /// `None` when the hub is not an issuer; else the checked settings: an https URL (http
    /// only with `--issuer-insecure-http`), and TLS files unless `--issuer-insecure-http`.
    pub fn settings(&self) -> Result<Option<IssuerSettings>, IssuerError> {
        if self.publish_cluster_issuer {
            return Ok(None);
        }
        let Some(url) = &self.issuer_url else {
            return Ok(None);
        };
        let Some(secret) = &self.issuer_key_secret else {
            return Err(IssuerError::Config(
                "--issuer-url needs --issuer-key-secret (or --publish-cluster-issuer)".into(),
            ));
        };
        let tls = self.tls(url)?;
        let rotation = match self.issuer_key_rotation.as_str() {
            "off" => None,
            r => {
                let period = rotation::parse_duration_seconds(r)
                    .map_err(|e| IssuerError::Config(format!("--issuer-key-rotation {e}")))?;
                let ahead = rotation::parse_duration_seconds(&self.issuer_key_publish_ahead)
                    .map_err(|e| IssuerError::Config(format!("--issuer-key-publish-ahead {e}")))?;
                if ahead >= period {
                    return Err(IssuerError::Config(format!(
                        "--issuer-key-publish-ahead {} must be shorter than --issuer-key-rotation {r}",
                        self.issuer_key_publish_ahead
                    )));
                }
                Some(rotation::RotationPolicy {
                    period_seconds: period,
                    publish_ahead_seconds: ahead,
                    ..rotation::RotationPolicy::default()
                })
            }
        };
        let x509_ca_secret = self.issuer_x509.then(|| {
            self.issuer_x509_ca_secret
                .clone()
                .unwrap_or_else(|| ca::default_ca_secret(secret))
        });
        if x509_ca_secret.as_ref() == Some(secret) {
            return Err(IssuerError::Config(format!(
                "--issuer-x509-ca-secret {secret} must differ from --issuer-key-secret: the CA and the signing keys are kept apart"
            )));
        }
        Ok(Some(IssuerSettings {
            url: url.clone(),
            secret: secret.clone(),
            x509_ca_secret,
            algorithm: self.issuer_key_algorithm,
            listen_addr: self.issuer_listen_addr,
            tls,
            rotation,
            refresh_period: std::time::Duration::from_secs(30),
            publish_configmap: self.issuer_publish_configmap.clone(),
            metrics: metrics::IssuerMetrics::default(),
        }))
    }
}
