//! The real `kleym hub` binary with everything wired, against kubesim (hub + 2 spokes): it
//! writes a `ClusterIdentityStatus` per profile and the `FleetIdentityReport`, serves
//! `/v1/report` and `/v1/clusters` to a ServiceAccount token from TokenRequest (right
//! audience, RBAC `get fleetidentityreports`) and refuses others, exposes per-spoke and
//! findings series on `/metrics`, and `/readyz` turns 200 once the inventory synced and
//! leadership is known.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kleym_api::hub_status::{ClusterIdentityStatus, FLEET_REPORT_NAME, FleetIdentityReport};
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, wait_for};
use kleym_e2e::fixtures::hub_process::read_listen_addrs;
use kleym_e2e::fixtures::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, register_admin_token_spoke};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(60);
const AUDIENCE: &str = "kleym-hub";
const SPOKES: [&str; 2] = ["east", "west"];

/// One HTTP/1.1 GET; returns (status code, body).
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// The body of a 200 as JSON (chunked transfer is not used for these small bodies by
/// axum with a known length).
fn json_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

async fn create<K>(api: &Api<K>, obj: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// ServiceAccounts `reader` (may get fleetidentityreports) and `nobody` in the hub namespace.
async fn setup_readers(hub: &kube::Client) {
    let sas: Api<ServiceAccount> = Api::namespaced(hub.clone(), HUB_NS);
    for name in ["reader", "nobody"] {
        create(&sas, json!({"metadata": {"name": name}})).await;
    }
    create(
        &Api::<ClusterRole>::all(hub.clone()),
        json!({
            "metadata": {"name": "kleym-report-reader"},
            "rules": [{"apiGroups": ["kleym.io"], "resources": ["fleetidentityreports"], "verbs": ["get"]}],
        }),
    )
    .await;
    create(
        &Api::<ClusterRoleBinding>::all(hub.clone()),
        json!({
            "metadata": {"name": "kleym-report-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kleym-report-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": HUB_NS}],
        }),
    )
    .await;
}

