//! Spoke clients over real TLS: the profile's CA and `tls-server-name` are honoured, bearer
//! tokens and client certificates both work, a rotated client certificate is picked up by
//! rebuilding the client, and a 401 for the certificate a client still sends does not reject
//! the cache's newer one.

use crate::connect_proxy;
use crate::support;
use crate::tls_spoke;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use kleym_hub::access::ExecApiVersion;
use kleym_hub::credentials::cache::refresh_deadline;
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialMetrics, ExecOptions, SpokeCredentials,
    build_spoke_client,
};
use rcgen::ExtendedKeyUsagePurpose;
use support::*;

const V1: &str = "client.authentication.k8s.io/v1";
const TOKEN: &str = "tls-bearer-token-0123456789abcdefghij";

fn opts() -> CacheOptions {
    CacheOptions {
        failure_backoff: Duration::ZERO,
        exec: ExecOptions {
            timeout: Duration::from_secs(20),
            ..ExecOptions::default()
        },
        ..CacheOptions::default()
    }
}

fn client_opts() -> ClientOptions {
    ClientOptions {
        connect_timeout: Some(Duration::from_secs(10)),
        ..ClientOptions::default()
    }
}

fn write_cert_credential(dir: &std::path::Path, pki: &tls_spoke::Pki, cn: &str) {
    let (cert, key) = pki.issue(cn, vec![], ExtendedKeyUsagePurpose::ClientAuth);
    let doc = serde_json::json!({"apiVersion": V1, "kind": "ExecCredential", "status": {"clientCertificateData": cert, "clientKeyData": key}});
    std::fs::write(dir.join("cred.json"), doc.to_string()).unwrap();
}

