//! End to end, keyless (issue 14): a hub that is its own JWT issuer and three kubesim spokes
//! whose API servers trust it through the `AuthenticationConfiguration` and RBAC that the real
//! `kleym trust-config` binary printed. No admin token, Secret or ServiceAccount token of a
//! spoke appears in any ClusterProfile or in the provider file: the hub engages every spoke
//! with `kleym credential spiffe-jwt`, bindings converge, each spoke maps the JWT-SVID to the
//! prefixed SPIFFE ID (the only user the printed RBAC grants anything), and a JWT-SVID minted
//! for one spoke is refused by the others. Everything the hub, the issuer and kubesim log at
//! trace level meanwhile contains no token and no private key.

use kleym_e2e::fixtures::keyless::{exec_access, register_credentialless, trust_config};
use kleym_test_support::authn::{apply_rbac, whoami};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_hub::access::audience::derived_audience;
use kleym_hub::credentials::{ExecOptions, run_plugin};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, PostParams};
use kubesim::ClusterHandle;
use serde_json::json;

/// Everything logged in this test process, at trace level.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

const BINDINGS: usize = 2;
const LIMIT: Duration = Duration::from_secs(90);
const HUB_ID: &str = "spiffe://example.org/kleym/hub";
const PROVIDER: &str = "kleym-spiffe-jwt";

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

