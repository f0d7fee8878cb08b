use std::sync::OnceLock;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use x509_parser::prelude::*;

use super::*;

fn pki() -> &'static ClusterPki {
    static PKI: OnceLock<ClusterPki> = OnceLock::new();
    PKI.get_or_init(|| ClusterPki::generate("alpha").unwrap())
}

fn parse(pem: &str) -> Vec<u8> {
    certs_from_pem(pem).unwrap().remove(0).to_vec()
}

#[test]
fn ca_is_a_proper_ca() {
    let der = parse(pki().ca_cert_pem());
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        "kubesim-alpha-ca"
    );
    assert_eq!(cert.subject(), cert.issuer());
    let bc = cert.basic_constraints().unwrap().unwrap();
    assert!(bc.critical && bc.value.ca);
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    assert!(cert.validity().is_valid());
    assert!(cert.tbs_certificate.raw_serial().len() <= 20);
}

#[test]
fn serving_cert_has_sans_and_server_auth() {
    let der = parse(pki().serving_cert_pem());
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert_eq!(cert.issuer().to_string(), "CN=kubesim-alpha-ca");
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    let names = &san.general_names;
    let ips: Vec<&[u8]> = names
        .iter()
        .filter_map(|n| match n {
            GeneralName::IPAddress(ip) => Some(*ip),
            _ => None,
        })
        .collect();
    let mut v6_loopback = [0u8; 16];
    v6_loopback[15] = 1;
    assert_eq!(ips, vec![&[127u8, 0, 0, 1][..], &v6_loopback[..]]);
    assert!(names.contains(&GeneralName::DNSName("localhost")));
    assert_eq!(names.len(), 3, "{names:?}");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    assert!(cert.extensions().iter().any(|e| matches!(
        e.parsed_extension(),
        ParsedExtension::AuthorityKeyIdentifier(_)
    )));
}

#[test]
fn client_cert_subject_maps_to_user_and_groups() {
    for groups in [
        vec![],
        vec!["system:masters".to_string()],
        vec!["dev".to_string(), "ops".to_string(), "qa".to_string()],
    ] {
        let (cert_pem, key_pem) = pki()
            .issue_client_cert("bob", &groups, Duration::from_secs(600))
            .unwrap();
        assert!(key_pem.contains("PRIVATE KEY"));
        let der = parse(&cert_pem);
        let user = user_from_client_cert(&der).unwrap();
        assert_eq!(user.username, "bob");
        let mut expected = groups.clone();
        expected.push("system:authenticated".into());
        assert_eq!(user.groups, expected);
        let (_, cert) = parse_x509_certificate(&der).unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        // The (possibly re-signed) certificate verifies against the CA's key.
        let ca_der = parse(pki().ca_cert_pem());
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        cert.verify_signature(Some(ca.public_key())).unwrap();
    }
}

#[test]
fn client_cert_validity_follows_request() {
    let (cert_pem, _) = pki()
        .issue_client_cert("carol", &[], Duration::from_secs(7200))
        .unwrap();
    let der = parse(&cert_pem);
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    let v = cert.validity();
    let span = v.not_after.timestamp() - v.not_before.timestamp();
    // backdated by BACKDATE, valid for the requested 2h after now.
    assert_eq!(span, 7200 + BACKDATE.as_secs() as i64);
    assert!(
        pki()
            .issue_client_cert("", &[], Duration::from_secs(1))
            .is_err()
    );
}

#[test]
fn user_from_garbage_is_an_error() {
    assert!(matches!(
        user_from_client_cert(b"nope"),
        Err(AuthError::Pki(_))
    ));
    assert!(certs_from_pem("no pem here").is_err());
}

/// Runs one TLS handshake over an in-memory pipe and returns the user the server saw.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    server_name: &str,
) -> std::result::Result<Option<UserInfo>, String> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let acceptor = TlsAcceptor::from(server);
    let server_task = tokio::spawn(async move {
        let mut tls = acceptor
            .accept(server_io)
            .await
            .map_err(|e| e.to_string())?;
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        let user = conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| user_from_client_cert(c).unwrap());
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(user)
    });
    let connector = TlsConnector::from(client);
    let name = ServerName::try_from(server_name.to_string()).unwrap();
    let client_result = async {
        let mut tls = connector
            .connect(name, client_io)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"pong");
        Ok::<_, String>(())
    }
    .await;
    let server_result = server_task.await.unwrap();
    client_result?;
    server_result
}

