//! Sharded mode (`--shard-mode sharded`): three in-process hub replicas share six spokes.
//! Every spoke is engaged by exactly one replica; a replica that stops hands its spokes
//! over; a replica that loses the hub cluster (its hub credential revoked) stops its
//! spokes before another takes them. Throughout, no spoke ever sees requests of two
//! replicas overlap: each spoke authenticates every replica as a user of its own
//! (a recording authenticator per replica), and per spoke every request of one replica
//! was let through before the next replica's first one arrived. While the first replica
//! hands spokes over, its requests are held a while at each spoke (discovery polls every
//! second keep some in flight): a successor that started before they were dropped would
//! see them let through after its own.
//!
//! The fleet report in sharded mode, built by the leader from every replica's published
//! observations, equals what one leader-mode replica reports for the same fleet, also as
//! clients read it: `/v1/report` and `/v1/clusters` over HTTPS from each sharded replica
//! equal the single replica's (timestamps and the fields that say which write left out).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kleym_api::hub_status::{
    ClusterIdentityObservation, ClusterIdentityStatus, FLEET_REPORT_NAME, FindingKind,
    FindingMember, FleetIdentityReport, FleetIdentityReportStatus,
};
use kleym_e2e::fixtures::env::{self, NS, SA};
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, grant_admin, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::{PROFILE_NS, register_admin_token_spoke};
use kleym_e2e::fixtures::recording::RecordingAuthenticator;
use kleym_hub::fleet::{FleetState, Phase};
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer};
use kleym_hub::http::{ApiState, HubView, load_tls_config, router, serve};
use kleym_hub::runtime::{Coordination, HubHandle, HubStartOptions, start_hub_with};
use kleym_hub::status::{StatusLoopOptions, WriterOptions};
use kleym_spoke::reconciler::CancellationToken;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const SPOKES: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
const REPLICAS: [&str; 3] = ["a", "b", "c"];

struct Replica {
    handle: HubHandle,
    shutdown: CancellationToken,
    hub_token: String,
}

impl Replica {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(LIMIT, self.handle.task)
            .await
            .expect("replica stopped in time")
            .expect("replica task");
    }
}

/// A sharded replica with hub credentials of its own (so they can be revoked on their
/// own) and a plugin handing every spoke the token of its own recorder.
/// With `hub_recorder`, its token is the replica's hub credential (so its hub requests can
/// be held).
async fn start_replica(
    f: &FleetHarness,
    name: &str,
    spoke_token: &str,
    weight: u32,
    hub_recorder: Option<&RecordingAuthenticator>,
) -> Replica {
    start_replica_with(f, name, spoke_token, Some(weight), hub_recorder, None).await
}

/// A replica in sharded mode with this weight (`None`: the default leader mode), running
/// the status loop with `status` (`None`: no status loop).
async fn start_replica_with(
    f: &FleetHarness,
    name: &str,
    spoke_token: &str,
    weight: Option<u32>,
    hub_recorder: Option<&RecordingAuthenticator>,
    status: Option<StatusLoopOptions>,
) -> Replica {
    let user = format!("replica-{name}");
    let hub_token = match hub_recorder {
        Some(r) => r.token().to_string(),
        None => {
            let t = format!("tok-hub-{user}-0123456789");
            f.hub.add_static_token(
                &t,
                kubesim_auth::UserInfo {
                    username: user.clone(),
                    ..Default::default()
                },
            );
            t
        }
    };
    grant_admin(&f.hub, &user).unwrap();
    let plugin = static_token_plugin(&f.dir, &format!("{name}.sh"), spoke_token, None).unwrap();
    let pf = f.dir.join(format!("{name}.json"));
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    let mut flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--namespace",
        HUB_NS,
        // Renew deadline 2 s, retry period 0.4 s.
        "--lease-duration-seconds",
        "3",
        "--instance",
        &user,
        "--discovery-interval-seconds",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(weight) = weight {
        flags.extend([
            "--shard-mode".into(),
            "sharded".into(),
            "--shard-weight".into(),
            weight.to_string(),
        ]);
    }
    let args = parse_hub_args(&flags).unwrap();
    let client = f.hub.client_for_token(&hub_token).await.unwrap();
    // Sharded replicas renew their Leases on a thread of their own, as `kleym hub` does.
    let coordination = match weight {
        Some(_) => {
            let (hub, token) = (f.hub.clone(), hub_token.clone());
            Some(
                Coordination::start(move || async move {
                    hub.client_for_token(&token)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))
                })
                .await
                .unwrap(),
            )
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    let handle = start_hub_with(
        &args,
        client,
        HubStartOptions {
            status,
            coordination,
        },
        shutdown.clone(),
    )
    .unwrap();
    Replica {
        handle,
        shutdown,
        hub_token,
    }
}

