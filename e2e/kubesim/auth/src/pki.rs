//! Per-cluster PKI: CA, serving certificate for 127.0.0.1/localhost, client certificates.
//!
//! Every simulated cluster gets its own self-signed CA (`CN=kubesim-<name>-ca`, ECDSA P-256)
//! and a serving certificate for `127.0.0.1`, `::1` and `localhost` signed by it. Certificates
//! carry what Go's crypto/x509 (kubectl) and webpki (rustls, kube-rs) insist on: CA
//! `basicConstraints` and `keyCertSign`, leaf `CA:FALSE`, `digitalSignature`, the right
//! extended key usage, SANs, authority/subject key identifiers and random positive serials.
//!
//! Client certificates follow kube-apiserver's x509 authenticator: `CN` is the username and
//! every `O` is a group.

mod der;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, SigningKey,
};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::{AuthError, Result, UserInfo};

/// Validity of a cluster CA.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Validity of the serving certificate.
const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Certificates start being valid a little in the past to tolerate clock skew.
const BACKDATE: Duration = Duration::from_secs(3600);

fn pki_err(context: &str, e: impl std::fmt::Display) -> AuthError {
    AuthError::Pki(format!("{context}: {e}"))
}

/// The ring crypto provider, installed explicitly per config (never the process default).
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A cluster's certificate authority and API server serving certificate.
pub struct ClusterPki {
    cluster_name: String,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_cert_pem: String,
    ca_cert_der: CertificateDer<'static>,
    serving_cert_pem: String,
    serving_cert_der: CertificateDer<'static>,
    serving_key_pem: String,
    serving_key_der: Vec<u8>,
}

impl std::fmt::Debug for ClusterPki {
    // Keys stay out of Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPki")
            .field("cluster_name", &self.cluster_name)
            .finish_non_exhaustive()
    }
}

impl ClusterPki {
    /// Generates a CA (`CN=kubesim-<cluster_name>-ca`) and a serving certificate for
    /// `127.0.0.1`, `::1` and `localhost` signed by it.
    pub fn generate(cluster_name: &str) -> Result<Self> {
        Self::generate_with_names(cluster_name, &[])
    }

    /// As [`ClusterPki::generate`], with `dns_names` also in the serving certificate: for a
    /// server that tests reach under a host name that is not loopback's (through a proxy,
    /// which clients never use for loopback addresses).
    pub fn generate_with_names(cluster_name: &str, dns_names: &[&str]) -> Result<Self> {
        Self::generate_with_addresses(cluster_name, dns_names, &[])
    }

    /// As [`ClusterPki::generate_with_names`], with `ips` also in the serving certificate:
    /// for a server at a loopback address other than `127.0.0.1`.
    pub fn generate_with_addresses(
        cluster_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<Self> {
        let now = SystemTime::now();
        let ca_key = KeyPair::generate().map_err(|e| pki_err("generate CA key", e))?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name(&format!("kubesim-{cluster_name}-ca"));
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        set_validity(&mut ca_params, now, CA_VALIDITY);
        ca_params.serial_number = Some(random_serial());
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(|e| pki_err("self-sign CA", e))?;

        let serving_key = KeyPair::generate().map_err(|e| pki_err("generate serving key", e))?;
        let mut params = leaf_params(
            &format!("kubesim-{cluster_name}-apiserver"),
            now,
            SERVING_VALIDITY,
        );
        params.subject_alt_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            SanType::DnsName(
                "localhost"
                    .to_string()
                    .try_into()
                    .map_err(|e| pki_err("SAN", e))?,
            ),
        ];
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        for name in dns_names {
            params.subject_alt_names.push(SanType::DnsName(
                name.to_string().try_into().map_err(|e| pki_err("SAN", e))?,
            ));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let serving = params
            .signed_by(&serving_key, &issuer)
            .map_err(|e| pki_err("sign serving certificate", e))?;

        Ok(ClusterPki {
            cluster_name: cluster_name.to_string(),
            ca_cert_pem: ca_cert.pem(),
            ca_cert_der: ca_cert.der().clone(),
            ca_params,
            ca_key,
            serving_cert_pem: serving.pem(),
            serving_cert_der: serving.der().clone(),
            serving_key_pem: serving_key.serialize_pem(),
            serving_key_der: serving_key.serialize_der(),
        })
    }

    /// The cluster name this PKI was generated for.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    /// The CA certificate (PEM) — goes into kubeconfig `certificate-authority-data`.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The CA certificate (DER).
    pub fn ca_cert_der(&self) -> &CertificateDer<'static> {
        &self.ca_cert_der
    }

    /// The serving certificate (PEM).
    pub fn serving_cert_pem(&self) -> &str {
        &self.serving_cert_pem
    }

    /// The serving certificate's private key (PKCS#8 PEM). Secret: never log it.
    pub fn serving_key_pem(&self) -> &str {
        &self.serving_key_pem
    }

