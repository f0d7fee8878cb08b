//! The fleet report built from published observations (sharded mode's input) against
//! kubesim: the status loop publishes every spoke of a planted fleet state as
//! `ClusterIdentityObservation`s, and `/v1/report`, `/v1/clusters` and the
//! `FleetIdentityReport` built from them equal those built from the state itself. An
//! observation edited behind the hub's back is refused (the report says so) and repaired;
//! a spoke that is gone loses its object.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::Namespace;
use kleym_api::hub_status::{
    ClusterIdentityObservation, DuplicateOf, FLEET_REPORT_NAME, FleetIdentityReport,
};
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};
use kleym_hub::fleet::{ErrorCategory, FleetState, Phase, SpokeError};
use kleym_hub::http::HubView;
use kleym_hub::inventory::InventorySynced;
use kleym_hub::report::published::Limits;
use kleym_hub::report::{BindingSnapshot, Caps, FullReport, bound_report};
use kleym_hub::runtime::{FleetHubView, LeaderInfo};
use kleym_hub::status::{
    ObservationCache, ObservationOptions, ReportInputs, StatusLoopOptions, WriterOptions,
    run_status_loop,
};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kubesim::{Kubesim, KubesimOptions, install_crd};
use serde_json::{Value, json};

const HUB_NS: &str = "kleym-system";
const TD: &str = "fleet.example";
const LIMIT: Duration = Duration::from_secs(60);

#[allow(clippy::too_many_arguments)]
fn binding(
    name: &str,
    id: &str,
    container: &str,
    ready: bool,
    reason: &str,
    peers: &[(&str, &str)],
    warning: Option<&str>,
) -> Arc<BindingSnapshot> {
    Arc::new(BindingSnapshot {
        namespace: "llm".into(),
        name: name.into(),
        mode: IdentityMode::PerObjective,
        spiffe_ids: vec![format!("spiffe://{TD}/ns/llm/{id}")],
        service_account: Some("vllm".into()),
        container_discriminator: Some(format!("k8s:container-name:{container}")),
        pool_selector: vec![("app".into(), "vllm".into())],
        ready,
        reason: Some(reason.into()),
        message: Some(format!("{reason} ({name})")),
        conflict_peers: peers
            .iter()
            .map(|(n, r)| ConflictPeer {
                name: (*n).into(),
                reason: (*r).into(),
            })
            .collect(),
        warnings: warning
            .map(|m| IdentityWarning {
                reason: "OverlappingDefaultIdentity".into(),
                message: m.into(),
            })
            .into_iter()
            .collect(),
    })
}

/// Collisions, a duplicate SPIFFE ID, drift, a warning, refused bindings, a failing spoke,
/// a duplicate member and a refused profile.
fn plant(state: &FleetState) {
    let synced_at = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    let engaged = |name: &str, bindings: Vec<Arc<BindingSnapshot>>| {
        state.update(&format!("fleet/{name}"), |s| {
            s.phase = Phase::Engaged;
            s.trust_domain = Some(TD.into());
            s.version = Some("v1.33.1".into());
            s.last_sync = Some(synced_at);
            s.bindings = Arc::new(bindings);
        });
    };
    engaged(
        "east",
        vec![
            binding("b-1", "objective/obj-1", "c-1", true, "Ready", &[], None),
            binding(
                "collide-x",
                "objective/obj-3",
                "shared",
                false,
                "IdentityCollision",
                &[("collide-y", "IdentityCollision")],
                None,
            ),
            binding(
                "collide-y",
                "objective/obj-4",
                "shared",
                false,
                "IdentityCollision",
                &[("collide-x", "IdentityCollision")],
                None,
            ),
            binding(
                "gone",
                "objective/none",
                "c-9",
                false,
                "TargetNotFound",
                &[],
                None,
            ),
        ],
    );
    engaged(
        "west",
        vec![
            binding("b-1", "objective/obj-1", "c-1", true, "Ready", &[], None),
            binding(
                "dup-x",
                "shared",
                "dx",
                false,
                "DuplicateSPIFFEID",
                &[("dup-y", "DuplicateSPIFFEID")],
                None,
            ),
            binding(
                "dup-y",
                "shared",
                "dy",
                false,
                "DuplicateSPIFFEID",
                &[("dup-x", "DuplicateSPIFFEID")],
                None,
            ),
        ],
    );
    engaged(
        "south",
        vec![binding(
            "b-1",
            "objective/obj-1",
            "c-other",
            true,
            "Ready",
            &[],
            Some("ClusterSPIFFEID default-id selects these pods; set fallback: true on it"),
        )],
    );
    state.update("fleet/down", |s| {
        s.phase = Phase::BackingOff;
        s.last_error = Some(SpokeError {
            category: ErrorCategory::Unreachable,
            message: "dial tcp 10.0.0.1:443: connection refused".into(),
            at: synced_at,
        });
        s.consecutive_failures = 4;
        s.next_retry = Some(synced_at + chrono::Duration::seconds(40));
    });
    state.update("fleet/east-twin", |s| {
        s.phase = Phase::Duplicate;
        s.reason = Some("engaged through fleet/east".into());
        s.duplicate_of = Some(DuplicateOf {
            cluster_profile: "fleet/east".into(),
            member_id: "member-east".into(),
        });
    });
    state.update("fleet/refused", |s| {
        s.phase = Phase::Refused;
        s.reason = Some("no access provider matches".into());
    });
}