#[tokio::test]
async fn handshake_with_client_cert_yields_user() {
    let (cert, key) = pki()
        .issue_client_cert(
            "admin",
            &["system:masters".into(), "ops".into()],
            Duration::from_secs(600),
        )
        .unwrap();
    let client = pki().client_config(Some((&cert, &key))).unwrap();
    let user = handshake(pki().server_config(true).unwrap(), client, "127.0.0.1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.username, "admin");
    assert_eq!(
        user.groups,
        vec!["system:masters", "ops", "system:authenticated"]
    );
}

#[tokio::test]
async fn handshake_without_client_cert_is_allowed_and_anonymous() {
    let client = pki().client_config(None).unwrap();
    for name in ["127.0.0.1", "localhost", "::1"] {
        let user = handshake(pki().server_config(true).unwrap(), client.clone(), name)
            .await
            .unwrap();
        assert_eq!(user, None);
    }
}

#[tokio::test]
async fn foreign_ca_is_rejected_both_ways() {
    let other = ClusterPki::generate("beta").unwrap();
    // A client certificate from another cluster's CA fails the handshake.
    let (cert, key) = other
        .issue_client_cert("mallory", &[], Duration::from_secs(600))
        .unwrap();
    let client = pki().client_config(Some((&cert, &key))).unwrap();
    assert!(
        handshake(pki().server_config(true).unwrap(), client, "127.0.0.1")
            .await
            .is_err()
    );
    // A client trusting only the other CA does not trust this cluster's server.
    let client = other.client_config(None).unwrap();
    assert!(
        handshake(pki().server_config(false).unwrap(), client, "127.0.0.1")
            .await
            .is_err()
    );
    // A name that is not in the SANs is rejected.
    let client = pki().client_config(None).unwrap();
    assert!(
        handshake(pki().server_config(false).unwrap(), client, "example.com")
            .await
            .is_err()
    );
}

/// Go's crypto/x509 is stricter than webpki in places: have the real kubectl talk to a TLS
/// server using our certificates, with a client certificate. Fails (never skips) without
/// kubectl, naming the command that installs it.
#[tokio::test]
async fn kubectl_accepts_our_certificates() {
    let kubectl = test_tools::require(test_tools::Tool::Kubectl);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // The canned responder below speaks HTTP/1.1 only, so do not offer h2.
    let mut config = (*pki().server_config(true).unwrap()).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let server = tokio::spawn(async move {
        // kubectl may open more than one connection; serve each with a canned /version.
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let user = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| user_from_client_cert(c).unwrap().username)
                    .unwrap_or_default();
                let mut buf = vec![0u8; 8192];
                let _ = tls.read(&mut buf).await;
                let body = format!(
                    r#"{{"major":"1","minor":"33","gitVersion":"v1.33.0-{user}","platform":"linux/amd64"}}"#
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let (cert, key) = pki()
        .issue_client_cert(
            "kube-user",
            &["dev".into(), "ops".into()],
            Duration::from_secs(600),
        )
        .unwrap();
    let files = [
        ("ca.crt", pki().ca_cert_pem().to_string()),
        ("c.crt", cert),
        ("c.key", key),
    ];
    for (name, content) in &files {
        std::fs::write(dir.join(name), content).unwrap();
    }
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {d}/ca.crt\nusers:\n- name: u\n  user:\n    client-certificate: {d}/c.crt\n    client-key: {d}/c.key\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        d = dir.display()
    );
    std::fs::write(dir.join("config"), kubeconfig).unwrap();
    let out = tokio::process::Command::new(kubectl)
        .args([
            "version",
            "-o",
            "json",
            "--request-timeout=10s",
            "--kubeconfig",
        ])
        .arg(dir.join("config"))
        .env("HOME", &dir)
        .output()
        .await
        .unwrap();
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("v1.33.0-kube-user"),
        "kubectl failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
}