/// Which replicas (by index) run each spoke now (any phase but `Standby`).
fn engaged_by(states: &[Option<FleetState>]) -> BTreeMap<String, Vec<usize>> {
    let mut out = BTreeMap::new();
    for s in SPOKES {
        let name = format!("fleet/{s}");
        let by: Vec<usize> = states
            .iter()
            .enumerate()
            .filter(|(_, st)| {
                st.as_ref()
                    .and_then(|st| st.get(&name))
                    .is_some_and(|x| x.phase != Phase::Standby)
            })
            .map(|(i, _)| i)
            .collect();
        out.insert(name, by);
    }
    out
}

/// Waits until every spoke is `Engaged` by exactly one of the replicas in `states`
/// (`None`: stopped), and returns the owner of each.
async fn one_owner_each(states: &[Option<FleetState>], what: &str) -> BTreeMap<String, usize> {
    let states = states.to_vec();
    wait_for(what, LIMIT, || {
        let states = states.clone();
        async move {
            let mut owners = BTreeMap::new();
            for (spoke, by) in engaged_by(&states) {
                let [i] = by.as_slice() else { return None };
                let engaged = states[*i]
                    .as_ref()
                    .and_then(|st| st.get(&spoke))
                    .is_some_and(|x| x.phase == Phase::Engaged);
                if !engaged {
                    return None;
                }
                owners.insert(spoke, *i);
            }
            Some(owners)
        }
    })
    .await
    .unwrap()
}

/// Per spoke, the replicas' requests never overlap. In the order the requests arrived, a
/// spoke's requests form runs of one replica each (a spoke may come back to a replica:
/// one that left, and was the owner before it came, hands it back). At every change of
/// runs, no request of the previous replica is let through after the next one's first
/// request arrived (until the previous replica's own next run); and there are no more runs
/// than engagements of the spoke, counted over every replica: two replicas working a spoke
/// at once interleave their requests (discovery polls every second), making more runs
/// than takes.
fn assert_no_overlap(recorders: &[Vec<Arc<RecordingAuthenticator>>], states: &[FleetState]) {
    type Time = chrono::DateTime<chrono::Utc>;
    for (s, per_replica) in SPOKES.iter().zip(recorders) {
        let engagements: u64 = states
            .iter()
            .filter_map(|st| st.get(&format!("fleet/{s}")))
            .map(|x| x.engagements)
            .sum();
        let mut arrivals: Vec<(Time, usize)> = per_replica
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.arrivals().into_iter().map(move |t| (t, i)))
            .collect();
        arrivals.sort();
        let mut runs: Vec<(usize, Time)> = Vec::new();
        for (t, i) in &arrivals {
            if runs.last().is_none_or(|(r, _)| r != i) {
                runs.push((*i, *t));
            }
        }
        for w in runs.windows(2) {
            let ((prev, _), (next, started)) = (w[0], w[1]);
            let back = arrivals
                .iter()
                .find(|(t, i)| *i == prev && *t > started)
                .map(|(t, _)| *t);
            let late: Vec<Time> = per_replica[prev]
                .passed_after(started)
                .into_iter()
                .filter(|t| back.is_none_or(|b| *t < b))
                .collect();
            assert!(
                late.is_empty(),
                "spoke {s}: requests of replica {} let through at {late:?}, after replica {} started at {started}",
                REPLICAS[prev],
                REPLICAS[next]
            );
        }
        let names: Vec<&str> = runs.iter().map(|(i, _)| REPLICAS[*i]).collect();
        assert!(
            runs.len() as u64 <= engagements,
            "spoke {s}: the replicas' requests interleave: runs {names:?}, {engagements} engagements"
        );
        println!("spoke {s}: runs {names:?}, {engagements} engagements");
    }
}

