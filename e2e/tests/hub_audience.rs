//! End to end: the audience of the hub's tokens is the hub's decision, not a ClusterProfile's.
//!
//! Two keyless spokes A and B trust the hub's JWT-SVIDs through what the real `kleym
//! trust-config` printed. A third ClusterProfile, written by an attacker, points the hub at a
//! capturing HTTPS server (127.0.0.1, port 0):
//! 1. its server is the capturing server and its exec extension says `audience: <B's URL>`;
//! 2. its server is B's URL, reached through the attacker's `proxy-url` with the attacker's CA
//!    (the proxy terminates TLS as B).
//!
//! In both cases the hub sends the capturing server a token, and B refuses that token (401):
//! its audience is the attacker's profile's, which B does not accept. Then, under a provider
//! entry that does allow profile-sourced audiences, the attacker's profile naming B's audience
//! is refused together with B's, the reason naming both.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, parse_hub_args, wait_for};
use kleym_e2e::fixtures::keyless::{exec_access, register_credentialless, trust_config};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::fixtures::profiles::{apply_profile, status};
use kleym_hub::credentials::{ExecOptions, run_plugin};
use kleym_hub::fleet::Phase;
use kleym_spoke::reconciler::CancellationToken;
use kleym_test_support::authn::{apply_rbac, whoami};
use kubesim::ClusterHandle;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(90);
const PROVIDER: &str = "kleym-spiffe-jwt";
/// A provider entry that lets profiles choose their audience.
const OPEN_PROVIDER: &str = "kleym-spiffe-jwt-open";
const HUB_ID: &str = "spiffe://example.org/kleym/hub";
const EXEC_EXT: &str = "client.authentication.k8s.io/exec";

/// The attacker's server: plain TLS, or an HTTP CONNECT proxy that then terminates TLS
/// itself. It records every bearer token it is sent and answers 401.
struct Capture {
    addr: SocketAddr,
    tokens: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    async fn start(cert_pem: &str, key_pem: &str) -> Self {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tokens: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = tokens.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = serve(tcp, acceptor, seen).await;
                });
            }
        });
        Self { addr, tokens }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn tokens(&self) -> Vec<String> {
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn serve(
    mut tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut first = [0u8; 1];
    tcp.peek(&mut first).await?;
    // Not a TLS handshake (0x16): a proxy request, which must be CONNECT.
    if first[0] != 0x16 {
        let head = read_head(&mut tcp).await?;
        if !head.starts_with("CONNECT ") {
            return Ok(());
        }
        tcp.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
    }
    let mut tls = acceptor.accept(tcp).await?;
    let head = read_head(&mut tls).await?;
    let token = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        let value = value.trim();
        (name.eq_ignore_ascii_case("authorization") && value.len() > 7)
            .then(|| value.strip_prefix("Bearer ").map(str::to_string))?
    });
    if let Some(t) = token {
        seen.lock().unwrap_or_else(|p| p.into_inner()).push(t);
    }
    tls.write_all(
        b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await?;
    tls.shutdown().await
}

/// An HTTP/1.1 request head (up to the blank line), read byte by byte so nothing after it is
/// consumed.
async fn read_head(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            break;
        }
        head.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The host name under which the attacker's profile names spoke B behind its proxy.
const B_HOST_NAME: &str = "spoke-b.fleet.test";

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// A spoke's answer to `token`: the HTTP status of `GET /api` with it (discovery, which any
/// authenticated user may read; `/version` would not do, kubesim serves it without looking at
/// the token).
async fn status_with(spoke: &ClusterHandle, token: &str) -> u16 {
    let client = spoke.client_for_token(token).await.unwrap();
    match client.list_core_api_versions().await {
        Ok(_) => 200,
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("{}: {e}", spoke.name()),
    }
}