    /// Issues a client certificate (`CN=user`, one `O` per group, `clientAuth`) valid for
    /// `validity` from now. Returns `(cert_pem, key_pem)`; the key is PKCS#8 PEM.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[String],
        validity: Duration,
    ) -> Result<(String, String)> {
        if user.is_empty() {
            return Err(AuthError::InvalidRequest(
                "client certificate user must not be empty".into(),
            ));
        }
        let key = KeyPair::generate().map_err(|e| pki_err("generate client key", e))?;
        let mut params = leaf_params(user, SystemTime::now(), validity);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if let [only] = groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, only.as_str());
        }
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| pki_err("sign client certificate", e))?;
        let der = if groups.len() > 1 {
            // rcgen keeps one value per attribute type; splice in a subject with every group.
            der::replace_subject(cert.der(), &der::encode_name(user, groups), |tbs| {
                self.ca_key
                    .sign(tbs)
                    .map_err(|e| pki_err("sign client certificate", e))
            })?
        } else {
            cert.der().to_vec()
        };
        Ok((pem_encode("CERTIFICATE", &der), key.serialize_pem()))
    }

    /// A rustls server config serving the cluster's certificate (chain: serving, CA) with ALPN
    /// `h2` and `http/1.1`. With `request_client_certs`, clients *may* present a certificate,
    /// which must then chain to the cluster CA (kube-apiserver's `--client-ca-file`);
    /// clients without one still connect (they authenticate with a token or are anonymous).
    pub fn server_config(&self, request_client_certs: bool) -> Result<Arc<ServerConfig>> {
        self.server_config_with_client_cas(request_client_certs, None)
    }

    /// As [`Self::server_config`], also accepting client certificates chaining to the CAs in
    /// `extra_client_ca_pem` (kube-apiserver's `--client-ca-file` holding more than the
    /// cluster CA). Extra CAs imply requesting client certificates.
    pub fn server_config_with_client_cas(
        &self,
        request_client_certs: bool,
        extra_client_ca_pem: Option<&str>,
    ) -> Result<Arc<ServerConfig>> {
        let request_client_certs = request_client_certs || extra_client_ca_pem.is_some();
        let provider = crypto_provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| pki_err("server TLS versions", e))?;
        let builder = if request_client_certs {
            let mut roots = self.root_store()?;
            if let Some(pem) = extra_client_ca_pem {
                for cert in certs_from_pem(pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| pki_err("client CA certificate", e))?;
                }
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| pki_err("client verifier", e))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.serving_key_der.clone()));
        let mut config = builder
            .with_single_cert(
                vec![self.serving_cert_der.clone(), self.ca_cert_der.clone()],
                key,
            )
            .map_err(|e| pki_err("server certificate", e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A root store holding only this cluster's CA.
    pub fn root_store(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca_cert_der.clone())
            .map_err(|e| pki_err("CA certificate", e))?;
        Ok(roots)
    }

    /// A rustls client config trusting this cluster's CA, optionally presenting a client
    /// certificate (`(cert_pem, key_pem)` as returned by [`ClusterPki::issue_client_cert`]).
    /// ALPN `http/1.1`. Handy for tests and in-process clients.
    pub fn client_config(&self, client_cert: Option<(&str, &str)>) -> Result<Arc<ClientConfig>> {
        client_config(&self.ca_cert_pem, client_cert)
    }
}

/// A rustls client config (ring provider) trusting the CA certificates in `ca_pem`,
/// optionally presenting a client certificate `(cert_pem, key_pem)`. ALPN `http/1.1`.
pub fn client_config(ca_pem: &str, client_cert: Option<(&str, &str)>) -> Result<Arc<ClientConfig>> {
    let roots = root_store_from_pem(ca_pem)?;
    let builder = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| pki_err("client TLS versions", e))?
        .with_root_certificates(roots);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => {
            let certs = certs_from_pem(cert_pem)?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| match e {
                pem::Error::NoItemsFound => AuthError::Pki("client key PEM: no private key".into()),
                e => pki_err("client key PEM", e),
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| pki_err("client certificate", e))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A root store with every certificate in `ca_pem` (at least one is required).
pub fn root_store_from_pem(ca_pem: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem(ca_pem)? {
        roots.add(cert).map_err(|e| pki_err("CA certificate", e))?;
    }
    Ok(roots)
}

/// Parses every `CERTIFICATE` block of a PEM bundle (at least one is required).
pub fn certs_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| pki_err("certificate PEM", e))?;
    if certs.is_empty() {
        return Err(AuthError::Pki("certificate PEM: no certificate".into()));
    }
    Ok(certs)
}

/// The user a verified client certificate authenticates, as kube-apiserver's x509
/// authenticator: `CN` → username, each `O` → a group, plus `system:authenticated`.
///
/// The caller must have verified the certificate against the cluster CA (the rustls
/// verifier of [`ClusterPki::server_config`] does); this only reads the subject.
pub fn user_from_client_cert(der: &[u8]) -> Result<UserInfo> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| pki_err("client certificate", e))?;
    let subject = cert.subject();
    let username = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    if username.is_empty() {
        return Err(AuthError::Pki(
            "client certificate has no common name".into(),
        ));
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_string)
        .collect();
    Ok(UserInfo {
        username,
        groups,
        ..Default::default()
    }
    .with_authenticated_group())
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn leaf_params(common_name: &str, now: SystemTime, validity: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, now, validity);
    params
}

fn set_validity(params: &mut CertificateParams, now: SystemTime, validity: Duration) {
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    // rcgen takes `time::OffsetDateTime`; build it from the epoch to avoid a direct `time` dep.
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + unix(now.checked_sub(BACKDATE).unwrap_or(now));
    params.not_after = epoch + unix(now + validity);
}

/// 16 random bytes with a non-zero, positive leading byte (RFC 5280: positive, ≤ 20 bytes).
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes[0] = (bytes[0] & 0x7f).max(1);
    SerialNumber::from_slice(&bytes)
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests;