/// `v` without the times that say when a body was built.
fn untimed(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("generatedAt");
                m.remove("lastTransitionTime");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

fn body(b: Result<bytes::Bytes, kleym_hub::http::EncodeError>) -> Value {
    untimed(serde_json::from_slice(&b.expect("body builds")).expect("body is JSON"))
}

async fn poll<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if std::time::Instant::now() >= deadline => {
                panic!("timed out after {LIMIT:?} waiting for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A hub cluster with kleym's CRDs and the hub namespace; its client.
async fn hub_cluster() -> (Kubesim, kube::Client) {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let hub = sim.cluster("hub").unwrap();
    for crd in kleym_test_support::all_crds().unwrap() {
        install_crd(&hub.store(), crd).unwrap();
    }
    let client = hub.kube_client().await.unwrap();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(HUB_NS.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    (sim, client)
}

/// The planted fleet state (leading), a shutdown token, and the observation cache of the
/// hub namespace.
fn planted_fleet(client: &kube::Client) -> (FleetState, CancellationToken, ObservationCache) {
    let state = FleetState::new();
    state.set_leader(true);
    plant(&state);
    let shutdown = CancellationToken::new();
    let cache =
        ObservationCache::watch(client.clone(), HUB_NS, Limits::default(), shutdown.clone());
    (state, shutdown, cache)
}

/// A status loop that passes every 50 ms (at least every 200 ms), publishes the spokes and
/// builds the report from `cache`.
fn loop_options(cache: &ObservationCache) -> StatusLoopOptions {
    StatusLoopOptions {
        min_rebuild: Duration::from_millis(50),
        tick: Duration::from_millis(200),
        observations: ObservationOptions {
            inputs: ReportInputs::Published,
            publish: true,
            namespace: HUB_NS.into(),
            cache: Some(cache.clone()),
            ..ObservationOptions::default()
        },
        ..StatusLoopOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_from_published_observations_equals_the_local_one() {
    let (_sim, client) = hub_cluster().await;
    let (state, shutdown, cache) = planted_fleet(&client);
    let mut options = loop_options(&cache);
    options.writer = WriterOptions {
        min_interval: Duration::from_millis(50),
        sync_refresh: Duration::from_secs(300),
    };
    options.observations.confirm_window = Duration::from_millis(200);
    let status_loop = tokio::spawn(run_status_loop(
        client.clone(),
        state.clone(),
        options,
        shutdown.clone(),
    ));
    let local = FleetHubView::new(
        state.clone(),
        InventorySynced::default(),
        LeaderInfo::always_leader(),
    );
    let published = FleetHubView::new(
        state.clone(),
        InventorySynced::default(),
        LeaderInfo::always_leader(),
    )
    .with_report_from_observations(cache.clone());
    let observations = Api::<ClusterIdentityObservation>::namespaced(client.clone(), HUB_NS);

    // Every spoke published, and read back whole.
    poll("every spoke published and read back", || {
        let cache = cache.clone();
        async move {
            let p = cache.published();
            let ok = p.values().filter(|r| r.is_ok()).count();
            if ok == 6 {
                Ok(())
            } else {
                Err(format!("{p:?}"))
            }
        }
    })
    .await;
    let want_report = body(local.report_json());
    let want_clusters = body(local.clusters_json());
    assert_eq!(
        want_report["findingCounts"]["collisions"], 3,
        "{want_report:#}"
    );
    assert_eq!(want_report["clusters"]["duplicates"], 1, "{want_report:#}");
    assert_eq!(body(published.report_json()), want_report);
    assert_eq!(body(published.clusters_json()), want_clusters);
    assert_eq!(
        untimed(published.cluster("fleet", "down").unwrap()),
        untimed(local.cluster("fleet", "down").unwrap())
    );

    // The FleetIdentityReport the status loop wrote from them is the local one, bounded.
    let want_status = bound_report(
        &FullReport::from_fleet(&state, Utc::now()).summary,
        &Caps::default(),
    );
    let reports = Api::<FleetIdentityReport>::all(client.clone());
    poll("the FleetIdentityReport", || {
        let reports = reports.clone();
        let want = untimed(serde_json::to_value(&want_status).unwrap());
        async move {
            let got = reports
                .get_opt(FLEET_REPORT_NAME)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|r| r.status)
                .ok_or("no report yet")?;
            let got = untimed(serde_json::to_value(&got).unwrap());
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:#}"))
            }
        }
    })
    .await;

    // A hub-namespace writer hides east's collision: refused, shown, then repaired.
    let before = observations.get("fleet.east").await.unwrap();
    let mut spec = serde_json::to_value(&before.spec).unwrap();
    spec["bindings"].as_array_mut().unwrap().retain(|b| {
        !b["name"]
            .as_str()
            .unwrap_or_default()
            .starts_with("collide")
    });
    observations
        .patch(
            "fleet.east",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"bindings": spec["bindings"]}})),
        )
        .await
        .unwrap();
    let refused = poll("the edited observation refused", || {
        let published = published.clone();
        async move {
            let east = published
                .cluster("fleet", "east")
                .ok_or("east not listed")?;
            let synced = east["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Synced"))
                .cloned()
                .ok_or("no Synced")?;
            if synced["status"] == "False" {
                Ok(synced)
            } else {
                Err(format!("{east:#}"))
            }
        }
    })
    .await;
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("ClusterIdentityObservation kleym-system/fleet.east")
            && message.contains("spec.digest"),
        "{message}"
    );
    poll("the edited observation repaired", || {
        let published = published.clone();
        let want = want_report.clone();
        async move {
            let got = body(published.report_json());
            if got == want {
                Ok(())
            } else {
                Err(format!("{:#}", got["spokes"]))
            }
        }
    })
    .await;

    // A spoke that is gone loses its object.
    state.remove("fleet/refused");
    poll("the removed spoke's object deleted", || {
        let observations = observations.clone();
        async move {
            let names: Vec<String> = observations
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            if names.len() == 5 && !names.contains(&"fleet.refused".to_string()) {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        }
    })
    .await;
    assert_eq!(body(published.clusters_json()), body(local.clusters_json()));

    shutdown.cancel();
    status_loop.await.unwrap();
}