#[tokio::test]
async fn bearer_token_over_tls_with_profile_ca_and_server_name() {
    let pki = tls_spoke::Pki::new();
    let addr = tls_spoke::start(&pki, TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &print_token(V1, TOKEN, None));
    let mut access = access_for(&s, ExecApiVersion::V1, &format!("https://{addr}"));
    access.cluster.certificate_authority_pem = Some(pki.ca_pem.clone().into_bytes().into());
    access.cluster.tls_server_name = Some(tls_spoke::SERVER_NAME.into());
    let creds = Arc::new(SpokeCredentials::new(
        access.clone(),
        opts(),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &client_opts()).await.unwrap();
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "token"
    );

    // Without tls-server-name the serving certificate does not match 127.0.0.1: refused.
    let mut no_name = access.clone();
    no_name.cluster.tls_server_name = None;
    let creds = Arc::new(SpokeCredentials::new(
        no_name,
        opts(),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &client_opts()).await.unwrap();
    let err = client.client.apiserver_version().await.unwrap_err();
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );

    // A different CA: refused.
    let mut other_ca = access;
    other_ca.cluster.certificate_authority_pem =
        Some(tls_spoke::Pki::new().ca_pem.into_bytes().into());
    let creds = Arc::new(SpokeCredentials::new(
        other_ca,
        opts(),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &client_opts()).await.unwrap();
    let err = client.client.apiserver_version().await.unwrap_err();
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
}

#[tokio::test]
async fn client_certificate_and_rotation_by_rebuild() {
    let pki = tls_spoke::Pki::new();
    let addr = tls_spoke::start(&pki, TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    write_cert_credential(dir.path(), &pki, "hub-a");
    let s = write_script(dir.path(), "p.sh", r#"cat "$KLEYM_TEST_DIR/cred.json""#);
    let mut access = access_for(&s, ExecApiVersion::V1, &format!("https://{addr}"));
    access.cluster.certificate_authority_pem = Some(pki.ca_pem.clone().into_bytes().into());
    access.cluster.tls_server_name = Some(tls_spoke::SERVER_NAME.into());
    let creds = Arc::new(SpokeCredentials::new(
        access,
        opts(),
        CredentialMetrics::default(),
    ));

    let client = build_spoke_client(creds.clone(), &client_opts())
        .await
        .unwrap();
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "cert:hub-a"
    );
    assert!(!client.needs_rebuild().await);

    // The plugin now hands out another certificate; the server rejected the old one.
    write_cert_credential(dir.path(), &pki, "hub-b");
    let current = creds.get().await.unwrap();
    creds.invalidate_after_401(current.generation);
    assert!(client.needs_rebuild().await);
    let rebuilt = build_spoke_client(creds, &client_opts()).await.unwrap();
    assert_eq!(
        rebuilt
            .client
            .apiserver_version()
            .await
            .unwrap()
            .git_version,
        "cert:hub-b"
    );
    assert!(!rebuilt.needs_rebuild().await);
}

#[tokio::test]
async fn profile_proxy_url_is_used() {
    let pki = tls_spoke::Pki::new();
    let spoke_addr = tls_spoke::start(&pki, TOKEN).await;
    let (proxy_addr, targets) = connect_proxy::start(spoke_addr).await;
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &print_token(V1, TOKEN, None));
    // The server name does not resolve here: only the proxy can reach it.
    let server = format!("https://{}:{}", tls_spoke::SERVER_NAME, spoke_addr.port());
    let mut access = access_for(&s, ExecApiVersion::V1, &server);
    access.cluster.certificate_authority_pem = Some(pki.ca_pem.clone().into_bytes().into());
    access.cluster.proxy_url = Some(format!("http://{proxy_addr}"));
    let creds = Arc::new(SpokeCredentials::new(
        access,
        opts(),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &client_opts()).await.unwrap();
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "token"
    );
    assert_eq!(
        targets.lock().unwrap().clone(),
        vec![format!("{}:{}", tls_spoke::SERVER_NAME, spoke_addr.port())]
    );
}

fn revoked_a(cn: &str) -> bool {
    cn == "hub-a"
}

#[tokio::test]
async fn a_401_for_a_replaced_client_certificate_does_not_reject_its_replacement() {
    let pki = tls_spoke::Pki::new();
    // The server no longer accepts hub-a.
    let addr = tls_spoke::start_revoking(&pki, TOKEN, revoked_a).await;
    let dir = tempfile::tempdir().unwrap();
    // Run n prints cred-n.json (and fails when there is none): hub-a valid for a minute, then
    // hub-b valid for an hour.
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!("{COUNT}\ncat \"$KLEYM_TEST_DIR/cred-$n.json\""),
    );
    for (n, cn, valid) in [(1, "hub-a", 60), (2, "hub-b", 3600)] {
        let (cert, key) = pki.issue(cn, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        let expires = (Utc::now() + chrono::Duration::seconds(valid))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let doc = serde_json::json!({"apiVersion": V1, "kind": "ExecCredential", "status": {
            "clientCertificateData": cert, "clientKeyData": key, "expirationTimestamp": expires}});
        std::fs::write(dir.path().join(format!("cred-{n}.json")), doc.to_string()).unwrap();
    }
    let mut access = access_for(&s, ExecApiVersion::V1, &format!("https://{addr}"));
    access.cluster.certificate_authority_pem = Some(pki.ca_pem.clone().into_bytes().into());
    access.cluster.tls_server_name = Some(tls_spoke::SERVER_NAME.into());
    let opts = CacheOptions {
        // hub-a is due for a background refresh 200 ms after it was obtained.
        refresh_fraction: 1.0,
        min_refresh_interval: Duration::from_millis(200),
        ..opts()
    };
    let creds = Arc::new(SpokeCredentials::new(
        access,
        opts,
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds.clone(), &client_opts())
        .await
        .unwrap();
    let first = creds.get().await.unwrap();
    let due = refresh_deadline(
        first.obtained_at,
        first.credential.expires_at.unwrap(),
        &opts,
    );
    if let Ok(wait) = (due - Utc::now()).to_std() {
        tokio::time::sleep(wait + Duration::from_millis(20)).await;
    }
    // The background refresh stores hub-b; the client is still built with hub-a.
    creds.get().await.unwrap();
    for _ in 0..1000 {
        if creds.get().await.unwrap().generation != first.generation {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refreshed = creds.get().await.unwrap();
    assert_eq!(refreshed.generation, first.generation + 1);

    // hub-a is rejected. The 401s are about hub-a: hub-b, never sent, stays the cache's
    // credential (no re-exec, which would fail here, and no 401 backoff).
    for _ in 0..3 {
        let err = client.client.apiserver_version().await.unwrap_err();
        assert!(
            err.to_string().contains("401") || err.to_string().contains("Unauthorized"),
            "{err}"
        );
    }
    assert_eq!(count(dir.path()), 2);
    assert_eq!(creds.get().await.unwrap().generation, refreshed.generation);
    assert!(client.needs_rebuild().await);

    let rebuilt = build_spoke_client(creds.clone(), &client_opts())
        .await
        .unwrap();
    assert_eq!(
        rebuilt
            .client
            .apiserver_version()
            .await
            .unwrap()
            .git_version,
        "cert:hub-b"
    );
    assert!(!rebuilt.needs_rebuild().await);
    assert_eq!(count(dir.path()), 2);
}