/// Waits until `n` replica Leases exist and all announce one view.
async fn settled(f: &FleetHarness, n: usize, what: &str) {
    let leases: Api<Lease> = Api::namespaced(f.hub_client.clone(), HUB_NS);
    wait_for(what, LIMIT, || {
        let leases = leases.clone();
        async move {
            let list = leases
                .list(&ListParams::default().labels("kleym.io/hub-replica=true"))
                .await
                .ok()?;
            let views: std::collections::BTreeSet<Option<String>> = list
                .items
                .iter()
                .map(|l| {
                    l.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("kleym.io/shard-view").cloned())
                })
                .collect();
            (list.items.len() == n && views.len() == 1 && !views.contains(&None)).then_some(())
        }
    })
    .await
    .unwrap();
}

async fn all_converged(f: &FleetHarness, n: usize, what: &str) {
    for s in SPOKES {
        let store = f.spoke(s).store();
        wait_for(&format!("{what}: {s}"), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, n).then_some(()) }
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_engage_each_spoke_once_and_hand_over_without_overlap() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&SPOKES, dir.path()).await.unwrap();
    // recorders[spoke][replica]: one recorder per replica on every spoke (a recorder's
    // token depends only on its name, so one plugin serves a replica for every spoke).
    let mut recorders = Vec::new();
    for s in SPOKES {
        let spoke = f.spoke(s);
        register_admin_token_spoke(
            &f.hub_client,
            s,
            &spoke,
            "ok",
            "tok-unused-0123456789",
            3,
            0..1,
        )
        .await
        .unwrap();
        recorders.push(
            REPLICAS
                .iter()
                .map(|r| RecordingAuthenticator::install(&spoke, &format!("replica-{r}")))
                .collect::<Vec<_>>(),
        );
    }
    let tokens: Vec<String> = recorders[0].iter().map(|r| r.token().to_string()).collect();
    let states = |replicas: &[Option<Replica>]| -> Vec<Option<FleetState>> {
        replicas
            .iter()
            .map(|r| r.as_ref().map(|r| r.handle.state.clone()))
            .collect()
    };

    // a alone engages every spoke. Its weight is half the others': once they join, it
    // keeps all six with a probability of 1/5^6, so spokes change hands.
    let a_hub = RecordingAuthenticator::install(&f.hub, "replica-a-hub");
    let mut replicas = vec![Some(
        start_replica(&f, REPLICAS[0], &tokens[0], 5, Some(&a_hub)).await,
    )];
    let alone = one_owner_each(&states(&replicas), "a engages every spoke").await;
    assert!(alone.values().all(|i| *i == 0));
    all_converged(&f, 1, "binding 0").await;
    // From now on a's requests are held at every spoke, so some are in flight whenever
    // it hands a spoke over, and its requests to the hub cluster are slowed down, so it
    // sees new views late (its rounds stay within its renew deadline): a replica that took
    // a spoke before a announced letting it go would overlap a for a while.
    for per in &recorders {
        per[0].set_delay(Duration::from_millis(1500));
    }
    a_hub.set_delay(Duration::from_millis(250));
    for (i, r) in REPLICAS.iter().enumerate().skip(1) {
        replicas.push(Some(start_replica(&f, r, &tokens[i], 10, None).await));
    }
    // Kept after a replica stops, for the engagement counts.
    let all_states: Vec<FleetState> = states(&replicas).into_iter().flatten().collect();

    // Each spoke engaged by exactly one replica.
    settled(&f, 3, "three replicas announce one view").await;
    let owners = one_owner_each(&states(&replicas), "every spoke engaged once").await;
    for per in &recorders {
        per[0].set_delay(Duration::ZERO);
    }
    a_hub.set_delay(Duration::ZERO);
    assert!(
        owners.values().any(|i| *i != 0),
        "no spoke changed hands: {owners:?}"
    );
    let leases: Api<Lease> = Api::namespaced(f.hub_client.clone(), HUB_NS);
    let replica_leases = leases
        .list(&ListParams::default().labels("kleym.io/hub-replica=true"))
        .await
        .unwrap();
    assert_eq!(replica_leases.items.len(), 3, "one Lease per replica");
    println!("owners with three replicas: {owners:?}");

    // c stops (deleting its Lease): its spokes move, the others' stay where they were.
    let c = replicas[2].take().unwrap();
    c.stop().await;
    settled(&f, 2, "two replicas announce one view").await;
    let after_c = one_owner_each(&states(&replicas), "c's spokes handed over").await;
    for (spoke, owner) in &owners {
        if *owner != 2 {
            assert_eq!(
                after_c[spoke], *owner,
                "{spoke} moved though its owner stayed"
            );
        }
    }
    for s in SPOKES {
        env::create_bindings(&f.spoke(s).store(), 1..2).unwrap();
    }
    all_converged(&f, 2, "binding 1 after c left").await;

    // a loses the hub cluster: it stops its spokes by its renew deadline, b takes them
    // once a's Lease expired.
    let a_token = replicas[0].as_ref().unwrap().hub_token.clone();
    f.hub.faults().revoke_token(&a_token);
    let a_state = replicas[0].as_ref().unwrap().handle.state.clone();
    let b_only = vec![
        None,
        Some(replicas[1].as_ref().unwrap().handle.state.clone()),
    ];
    let after_a = one_owner_each(&b_only, "a's spokes taken by b").await;
    assert!(after_a.values().all(|i| *i == 1));
    for s in SPOKES {
        let phase = a_state.get(&format!("fleet/{s}")).map(|x| x.phase);
        assert!(
            phase.is_none_or(|p| p == Phase::Standby),
            "a still runs {s}: {phase:?}"
        );
        env::create_bindings(&f.spoke(s).store(), 2..3).unwrap();
    }
    all_converged(&f, 3, "binding 2 after a lost the hub").await;

    assert_no_overlap(&recorders, &all_states);
    for r in replicas.into_iter().flatten() {
        r.stop().await;
    }
}

