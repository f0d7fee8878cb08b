//! `kleym explain --hub-url` against a running in-process hub engaging one kubesim spoke: the
//! hub API reads the spoke with the client of the spoke task that engages it, its answer is
//! the local command's, and once the hub stopped engaging the spoke it no longer reaches it.

use std::sync::Arc;
use std::time::Duration;

use kleym_e2e::fixtures::env::{self, NS};
use kleym_e2e::fixtures::harness::{FleetHarness, grant_admin, wait_for};
use kleym_e2e::fixtures::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, apply_profile, status};
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer};
use kleym_hub::http::{ApiState, HubView, SpokeReach, router, serve};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const TD: &str = "fleet.example";

fn user(name: &str) -> kubesim_auth::UserInfo {
    kubesim_auth::UserInfo {
        username: name.into(),
        ..Default::default()
    }
}

/// `kleym explain <args> -o json`; (exit code, stdout as JSON, stderr).
async fn kleym(args: &[&str]) -> (Option<i32>, Value, String) {
    let out = tokio::process::Command::new(kleym_binary().expect("kleym binary"))
        .arg("explain")
        .args(args)
        .args([
            "-o",
            "json",
            "--trust-domain",
            TD,
            "--cluster-name",
            "spoke-a",
        ])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_hub_explains_the_spokes_it_engages() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a"], dir.path()).await.unwrap();
    let a = f.spoke("spoke-a");
    a.add_static_token("tok-a-0123456789", user("hub-a"));
    grant_admin(&a, "hub-a").unwrap();
    let script = static_token_plugin(dir.path(), "plugin.sh", "tok-a-0123456789", None).unwrap();
    env::seed_environment(&a.store(), 1).unwrap();
    env::create_bindings(&a.store(), 0..1).unwrap();
    let admin = a.kube_client().await.unwrap();
    kleym_e2e::single::create_manifest(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    )
    .await;
    kleym_e2e::single::create_manifest(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vllm-0", "namespace": NS, "labels": {"app": "vllm-qwen"}},
            "spec": {"serviceAccountName": env::SA, "nodeName": "node-a",
                "containers": [{"name": "c-0", "image": "vllm:1"}]}}),
    )
    .await;
    let pf = dir.path().join("providers.json");
    let providers = json!({"providers": [{"name": "script", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": script,
        "interactiveMode": "Never"}}]});
    std::fs::write(&pf, providers.to_string()).unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-a",
        status(
            vec![access_provider("script", &a, None)],
            true,
            "2026-01-01T00:00:00Z",
            &[],
        ),
    )
    .await
    .unwrap();
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            TD.into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    let view = hub.handle.view.clone();
    wait_for("spoke-a engaged and reachable", LIMIT, || {
        let reach = view.spoke_reach(PROFILE_NS, "spoke-a");
        async move { matches!(reach, SpokeReach::Client(_)).then_some(()) }
    })
    .await
    .unwrap();
    let store = a.store();
    wait_for("binding 0 compiled", LIMIT, || {
        let store = store.clone();
        async move {
            env::csid_names(&store)
                .contains(&env::csid_name(0))
                .then_some(())
        }
    })
    .await
    .unwrap();

    // The hub's own API over its fleet view (authentication is the subject of
    // explain_binding.rs; here it is off).
    let metrics = hub.handle.api_metrics.clone();
    let auth = ApiAuth::new(
        AuthConfig::new(AuthMode::Off, "kleym-hub"),
        Arc::new(KubeReviewer::new(f.hub_client.clone())),
        metrics.clone(),
    );
    let app = router(ApiState {
        view: view.clone(),
        registry: hub.handle.registry.clone(),
        auth,
        metrics,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_api, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, app, None, async {
        let _ = stopped.await;
    }));

    let kubeconfig = dir.path().join("spoke-a.kubeconfig");
    std::fs::write(&kubeconfig, a.kubeconfig_yaml()).unwrap();
    let pod = format!("{NS}/vllm-0");
    let cluster = format!("{PROFILE_NS}/spoke-a");
    let (code, local, err) =
        kleym(&["pod", &pod, "--kubeconfig", kubeconfig.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    // The binding's identity reaches the pod's container c-0.
    assert_eq!(local["bindings"][0]["selectsPod"], true, "{local:#}");
    let (code, via_hub, err) =
        kleym(&["pod", &pod, "--hub-url", &url, "--cluster", &cluster]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(via_hub, local);
    let binding = format!("{NS}/{}", env::binding_name(0));
    let (code, local, err) = kleym(&[
        "binding",
        &binding,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(local["selected"]["count"], 1, "{local:#}");
    let (code, via_hub, err) = kleym(&[
        "binding",
        &binding,
        "--hub-url",
        &url,
        "--cluster",
        &cluster,
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(via_hub, local);

    // Stopped, the hub no longer engages the spoke: the API does not reach it.
    hub.stop().await.unwrap();
    assert!(!matches!(
        view.spoke_reach(PROFILE_NS, "spoke-a"),
        SpokeReach::Client(_)
    ));
    let (code, _, err) = kleym(&["pod", &pod, "--hub-url", &url, "--cluster", &cluster]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("503 Service Unavailable") && err.contains("not engaged"),
        "{err}"
    );
    let _ = stop_api.send(());
}
