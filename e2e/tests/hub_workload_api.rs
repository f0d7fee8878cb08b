//! SVIDs from a SPIRE agent (issue 14): `kleym credential spiffe-jwt|spiffe-x509
//! --workload-api-socket` against a stand-in agent that speaks the SPIFFE Workload API (gRPC on
//! a unix socket, `e2e/src/fixtures/spire_agent.rs`).
//!
//! - The real binary asks for the spoke's audience with the security header, and prints the
//!   SVID the agent gave (JWT and X.509).
//! - Refused, with a message naming why: an SVID outside the trust domain, a SPIFFE ID the agent
//!   does not offer, a malformed socket URI; an agent that hangs fails within
//!   `--workload-api-timeout-seconds`, and the hub's exec timeout kills a plugin waiting longer.
//! - End to end: a hub engages kubesim spokes whose API servers trust only "SPIRE" (its OIDC
//!   discovery documents for JWT-SVIDs, its CA for X.509-SVIDs), configured from what
//!   `kleym trust-config` printed; no key of the hub's and nothing static anywhere.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fixtures::keyless::{exec_access, register_credentialless, trust_config};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::fixtures::spire_agent::{AgentIdentity, JwtMinter, Mode, SpireAgent};
use kleym_hub::access::EffectiveAccess;
use kleym_hub::access::audience::derived_audience;
use kleym_hub::credentials::{ExecOptions, run_plugin};
use kleym_hub::issuer::keys::SigningKey;
use kleym_hub::issuer::x509::HubCa;
use kleym_test_support::authn::{apply_rbac, whoami};
use kubesim::ClusterHandle;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

/// The hub's SPIFFE ID in SPIRE, registered outside `/ns/` (the tenants' space, which the
/// plugins refuse for the hub).
const SPIRE_ID: &str = "spiffe://example.org/kleym/hub-spire";
/// The ClusterProfile the probes below run the plugin for, and its derived audience.
const PROBE: &str = "fleet/probe";
const PROBE_AUDIENCE: &str = "kleym.io/clusterprofile/fleet/probe";
/// The DNS name of the hub's registration entry: SPIRE puts it in the X.509-SVID's CN.
const X509_USER: &str = "kleym-hub.example.org";
const BINDINGS: usize = 2;
const LIMIT: Duration = Duration::from_secs(90);

/// A minter signing as SPIRE's server would: `iss` = its OIDC issuer, 5-minute tokens.
fn minter(key: Arc<SigningKey>, issuer_url: String) -> JwtMinter {
    Arc::new(move |id: &str, audiences: &[String]| {
        let now = chrono::Utc::now().timestamp();
        key.sign_jwt(&json!({
            "iss": issuer_url, "sub": id, "aud": audiences,
            "iat": now, "exp": now + 300,
        }))
        .expect("signing a test JWT-SVID")
    })
}

/// An X.509-SVID for `id` with CN `cn`, issued by `ca`, in the agent's wire form.
fn x509_svid(ca: &HubCa, id: &str, cn: &str) -> (Vec<u8>, Vec<u8>) {
    let (cert, key, _) = ca
        .issue_svid(id, cn, chrono::Utc::now(), chrono::Duration::hours(1))
        .unwrap();
    let chain = CertificateDer::from_pem_slice(cert.as_bytes())
        .unwrap()
        .to_vec();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .unwrap()
        .secret_der()
        .to_vec();
    (chain, key)
}

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Runs the real `kleym credential ARGS…` as the hub would, for a spoke at `server` listed by
/// ClusterProfile [`PROBE`].
async fn plugin(kleym: &Path, args: &[&str], server: &str) -> std::process::Output {
    tokio::process::Command::new(kleym)
        .arg("credential")
        .args(args)
        .env("KLEYM_CLUSTER_AUDIENCE", PROBE_AUDIENCE)
        .env("KLEYM_CLUSTER_PROFILE", PROBE)
        .env(
            "KUBERNETES_EXEC_INFO",
            json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                   "spec": {"cluster": {"server": server}, "interactive": false}})
            .to_string(),
        )
        .env_remove("KLEYM_ISSUER_URL")
        .env_remove("KLEYM_ISSUER_KEY_SECRET")
        .env_remove("KLEYM_TRUST_DOMAIN")
        .output()
        .await
        .unwrap()
}