async fn token(hub: &kube::Client, sa: &str, audience: &str) -> String {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(hub.clone(), HUB_NS)
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleym_hub_binary_writes_status_and_serves_the_authenticated_api() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&SPOKES, dir.path()).await.unwrap();
    let mut providers = Vec::new();
    for (i, name) in SPOKES.iter().enumerate() {
        let s = f.spoke(name);
        let secret = format!("tok-wired-{name}-0123456789abcdef");
        register_admin_token_spoke(&f.hub_client, name, &s, name, &secret, 2, 0..1 + i)
            .await
            .unwrap();
        let plugin = static_token_plugin(dir.path(), &format!("{name}.sh"), &secret, None).unwrap();
        providers.push(json!({"name": name, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}));
    }
    let pf = dir.path().join("providers.json");
    std::fs::write(&pf, json!({ "providers": providers }).to_string()).unwrap();
    setup_readers(&f.hub_client).await;

    // kleym's admission policy bounds the hub's user on the spokes, as on every fleet test's.
    f.install_admission_policies(&["--trust-domain".into(), "wired.example".into()])
        .unwrap();
    // Ports the child chooses, named in its --listen-addrs-file.
    let addrs_file = dir.path().join("listen-addrs.json");
    let mut child = tokio::process::Command::new(&kleym)
        .args(["hub", "--kubeconfig"])
        .arg(f.hub_kubeconfig())
        .arg("--clusterprofile-provider-file")
        .arg(&pf)
        .args(["--trust-domain", "wired.example", "--namespace", HUB_NS])
        .args(["--lease-duration-seconds", "3"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--api-addr", "127.0.0.1:0"])
        .arg("--listen-addrs-file")
        .arg(&addrs_file)
        .args(["--api-insecure-http", "--api-auth-mode", "enforce"])
        .args(["--log-level", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_task = tokio::spawn(async move {
        let mut e = String::new();
        let _ = stderr.read_to_string(&mut e).await;
        e
    });

    let addrs = read_listen_addrs(&addrs_file, LIMIT)
        .await
        .expect("the hub names its listeners");
    let (metrics_addr, api_addr): (SocketAddr, SocketAddr) = (addrs["metrics"], addrs["api"]);
    // Ready once the inventory synced and this replica won the Lease.
    for addr in [metrics_addr, api_addr] {
        wait_for("/readyz 200", LIMIT, || async move {
            get(addr, "/readyz", None).await.filter(|(c, _)| *c == 200)
        })
        .await
        .unwrap();
    }

    // Status objects written by the real hub.
    let statuses: Api<ClusterIdentityStatus> = Api::namespaced(f.hub_client.clone(), PROFILE_NS);
    for (i, name) in SPOKES.iter().enumerate() {
        let statuses = statuses.clone();
        wait_for("ClusterIdentityStatus per profile", LIMIT, || {
            let statuses = statuses.clone();
            async move {
                let st = statuses.get_opt(name).await.ok()??.status?;
                (st.bindings.total == 1 + i as i64).then_some(())
            }
        })
        .await
        .unwrap();
    }
    let reports: Api<FleetIdentityReport> = Api::all(f.hub_client.clone());
    let fleet = wait_for("FleetIdentityReport", LIMIT, || {
        let reports = reports.clone();
        async move {
            let st = reports.get_opt(FLEET_REPORT_NAME).await.ok()??.status?;
            (st.clusters.total == 2 && st.bindings == 3).then_some(st)
        }
    })
    .await
    .unwrap();
    assert_eq!(fleet.clusters.ready, 2, "{fleet:?}");

    // /v1 with a real, audience-scoped ServiceAccount token and RBAC.
    let reader = token(&f.hub_client, "reader", AUDIENCE).await;
    let (code, body) = get(api_addr, "/v1/report", Some(&reader)).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let report = json_body(&body);
    assert_eq!(report["clusters"]["total"], 2, "{report}");
    assert_eq!(report["spokes"].as_array().unwrap().len(), 2, "{report}");
    let (code, body) = get(api_addr, "/v1/clusters", Some(&reader)).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let clusters = json_body(&body);
    assert_eq!(clusters["count"], 2, "{clusters}");
    assert_eq!(
        clusters["items"][0]["cluster"],
        format!("{PROFILE_NS}/east")
    );
    assert_eq!(clusters["items"][1]["phase"], "Engaged", "{clusters}");
    let (code, body) = get(
        api_addr,
        &format!("/v1/clusters/{PROFILE_NS}/west"),
        Some(&reader),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_body(&body)["name"], "west");

    // Refused: no token, wrong audience, no RBAC; /v1 is not on the metrics port.
    let (code, _) = get(api_addr, "/v1/report", None).await.unwrap();
    assert_eq!(code, 401);
    let default_audience = token(&f.hub_client, "reader", "https://kubernetes.default.svc").await;
    let (code, _) = get(api_addr, "/v1/report", Some(&default_audience))
        .await
        .unwrap();
    assert_eq!(code, 401);
    let nobody = token(&f.hub_client, "nobody", AUDIENCE).await;
    let (code, _) = get(api_addr, "/v1/clusters", Some(&nobody)).await.unwrap();
    assert_eq!(code, 403);
    let (code, _) = get(metrics_addr, "/v1/report", Some(&reader))
        .await
        .unwrap();
    assert_eq!(code, 404);

    // Metrics: per-spoke, findings by kind, API requests (one registry on both ports).
    let metrics = wait_for("per-spoke series", LIMIT, || async move {
        get(metrics_addr, "/metrics", None)
            .await
            .map(|(_, m)| m)
            .filter(|m| {
                m.contains("kleym_hub_spoke_phase{cluster=\"fleet/west\",phase=\"Engaged\"} 1")
            })
    })
    .await
    .unwrap();
    for series in [
        "kleym_hub_spoke_last_sync_timestamp_seconds{cluster=\"fleet/east\"}",
        "kleym_hub_spoke_consecutive_failures{cluster=\"fleet/east\"} 0",
        "kleym_hub_spoke_bindings{cluster=\"fleet/west\"} 2",
        "kleym_hub_findings{kind=\"CrossClusterDrift\"}",
        "kleym_hub_spokes{phase=\"Engaged\"} 2",
        "kleym_hub_leader 1",
        "kleym_spoke_reconciles_total{cluster=\"fleet/west\",result=",
        "kleym_hub_api_requests_total{route=\"/v1/report\",code=\"200\"}",
        "kleym_hub_api_authz_total{outcome=\"denied\"}",
    ] {
        assert!(metrics.contains(series), "missing {series}: {metrics}");
    }
    let (code, api_metrics) = get(api_addr, "/metrics", None).await.unwrap();
    assert_eq!(code, 200);
    assert!(api_metrics.contains("kleym_hub_spoke_phase{"));

    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("kleym hub exits after SIGTERM")
        .unwrap();
    let logs = err_task.await.unwrap();
    assert!(exit.success(), "{exit:?}: {logs}");
    for t in [&reader, &nobody, &default_audience] {
        assert!(!logs.contains(t.as_str()), "a token leaked into the logs");
    }
}