/// A JWT-SVID minted as the hub would for spoke `s` (ClusterProfile `fleet/<name>`).
async fn mint(kleym: &str, s: &ClusterHandle, args: Vec<String>) -> String {
    let opts = ExecOptions {
        timeout: Duration::from_secs(30),
        ..ExecOptions::default()
    };
    let profile = format!("fleet/{}", s.name());
    let c = run_plugin(
        &exec_access(&profile, &s.url(), PROVIDER, kleym, args),
        &opts,
    )
    .await
    .unwrap();
    c.token.unwrap().expose().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_engages_three_spokes_with_spiffe_jwt_and_nothing_static() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(move || writer.clone())
        .init();
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a", "spoke-b", "spoke-c"], dir.path())
        .await
        .unwrap();
    let spokes = [f.spoke("spoke-a"), f.spoke("spoke-b"), f.spoke("spoke-c")];
    let hub_kc = f.hub_kubeconfig().display().to_string();

    // The issuer: TLS from a CA of its own, keys in a Secret the hub creates.
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
    let hub_flags = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
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
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let settings = parse_hub_args(&hub_flags(&["--issuer-x509"]))
        .unwrap()
        .issuer
        .settings()
        .unwrap()
        .unwrap();
    let stop = CancellationToken::new();
    let client = f.hub.kube_client().await.unwrap();
    let (docs, _) = kleym_hub::issuer::serve::start(
        &settings,
        listener,
        client,
        std::sync::Arc::new(|| true),
        stop.clone(),
    )
    .await
    .unwrap();

    // Profiles: server URL and CA only.
    register_credentialless(&f.hub_client, &spokes, PROVIDER, BINDINGS + 2, BINDINGS)
        .await
        .unwrap();

    // The spoke side, exactly as `kleym trust-config` prints it.
    let trust = dir.path().join("trust");
    let printed = trust_config(
        Path::new(&kleym),
        &hub_kc,
        [
            OsStr::new("--issuer-url"),
            OsStr::new(&issuer_url),
            OsStr::new("--issuer-ca-file"),
            ca.as_os_str(),
            OsStr::new("--trust-domain"),
            OsStr::new("example.org"),
            OsStr::new("--output-dir"),
            trust.as_os_str(),
        ],
    )
    .unwrap();
    assert_eq!(printed.len(), 3);
    for s in &spokes {
        let entry = printed
            .iter()
            .find(|e| e["spoke"] == format!("fleet/{}", s.name()))
            .unwrap();
        assert_eq!(entry["audience"], derived_audience("fleet", s.name()));
        assert_eq!(entry["username"], format!("kleym:{HUB_ID}"));
        // The file written for the API server's --authentication-config.
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
        // And the admission policy it prints for the hub's user.
        assert!(kleym_e2e::fixtures::admission::apply_printed_policy(s, entry).unwrap());
    }

    // The X.509 variant prints the hub CA (of its own Secret, beside the key Secret) and the
    // same binding.
    let x509 = trust_config(
        Path::new(&kleym),
        &hub_kc,
        [
            "--credential",
            "spiffe-x509",
            "--issuer-key-secret",
            "kleym/kleym-issuer",
            "--trust-domain",
            "example.org",
        ],
    )
    .unwrap();
    let ca_secret =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(f.hub_client.clone(), HUB_NS)
            .get("kleym-issuer-x509-ca")
            .await
            .unwrap();
    let ca_pem = String::from_utf8(ca_secret.data.unwrap()["x509-ca.crt"].0.clone()).unwrap();
    assert_eq!(x509.len(), 3);
    assert!(x509.iter().all(|e| e["clientCA"] == ca_pem.as_str()));
    assert_eq!(
        x509[0]["rbac"][1]["subjects"][0]["name"],
        format!("kleym:{HUB_ID}")
    );

    // Nothing static: the provider file names only the plugin and the issuer.
    let pf = dir.path().join("providers.json");
    let provider_file = json!({"providers": [{"name": PROVIDER, "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
        "args": spiffe_jwt_args(&issuer_url, &hub_kc),
        "provideClusterInfo": true, "interactiveMode": "Never"}}]});
    std::fs::write(&pf, provider_file.to_string()).unwrap();
    for s in &spokes {
        let text = provider_file.to_string();
        assert!(!text.contains(&s.admin_token()));
    }
    let hub = f
        .start_hub(&hub_flags(&[
            "--clusterprofile-provider-file",
            pf.to_str().unwrap(),
        ]))
        .await
        .unwrap();

    for s in &spokes {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }

    // Every engaged spoke cost one JWT-SVID signed with the hub's key, and the hub counts it.
    let signed = hub
        .handle
        .credentials
        .metrics()
        .tokens_signed
        .get_or_create(&kleym_hub::credentials::metrics::SignedLabels {
            credential_type: "spiffe-jwt".into(),
            signer: "hub-key".into(),
        })
        .get();
    assert!(signed >= spokes.len() as u64, "{signed}");

    // Each spoke sees the mapped user; a token minted for one spoke is refused by the others.
    let args = spiffe_jwt_args(&issuer_url, &hub_kc);
    let mut minted = Vec::new();
    for (i, s) in spokes.iter().enumerate() {
        let token = mint(&kleym, s, args.clone()).await;
        minted.push(token.clone());
        assert_eq!(
            whoami(s, &token).await.as_deref(),
            Some(format!("kleym:{HUB_ID}").as_str())
        );
        for (j, other) in spokes.iter().enumerate() {
            if i != j {
                assert_eq!(
                    whoami(other, &token).await,
                    None,
                    "{} accepted {}'s token",
                    other.name(),
                    s.name()
                );
            }
        }
    }

    // `kleym issuer rotate --revoke-old`: once each spoke has refetched the JWKS (it does on
    // the new kid), the hub's cached tokens are refused (401); the hub re-runs the plugin and
    // new bindings still converge.
    let out = Command::new(&kleym)
        .args(["issuer", "rotate", "--kubeconfig", &hub_kc, "--revoke-old"])
        .args(["--issuer-key-secret", &format!("{HUB_NS}/kleym-issuer")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ring = kleym_hub::issuer::secret::load_or_create(
        f.hub_client.clone(),
        &settings.secret,
        settings.algorithm,
        false,
    )
    .await
    .unwrap();
    docs.update_from_ring(&ring);
    assert_eq!(docs.kids().len(), 1);
    let execs = || {
        hub.handle
            .credentials
            .metrics()
            .exec_total
            .get_or_create(&kleym_hub::credentials::metrics::ExecResultLabels {
                provider: PROVIDER.into(),
                result: "success".into(),
            })
            .get()
    };
    let execs_before = execs();
    for s in &spokes {
        let token = mint(&kleym, s, args.clone()).await;
        let mut seen = None;
        for _ in 0..50 {
            seen = whoami(s, &token).await;
            if seen.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(seen.is_some(), "{} accepts the new key", s.name());
        for old in &minted {
            assert_eq!(whoami(s, old).await, None, "revoked key's token refused");
        }
        env::create_bindings(&s.store(), BINDINGS..BINDINGS + 2).unwrap();
    }
    for s in &spokes {
        let store = s.store();
        wait_for(
            &format!("{} converged after revocation", s.name()),
            LIMIT,
            || {
                let store = store.clone();
                async move { env::converged(&store, BINDINGS + 2).then_some(()) }
            },
        )
        .await
        .unwrap();
        assert!(
            s.requests().entries().iter().any(|r| r.status == 401),
            "{}: the hub's revoked token was refused at least once",
            s.name()
        );
    }
    assert!(
        execs() > execs_before,
        "the hub re-ran the plugin after the 401s"
    );
    hub.stop().await.unwrap();
    stop.cancel();

    // Nothing secret in the trace-level logs: no token (nor its signature part), no line of
    // the issuer's private key.
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        f.hub.kube_client().await.unwrap(),
        HUB_NS,
    )
    .get("kleym-issuer")
    .await
    .unwrap();
    let pem = String::from_utf8(secret.data.unwrap()["signing-keys.pem"].0.clone()).unwrap();
    let text = logs.text();
    assert!(
        text.len() > 10_000,
        "trace logs were captured ({} bytes)",
        text.len()
    );
    for token in &minted {
        let signature = token.rsplit('.').next().unwrap();
        assert!(!text.contains(signature), "a token reached the logs");
    }
    for line in pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "a private key line reached the logs");
    }
}