fn spiffe_jwt_args(issuer_url: &str, hub_kc: &str) -> Vec<String> {
    [
        "credential",
        "spiffe-jwt",
        "--issuer-url",
        issuer_url,
        "--issuer-key-secret",
        &format!("{HUB_NS}/kleym-issuer"),
        "--trust-domain",
        "example.org",
        "--kubeconfig",
        hub_kc,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Sets the attacker's profile `fleet/evil` to offer `provider` with `cluster`.
async fn evil(hub: &kube::Client, provider: &str, cluster: Value) {
    apply_profile(
        hub,
        "evil",
        status(
            vec![json!({"name": provider, "cluster": cluster})],
            true,
            "2026-01-01T00:00:00Z",
            &[],
        ),
    )
    .await
    .unwrap();
}

/// Waits for a token captured after the first `before`, and returns it.
async fn captured(capture: &Capture, before: usize, what: &str) -> String {
    wait_for(what, LIMIT, || {
        let tokens = capture.tokens();
        async move { tokens.get(before).cloned() }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_cannot_steer_the_hubs_token_to_another_spoke() {
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a", "spoke-b"], dir.path())
        .await
        .unwrap();
    let (a, b) = (f.spoke("spoke-a"), f.spoke("spoke-b"));
    let hub_kc = f.hub_kubeconfig().display().to_string();

    // The hub's issuer, served over TLS from a CA of its own.
    let pki = kubesim_auth::pki::ClusterPki::generate("issuer").unwrap();
    let (cert, key, ca) = (
        dir.path().join("issuer.crt"),
        dir.path().join("issuer.key"),
        dir.path().join("issuer-ca.crt"),
    );
    std::fs::write(&cert, pki.serving_cert_pem()).unwrap();
    std::fs::write(&key, pki.serving_key_pem()).unwrap();
    std::fs::write(&ca, pki.ca_cert_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer_url = format!("https://{}", listener.local_addr().unwrap());
    let mut hub_flags: Vec<String> = [
        "--issuer-url",
        &issuer_url,
        "--issuer-key-secret",
        &format!("{HUB_NS}/kleym-issuer"),
        "--issuer-tls-cert-file",
        cert.to_str().unwrap(),
        "--issuer-tls-key-file",
        key.to_str().unwrap(),
        "--trust-domain",
        "example.org",
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let settings = parse_hub_args(&hub_flags)
        .unwrap()
        .issuer
        .settings()
        .unwrap()
        .unwrap();
    let stop = CancellationToken::new();
    kleym_hub::issuer::serve::start(
        &settings,
        listener,
        f.hub.kube_client().await.unwrap(),
        Arc::new(|| true),
        stop.clone(),
    )
    .await
    .unwrap();

    // A and B: keyless, configured exactly as `kleym trust-config` prints.
    let spokes = [a.clone(), b.clone()];
    register_credentialless(&f.hub_client, &spokes, PROVIDER, 1, 1)
        .await
        .unwrap();
    let printed = trust_config(
        Path::new(&kleym),
        &hub_kc,
        [
            "--issuer-url",
            &issuer_url,
            "--issuer-ca-file",
            ca.to_str().unwrap(),
            "--trust-domain",
            "example.org",
            "--output-dir",
            dir.path().join("trust").to_str().unwrap(),
        ],
    )
    .unwrap();
    for s in &spokes {
        let entry = printed
            .iter()
            .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
            .unwrap();
        let file = dir
            .path()
            .join("trust")
            .join(format!("fleet_{}", s.name()))
            .join("authentication-config.yaml");
        s.set_authentication_config(&std::fs::read_to_string(file).unwrap())
            .unwrap();
        for doc in entry["rbac"].as_array().unwrap() {
            apply_rbac(s, doc).await;
        }
    }

    // The attacker's server, with a certificate for 127.0.0.1 and for the host name under
    // which the attacker's profile names B (below) from the attacker's own CA.
    let attacker =
        kubesim_auth::pki::ClusterPki::generate_with_names("attacker", &[B_HOST_NAME]).unwrap();
    let capture = Capture::start(attacker.serving_cert_pem(), attacker.serving_key_pem()).await;
    let attacker_ca = STANDARD.encode(attacker.ca_cert_pem());

    // 1. Server: the capturing server; exec extension: B's URL as the audience.
    evil(
        &f.hub_client,
        PROVIDER,
        json!({"server": capture.url(), "certificate-authority-data": attacker_ca,
               "extensions": [{"name": EXEC_EXT, "extension": {"audience": b.url()}}]}),
    )
    .await;

    let pf = dir.path().join("providers.json");
    let entry = |name: &str, extra: Value| {
        let mut e = json!({"name": name, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
            "args": spiffe_jwt_args(&issuer_url, &hub_kc),
            "provideClusterInfo": true, "interactiveMode": "Never"}});
        if let (Some(e), Some(x)) = (e.as_object_mut(), extra.as_object()) {
            e.extend(x.clone());
        }
        e
    };
    std::fs::write(
        &pf,
        json!({"providers": [
            entry(PROVIDER, json!({})),
            entry(OPEN_PROVIDER, json!({"profileSourcedAudiencePolicy": "Allow"})),
        ]})
        .to_string(),
    )
    .unwrap();
    hub_flags.extend([
        "--clusterprofile-provider-file".to_string(),
        pf.display().to_string(),
    ]);
    let hub = f.start_hub(&hub_flags).await.unwrap();

    // A and B work with the new audience.
    for s in &spokes {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, 1).then_some(()) }
        })
        .await
        .unwrap();
    }

    // The probe tells an accepted token from a refused one: the hub's token for B itself is
    // accepted.
    let own = run_plugin(
        &exec_access(
            "fleet/spoke-b",
            &b.url(),
            PROVIDER,
            &kleym,
            spiffe_jwt_args(&issuer_url, &hub_kc),
        ),
        &ExecOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(status_with(&b, own.token.unwrap().expose()).await, 200);

    let token = captured(&capture, 0, "a token at the capturing server").await;
    assert_eq!(claims(&token)["sub"], HUB_ID, "it is the hub's token");
    assert_eq!(
        status_with(&b, &token).await,
        401,
        "B accepted a token sent to the attacker's server (aud {})",
        claims(&token)["aud"]
    );
    assert_eq!(whoami(&a, &token).await, None);
    assert!(
        b.requests().entries().iter().any(|r| r.status == 401),
        "B refused it"
    );

    // 2. Server: B, through the attacker's proxy, with the attacker's CA. Clients never
    //    proxy loopback addresses, so the profile names B by a host name (a real spoke's
    //    URL is one); the hub resolves nothing itself, the proxy gets the CONNECT.
    let before = capture.tokens().len();
    let b_port = b
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    evil(
        &f.hub_client,
        PROVIDER,
        json!({"server": format!("https://{B_HOST_NAME}:{b_port}"), "certificate-authority-data": attacker_ca,
               "proxy-url": format!("http://{}", capture.addr)}),
    )
    .await;
    let token = captured(&capture, before, "a token through the attacker's proxy").await;
    assert_eq!(claims(&token)["sub"], HUB_ID, "it is the hub's token");
    assert_eq!(
        status_with(&b, &token).await,
        401,
        "B accepted a token sent through the attacker's proxy (aud {})",
        claims(&token)["aud"]
    );

    // 3. A provider entry that allows profile-sourced audiences: the attacker names B's
    //    audience. Both profiles are refused, each reason naming both; no token is minted
    //    for the attacker's server meanwhile.
    let b_audience = printed
        .iter()
        .find(|e| e["spoke"] == "fleet/spoke-b")
        .unwrap()["audience"]
        .as_str()
        .unwrap()
        .to_string();
    evil(
        &f.hub_client,
        OPEN_PROVIDER,
        json!({"server": capture.url(), "certificate-authority-data": attacker_ca,
               "extensions": [{"name": EXEC_EXT, "extension": {"audience": b_audience}}]}),
    )
    .await;
    let state = hub.handle.state.clone();
    for name in ["fleet/evil", "fleet/spoke-b"] {
        let reason = wait_for(&format!("{name} refused"), LIMIT, || {
            let s = state.get(name);
            async move {
                s.filter(|s| s.phase == Phase::Refused)
                    .and_then(|s| s.reason)
            }
        })
        .await
        .unwrap();
        assert!(
            reason.contains("fleet/evil")
                && reason.contains("fleet/spoke-b")
                && reason.contains("audience"),
            "{name}: {reason}"
        );
    }
    // The attacker gives up its audience: B is engaged again.
    evil(
        &f.hub_client,
        OPEN_PROVIDER,
        json!({"server": capture.url(), "certificate-authority-data": attacker_ca}),
    )
    .await;
    wait_for("spoke-b engaged again", LIMIT, || {
        let s = state.get("fleet/spoke-b");
        async move { s.filter(|s| s.phase != Phase::Refused).map(|_| ()) }
    })
    .await
    .unwrap();
    // Nothing the attacker captured, in any phase, carries A's or B's audience.
    for t in capture.tokens() {
        let aud = claims(&t)["aud"].clone();
        for s in &spokes {
            let theirs = printed
                .iter()
                .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
                .unwrap()["audience"]
                .clone();
            assert!(
                !aud.as_array().unwrap().contains(&theirs),
                "a token for {} reached the attacker: {aud}",
                s.name()
            );
        }
    }
    hub.stop().await.unwrap();
    stop.cancel();
}
