//! Two wired hubs in process (status loop and hub API on each) sharing one Lease: the
//! follower is ready (leadership known), authenticates `/v1/*` callers like the leader and,
//! with nothing published yet, answers 503 `NotPublished`; it writes no status while
//! following (its status loop runs, ticking: neither the `FleetIdentityReport` nor any
//! `ClusterIdentityStatus`); once the leader stops, the follower takes over, serves
//! `/v1/report` to an authorized token and writes the `FleetIdentityReport` and the spoke's
//! `ClusterIdentityStatus`. Behind one address (a round-robin proxy, as a Service spreads
//! calls over its endpoints), both replicas answer every call with the same content.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kleym_api::hub_status::{ClusterIdentityStatus, FLEET_REPORT_NAME, FleetIdentityReport};
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kleym_hub::fleet::Phase;
use kleym_hub::http::HubView;
use kleym_hub::runtime::{HubHandle, HubStartOptions, api_router, start_hub_with};
use kleym_hub::status::StatusLoopOptions;
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "tok-wired-leader-0123456789";
const LIMIT: Duration = Duration::from_secs(60);

/// One HTTP/1.1 GET; returns the raw response.
async fn get(addr: SocketAddr, path: &str, token: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn create<K>(api: &Api<K>, obj: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A `kleym-hub`-audience token of `reader`, who may get fleetidentityreports.
async fn reader_token(hub: &kube::Client) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(hub.clone(), HUB_NS);
    create(&sas, json!({"metadata": {"name": "reader"}})).await;
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
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["kleym-hub".into()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create_token_request("reader", &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

struct Replica {
    handle: HubHandle,
    addr: SocketAddr,
    shutdown: CancellationToken,
}

async fn start_replica(f: &FleetHarness, pf: &std::path::Path, with_status: bool) -> Replica {
    let flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--namespace",
        HUB_NS,
        "--lease-duration-seconds",
        "2",
        "--api-insecure-http",
        "--api-auth-mode",
        "enforce",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args = parse_hub_args(&flags).unwrap();
    f.install_admission_policies(&flags).unwrap();
    let client = f.hub.kube_client().await.unwrap();
    let shutdown = CancellationToken::new();
    let status = StatusLoopOptions {
        min_rebuild: Duration::from_millis(100),
        tick: Duration::from_millis(500),
        ..StatusLoopOptions::default()
    };
    let handle = start_hub_with(
        &args,
        client.clone(),
        HubStartOptions {
            status: with_status.then_some(status),
            coordination: None,
        },
        shutdown.clone(),
    )
    .unwrap();
    let app = api_router(&handle, &args.api, client);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = shutdown.clone();
    tokio::spawn(kleym_hub::http::serve(listener, app, None, async move {
        stop.cancelled().await
    }));
    Replica {
        handle,
        addr,
        shutdown,
    }
}

async fn fleet_report(hub: &kube::Client) -> Option<FleetIdentityReport> {
    Api::<FleetIdentityReport>::all(hub.clone())
        .get_opt(FLEET_REPORT_NAME)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_names_the_leader_writes_nothing_and_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, 1, 0..1)
        .await
        .unwrap();
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    let token = reader_token(&f.hub_client).await;

    // Replica a runs no status loop, so any status object can only come from b.
    let a = start_replica(&f, &pf, false).await;
    let a_view = a.handle.view.clone();
    let leader = wait_for("replica a leads and reads its own Lease", LIMIT, || {
        let v = a_view.clone();
        async move {
            let l = v.leader();
            if l.is_leader { l.leader_identity } else { None }
        }
    })
    .await
    .unwrap();
    let b = start_replica(&f, &pf, true).await;
    let b_view = b.handle.view.clone();
    let want = leader.clone();
    wait_for("replica b knows the leader and is ready", LIMIT, || {
        let v = b_view.clone();
        let want = want.clone();
        async move {
            (v.ready().is_ready() && v.leader().leader_identity == Some(want)).then_some(())
        }
    })
    .await
    .unwrap();
    // a has engaged the spoke (b's state would show it as Standby only); b's status loop
    // must then pass a few times as a follower (its pass counter proves it had the chance)
    // and write nothing.
    wait_for("the spoke engaged by a", LIMIT, || {
        let st = a.handle.state.clone();
        async move { (st.get("fleet/spoke")?.phase == Phase::Engaged).then_some(()) }
    })
    .await
    .unwrap();
    let b_status = b.handle.status_metrics.clone();
    let passes_then = b_status.passes(false);
    wait_for("three follower passes of b's status loop", LIMIT, || {
        let b_status = b_status.clone();
        async move { (b_status.passes(false) >= passes_then + 3).then_some(()) }
    })
    .await
    .unwrap();
    assert_eq!(b_status.passes(true), 0, "b never led");
    assert!(
        fleet_report(&f.hub_client).await.is_none(),
        "a follower wrote the FleetIdentityReport"
    );
    let statuses = Api::<ClusterIdentityStatus>::all(f.hub_client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        statuses.items.is_empty(),
        "a follower wrote ClusterIdentityStatus {:?}",
        statuses
            .items
            .iter()
            .map(|o| o.metadata.name.clone())
            .collect::<Vec<_>>()
    );

    // Nothing is published (a writes no status): the follower says so, but only to a
    // caller that passed authentication.
    let follower = get(b.addr, "/v1/report", &token).await;
    assert!(follower.starts_with("HTTP/1.1 503"), "{follower}");
    assert!(follower.contains("NotPublished"), "{follower}");
    let anonymous = get(b.addr, "/v1/report", "not-a-token").await;
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(!b.handle.view.leader().is_leader);
    let led = get(a.addr, "/v1/report", &token).await;
    assert!(led.starts_with("HTTP/1.1 200"), "{led}");

    // a stops (releasing the Lease); b takes over, serves /v1 and writes the report again.
    a.shutdown.cancel();
    tokio::time::timeout(LIMIT, a.handle.task)
        .await
        .unwrap()
        .unwrap();
    wait_for("b leads", LIMIT, || {
        let v = b.handle.view.clone();
        async move { v.leader().is_leader.then_some(()) }
    })
    .await
    .unwrap();
    let report = wait_for("b rewrites the FleetIdentityReport", LIMIT, || {
        let c = f.hub_client.clone();
        async move { fleet_report(&c).await?.status }
    })
    .await
    .unwrap();
    assert_eq!(report.clusters.total, 1, "{report:?}");
    wait_for("b writes the spoke's ClusterIdentityStatus", LIMIT, || {
        let c = f.hub_client.clone();
        async move {
            Api::<ClusterIdentityStatus>::namespaced(c, "fleet")
                .get_opt("spoke")
                .await
                .ok()??
                .status
        }
    })
    .await
    .unwrap();
    let served = get(b.addr, "/v1/report", &token).await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    b.shutdown.cancel();
    tokio::time::timeout(LIMIT, b.handle.task)
        .await
        .unwrap()
        .unwrap();
}

/// A round-robin TCP proxy on 127.0.0.1 over `backends`, as a Service spreads connections
/// over its endpoints; returns its address and the connections each backend got.
async fn round_robin(
    backends: Vec<SocketAddr>,
) -> (
    SocketAddr,
    std::sync::Arc<Vec<std::sync::atomic::AtomicUsize>>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = std::sync::Arc::new(
        (0..backends.len())
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let seen = counts.clone();
    tokio::spawn(async move {
        let next = AtomicUsize::new(0);
        while let Ok((mut inbound, _)) = listener.accept().await {
            let i = next.fetch_add(1, Ordering::Relaxed) % backends.len();
            seen[i].fetch_add(1, Ordering::Relaxed);
            let backend = backends[i];
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, counts)
}

/// The body of a raw HTTP/1.1 response, parsed as JSON.
fn body_json(resp: &str) -> Value {
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

/// What `/v1/report` says about the fleet, without the times at which it was built (the
/// leader builds at request time, the published object at its last status pass).
fn report_content(report: &Value) -> Value {
    let spokes: Vec<Value> = report["spokes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let conditions: Vec<Value> = s["status"]["conditions"]
                        .as_array()
                        .map(|c| {
                            c.iter()
                                .map(|c| json!([c["type"], c["status"], c["reason"]]))
                                .collect()
                        })
                        .unwrap_or_default();
                    json!({"cluster": s["cluster"], "bindings": s["status"]["bindings"],
                           "conditions": conditions,
                           "nonReadyBindings": s["status"]["nonReadyBindings"]})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "clusters": report["clusters"], "bindings": report["bindings"],
        "findingCounts": report["findingCounts"], "findings": report["findings"],
        "spokes": spokes,
    })
}

/// Two replicas (one leads, one follows, both with the status loop and the API) behind one
/// address: 100 calls of `/v1/report` and 100 of `/v1/clusters`, alternating between the
/// replicas, all succeed, and every report says the same about the fleet as the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_answers_v1_behind_one_address() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, 3, 0..3)
        .await
        .unwrap();
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    let token = reader_token(&f.hub_client).await;
    let a = start_replica(&f, &pf, true).await;
    let a_view = a.handle.view.clone();
    wait_for("replica a leads", LIMIT, || {
        let v = a_view.clone();
        async move { v.leader().is_leader.then_some(()) }
    })
    .await
    .unwrap();
    let b = start_replica(&f, &pf, true).await;
    // Converged: the leader's own report has the spoke ready with its three bindings, and
    // the follower's (from the published objects) says the same.
    let (a_addr, b_addr, tok) = (a.addr, b.addr, token.clone());
    let want = wait_for("both replicas report the converged fleet", LIMIT, || {
        let tok = tok.clone();
        async move {
            let led = get(a_addr, "/v1/report", &tok).await;
            let followed = get(b_addr, "/v1/report", &tok).await;
            if !(led.starts_with("HTTP/1.1 200") && followed.starts_with("HTTP/1.1 200")) {
                return None;
            }
            let (led, followed) = (body_json(&led), body_json(&followed));
            let content = report_content(&led);
            (led["clusters"]["ready"] == 1
                && led["bindings"] == 3
                && report_content(&followed) == content)
                .then_some(content)
        }
    })
    .await
    .unwrap();
    assert!(!b.handle.view.leader().is_leader, "b follows");

    let (proxy, counts) = round_robin(vec![a.addr, b.addr]).await;
    let requests = f.hub.requests();
    requests.clear();
    let mut failures = Vec::new();
    for i in 0..100 {
        let r = get(proxy, "/v1/report", &token).await;
        if !r.starts_with("HTTP/1.1 200") {
            failures.push(format!(
                "call {i}: {}",
                r.lines().next().unwrap_or_default()
            ));
            continue;
        }
        assert_eq!(report_content(&body_json(&r)), want, "call {i}");
        let c = get(proxy, "/v1/clusters", &token).await;
        if !c.starts_with("HTTP/1.1 200") {
            failures.push(format!(
                "clusters call {i}: {}",
                c.lines().next().unwrap_or_default()
            ));
            continue;
        }
        let c = body_json(&c);
        assert_eq!(c["count"], 1, "{c}");
        assert_eq!(c["items"][0]["cluster"], "fleet/spoke", "{c}");
    }
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "calls failed behind one address"
    );
    let served: Vec<usize> = counts
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert_eq!(served, vec![100, 100], "each replica got half of the calls");
    // The follower answered its 100 calls from its watch caches: reads of the status
    // objects in the hub cluster during the calls (the leader's status loop included)
    // stay far below one per call.
    let reads = requests
        .with_method("GET")
        .iter()
        .filter(|r| {
            r.path.contains("/fleetidentityreports") || r.path.contains("/clusteridentitystatuses")
        })
        .count();
    assert!(
        reads < 50,
        "{reads} reads of the status objects for 100 follower calls"
    );
    for r in [a, b] {
        r.shutdown.cancel();
        tokio::time::timeout(LIMIT, r.handle.task)
            .await
            .unwrap()
            .unwrap();
    }
}
