//! A credential produced by an exec plugin.

use chrono::{DateTime, Utc};

use super::secret::{Secret, short_hash};

/// A client certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// PEM certificate chain.
    pub certificate_pem: String,
    /// PEM private key.
    pub key_pem: Secret,
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field(
                "certificate",
                &format_args!("sha256:{}", short_hash(self.certificate_pem.as_bytes())),
            )
            .field("key", &self.key_pem)
            .finish()
    }
}

/// What an `ExecCredential.status` carries, validated. At least one of `token` and
/// `client_certificate` is present (client-go's rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// Bearer token.
    pub token: Option<Secret>,
    /// Client certificate and key.
    pub client_certificate: Option<ClientCertificate>,
    /// `expirationTimestamp`; `None` means the credential does not expire (kept until a 401).
    pub expires_at: Option<DateTime<Utc>>,
}

impl Credential {
    /// A loggable identifier of the credential content (hashes only).
    pub fn short_id(&self) -> String {
        match (&self.token, &self.client_certificate) {
            (Some(t), _) => format!("token:{}", t.short_hash()),
            (None, Some(c)) => format!("cert:{}", short_hash(c.certificate_pem.as_bytes())),
            (None, None) => "none".into(),
        }
    }
}