/// A spoke this replica published is written again at most once per `min_interval`,
/// however often its content changes (during a cold start it changes every pass, and each
/// write reaches every replica's watch), while a spoke not published yet is written at
/// once. Passes go through the spokes in name order, so `fleet/zulu` (new) is written in
/// the same pass as `fleet/south` (changed) and after it: zulu on the server with south
/// still old shows south held back; south new afterwards shows it was only held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_spoke_is_republished_at_most_once_per_interval() {
    let (_sim, client) = hub_cluster().await;
    let (state, shutdown, cache) = planted_fleet(&client);
    let min_interval = Duration::from_secs(3);
    let mut options = loop_options(&cache);
    options.observations.min_interval = min_interval;
    // New spokes written at once (they are not being engaged).
    options.observations.settle = Duration::ZERO;
    let status_loop = tokio::spawn(run_status_loop(
        client.clone(),
        state.clone(),
        options,
        shutdown.clone(),
    ));
    let observations = Api::<ClusterIdentityObservation>::namespaced(client.clone(), HUB_NS);
    poll("every spoke published", || {
        let cache = cache.clone();
        async move {
            let n = cache.published().values().filter(|r| r.is_ok()).count();
            if n == 6 {
                Ok(())
            } else {
                Err(format!("{n} of 6"))
            }
        }
    })
    .await;
    let first = observations.get("fleet.south").await.unwrap();
    assert_eq!(
        first.spec.spoke_version.as_deref(),
        Some("v1.33.1"),
        "{first:?}"
    );

    state.update("fleet/south", |s| s.version = Some("v1.34.0".into()));
    state.update("fleet/zulu", |s| {
        s.phase = Phase::Engaged;
        s.trust_domain = Some(TD.into());
    });
    poll("the new spoke published", || {
        let observations = observations.clone();
        async move {
            match observations.get_opt("fleet.zulu").await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let held = observations.get("fleet.south").await.unwrap();
    assert_eq!(
        held.metadata.resource_version, first.metadata.resource_version,
        "south was rewritten within {min_interval:?} of its first write: {held:?}"
    );
    let rewritten = poll("the changed spoke published after the interval", || {
        let observations = observations.clone();
        async move {
            let o = observations
                .get("fleet.south")
                .await
                .map_err(|e| e.to_string())?;
            if o.spec.spoke_version.as_deref() == Some("v1.34.0") {
                Ok(o)
            } else {
                Err(format!("{:?}", o.spec.spoke_version))
            }
        }
    })
    .await;
    assert_ne!(rewritten.spec.digest, first.spec.digest);

    shutdown.cancel();
    status_loop.await.unwrap();
}

/// Waits for `cache`'s first list (a publisher compares with it, and publishes nothing
/// before).
async fn watch_synced(cache: &ObservationCache) {
    poll("the observation watch synced", || {
        let synced = cache.synced();
        async move {
            if synced {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;
}

/// A publish pass encodes (serialises and hashes) only the spokes that moved since the pass
/// before; the others keep the digest computed then, and are still compared with the
/// server: an object deleted behind the hub's back is rewritten without its spoke moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_pass_encodes_only_the_spokes_that_moved() {
    use kleym_hub::report::published::local_spokes;
    use kleym_hub::status::observations::ObservationPublisher;
    let (_sim, client) = hub_cluster().await;
    let (state, shutdown, cache) = planted_fleet(&client);
    let mut options = loop_options(&cache).observations;
    options.min_interval = Duration::ZERO;
    options.confirm_window = Duration::ZERO;
    options.settle = Duration::ZERO;
    let mut publisher = ObservationPublisher::new(client.clone(), cache.clone(), options);
    watch_synced(&cache).await;
    let spokes = local_spokes(&state);
    let n = spokes.len();
    let first = publisher.publish(&spokes, &|_| true).await;
    assert_eq!((first.encoded, first.failed), (n, 0), "{first:?}");
    assert!(first.written >= n, "{first:?}");
    poll("every spoke on the server, read back whole", || {
        let cache = cache.clone();
        async move {
            let ok = cache.published().values().filter(|r| r.is_ok()).count();
            if ok == n {
                Ok(())
            } else {
                Err(format!("{ok} of {n}"))
            }
        }
    })
    .await;

    let again = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!(
        (again.encoded, again.unchanged, again.written),
        (0, n, 0),
        "{again:?}"
    );

    state.update("fleet/east", |s| s.version = Some("v1.34.0".into()));
    let moved = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!((moved.encoded, moved.written), (1, 1), "{moved:?}");
    let observations = Api::<ClusterIdentityObservation>::namespaced(client.clone(), HUB_NS);
    let east = observations.get("fleet.east").await.unwrap();
    assert_eq!(east.spec.spoke_version.as_deref(), Some("v1.34.0"));

    // Deleted behind the hub's back: rewritten from the kept digest's spoke, encoded again
    // only to be written.
    observations
        .delete("fleet.down", &Default::default())
        .await
        .unwrap();
    poll("the deletion seen by the watch", || {
        let cache = cache.clone();
        async move {
            if cache.published().contains_key("fleet/down") {
                Err("still there".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
    let repaired = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!((repaired.encoded, repaired.written), (0, 1), "{repaired:?}");
    let want = local_spokes(&state)
        .into_iter()
        .find(|s| s.observation.cluster == "fleet/down")
        .unwrap();
    poll("the rewritten spoke read back as it is", || {
        let cache = cache.clone();
        let want = want.clone();
        async move {
            match cache.published().get("fleet/down") {
                Some(Ok(got)) if *got == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    shutdown.cancel();
}

/// A spoke not published yet is first written once it has settled: no longer being
/// engaged, and unchanged across a pass; at the latest `first_write_within` after the
/// publisher first saw it. Through a cold start a spoke's state moves for seconds, and each
/// write reaches every replica's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_not_published_yet_is_first_written_once_it_settles() {
    use kleym_hub::report::published::local_spokes;
    use kleym_hub::status::observations::ObservationPublisher;
    let (_sim, client) = hub_cluster().await;
    let (state, shutdown, cache) = planted_fleet(&client);
    for (name, phase) in [
        ("fleet/new-a", Phase::Connecting),
        ("fleet/new-b", Phase::Syncing),
    ] {
        state.update(name, |s| {
            s.phase = phase;
            s.trust_domain = Some(TD.into());
        });
    }
    let settle = Duration::from_secs(1);
    let within = Duration::from_secs(4);
    let mut options = loop_options(&cache).observations;
    options.settle = settle;
    options.first_write_within = within;
    let mut publisher = ObservationPublisher::new(client.clone(), cache.clone(), options);
    watch_synced(&cache).await;
    let observations = Api::<ClusterIdentityObservation>::namespaced(client.clone(), HUB_NS);
    let on_server = |name: &'static str| {
        let observations = observations.clone();
        async move { observations.get_opt(name).await.unwrap() }
    };
    let started = std::time::Instant::now();
    let spokes = local_spokes(&state);
    let n = spokes.len();
    let first = publisher.publish(&spokes, &|_| true).await;
    assert_eq!((first.written, first.deferred), (0, n), "{first:?}");
    let due = publisher.next_due().expect("the held spokes fall due");
    assert!(
        due > started && due <= started + settle + Duration::from_millis(500),
        "due {:?} after the first pass",
        due - started
    );

    // Settled: the planted spokes. Not yet: new-a, just engaged; new-b, still syncing.
    tokio::time::sleep_until((started + settle).into()).await;
    state.update("fleet/new-a", |s| s.phase = Phase::Engaged);
    let second = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!((second.written, second.deferred), (n - 2, 2), "{second:?}");
    assert!(on_server("fleet.new-a").await.is_none());

    tokio::time::sleep(settle).await;
    // Its reconciler went idle again: `lastSync` alone does not hold a spoke back.
    state.update("fleet/new-a", |s| s.last_sync = Some(Utc::now()));
    let third = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!((third.written, third.deferred), (1, 1), "{third:?}");
    let a = on_server("fleet.new-a").await.expect("new-a written");
    assert_eq!(a.spec.phase.as_deref(), Some("Engaged"));
    assert!(on_server("fleet.new-b").await.is_none());

    // Still syncing at the latest time: written as it is.
    tokio::time::sleep_until((started + within).into()).await;
    let late = publisher.publish(&local_spokes(&state), &|_| true).await;
    assert_eq!((late.written, late.deferred), (1, 0), "{late:?}");
    let b = on_server("fleet.new-b").await.expect("new-b written");
    assert_eq!(b.spec.phase.as_deref(), Some("Syncing"));

    shutdown.cancel();
}

/// A spoke of `bindings` bindings as fleet-bench makes them (one objective each, the
/// spoke's own ClusterSPIFFEID names in the ready messages).
fn bench_spoke(i: usize, bindings: usize) -> kleym_hub::report::published::PublishedSpoke {
    let state = FleetState::new();
    let name = format!("fleet-system/spoke-{i:05}");
    state.update(&name, |s| {
        s.phase = Phase::Engaged;
        s.trust_domain = Some(TD.into());
        s.version = Some("v1.33.1".into());
        s.last_sync = Some(Utc.timestamp_opt(1_800_000_000, 0).unwrap());
        s.bindings = Arc::new(
            (0..bindings)
                .map(|j| {
                    let id = format!("spiffe://{TD}/ns/llm/objective/obj-{j:04}");
                    Arc::new(BindingSnapshot {
                        namespace: "llm".into(),
                        name: format!("b-{j:04}"),
                        mode: IdentityMode::PerObjective,
                        spiffe_ids: vec![id.clone()],
                        service_account: Some("vllm".into()),
                        container_discriminator: Some(format!("k8s:container-name:c-{j:04}")),
                        pool_selector: vec![("app".into(), "vllm-pool".into())],
                        ready: true,
                        reason: Some("Ready".into()),
                        message: Some(format!(
                            "ClusterSPIFFEID kleym-llm-b-{j:04}-3f9a1c2e registers {id}"
                        )),
                        conflict_peers: Vec::new(),
                        warnings: Vec::new(),
                    })
                })
                .collect(),
        );
    });
    kleym_hub::report::published::local_spokes(&state).remove(0)
}

/// The objects of `spoke` as the API server stores them (without the server's own metadata:
/// uid, resourceVersion, creationTimestamp and the one managedFields entry add about 300
/// bytes per object).
fn bench_objects(
    spoke: &kleym_hub::report::published::PublishedSpoke,
) -> Vec<Arc<ClusterIdentityObservation>> {
    use kleym_hub::report::published::{encode, object_name};
    encode(spoke, &Limits::default())
        .into_iter()
        .map(|spec| {
            let mut o =
                ClusterIdentityObservation::new(&object_name(&spec.cluster, spec.part), spec);
            o.metadata.namespace = Some(HUB_NS.into());
            o.metadata.labels = Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "kleym".to_string(),
                )]
                .into(),
            );
            Arc::new(o)
        })
        .collect()
}

/// Figures for docs/benchmarks.md: bytes per spoke, and one report pass from published
/// observations at 5000 spokes × 4 bindings. Run with
/// `cargo test -p kleym-hub --release --test hub report_published:: -- --ignored --nocapture`.
#[test]
#[ignore = "prints figures; run in release"]
fn published_observation_figures() {
    use kleym_hub::report::SpokeObservation;
    use kleym_hub::report::published::{assemble, merge};
    let bytes = |objs: &[Arc<ClusterIdentityObservation>]| -> usize {
        objs.iter()
            .map(|o| serde_json::to_vec(&**o).unwrap().len())
            .sum()
    };
    for bindings in [4, 100] {
        let objs = bench_objects(&bench_spoke(0, bindings));
        let b = bytes(&objs);
        println!(
            "{bindings} bindings: {b} bytes per spoke in {} object(s), {:.0} bytes per binding",
            objs.len(),
            b as f64 / bindings as f64
        );
    }
    const SPOKES: usize = 5000;
    let local: Vec<_> = (0..SPOKES).map(|i| bench_spoke(i, 4)).collect();
    let objs: Vec<_> = local.iter().flat_map(bench_objects).collect();
    println!(
        "{SPOKES} spokes x 4 bindings: {} objects, {:.1} MiB of JSON",
        objs.len(),
        bytes(&objs) as f64 / (1024.0 * 1024.0)
    );
    let limits = Limits::default();
    let t = std::time::Instant::now();
    let decoded = assemble(&objs, &limits);
    let decode = t.elapsed();
    assert_eq!(decoded.values().filter(|r| r.is_ok()).count(), SPOKES);
    let t = std::time::Instant::now();
    let merged = merge(local.clone(), &decoded);
    let inputs: Vec<SpokeObservation> = merged.into_iter().map(|s| s.observation).collect();
    let from_published = FullReport::build(&inputs, Utc::now());
    let published_pass = t.elapsed();
    let t = std::time::Instant::now();
    let locals: Vec<SpokeObservation> = local.iter().map(|s| s.observation.clone()).collect();
    let from_local = FullReport::build(&locals, Utc::now());
    let local_pass = t.elapsed();
    assert_eq!(from_published.summary.bindings, from_local.summary.bindings);
    println!(
        "report pass at {SPOKES} spokes: decoding every object {:.1} ms (once per change of a spoke's objects), merge + analysis from published {:.1} ms, analysis from local state {:.1} ms",
        decode.as_secs_f64() * 1e3,
        published_pass.as_secs_f64() * 1e3,
        local_pass.as_secs_f64() * 1e3
    );
    // What a status pass saves per unchanged spoke: encoding it (serialising and hashing,
    // as the publisher did for every spoke on every pass) against comparing it with the
    // spoke it was last encoded from (a copy of the state, sharing its bindings).
    let t = std::time::Instant::now();
    let digests: usize = local
        .iter()
        .map(|s| {
            kleym_hub::report::published::encode(s, &limits)[0]
                .digest
                .len()
        })
        .sum();
    let encode_all = t.elapsed();
    let again: Vec<_> = local.to_vec();
    let t = std::time::Instant::now();
    let same = local.iter().zip(&again).filter(|(a, b)| a == b).count();
    let compare_all = t.elapsed();
    assert_eq!((digests, same), (SPOKES * 64, SPOKES));
    println!(
        "status pass at {SPOKES} unchanged spokes: encoding every spoke {:.1} ms, comparing every spoke with its last encoding {:.2} ms",
        encode_all.as_secs_f64() * 1e3,
        compare_all.as_secs_f64() * 1e3
    );
}
