//! Serving the hub API over TLS (rustls) and, when asked, plain HTTP; flag validation.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer};
use kleym_hub::http::{
    ApiArgs, ApiMetrics, ApiState, StaticHubView, load_tls_config, load_tls_config_with, router,
    serve,
};
use prometheus_client::registry::Registry;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::sync::Arc;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    api: ApiArgs,
}

fn app() -> axum::Router {
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    // Mode `off`: these tests never reach the reviewer, but a KubeReviewer needs a client.
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let auth = ApiAuth::new(
        AuthConfig::new(AuthMode::Off, "kleym-hub"),
        Arc::new(KubeReviewer::new(client)),
        metrics.clone(),
    );
    router(ApiState {
        view: Arc::new(StaticHubView::leader()),
        registry: Arc::new(registry),
        auth,
        metrics,
    })
}

fn write_cert(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key, ck.cert.pem())
}

async fn get_over_tls(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
) -> (u16, String, Vec<u8>) {
    try_get_over_tls(addr, ca_pem, alpn).await.unwrap()
}

async fn try_get_over_tls(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
) -> Result<(u16, String, Vec<u8>), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let negotiated = tls
        .get_ref()
        .1
        .alpn_protocol()
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let req = http::Request::get(format!("https://{addr}/healthz"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = if alpn == b"h2" {
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((
        status,
        String::from_utf8_lossy(&body).into_owned(),
        negotiated,
    ))
}

#[tokio::test]
async fn serves_over_tls_with_h2_and_http1() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = write_cert(dir.path());
    let args = Cli::try_parse_from([
        "t",
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ])
    .unwrap()
    .api;
    let tls = args.tls().unwrap().expect("TLS configured");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app(), Some(tls), async {
        let _ = stopped.await;
    }));
    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let (status, body, negotiated) = get_over_tls(addr, &ca, alpn).await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        assert_eq!(negotiated, alpn);
    }
    // A plain-HTTP request to the TLS port is not served.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let plain = send
        .send_request(
            http::Request::get("/healthz")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await;
    assert!(
        plain.is_err(),
        "plain HTTP must not be answered on the TLS port"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn serves_plain_http_only_when_asked() {
    let args = Cli::try_parse_from(["t", "--api-insecure-http"])
        .unwrap()
        .api;
    assert!(args.tls().unwrap().is_none());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app(), None, async {
        let _ = stopped.await;
    }));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(
            http::Request::get("/v1/report")
                .header("host", "x")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn flags_require_an_explicit_transport() {
    let args = Cli::try_parse_from(["t"]).unwrap().api;
    let err = args.tls().unwrap_err().to_string();
    assert!(err.contains("--api-insecure-http"), "{err}");
    assert!(Cli::try_parse_from(["t", "--tls-cert-file", "/c"]).is_err());
    assert!(
        Cli::try_parse_from([
            "t",
            "--tls-cert-file",
            "/c",
            "--tls-key-file",
            "/k",
            "--api-insecure-http"
        ])
        .is_err()
    );
    let args = Cli::try_parse_from([
        "t",
        "--api-insecure-http",
        "--api-auth-mode",
        "enforce",
        "--api-audience",
        "aud",
        "--api-token-cache-ttl-seconds",
        "30",
    ])
    .unwrap()
    .api;
    let c = args.auth_config();
    assert_eq!(c.mode, AuthMode::Enforce);
    assert_eq!(c.audience, "aud");
    assert_eq!(c.positive_ttl, std::time::Duration::from_secs(30));
}

#[test]
fn tls_loading_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = write_cert(dir.path());
    let missing = dir.path().join("missing.key");
    let err = load_tls_config(&cert, &missing).unwrap_err().to_string();
    assert!(err.contains("missing.key"), "{err}");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let err = load_tls_config(&empty, &key).unwrap_err().to_string();
    assert!(err.contains("no certificate"), "{err}");
    let err = load_tls_config(&cert, &empty).unwrap_err().to_string();
    assert!(err.contains("no private key"), "{err}");
    // A key that does not match the certificate.
    let (_, other_key, _) = write_cert(&{
        let d = dir.path().join("other");
        std::fs::create_dir(&d).unwrap();
        d
    });
    let err = load_tls_config(&cert, &other_key).unwrap_err().to_string();
    assert!(err.contains("usable pair"), "{err}");
}

/// Overwrite the pair at `cert`/`key` with a new self-signed one and give both files a
/// distinct mtime (file timestamps can be too coarse to differ between quick writes).
fn rotate(cert: &std::path::Path, key: &std::path::Path, cert_pem: &str, key_pem: &str, secs: u64) {
    std::fs::write(cert, cert_pem).unwrap();
    std::fs::write(key, key_pem).unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    for p in [cert, key] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

#[tokio::test]
async fn rotated_certificate_files_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca_a) = write_cert(dir.path());
    let tls = load_tls_config_with(&cert, &key, std::time::Duration::ZERO).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app(), Some(tls), async {
        let _ = stopped.await;
    }));
    assert_eq!(get_over_tls(addr, &ca_a, b"http/1.1").await.0, 200);

    let b = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let ca_b = b.cert.pem();
    rotate(
        &cert,
        &key,
        &ca_b,
        &b.signing_key.serialize_pem(),
        1_000_000,
    );
    assert_eq!(get_over_tls(addr, &ca_b, b"http/1.1").await.0, 200);
    assert!(
        try_get_over_tls(addr, &ca_a, b"http/1.1").await.is_err(),
        "the old certificate is gone"
    );

    // A broken replacement is ignored: the last good pair keeps serving.
    rotate(&cert, &key, "garbage", "garbage", 2_000_000);
    assert_eq!(get_over_tls(addr, &ca_b, b"http/1.1").await.0, 200);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