/// The real `kleym hub` binary as an issuer: it refuses an `http://` issuer URL and a Secret
/// holding a foreign key, names why, and leaves the Secret alone; with good flags it creates
/// the Secret and serves discovery and the JWKS over TLS well enough for a spoke to verify a
/// JWT-SVID through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleym_hub_binary_serves_the_issuer_and_refuses_bad_issuer_input() {
    use kleym_e2e::fixtures::hub_process::HubProcess;
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let spoke = f.spoke("spoke");
    let pki = kubesim_auth::pki::ClusterPki::generate("issuer").unwrap();
    let (cert, key) = (dir.path().join("issuer.crt"), dir.path().join("issuer.key"));
    std::fs::write(&cert, pki.serving_cert_pem()).unwrap();
    std::fs::write(&key, pki.serving_key_pem()).unwrap();
    // The one port chosen before the hub starts: the issuer URL names it, and the spoke and
    // the plugin fetch from that URL, so it cannot be left to the hub (whose metrics port is
    // its own choice, read back from its --listen-addrs-file by HubProcess).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let issuer_url = format!("https://{addr}");
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": PROVIDER, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym.to_str().unwrap(),
            "args": spiffe_jwt_args(&issuer_url, f.hub_kubeconfig().to_str().unwrap()),
            "provideClusterInfo": true, "interactiveMode": "Never"}}]})
        .to_string(),
    )
    .unwrap();
    let flags = |url: &str, secret: &str| -> Vec<String> {
        [
            "--clusterprofile-provider-file",
            pf.to_str().unwrap(),
            "--issuer-url",
            url,
            "--issuer-key-secret",
            secret,
            "--issuer-listen-addr",
            &addr.to_string(),
            "--issuer-tls-cert-file",
            cert.to_str().unwrap(),
            "--issuer-tls-key-file",
            key.to_str().unwrap(),
            "--leader-elect=false",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let refused = |flags: Vec<String>| {
        let out = Command::new(&kleym)
            .args(["hub", "--kubeconfig"])
            .arg(f.hub_kubeconfig())
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(flags(&format!("http://{addr}"), "kleym/kleym-issuer"));
    assert!(err.contains("--issuer-insecure-http"), "{err}");
    // A malformed key in an existing Secret: refused, named, never overwritten.
    let p384 = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    let secrets =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(f.hub_client.clone(), HUB_NS);
    let foreign: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "foreign", "namespace": HUB_NS},
        "stringData": {"signing-keys.pem": p384},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let before = secrets
        .get("foreign")
        .await
        .unwrap()
        .metadata
        .resource_version;
    let err = refused(flags(&issuer_url, "kleym/foreign"));
    assert!(
        err.contains("issuer Secret kleym/foreign data[signing-keys.pem]"),
        "{err}"
    );
    assert_eq!(
        secrets
            .get("foreign")
            .await
            .unwrap()
            .metadata
            .resource_version,
        before
    );

    // Good flags: the binary creates the Secret and serves the documents.
    let hub = HubProcess::spawn(
        &kleym,
        &f.hub_kubeconfig(),
        &flags(&issuer_url, "kleym/kleym-issuer"),
        &dir.path().join("hub.log"),
    )
    .unwrap();
    spoke
        .set_authentication_config(
            &json!({
                "apiVersion": "apiserver.config.k8s.io/v1beta1",
                "kind": "AuthenticationConfiguration",
                "jwt": [{"issuer": {"url": issuer_url, "audiences": [derived_audience("fleet", spoke.name())],
                                    "certificateAuthority": pki.ca_cert_pem()},
                         "claimMappings": {"username": {"claim": "sub", "prefix": "kleym:"}}}],
            })
            .to_string(),
        )
        .unwrap();
    let hub_kc = f.hub_kubeconfig().display().to_string();
    let kleym_s = kleym.to_str().unwrap().to_string();
    let user = wait_for(
        "the spoke verifies through the binary's issuer",
        LIMIT,
        || {
            let (kleym_s, hub_kc, issuer_url, spoke, secrets) = (
                kleym_s.clone(),
                hub_kc.clone(),
                issuer_url.clone(),
                spoke.clone(),
                secrets.clone(),
            );
            async move {
                secrets.get_opt("kleym-issuer").await.ok().flatten()?;
                let token = mint(&kleym_s, &spoke, spiffe_jwt_args(&issuer_url, &hub_kc)).await;
                whoami(&spoke, &token).await
            }
        },
    )
    .await;
    let log = kleym_e2e::fixtures::hub_process::log_tail(hub.log_path(), 40);
    assert_eq!(
        user.as_deref().ok(),
        Some(format!("kleym:{HUB_ID}").as_str()),
        "{log}"
    );
    hub.stop(Duration::from_secs(30)).await.unwrap();
}

/// The same fleet over X.509-SVIDs: three spokes whose API servers trust the hub CA of the
/// issuer Secret as a client CA and apply the RBAC `kleym trust-config --credential
/// spiffe-x509` printed; the hub engages them all with `kleym credential spiffe-x509`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_engages_three_spokes_with_spiffe_x509() {
    use kleym_hub::issuer::ca::{default_ca_secret, load_or_create};
    use kleym_hub::issuer::secret::SecretRef;
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&[], dir.path()).await.unwrap();
    let hub_kc = f.hub_kubeconfig().display().to_string();
    let at = SecretRef {
        namespace: HUB_NS.into(),
        name: "kleym-issuer".into(),
    };
    let ring = load_or_create(f.hub_client.clone(), &default_ca_secret(&at), &at, true)
        .await
        .unwrap();
    let ca = ring.ca().cert_pem.clone();
    let names = ["x509-a", "x509-b", "x509-c"];
    let mut options = kubesim::KubesimOptions {
        crds: kleym_e2e::fixtures::all_crds().unwrap(),
        ..Default::default()
    };
    for n in names {
        options.client_cas.insert(n.into(), ca.clone());
    }
    let sim = kubesim::Kubesim::start(&names, options).await.unwrap();
    let spokes: Vec<ClusterHandle> = names.iter().map(|n| sim.cluster(n).unwrap()).collect();
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
        Path::new(&kleym),
        &hub_kc,
        [
            "--credential",
            "spiffe-x509",
            "--issuer-key-secret",
            "kleym/kleym-issuer",
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
        assert_eq!(entry["clientCA"], ca.as_str());
        for doc in entry["rbac"].as_array().unwrap() {
            apply_rbac(s, doc).await;
        }
        // And the admission policy it prints for the hub's user.
        assert!(kleym_e2e::fixtures::admission::apply_printed_policy(s, entry).unwrap());
    }
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "kleym-spiffe-x509", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
            "args": ["credential", "spiffe-x509", "--issuer-x509-ca-secret", "kleym/kleym-issuer-x509-ca",
                     "--trust-domain", "example.org", "--kubeconfig", hub_kc],
            "interactiveMode": "Never"}}]})
        .to_string(),
    )
    .unwrap();
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
    for s in &spokes {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
    hub.stop().await.unwrap();
}
