//! kubeconfig files for simulated clusters (CA embedded; token or client-certificate users).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

/// How a kubeconfig user authenticates.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A bearer token.
    Token(String),
    /// A client certificate and its private key (PEM).
    ClientCert {
        /// Certificate PEM.
        cert_pem: String,
        /// Private key PEM.
        key_pem: String,
    },
}

/// One cluster entry of a kubeconfig.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Cluster, user and context name.
    pub name: String,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// CA certificate PEM.
    pub ca_pem: String,
    /// The user's credentials.
    pub credentials: Credentials,
}

/// A kubeconfig (YAML) with one context per entry; the first entry is the current context.
pub fn render(entries: &[Entry]) -> String {
    let clusters: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({"name": e.name, "cluster": {
                "server": e.server,
                "certificate-authority-data": STANDARD.encode(e.ca_pem.as_bytes()),
            }})
        })
        .collect();
    let users: Vec<_> = entries
        .iter()
        .map(|e| {
            let user = match &e.credentials {
                Credentials::Token(t) => json!({"token": t}),
                Credentials::ClientCert { cert_pem, key_pem } => json!({
                    "client-certificate-data": STANDARD.encode(cert_pem.as_bytes()),
                    "client-key-data": STANDARD.encode(key_pem.as_bytes()),
                }),
            };
            json!({"name": e.name, "user": user})
        })
        .collect();
    let contexts: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({"name": e.name, "context": {"cluster": e.name, "user": e.name, "namespace": "default"}})
        })
        .collect();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": clusters,
        "users": users,
        "contexts": contexts,
        "current-context": entries.first().map(|e| e.name.clone()).unwrap_or_default(),
    });
    crate::yaml::to_string(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_kube_rs_readable_kubeconfig() {
        let y = render(&[Entry {
            name: "hub".into(),
            server: "https://127.0.0.1:1234".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            credentials: Credentials::Token("t0k".into()),
        }]);
        let kc = kube::config::Kubeconfig::from_yaml(&y).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("hub"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:1234"));
        assert!(cluster.certificate_authority_data.is_some());
        assert!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.is_some());
    }
}
