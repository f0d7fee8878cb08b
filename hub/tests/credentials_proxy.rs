//! Which connections go through a proxy, with a capturing CONNECT proxy on 127.0.0.1 that
//! records every tunnel asked for: the process's own `HTTPS_PROXY` and a profile's
//! `proxy-url` are used for a remote spoke, but never for loopback (whatever `NO_PROXY` says,
//! as Go's `httpproxy` behaves), never for a server `NO_PROXY` names (profile proxies
//! included), and never for the hub's own client to its cluster on loopback.
//!
//! The proxy variables are process-wide, so this binary holds one test, which sets them once
//! before any other thread exists.

#[path = "fixtures/connect_proxy.rs"]
mod connect_proxy;
#[path = "fixtures/hub_sim.rs"]
mod hub_sim;
#[path = "fixtures/support.rs"]
mod support;
#[path = "fixtures/tls_spoke.rs"]
mod tls_spoke;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kleym_hub::access::ExecApiVersion;
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialMetrics, ExecOptions, SpokeCredentials,
    build_spoke_client,
};
use support::*;

const V1: &str = "client.authentication.k8s.io/v1";
const TOKEN: &str = "proxy-test-bearer-token-0123456789abcdef";
/// A name only `NO_PROXY` mentions: it does not resolve, so it is reached directly or not at
/// all.
const NO_PROXY_NAME: &str = "direct.spoke.internal";

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

/// What the spoke at `server` answers as its version (`token`: it authenticated us), or the
/// error, with `proxy_url` as the profile's.
async fn spoke_version(
    dir: &std::path::Path,
    pki: &tls_spoke::Pki,
    server: &str,
    proxy_url: Option<String>,
) -> Result<String, String> {
    let s = write_script(dir, "p.sh", &print_token(V1, TOKEN, None));
    let mut access = access_for(&s, ExecApiVersion::V1, server);
    access.cluster.certificate_authority_pem = Some(pki.ca_pem.clone().into_bytes().into());
    access.cluster.tls_server_name = Some(tls_spoke::SERVER_NAME.into());
    access.cluster.proxy_url = proxy_url;
    let creds = Arc::new(SpokeCredentials::new(
        access,
        opts(),
        CredentialMetrics::default(),
    ));
    let client_opts = ClientOptions {
        connect_timeout: Some(Duration::from_secs(10)),
        ..ClientOptions::default()
    };
    let client = build_spoke_client(creds, &client_opts)
        .await
        .map_err(|e| e.to_string())?;
    client
        .client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .map_err(|e| e.to_string())
}

fn tunnels(targets: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    targets.lock().unwrap().clone()
}

#[test]
fn proxies_are_used_for_remote_spokes_only() {
    // One thread: the environment is set below while no other thread runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pki = tls_spoke::Pki::new();
    let (spoke, (proxy, targets)) = rt.block_on(async {
        let spoke = tls_spoke::start(&pki, TOKEN).await;
        (spoke, connect_proxy::start(spoke).await)
    });
    // SAFETY: no other thread exists yet that could read the environment concurrently (the
    // runtime is current-thread and has not started its blocking pool).
    unsafe {
        std::env::set_var("HTTPS_PROXY", format!("http://{proxy}"));
        std::env::set_var("NO_PROXY", NO_PROXY_NAME);
        std::env::remove_var("https_proxy");
        std::env::remove_var("no_proxy");
        std::env::remove_var("KUBERNETES_SERVICE_HOST");
    }
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let remote = format!("https://{}:{}", tls_spoke::SERVER_NAME, spoke.port());
        let loopback = format!("https://{spoke}");
        let profile_proxy = Some(format!("http://{proxy}"));

        // The environment's proxy reaches a remote spoke: the proxy tunnelled it.
        let v = spoke_version(dir.path(), &pki, &remote, None).await;
        assert_eq!(v.as_deref(), Ok("token"));
        assert_eq!(
            tunnels(&targets),
            vec![format!("{}:{}", tls_spoke::SERVER_NAME, spoke.port())]
        );

        // Loopback is reached directly, with the environment's proxy and with a profile's.
        for proxy_url in [None, profile_proxy.clone()] {
            let v = spoke_version(dir.path(), &pki, &loopback, proxy_url.clone()).await;
            assert_eq!(v.as_deref(), Ok("token"), "{proxy_url:?}");
        }
        assert_eq!(tunnels(&targets).len(), 1, "loopback never tunnelled");
        let localhost = format!("https://localhost:{}", spoke.port());
        let v = spoke_version(dir.path(), &pki, &localhost, profile_proxy.clone()).await;
        assert_eq!(v.as_deref(), Ok("token"));
        assert_eq!(tunnels(&targets).len(), 1, "localhost never tunnelled");

        // A server NO_PROXY names is never tunnelled, not even through the profile's proxy
        // (the name resolves nowhere, so the direct attempt fails).
        let named = format!("https://{NO_PROXY_NAME}:{}", spoke.port());
        for proxy_url in [None, profile_proxy.clone()] {
            let v = spoke_version(dir.path(), &pki, &named, proxy_url.clone()).await;
            assert!(v.is_err(), "{proxy_url:?}: {v:?}");
        }
        assert_eq!(tunnels(&targets).len(), 1, "NO_PROXY honoured");

        // The profile's proxy reaches a remote spoke too.
        let v = spoke_version(dir.path(), &pki, &remote, profile_proxy).await;
        assert_eq!(v.as_deref(), Ok("token"));
        assert_eq!(tunnels(&targets).len(), 2);

        // The hub's own client to its cluster on loopback ignores HTTPS_PROXY.
        let hub = hub_sim::start("unused").await;
        let kc = hub_sim::write_kubeconfig(dir.path(), &hub);
        let client = kleym_hub::kubeconfig::client_from_flags(Some(&kc), None)
            .await
            .unwrap();
        client.apiserver_version().await.unwrap();
        assert_eq!(
            tunnels(&targets).len(),
            2,
            "the hub's own cluster never tunnelled"
        );
    });
}