fn access(kleym: &Path, server: &str, provider: &str, args: Vec<String>) -> EffectiveAccess {
    exec_access(PROBE, server, provider, &kleym.display().to_string(), args)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the plugin exited with `code` (1: refused, 2: usage error), printed nothing, and
/// said every one of `needles` on stderr; returns stderr.
fn assert_failed(out: &std::process::Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_take_svids_from_the_workload_api_and_refuse_wrong_ones() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = SigningKey::generate_es256().unwrap();
    let mint = minter(Arc::new(key), "https://oidc.example.org".into());
    let ca = HubCa::generate(chrono::Utc::now()).unwrap();
    let hub = AgentIdentity {
        spiffe_id: SPIRE_ID.into(),
        jwt: Some(mint.clone()),
        x509: Some(x509_svid(&ca, SPIRE_ID, X509_USER)),
    };
    let agent = SpireAgent::start(dir.path(), vec![hub.clone()]).unwrap();
    let socket = agent.socket_uri();
    let server = "https://spoke-a.example.org:6443";

    // JWT-SVID: asked for the spoke's audience, with the security header; printed as given.
    let out = plugin(
        &kleym,
        &[
            "spiffe-jwt",
            "--workload-api-socket",
            &socket,
            "--trust-domain",
            "example.org",
        ],
        server,
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let cred: Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = cred["status"]["token"].as_str().unwrap();
    assert_eq!(claims(token)["sub"], SPIRE_ID);
    assert_eq!(claims(token)["aud"], json!([PROBE_AUDIENCE]));
    assert!(cred["status"]["expirationTimestamp"].is_string());
    let calls = agent.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].method, "/SpiffeWorkloadAPI/FetchJWTSVID");
    assert_eq!(calls[0].audience, vec![PROBE_AUDIENCE.to_string()]);
    assert_eq!(calls[0].spiffe_id, "");
    assert!(calls[0].security_header);

    // Through the hub's exec runner, as an engaged spoke would: `--hub-spiffe-id` is the ID
    // asked for.
    let args: Vec<String> = [
        "credential",
        "spiffe-jwt",
        "--workload-api-socket",
        &socket,
        "--hub-spiffe-id",
        SPIRE_ID,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = run_plugin(
        &access(&kleym, server, "kleym-spiffe-jwt", args),
        &ExecOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(claims(c.token.unwrap().expose())["sub"], SPIRE_ID);
    assert_eq!(agent.calls()[1].spiffe_id, SPIRE_ID);

    // X.509-SVID: the first message of the stream, chain and key in PEM.
    let args: Vec<String> = [
        "credential",
        "spiffe-x509",
        "--workload-api-socket",
        &socket,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = run_plugin(
        &access(&kleym, server, "kleym-spiffe-x509", args),
        &ExecOptions::default(),
    )
    .await
    .unwrap();
    let cert = c.client_certificate.unwrap();
    let leaf = CertificateDer::from_pem_slice(cert.certificate_pem.as_bytes()).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    assert_eq!(
        parsed
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        X509_USER
    );
    assert_eq!(agent.calls()[2].method, "/SpiffeWorkloadAPI/FetchX509SVID");

    // An SVID outside the trust domain is refused, named, and its token is not echoed.
    let foreign = "spiffe://other.org/kleym/hub";
    agent.set_identities(vec![AgentIdentity {
        spiffe_id: foreign.into(),
        jwt: Some(mint.clone()),
        x509: Some(x509_svid(&ca, foreign, X509_USER)),
    }]);
    for kind in ["spiffe-jwt", "spiffe-x509"] {
        let out = plugin(
            &kleym,
            &[
                kind,
                "--workload-api-socket",
                &socket,
                "--trust-domain",
                "example.org",
            ],
            server,
        )
        .await;
        let err = assert_failed(&out, 1, &["outside the trust domain", foreign]);
        assert!(
            !err.contains("eyJ"),
            "{kind}: a token reached stderr: {err}"
        );
    }

    // An SVID in the tenants' space (`/ns/...`, the registrar's default form) is refused for
    // the hub: a tenant owning that namespace on any cluster could be issued it.
    let tenants = "spiffe://example.org/ns/kleym-system/sa/kleym-hub";
    agent.set_identities(vec![AgentIdentity {
        spiffe_id: tenants.into(),
        jwt: Some(mint.clone()),
        x509: Some(x509_svid(&ca, tenants, X509_USER)),
    }]);
    for kind in ["spiffe-jwt", "spiffe-x509"] {
        let out = plugin(
            &kleym,
            &[
                kind,
                "--workload-api-socket",
                &socket,
                "--trust-domain",
                "example.org",
            ],
            server,
        )
        .await;
        let err = assert_failed(&out, 1, &["/ns/", tenants]);
        assert!(
            !err.contains("eyJ"),
            "{kind}: a token reached stderr: {err}"
        );
    }

    // A SPIFFE ID the agent does not issue to this process: PermissionDenied, explained.
    agent.set_identities(vec![hub.clone()]);
    let out = plugin(
        &kleym,
        &[
            "spiffe-jwt",
            "--workload-api-socket",
            &socket,
            "--hub-spiffe-id",
            "spiffe://example.org/not-mine",
        ],
        server,
    )
    .await;
    assert_failed(&out, 1, &["PermissionDenied", "registration entry"]);

    // A wedged agent: the plugin gives up after --workload-api-timeout-seconds, saying so.
    agent.set_mode(Mode::Hang);
    let started = Instant::now();
    let out = plugin(
        &kleym,
        &[
            "spiffe-x509",
            "--workload-api-socket",
            &socket,
            "--workload-api-timeout-seconds",
            "1",
        ],
        server,
    )
    .await;
    assert_failed(&out, 1, &["no answer within 1 s"]);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // And the hub's exec timeout ends a plugin that would wait longer (its default 10 s).
    let args: Vec<String> = ["credential", "spiffe-jwt", "--workload-api-socket", &socket]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let started = Instant::now();
    let err = run_plugin(
        &access(&kleym, server, "kleym-spiffe-jwt", args),
        &ExecOptions {
            timeout: Duration::from_secs(1),
            ..ExecOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    // No agent at the socket: refused, naming the socket.
    let missing = format!("unix://{}/none.sock", dir.path().display());
    let out = plugin(
        &kleym,
        &["spiffe-jwt", "--workload-api-socket", &missing],
        server,
    )
    .await;
    assert_failed(&out, 1, &[&missing]);

    // Usage errors (exit 2) name the flag: a TCP endpoint, and key flags with a socket.
    let out = plugin(
        &kleym,
        &[
            "spiffe-jwt",
            "--workload-api-socket",
            "tcp://127.0.0.1:8081",
        ],
        server,
    )
    .await;
    assert_failed(&out, 2, &["--workload-api-socket"]);
    let out = plugin(
        &kleym,
        &[
            "spiffe-jwt",
            "--workload-api-socket",
            &socket,
            "--issuer-url",
            "https://hub.example.org",
        ],
        server,
    )
    .await;
    assert_failed(&out, 2, &["--issuer-url"]);
}

/// The stand-in agent refuses a call without the security header, as SPIRE's does: it is what
/// makes the client's header (asserted above) necessary.
#[tokio::test]
async fn the_agent_refuses_calls_without_the_security_header() {
    use kleym_e2e::fixtures::spire_agent::messages;
    let dir = tempfile::tempdir().unwrap();
    let agent = SpireAgent::start(dir.path(), vec![]).unwrap();
    let path = dir.path().join("agent.sock");
    let channel = tonic::transport::Endpoint::try_from("http://agent.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<_, messages::JwtSvidResponse, _>(
            tonic::Request::new(messages::JwtSvidRequest {
                audience: vec!["a".into()],
                spiffe_id: String::new(),
            }),
            http::uri::PathAndQuery::from_static("/SpiffeWorkloadAPI/FetchJWTSVID"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("security header"), "{status:?}");
    assert!(!agent.calls()[0].security_header);
}

/// The OIDC discovery provider of the stand-in SPIRE server: its signing key's JWKS and
/// discovery document over HTTPS (kleym's issuer router serves them). Returns the issuer
/// URL and the CA file that verifies it.
async fn oidc_provider(key: &SigningKey, dir: &Path) -> (String, std::path::PathBuf) {
    let pki = kubesim_auth::pki::ClusterPki::generate("spire-oidc").unwrap();
    let (cert, tls_key, ca) = (
        dir.join("oidc.crt"),
        dir.join("oidc.key"),
        dir.join("oidc-ca.crt"),
    );
    std::fs::write(&cert, pki.serving_cert_pem()).unwrap();
    std::fs::write(&tls_key, pki.serving_key_pem()).unwrap();
    std::fs::write(&ca, pki.ca_cert_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let docs = kleym_hub::issuer::serve::IssuerDocuments::new(&url, std::slice::from_ref(key));
    let tls = kleym_hub::http::load_tls_config(&cert, &tls_key).unwrap();
    tokio::spawn(kleym_hub::http::serve(
        listener,
        kleym_hub::issuer::serve::router(docs),
        Some(tls),
        std::future::pending(),
    ));
    (url, ca)
}

/// Starts the hub with a provider file whose one entry runs `kleym credential <plugin>
/// --workload-api-socket <agent>`: no key, no kubeconfig, nothing static. Returns once every
/// spoke converged.
async fn engage_from_agent(
    f: &FleetHarness,
    dir: &Path,
    kleym: &Path,
    plugin: &str,
    agent: &SpireAgent,
    spokes: &[ClusterHandle],
) -> RunningHub {
    let name = format!("kleym-{plugin}");
    let pf = dir.join(format!("{name}.json"));
    let argv = [
        "credential",
        plugin,
        "--workload-api-socket",
        &agent.socket_uri(),
        "--trust-domain",
        "example.org",
    ];
    let entry = json!({"name": name, "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": kleym.display().to_string(), "args": argv, "interactiveMode": "Never",
        "provideClusterInfo": plugin == "spiffe-jwt"}});
    std::fs::write(&pf, json!({"providers": [entry]}).to_string()).unwrap();
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "example.org".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    wait_converged(spokes).await;
    hub
}

async fn wait_converged(spokes: &[ClusterHandle]) {
    for s in spokes {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_engages_spokes_with_jwt_svids_from_a_spire_agent() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spire-a", "spire-b"], dir.path())
        .await
        .unwrap();
    let spokes = [f.spoke("spire-a"), f.spoke("spire-b")];
    let hub_kc = f.hub_kubeconfig().display().to_string();
    let (key, _) = SigningKey::generate_es256().unwrap();
    let (issuer_url, issuer_ca) = oidc_provider(&key, dir.path()).await;
    let agent = SpireAgent::start(
        dir.path(),
        vec![AgentIdentity {
            spiffe_id: SPIRE_ID.into(),
            jwt: Some(minter(Arc::new(key), issuer_url.clone())),
            x509: None,
        }],
    )
    .unwrap();
    register_credentialless(
        &f.hub_client,
        &spokes,
        "kleym-spiffe-jwt",
        BINDINGS + 2,
        BINDINGS,
    )
    .await
    .unwrap();

    // The spoke side, as `kleym trust-config` prints it for SPIRE's issuer and the hub's ID.
    let trust = dir.path().join("trust");
    let printed = trust_config(
        &kleym,
        &hub_kc,
        [
            "--issuer-url",
            &issuer_url,
            "--issuer-ca-file",
            issuer_ca.to_str().unwrap(),
            "--hub-spiffe-id",
            SPIRE_ID,
            "--output-dir",
            trust.to_str().unwrap(),
        ],
    )
    .unwrap();
    for s in &spokes {
        let entry = printed
            .iter()
            .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
            .unwrap();
        let file = trust
            .join(format!("fleet_{}", s.name()))
            .join("authentication-config.yaml");
        s.set_authentication_config(&std::fs::read_to_string(file).unwrap())
            .unwrap();
        for doc in entry["rbac"].as_array().unwrap() {
            apply_rbac(s, doc).await;
        }
        // And the admission policy it prints for the hub's user.
        assert!(kleym_e2e::fixtures::admission::apply_printed_policy(s, entry).unwrap());
    }

    // The provider entry names the agent's socket and nothing else: no key, no kubeconfig.
    let hub = engage_from_agent(&f, dir.path(), &kleym, "spiffe-jwt", &agent, &spokes).await;

    // The hub asked the agent once per spoke audience, always with the security header.
    let calls = agent.calls();
    for s in &spokes {
        assert!(
            calls
                .iter()
                .any(|c| c.audience == vec![derived_audience("fleet", s.name())]
                    && c.security_header),
            "{} never asked for: {calls:?}",
            s.name()
        );
    }
    // The hub counts the SVIDs it got, by type and signer.
    let signed = hub
        .handle
        .credentials
        .metrics()
        .tokens_signed
        .get_or_create(&kleym_hub::credentials::metrics::SignedLabels {
            credential_type: "spiffe-jwt".into(),
            signer: "workload-api".into(),
        })
        .get();
    assert!(signed >= spokes.len() as u64, "{signed}");
    // Each spoke maps the SVID to the prefixed SPIFFE ID; a token for one is refused by the
    // other (audience confinement holds for SPIRE's tokens too).
    let args: Vec<String> = [
        "credential",
        "spiffe-jwt",
        "--workload-api-socket",
        &agent.socket_uri(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (i, s) in spokes.iter().enumerate() {
        let c = run_plugin(
            &exec_access(
                &format!("fleet/{}", s.name()),
                &s.url(),
                "kleym-spiffe-jwt",
                &kleym.display().to_string(),
                args.clone(),
            ),
            &ExecOptions::default(),
        )
        .await
        .unwrap();
        let token = c.token.unwrap().expose().to_string();
        let user = format!("kleym:{SPIRE_ID}");
        assert_eq!(whoami(s, &token).await.as_deref(), Some(user.as_str()));
        assert_eq!(whoami(&spokes[1 - i], &token).await, None);
    }
    hub.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_engages_spokes_with_x509_svids_from_a_spire_agent() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&[], dir.path()).await.unwrap();
    let hub_kc = f.hub_kubeconfig().display().to_string();
    // SPIRE's X.509 CA: the spokes trust it, and nothing of the hub's.
    let spire_ca = HubCa::generate(chrono::Utc::now()).unwrap();
    let bundle = dir.path().join("spire-bundle.pem");
    std::fs::write(&bundle, &spire_ca.cert_pem).unwrap();
    let names = ["spire-x-a", "spire-x-b"];
    let mut options = kubesim::KubesimOptions {
        crds: kleym_e2e::fixtures::all_crds().unwrap(),
        ..Default::default()
    };
    for n in names {
        options
            .client_cas
            .insert(n.into(), spire_ca.cert_pem.clone());
    }
    let sim = kubesim::Kubesim::start(&names, options).await.unwrap();
    let spokes: Vec<ClusterHandle> = names.iter().map(|n| sim.cluster(n).unwrap()).collect();
    let agent = SpireAgent::start(
        dir.path(),
        vec![AgentIdentity {
            spiffe_id: SPIRE_ID.into(),
            jwt: None,
            x509: Some(x509_svid(&spire_ca, SPIRE_ID, X509_USER)),
        }],
    )
    .unwrap();
    register_credentialless(
        &f.hub_client,
        &spokes,
        "kleym-spiffe-x509",
        BINDINGS,
        BINDINGS,
    )
    .await
    .unwrap();
    let printed = trust_config(
        &kleym,
        &hub_kc,
        [
            "--credential",
            "spiffe-x509",
            "--client-ca-file",
            bundle.to_str().unwrap(),
            "--x509-username",
            X509_USER,
            "--hub-spiffe-id",
            SPIRE_ID,
            "--trust-domain",
            "example.org",
        ],
    )
    .unwrap();
    for s in &spokes {
        let entry = printed
            .iter()
            .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
            .unwrap();
        assert_eq!(entry["clientCA"], spire_ca.cert_pem.as_str());
        assert_eq!(entry["username"], X509_USER);
        for doc in entry["rbac"].as_array().unwrap() {
            apply_rbac(s, doc).await;
        }
        // And the admission policy it prints for the hub's user.
        assert!(kleym_e2e::fixtures::admission::apply_printed_policy(s, entry).unwrap());
    }
    let hub = engage_from_agent(&f, dir.path(), &kleym, "spiffe-x509", &agent, &spokes).await;
    assert!(
        agent
            .calls()
            .iter()
            .all(|c| c.method == "/SpiffeWorkloadAPI/FetchX509SVID" && c.security_header)
    );
    hub.stop().await.unwrap();
}