/// Serves `handle`'s hub API (its fleet view, as `kleym hub` serves it) over HTTPS on a
/// port of its own with a serving certificate of `pki` (authentication off: the subject of
/// hub_api_auth.rs); returns the address.
async fn serve_api_https(
    f: &FleetHarness,
    handle: &HubHandle,
    pki: &kubesim_auth::pki::ClusterPki,
    name: &str,
) -> std::net::SocketAddr {
    let (cert, key) = (
        f.dir.join(format!("{name}-api.crt")),
        f.dir.join(format!("{name}-api.key")),
    );
    std::fs::write(&cert, pki.serving_cert_pem()).unwrap();
    std::fs::write(&key, pki.serving_key_pem()).unwrap();
    let tls = load_tls_config(&cert, &key).unwrap();
    let metrics = handle.api_metrics.clone();
    let auth = ApiAuth::new(
        AuthConfig::new(AuthMode::Off, "kleym-hub"),
        Arc::new(KubeReviewer::new(f.hub_client.clone())),
        metrics.clone(),
    );
    let app = router(ApiState {
        view: handle.view.clone(),
        registry: handle.registry.clone(),
        auth,
        metrics,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, app, Some(tls), std::future::pending()));
    addr
}

/// GET `path` over HTTPS (HTTP/1.1), trusting only `ca_pem`; the body of a 200 as JSON.
async fn get_https(addr: std::net::SocketAddr, ca_pem: &str, path: &str) -> Result<Value, String> {
    use http_body_util::BodyExt;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://{addr}{path}"))
        .header("host", "127.0.0.1")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != 200 {
        return Err(format!(
            "{path}: {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// `/v1/report` and `/v1/clusters` of the API at `addr`, timestamps left out.
async fn api_over_https(addr: std::net::SocketAddr, ca: &str) -> Result<(Value, Value), String> {
    Ok((
        timeless(get_https(addr, ca, "/v1/report").await?),
        timeless(get_https(addr, ca, "/v1/clusters").await?),
    ))
}

const FLEET_TOKEN: &str = "tok-fleet-hub-0123456789";
const TD: &str = "fleet.example";
/// How long the single replica may take to say what the sharded ones said.
const SAME_LIMIT: Duration = Duration::from_secs(20);
/// Fields that say when or which write, not what: left out when comparing reports.
const UNCOMPARED: [&str; 4] = [
    "generatedAt",
    "resourceVersion",
    "generation",
    "observedGeneration",
];

/// A status loop that writes promptly, as the fleet report tests run it.
fn prompt_status() -> StatusLoopOptions {
    StatusLoopOptions {
        writer: WriterOptions {
            min_interval: Duration::from_millis(200),
            sync_refresh: Duration::from_secs(300),
        },
        min_rebuild: Duration::from_millis(100),
        tick: Duration::from_millis(500),
        ..StatusLoopOptions::default()
    }
}

/// A PerObjective binding in the spoke's namespace, confined to `container`.
fn plant(
    spoke: &str,
    f: &FleetHarness,
    name: &str,
    objective: &str,
    container: &str,
    id: Option<&str>,
) {
    let mut spec = json!({
        "targetRef": {"name": objective},
        "mode": "PerObjective",
        "containerDiscriminator": {"type": "ContainerName", "value": container},
        "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{SA}")]
    });
    if let Some(t) = id {
        spec["spiffeIDTemplate"] = json!(t);
    }
    let store = f.spoke(spoke).store();
    let res = store
        .resolve("kleym.io", "v1alpha1", "inferenceidentitybindings")
        .expect("served");
    store
        .create(
            &res,
            Some(NS),
            json!({"apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
                   "metadata": {"name": name, "namespace": NS}, "spec": spec}),
            &kubesim_store::WriteOptions::default(),
        )
        .expect("binding created");
}

fn member(spoke: &str, binding: &str) -> FindingMember {
    FindingMember {
        cluster: format!("{PROFILE_NS}/{spoke}"),
        namespace: NS.into(),
        binding: binding.into(),
    }
}

/// `v` without the fields that say when or which write ([`UNCOMPARED`], and every
/// timestamp string), so two runs over one fleet compare equal exactly when they say the
/// same.
fn timeless(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !UNCOMPARED.contains(&k.as_str()))
                .map(|(k, v)| (k, timeless(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(timeless).collect()),
        Value::String(s) if chrono::DateTime::parse_from_rfc3339(&s).is_ok() => json!("<time>"),
        v => v,
    }
}

/// What the hub cluster shows of the fleet, once every spoke is synced: the
/// `FleetIdentityReport`'s status and each spoke's `ClusterIdentityStatus` status, by name,
/// timestamps left out.
#[derive(Debug, Clone, PartialEq)]
struct Published {
    report: FleetIdentityReportStatus,
    report_json: Value,
    clusters: BTreeMap<String, Value>,
}

async fn published_when_synced(hub: &kube::Client) -> Result<Published, String> {
    let report = Api::<FleetIdentityReport>::all(hub.clone())
        .get_opt(FLEET_REPORT_NAME)
        .await
        .map_err(|e| e.to_string())?
        .and_then(|r| r.status)
        .ok_or("no FleetIdentityReport status yet")?;
    if report.clusters.total != SPOKES.len() as i64 || report.clusters.unhealthy != 0 {
        return Err(format!("report's clusters: {:?}", report.clusters));
    }
    let statuses = Api::<ClusterIdentityStatus>::namespaced(hub.clone(), PROFILE_NS)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut clusters = BTreeMap::new();
    for c in statuses.items {
        let name = c.metadata.name.clone().unwrap_or_default();
        let st = c.status.ok_or(format!("{name}: no status yet"))?;
        let synced = st
            .conditions
            .iter()
            .any(|c| c.type_ == "Synced" && c.status == "True");
        if !synced {
            return Err(format!("{name} not synced: {:?}", st.conditions));
        }
        clusters.insert(
            name,
            timeless(serde_json::to_value(&st).map_err(|e| e.to_string())?),
        );
    }
    if clusters.len() != SPOKES.len() {
        return Err(format!("ClusterIdentityStatuses: {:?}", clusters.keys()));
    }
    Ok(Published {
        report_json: timeless(serde_json::to_value(&report).map_err(|e| e.to_string())?),
        report,
        clusters,
    })
}

/// The leader's report in sharded mode is built from every replica's published
/// observations: planted findings that need several replicas' spokes (a cross-cluster
/// drift over spokes of different owners) and refused bindings on spokes of different
/// owners must come out exactly as one replica running every spoke reports them: the
/// `FleetIdentityReport`, every `ClusterIdentityStatus`, the API's report of every replica,
/// and `/v1/report` and `/v1/clusters` over HTTPS from every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharded_report_equals_the_single_replica_report() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&SPOKES, dir.path()).await.unwrap();
    // b-0 everywhere alike (no finding); b-1 on another container in s5: a drift that
    // names every spoke, so every replica's share.
    for s in SPOKES {
        register_admin_token_spoke(&f.hub_client, s, &f.spoke(s), "ok", FLEET_TOKEN, 5, 0..1)
            .await
            .unwrap();
        let container = if s == "s5" { "c-other" } else { "c-1" };
        plant(s, &f, "b-1", "obj-1", container, None);
    }

    let mut replicas = Vec::new();
    for r in REPLICAS {
        replicas.push(
            start_replica_with(&f, r, FLEET_TOKEN, Some(10), None, Some(prompt_status())).await,
        );
    }
    settled(&f, 3, "three replicas announce one view").await;
    let states: Vec<Option<FleetState>> = replicas
        .iter()
        .map(|r| Some(r.handle.state.clone()))
        .collect();
    let owners = one_owner_each(&states, "every spoke engaged once").await;
    println!("owners: {owners:?}");
    // The collision on s0, the duplicate SPIFFE ID on a spoke another replica owns.
    let owner = |s: &str| owners[&format!("{PROFILE_NS}/{s}")];
    let collided = "s0";
    let duplicated = *SPOKES
        .iter()
        .find(|s| owner(s) != owner(collided))
        .expect("one replica owns every spoke");
    plant(collided, &f, "collide-x", "obj-3", "shared", None);
    plant(collided, &f, "collide-y", "obj-4", "shared", None);
    let dup = "spiffe://{{ .TrustDomain }}/ns/llm/shared";
    plant(duplicated, &f, "dup-x", "obj-3", "dx", Some(dup));
    plant(duplicated, &f, "dup-y", "obj-4", "dy", Some(dup));
    let mut expected = vec![
        (
            FindingKind::IdentityCollision,
            None,
            vec![member(collided, "collide-x"), member(collided, "collide-y")],
        ),
        (
            FindingKind::DuplicateSpiffeId,
            Some(format!("spiffe://{TD}/ns/{NS}/shared")),
            vec![member(duplicated, "dup-x"), member(duplicated, "dup-y")],
        ),
        (
            FindingKind::CrossClusterDrift,
            Some(format!("spiffe://{TD}/ns/{NS}/objective/obj-1")),
            SPOKES.iter().map(|s| member(s, "b-1")).collect(),
        ),
    ];
    expected.sort();

    // Sharded: the planted findings, every spoke synced, and every replica's API says the
    // same.
    let hub = f.hub_client.clone();
    let sharded = wait_for(
        "the sharded report shows the planted findings",
        LIMIT,
        || {
            let hub = hub.clone();
            let expected = expected.clone();
            async move {
                let p = published_when_synced(&hub).await.ok()?;
                let mut got: Vec<_> = p
                    .report
                    .findings
                    .iter()
                    .map(|f| (f.kind, f.spiffe_id.clone(), f.members.clone()))
                    .collect();
                got.sort();
                (got == expected && p.report.finding_counts.total == 3).then_some(p)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(sharded.report.bindings, 16, "{:?}", sharded.report);
    let views: Vec<_> = replicas.iter().map(|r| r.handle.view.clone()).collect();
    let sharded_api = wait_for("every replica's API serves one report", LIMIT, || {
        let views = views.clone();
        async move {
            let reports: Vec<Value> = views.iter().map(|v| timeless(v.report())).collect();
            let first = reports[0].clone();
            let all_planted = first["findingCounts"]["total"] == json!(3)
                && first["spokes"]
                    .as_array()
                    .is_some_and(|s| s.len() == SPOKES.len());
            (all_planted && reports.iter().all(|r| *r == first)).then_some(first)
        }
    })
    .await
    .unwrap();

    // Over HTTPS, as clients see it: every sharded replica answers `/v1/report` with that
    // report and `/v1/clusters` with one list.
    let pki = kubesim_auth::pki::ClusterPki::generate("hub-api").unwrap();
    let ca = pki.ca_cert_pem().to_string();
    let mut addrs = Vec::new();
    for (r, name) in replicas.iter().zip(REPLICAS) {
        addrs.push(serve_api_https(&f, &r.handle, &pki, name).await);
    }
    let https_sharded = wait_for(
        "every sharded replica serves one report and one cluster list over HTTPS",
        LIMIT,
        || {
            let (addrs, ca, want) = (addrs.clone(), ca.clone(), sharded_api.clone());
            async move {
                let mut answers = Vec::new();
                for a in &addrs {
                    answers.push(api_over_https(*a, &ca).await.ok()?);
                }
                let first = answers[0].clone();
                let clusters = first.1["items"].as_array().map_or(0, Vec::len);
                (first.0 == want && clusters == SPOKES.len() && answers.iter().all(|a| *a == first))
                    .then_some(first)
            }
        },
    )
    .await
    .unwrap();

    // The same fleet, one replica in the default leader mode: start from no status objects
    // (the sharded run's are removed), so everything compared is its own.
    for r in replicas {
        r.stop().await;
    }
    let delete = kube::api::DeleteParams::default();
    Api::<FleetIdentityReport>::all(hub.clone())
        .delete(FLEET_REPORT_NAME, &delete)
        .await
        .unwrap();
    let statuses = Api::<ClusterIdentityStatus>::namespaced(hub.clone(), PROFILE_NS);
    for s in SPOKES {
        statuses.delete(s, &delete).await.unwrap();
    }
    let observations = Api::<ClusterIdentityObservation>::namespaced(hub.clone(), HUB_NS);
    for o in observations
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let name = o.metadata.name.unwrap();
        observations.delete(&name, &delete).await.unwrap();
    }
    let single =
        start_replica_with(&f, "single", FLEET_TOKEN, None, None, Some(prompt_status())).await;
    // Polled until equal (a status object is written again as the replica learns more,
    // e.g. its first successful sync); one that stays different fails with both shown.
    let same = wait_for(
        "the single replica's report equals the sharded one",
        SAME_LIMIT,
        || {
            let hub = hub.clone();
            let want = sharded.clone();
            async move {
                let p = published_when_synced(&hub).await.ok()?;
                (p.report_json == want.report_json && p.clusters == want.clusters).then_some(())
            }
        },
    )
    .await;
    if let Err(e) = same {
        let alone = published_when_synced(&hub).await.expect(&e);
        assert_eq!(
            alone.report_json, sharded.report_json,
            "FleetIdentityReport: single replica (left) vs sharded (right)"
        );
        assert_eq!(
            alone.clusters, sharded.clusters,
            "ClusterIdentityStatuses: single replica (left) vs sharded (right)"
        );
    }
    assert_eq!(
        timeless(single.handle.view.report()),
        sharded_api,
        "the API's report: single replica (left) vs sharded (right)"
    );
    // And over HTTPS: the single replica's `/v1/report` and `/v1/clusters` are the sharded
    // replicas'.
    let single_addr = serve_api_https(&f, &single.handle, &pki, "single").await;
    let same = wait_for(
        "the single replica's API over HTTPS equals the sharded replicas'",
        SAME_LIMIT,
        || {
            let (ca, want) = (ca.clone(), https_sharded.clone());
            async move { (api_over_https(single_addr, &ca).await.ok()? == want).then_some(()) }
        },
    )
    .await;
    if let Err(e) = same {
        let alone = api_over_https(single_addr, &ca).await.expect(&e);
        assert_eq!(
            alone.0, https_sharded.0,
            "/v1/report: single replica (left) vs sharded (right)"
        );
        assert_eq!(
            alone.1, https_sharded.1,
            "/v1/clusters: single replica (left) vs sharded (right)"
        );
    }
    single.stop().await;
}
