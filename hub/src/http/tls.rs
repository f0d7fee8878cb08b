//! The serving certificate: loaded from PEM files and reloaded when they change (as
//! cert-manager or a kubelet-projected Secret rotates them), without a restart.

use crate::http::HttpError;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often a handshake may look at the files' modification times.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// A rustls server configuration from PEM files (certificate chain, private key), offering
/// HTTP/2 and HTTP/1.1; the files are re-read when they change (checked at most every
/// [`RELOAD_CHECK_INTERVAL`]). A broken replacement is logged and the previous pair kept.
pub fn load_tls_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    load_tls_config_with(cert_file, key_file, RELOAD_CHECK_INTERVAL)
}

/// [`load_tls_config`] with an explicit check interval (tests).
pub fn load_tls_config_with(
    cert_file: &Path,
    key_file: &Path,
    check_interval: Duration,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = CertReloader::new(cert_file, key_file, provider.clone(), check_interval)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves the current certificate, re-reading the files when their mtimes change.
#[derive(Debug)]
struct CertReloader {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    check_interval: Duration,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    mtimes: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl CertReloader {
    fn new(
        cert_file: &Path,
        key_file: &Path,
        provider: Arc<CryptoProvider>,
        check_interval: Duration,
    ) -> Result<Self, HttpError> {
        let mtimes = (mtime(cert_file), mtime(key_file));
        let key = load_pair(cert_file, key_file, &provider)?;
        Ok(Self {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            check_interval,
            state: Mutex::new(Loaded {
                key,
                mtimes,
                checked: Instant::now(),
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() >= self.check_interval {
            state.checked = Instant::now();
            let mtimes = (mtime(&self.cert_file), mtime(&self.key_file));
            if mtimes != state.mtimes {
                // Remember the new mtimes even on failure: a half-written pair is retried
                // when the files change again, not on every handshake.
                state.mtimes = mtimes;
                match load_pair(&self.cert_file, &self.key_file, &self.provider) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert_file.display(), "hub API: serving certificate reloaded");
                        state.key = key;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "hub API: new certificate files are unusable; still serving the previous pair"
                    ),
                }
            }
        }
        state.key.clone()
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn load_pair(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, HttpError> {
    let tls = HttpError::Tls;
    let cert_pem = std::fs::read(cert_file).map_err(|e| {
        tls(format!(
            "reading --tls-cert-file {}: {e}",
            cert_file.display()
        ))
    })?;
    let key_pem = std::fs::read(key_file).map_err(|e| {
        tls(format!(
            "reading --tls-key-file {}: {e}",
            key_file.display()
        ))
    })?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(format!("parsing {}: {e}", cert_file.display())))?;
    if certs.is_empty() {
        return Err(tls(format!("{} holds no certificate", cert_file.display())));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => tls(format!("{} holds no private key", key_file.display())),
        e => tls(format!("parsing {}: {e}", key_file.display())),
    })?;
    let certified = CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        tls(format!(
            "certificate and key do not form a usable pair: {e}"
        ))
    })?;
    Ok(Arc::new(certified))
}
