//! `kleym explain --hub-url` against a running in-process hub engaging one kubesim spoke: the
//! hub API answers from the caches of the spoke task that engages it and reads the spoke
//! (with that task's client) only for what no cache holds, its answer is the local
//! command's, and once the hub stopped engaging the spoke it no longer reaches it.
//!
//! What the hub read is taken from the spoke's own request log during each explain call:
//! the reads an explanation could make (pods, nodes, the namespace, ClusterSPIFFEIDs,
//! bindings, objectives, pools), so the spoke reconciler's discovery and the hub's health
//! probes do not count.

use std::sync::Arc;
use std::time::Duration;

use kleym_e2e::fixtures::env::{self, NS};
use kleym_e2e::fixtures::harness::{FleetHarness, grant_admin, wait_for};
use kleym_e2e::fixtures::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, apply_profile, status};
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer};
use kleym_hub::http::{ApiState, HubView, SpokeReach, router, serve};
use kubesim::{ErrorRule, LoggedRequest};
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

/// The reads an explanation could make, among `log`'s requests answered in `[from, to]`,
/// as `METHOD path`, in the order they were answered.
fn explain_reads(
    log: &[LoggedRequest],
    from: tokio::time::Instant,
    to: tokio::time::Instant,
) -> Vec<String> {
    const KINDS: [&str; 8] = [
        "/pods",
        "/nodes",
        "/api/v1/namespaces/",
        "/clusterspiffeids",
        "/inferenceidentitybindings",
        "/inferenceobjectives",
        "/inferencepools",
        "/inferencemodels",
    ];
    log.iter()
        .filter(|r| r.at >= from && r.at <= to && r.method == "GET")
        .filter(|r| KINDS.iter().any(|k| r.path.contains(k)))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
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
    // A foreign identity for the same pods, with DNS names: the hub rebuilds it from its
    // cached view.
    kleym_e2e::single::create_manifest(
        &admin,
        &json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
            "metadata": {"name": "team-default"},
            "spec": {"spiffeIDTemplate": "spiffe://fleet.example/team/{{ .PodMeta.Name }}",
                "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
                "dnsNameTemplates": ["{{ .PodMeta.Name }}.team.example"],
                "workloadSelectorTemplates": ["k8s:ns:llm"]}}),
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
        async move {
            (!matches!(reach, SpokeReach::NotHere(_) | SpokeReach::Unknown)).then_some(())
        }
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
    let log = a.requests();
    let (from, (code, via_hub, err)) = (
        tokio::time::Instant::now(),
        kleym(&["pod", &pod, "--hub-url", &url, "--cluster", &cluster]).await,
    );
    let reads = explain_reads(&log.entries(), from, tokio::time::Instant::now());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(via_hub, local);
    assert!(
        local["clusterSPIFFEIDs"]
            .to_string()
            .contains("vllm-0.team.example"),
        "the foreign object renders its DNS name: {local:#}"
    );
    eprintln!("hub explain pod read from the spoke: {reads:#?}");
    // Everything else came from the caches: no namespace, no list of ClusterSPIFFEIDs or
    // bindings.
    assert_eq!(
        reads,
        [
            format!("GET /api/v1/namespaces/{NS}/pods/vllm-0"),
            "GET /api/v1/nodes/node-a".to_string(),
        ]
    );
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
    let from = tokio::time::Instant::now();
    let (code, via_hub, err) = kleym(&[
        "binding",
        &binding,
        "--hub-url",
        &url,
        "--cluster",
        &cluster,
    ])
    .await;
    let reads = explain_reads(&log.entries(), from, tokio::time::Instant::now());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(via_hub, local);
    eprintln!("hub explain binding read from the spoke: {reads:#?}");
    // The pool's pods (one list by its label) and their node.
    assert_eq!(
        reads,
        [
            format!("GET /api/v1/namespaces/{NS}/pods"),
            "GET /api/v1/nodes/node-a".to_string(),
        ]
    );

    // Drift: an administrator edits kleym's ClusterSPIFFEID, and kleym cannot put it back
    // (its writes fail). The hub's cache keeps only the spec's digest, which is no longer
    // the one kleym compiles: the hub reads that one object and shows it as it is.
    a.faults()
        .add_error_rule(ErrorRule {
            verb: Some("patch".into()),
            resource: Some("clusterspiffeids.spire.spiffe.io".into()),
            rate: 1.0,
            code: 503,
        })
        .unwrap();
    let csids = kube::Api::<kleym_api::external::spiffeid::ClusterSPIFFEID>::all(admin.clone());
    let output = env::csid_name(0);
    let mut edited = csids.get(&output).await.unwrap();
    edited.spec.dns_name_templates = Some(vec!["edited.example".into()]);
    csids
        .replace(&output, &Default::default(), &edited)
        .await
        .unwrap();
    wait_for("the hub's cache holds the edited object", LIMIT, || {
        let reach = view.spoke_reach(PROFILE_NS, "spoke-a");
        let output = output.clone();
        async move {
            let SpokeReach::Cached(c) = reach else {
                return None;
            };
            let ids = kleym_spoke::reconciler::explain_view::cluster_spiffe_ids(&c.context).ok()?;
            ids.to_read.iter().any(|r| r.name == output).then_some(())
        }
    })
    .await
    .unwrap();
    let from = tokio::time::Instant::now();
    let (code, via_hub, err) =
        kleym(&["pod", &pod, "--hub-url", &url, "--cluster", &cluster]).await;
    let reads = explain_reads(&log.entries(), from, tokio::time::Instant::now());
    assert_eq!(code, Some(0), "{err}");
    eprintln!("hub explain pod read from the spoke after drift: {reads:#?}");
    assert_eq!(
        reads,
        [
            format!("GET /api/v1/namespaces/{NS}/pods/vllm-0"),
            "GET /api/v1/nodes/node-a".to_string(),
            format!("GET /apis/spire.spiffe.io/v1alpha1/clusterspiffeids/{output}"),
        ]
    );
    let kleyms = via_hub["clusterSPIFFEIDs"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == output.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("{via_hub:#}"));
    assert_eq!(
        kleyms["entry"]["dnsNames"],
        json!(["edited.example"]),
        "the hub shows the edited spec: {kleyms:#}"
    );
    let (code, local, err) =
        kleym(&["pod", &pod, "--kubeconfig", kubeconfig.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(via_hub, local);
    a.faults().clear_error_rules();

    // Stopped, the hub no longer engages the spoke: the API does not reach it.
    hub.stop().await.unwrap();
    assert!(matches!(
        view.spoke_reach(PROFILE_NS, "spoke-a"),
        SpokeReach::NotHere(_)
    ));
    let (code, _, err) = kleym(&["pod", &pod, "--hub-url", &url, "--cluster", &cluster]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("503 Service Unavailable") && err.contains("not engaged"),
        "{err}"
    );
    let _ = stop_api.send(());
}
