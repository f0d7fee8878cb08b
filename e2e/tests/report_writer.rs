//! The hub's status writers against kubesim: server-side apply, owner reference to the
//! ClusterProfile (garbage collection), no write when nothing changed (counted by
//! resourceVersion changes), rate limiting with coalescing.

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::Namespace;
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_api::hub_status::{
    ClusterIdentityStatus, FLEET_REPORT_NAME, FindingKind, FleetIdentityReport,
};
use kleym_hub::report::{
    BindingSnapshot, Caps, ErrorCategory, FullReport, Health, SpokeObservation, bound_report,
    cluster_status, shared,
};
use kleym_hub::status::{FIELD_MANAGER, StatusOwnerRef, StatusWriter, WriterOptions};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions, install_crd};
use serde_json::json;

const NS: &str = "fleet";

async fn start() -> (Kubesim, ClusterHandle, kube::Client) {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let hub = sim.cluster("hub").unwrap();
    for crd in kleym_e2e::fixtures::all_crds().unwrap() {
        install_crd(&hub.store(), crd).unwrap();
    }
    let client = hub.kube_client().await.unwrap();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NS.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    (sim, hub, client)
}

async fn create_profile(client: &kube::Client, name: &str) -> StatusOwnerRef {
    let profile: ClusterProfile = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"displayName": name, "clusterManager": {"name": "test"}},
    }))
    .unwrap();
    let created = Api::<ClusterProfile>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    StatusOwnerRef {
        namespace: NS.into(),
        name: name.into(),
        uid: created.metadata.uid.unwrap(),
    }
}

fn spoke(at: i64, healthy: bool, bindings: usize) -> SpokeObservation {
    SpokeObservation {
        cluster: format!("{NS}/east"),
        trust_domain: Some("example.org".into()),
        credentials: Health::Ok,
        reachable: if healthy {
            Health::Ok
        } else {
            Health::Failed(ErrorCategory::Unreachable)
        },
        synced: Health::Ok,
        error_message: (!healthy).then(|| "dial tcp 10.0.0.1:443: connection refused".into()),
        consecutive_failures: 0,
        next_retry: None,
        spoke_version: Some("v1.33.1".into()),
        last_sync: Some(Utc.timestamp_opt(at, 0).unwrap()),
        bindings: shared((0..bindings).map(|i| BindingSnapshot {
            namespace: "team".into(),
            name: format!("b{i}"),
            spiffe_ids: vec![format!("spiffe://example.org/ns/team/objective/o{i}")],
            service_account: Some("sa".into()),
            ready: i != 0,
            reason: Some(if i == 0 { "InvalidRef" } else { "Ready" }.into()),
            ..Default::default()
        })),
        duplicate_of: None,
        admission_policy: None,
    }
}

fn status_at(
    at: i64,
    healthy: bool,
    bindings: usize,
) -> kleym_api::hub_status::ClusterIdentityStatusStatus {
    cluster_status(
        &spoke(at, healthy, bindings),
        Utc.timestamp_opt(at, 0).unwrap(),
        Some(&Caps::default()),
    )
}

async fn cis(client: &kube::Client, name: &str) -> Option<ClusterIdentityStatus> {
    Api::<ClusterIdentityStatus>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

fn rv(o: &ClusterIdentityStatus) -> String {
    o.metadata.resource_version.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_is_owned_written_once_and_only_on_change() {
    let (_sim, _hub, client) = start().await;
    let profile = create_profile(&client, "east").await;
    let options = WriterOptions {
        min_interval: Duration::from_secs(3600),
        sync_refresh: Duration::from_secs(300),
    };
    let mut writer = StatusWriter::new(client.clone(), options);
    let t0 = Instant::now();

    writer.submit_cluster(profile.clone(), status_at(1_000, true, 3));
    let stats = writer.flush(t0).await;
    assert_eq!((stats.written, stats.failed), (1, 0), "{stats:?}");
    let obj = cis(&client, "east").await.expect("created");
    let owner = &obj.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ClusterProfile", profile.uid.as_str())
    );
    assert!(
        obj.metadata
            .managed_fields
            .iter()
            .flatten()
            .all(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
    );
    let st = obj.status.clone().unwrap();
    assert_eq!(st.bindings.total, 3);
    assert_eq!(st.bindings.not_ready, 1);
    assert_eq!(st.non_ready_bindings[0].reason, "InvalidRef");
    assert_eq!(st.trust_domain.as_deref(), Some("example.org"));
    let first_rv = rv(&obj);

    // Same content, later timestamps (sync 30 s later): no write, even long after the interval.
    for (i, at) in [1_030, 1_060, 1_090].into_iter().enumerate() {
        writer.submit_cluster(profile.clone(), status_at(at, true, 3));
        let stats = writer
            .flush(t0 + Duration::from_secs(7200 * (i as u64 + 1)))
            .await;
        assert_eq!((stats.written, stats.unchanged), (0, 1), "{stats:?}");
    }
    assert_eq!(rv(&cis(&client, "east").await.unwrap()), first_rv);

    // A new writer (hub restart) reads the object and still writes nothing.
    let mut restarted = StatusWriter::new(client.clone(), options);
    restarted.submit_cluster(profile.clone(), status_at(1_100, true, 3));
    let stats = restarted.flush(Instant::now()).await;
    assert_eq!((stats.written, stats.unchanged), (0, 1), "{stats:?}");
    assert_eq!(rv(&cis(&client, "east").await.unwrap()), first_rv);

    // A change is written; the transition time of an unchanged condition is kept.
    let later = t0 + Duration::from_secs(100_000);
    writer.submit_cluster(profile.clone(), status_at(2_000, false, 3));
    assert_eq!(writer.flush(later).await.written, 1);
    let obj = cis(&client, "east").await.unwrap();
    assert_ne!(rv(&obj), first_rv);
    let st = obj.status.unwrap();
    let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    assert_eq!(cond("Reachable").status, "False");
    assert_eq!(cond("Reachable").reason, "Unreachable");
    assert!(cond("Reachable").message.contains("connection refused"));
    assert_eq!(cond("Ready").reason, "Unreachable");
    let kept = cond("CredentialsAvailable")
        .last_transition_time
        .0
        .as_second();
    assert_eq!(kept, 1_000, "unchanged condition keeps its transition time");
    assert_eq!(cond("Reachable").last_transition_time.0.as_second(), 2_000);

    // Deleted behind the writer's back: repaired after a resync, not before.
    let rv_before = rv(&cis(&client, "east").await.unwrap());
    Api::<ClusterIdentityStatus>::namespaced(client.clone(), NS)
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    writer.submit_cluster(profile.clone(), status_at(2_010, false, 3));
    assert_eq!(
        writer
            .flush(later + Duration::from_secs(4_000))
            .await
            .unchanged,
        1
    );
    assert!(cis(&client, "east").await.is_none());
    writer.resync();
    writer.submit_cluster(profile.clone(), status_at(2_020, false, 3));
    assert_eq!(
        writer
            .flush(later + Duration::from_secs(8_000))
            .await
            .written,
        1
    );
    let again = cis(&client, "east").await.expect("recreated");
    assert_ne!(rv(&again), rv_before);
    assert_eq!(again.metadata.owner_references.unwrap()[0].uid, profile.uid);

    // Deleting the profile garbage-collects its status.
    Api::<ClusterProfile>::namespaced(client.clone(), NS)
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while cis(&client, "east").await.is_some() {
        assert!(
            Instant::now() < deadline,
            "ClusterIdentityStatus not collected with its profile"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_rate_limited_and_coalesced() {
    let (_sim, _hub, client) = start().await;
    let profile = create_profile(&client, "east").await;
    let mut writer = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::from_secs(10),
            sync_refresh: Duration::from_secs(300),
        },
    );
    let t0 = Instant::now();
    writer.submit_cluster(profile.clone(), status_at(1_000, true, 1));
    assert_eq!(writer.flush(t0).await.written, 1);
    let rv0 = rv(&cis(&client, "east").await.unwrap());

    // Three changes within the interval: deferred, then one write of the last.
    for (i, n) in [2, 3, 4].into_iter().enumerate() {
        writer.submit_cluster(profile.clone(), status_at(1_001, true, n));
        let stats = writer.flush(t0 + Duration::from_secs(i as u64 + 1)).await;
        assert_eq!((stats.written, stats.deferred), (0, 1), "{stats:?}");
    }
    assert_eq!(rv(&cis(&client, "east").await.unwrap()), rv0);
    assert!(writer.next_due().is_some());
    let stats = writer.flush(t0 + Duration::from_secs(10)).await;
    assert_eq!(stats.written, 1, "{stats:?}");
    let obj = cis(&client, "east").await.unwrap();
    assert_eq!(
        obj.status.unwrap().bindings.total,
        4,
        "the last submission wins"
    );
    assert!(writer.next_due().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_report_is_written_only_when_findings_change_and_kleym_report_reads_it() {
    let (_sim, hub, client) = start().await;
    let mut writer = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::ZERO,
            sync_refresh: Duration::from_secs(300),
        },
    );
    let api = Api::<FleetIdentityReport>::all(client.clone());
    let drift = |sa: &str, cluster: &str| SpokeObservation {
        cluster: cluster.into(),
        bindings: shared([BindingSnapshot {
            namespace: "n".into(),
            name: "b".into(),
            spiffe_ids: vec!["spiffe://example.org/ns/n/objective/o".into()],
            service_account: Some(sa.into()),
            ready: true,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let build = |at: i64, sa_west: &str| {
        let fleet = vec![drift("sa", "fleet/east"), drift(sa_west, "fleet/west")];
        bound_report(
            &FullReport::build(&fleet, Utc.timestamp_opt(at, 0).unwrap()).summary,
            &Caps::default(),
        )
    };
    let t0 = Instant::now();
    writer.submit_report(build(1_000, "other"));
    assert_eq!(writer.flush(t0).await.written, 1);
    let obj = api.get(FLEET_REPORT_NAME).await.unwrap();
    let st = obj.status.clone().unwrap();
    assert_eq!(st.findings.len(), 1);
    assert_eq!(st.findings[0].kind, FindingKind::CrossClusterDrift);
    assert_eq!(st.generated_at.as_ref().unwrap().0.as_second(), 1_000);
    let rv1 = obj.metadata.resource_version.clone();

    // `kleym report` reads it from the hub cluster through a kubeconfig.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("hub.kubeconfig");
    std::fs::write(&kubeconfig, hub.kubeconfig_yaml()).unwrap();
    let kleym = kleym_e2e::fixtures::plugins::kleym_binary().expect("kleym binary");
    let run = |extra: &[&str]| {
        let mut args = vec!["report", "--kubeconfig", kubeconfig.to_str().unwrap()];
        args.extend_from_slice(extra);
        std::process::Command::new(&kleym)
            .args(&args)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("[1] COLLISION CrossClusterDrift"), "{table}");
    assert!(table.contains("fleet/west"), "{table}");
    let out = run(&["-o", "json", "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: kleym_api::hub_status::FleetIdentityReportStatus =
        serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc, st);
    assert_eq!(run(&["--name", "nope"]).status.code(), Some(2));

    // Rebuilt later with the same findings: generatedAt would move, but nothing is written.
    writer.submit_report(build(2_000, "other"));
    assert_eq!(writer.flush(t0 + Duration::from_secs(1)).await.unchanged, 1);
    assert_eq!(
        api.get(FLEET_REPORT_NAME)
            .await
            .unwrap()
            .metadata
            .resource_version,
        rv1
    );

    // Fixed: the finding clears and generatedAt moves with the content.
    writer.submit_report(build(3_000, "sa"));
    assert_eq!(writer.flush(t0 + Duration::from_secs(2)).await.written, 1);
    let st = api.get(FLEET_REPORT_NAME).await.unwrap().status.unwrap();
    assert!(st.findings.is_empty());
    assert_eq!(st.finding_counts.total, 0);
    assert_eq!(st.generated_at.unwrap().0.as_second(), 3_000);
}

/// ClusterIdentityStatus objects in the hub's store that carry a status (read in process,
/// without a request: the fence below runs inside the writer).
fn written_statuses(hub: &ClusterHandle) -> usize {
    let store = hub.store();
    let Some(res) = store.resolve("kleym.io", "v1alpha1", "clusteridentitystatuses") else {
        return 0;
    };
    store
        .list(&res, None, &kubesim_store::ListOptions::default())
        .ok()
        .and_then(|l| l.get("items").and_then(|i| i.as_array()).cloned())
        .unwrap_or_default()
        .iter()
        .filter(|o| o.get("status").is_some_and(|s| !s.is_null()))
        .count()
}

/// Leadership is asked right before every write, not once per flush: with a fence that
/// says "not leader" as soon as one ClusterIdentityStatus carries a status (leadership lost
/// in the middle of a flush), a flush of three statuses and the report writes exactly that
/// one; the rest stays pending and is written once the fence allows it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_asks_the_leadership_fence() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (_sim, hub, client) = start().await;
    let mut profiles = Vec::new();
    for name in ["east", "west", "north"] {
        profiles.push(create_profile(&client, name).await);
    }
    let leading_again = Arc::new(AtomicBool::new(false));
    let fence = {
        let (hub, again) = (hub.clone(), leading_again.clone());
        Arc::new(move || again.load(Ordering::SeqCst) || written_statuses(&hub) == 0)
    };
    let mut writer = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::ZERO,
            sync_refresh: Duration::from_secs(300),
        },
    )
    .with_fence(fence);
    for p in &profiles {
        writer.submit_cluster(p.clone(), status_at(1_000, true, 2));
    }
    writer.submit_report(bound_report(
        &FullReport::build(
            &[spoke(1_000, true, 2)],
            Utc.timestamp_opt(1_000, 0).unwrap(),
        )
        .summary,
        &Caps::default(),
    ));
    let stats = writer.flush(Instant::now()).await;
    assert_eq!((stats.written, stats.failed), (1, 0), "{stats:?}");
    assert!(stats.fenced, "{stats:?}");
    assert_eq!(written_statuses(&hub), 1);
    assert!(
        Api::<FleetIdentityReport>::all(client.clone())
            .get_opt(FLEET_REPORT_NAME)
            .await
            .unwrap()
            .is_none(),
        "the report was written after leadership was lost"
    );

    leading_again.store(true, Ordering::SeqCst);
    let stats = writer.flush(Instant::now()).await;
    assert_eq!((stats.written, stats.failed), (3, 0), "{stats:?}");
    assert!(!stats.fenced);
    assert_eq!(written_statuses(&hub), 3);
}

/// Found by the chaos soak (`fleet-bench --scenario chaos --seed 1 --spokes 3 --bindings 5
/// --duration-seconds 20`): a profile deleted and recreated under the same name while a
/// replica took over left the writer believing its ClusterIdentityStatus existed after the
/// garbage collector had removed it, and every status write answered 404 until the
/// 10-minute resync. A status write that finds the object gone must make the next flush
/// recreate it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_gone_behind_the_writers_back_is_recreated_by_the_next_flush() {
    let (_sim, _hub, client) = start().await;
    let profile = create_profile(&client, "east").await;
    let options = WriterOptions {
        min_interval: Duration::from_secs(3600),
        sync_refresh: Duration::from_secs(300),
    };
    let mut writer = StatusWriter::new(client.clone(), options);
    let t0 = Instant::now();
    writer.submit_cluster(profile.clone(), status_at(1_000, true, 3));
    assert_eq!(writer.flush(t0).await.written, 1);
    let first = cis(&client, "east").await.expect("created");
    Api::<ClusterIdentityStatus>::namespaced(client.clone(), NS)
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();

    // New content: the write finds the object gone (404) ...
    let later = t0 + Duration::from_secs(10_000);
    writer.submit_cluster(profile.clone(), status_at(2_000, false, 3));
    let stats = writer.flush(later).await;
    assert_eq!((stats.written, stats.failed), (0, 1), "{stats:?}");
    assert!(
        writer.next_due().is_some_and(|t| t <= Instant::now()),
        "due at once"
    );
    // ... and the next flush, without a resync, recreates it with its owner and status.
    let stats = writer.flush(later).await;
    assert_eq!((stats.written, stats.failed), (1, 0), "{stats:?}");
    let again = cis(&client, "east").await.expect("recreated");
    assert_ne!(again.metadata.uid, first.metadata.uid);
    assert_eq!(again.metadata.owner_references.unwrap()[0].uid, profile.uid);
    let st = again.status.expect("status written");
    assert_eq!(st.bindings.total, 3);
    let reachable = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Reachable")
        .unwrap();
    assert_eq!(reachable.status, "False");
}

/// Found by the chaos soak with the writer fix above: the status loop looks profile UIDs
/// up again only when a name is missing or at the 10-minute resync, so a profile deleted
/// and recreated under the same name kept being written with the deleted profile's UID as
/// owner, which the garbage collector removed at once (404 on the status, every pass). A
/// status object found gone must make the loop list the UIDs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_recreated_under_its_name_gets_its_status_back_before_the_resync() {
    use kleym_hub::fleet::FleetState;
    use kleym_hub::status::{StatusLoopOptions, run_status_loop};
    use kleym_spoke::reconciler::CancellationToken;

    let (_sim, _hub, client) = start().await;
    let first = create_profile(&client, "east").await;
    let state = FleetState::new();
    state.set_leader(true);
    state.update(&format!("{NS}/east"), |s| {
        s.phase = kleym_hub::fleet::Phase::Engaged;
        s.version = Some("v1".into());
    });
    let stop = CancellationToken::new();
    let status_loop = tokio::spawn(run_status_loop(
        client.clone(),
        state.clone(),
        StatusLoopOptions {
            writer: WriterOptions {
                min_interval: Duration::from_millis(100),
                sync_refresh: Duration::from_secs(300),
            },
            min_rebuild: Duration::from_millis(50),
            tick: Duration::from_millis(200),
            resync: Duration::from_secs(600),
            ..StatusLoopOptions::default()
        },
        stop.clone(),
    ));
    let owned_by = |uid: String| {
        let client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let owner = cis(&client, "east")
                    .await
                    .and_then(|o| o.metadata.owner_references)
                    .and_then(|r| r.first().map(|r| r.uid.clone()));
                if owner.as_deref() == Some(uid.as_str()) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "no ClusterIdentityStatus owned by {uid} within 60 s (owner: {owner:?})"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    owned_by(first.uid.clone()).await;

    // The profile is deleted (its status goes with it) and created again under its name.
    Api::<ClusterProfile>::namespaced(client.clone(), NS)
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while cis(&client, "east").await.is_some() {
        assert!(Instant::now() < deadline, "status not collected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = create_profile(&client, "east").await;
    assert_ne!(second.uid, first.uid);
    // The spoke is engaged again: its content changes.
    state.update(&format!("{NS}/east"), |s| s.version = Some("v2".into()));
    owned_by(second.uid.clone()).await;
    stop.cancel();
    status_loop.await.unwrap();
}

/// A spoke's first status waits until the spoke is engaged and its observation has
/// settled: written mid-way, it would hold back the status that says the spoke is ready for
/// the writer's interval. `east`, engaged after a second and changed again just after, gets
/// one write, with its final content; `west`, still syncing, is written as it is once
/// `within` has passed, and not before; so is the report, which waits while any spoke is
/// being engaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spokes_first_status_waits_until_it_is_engaged_and_settled() {
    use kleym_hub::fleet::{FleetState, Phase};
    use kleym_hub::status::{FirstWriteOptions, StatusLoopOptions, run_status_loop};
    use kleym_spoke::reconciler::CancellationToken;

    let (_sim, hub, client) = start().await;
    for name in ["east", "west"] {
        create_profile(&client, name).await;
    }
    let state = FleetState::new();
    state.set_leader(true);
    for (name, phase) in [("east", Phase::Connecting), ("west", Phase::Syncing)] {
        state.update(&format!("{NS}/{name}"), |s| {
            s.phase = phase;
            s.version = Some("v-engaging".into());
        });
    }
    let first_write = FirstWriteOptions {
        settle: Duration::from_secs(3),
        within: Duration::from_secs(8),
    };
    let stop = CancellationToken::new();
    let started = Instant::now();
    let status_loop = tokio::spawn(run_status_loop(
        client.clone(),
        state.clone(),
        StatusLoopOptions {
            writer: WriterOptions {
                min_interval: Duration::from_secs(60),
                sync_refresh: Duration::from_secs(300),
            },
            min_rebuild: Duration::from_millis(50),
            tick: Duration::from_millis(200),
            first_write,
            ..StatusLoopOptions::default()
        },
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(written_statuses(&hub), 0, "a status written while engaging");
    let east = format!("{NS}/east");
    state.update(&east, |s| {
        s.phase = Phase::Engaged;
        s.version = Some("v-engaged".into());
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    state.update(&east, |s| s.version = Some("v-settled".into()));
    let version = |o: &ClusterIdentityStatus| {
        o.status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|v| v.get("spokeVersion").cloned())
    };
    let written = |name: &'static str, limit: Duration| {
        let client = client.clone();
        async move {
            let deadline = Instant::now() + limit;
            loop {
                if let Some(o) = cis(&client, name).await.filter(|o| o.status.is_some()) {
                    return o;
                }
                assert!(Instant::now() < deadline, "{name}: no status");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let east = written("east", Duration::from_secs(30)).await;
    assert_eq!(version(&east), Some(json!("v-settled")), "{east:?}");
    assert!(
        cis(&client, "west").await.is_none(),
        "west written while syncing, {:?} after the start",
        started.elapsed()
    );
    let report = || async {
        Api::<FleetIdentityReport>::all(client.clone())
            .get_opt(FLEET_REPORT_NAME)
            .await
            .unwrap()
    };
    assert!(
        report().await.is_none(),
        "the report written while west is syncing"
    );
    let west = written("west", Duration::from_secs(30)).await;
    assert!(
        started.elapsed() >= first_write.within,
        "west written {:?} after the start",
        started.elapsed()
    );
    assert_eq!(version(&west), Some(json!("v-engaging")), "{west:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while report().await.is_none() {
        assert!(Instant::now() < deadline, "no report after the bound");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let east_now = cis(&client, "east").await.unwrap();
    assert_eq!(rv(&east_now), rv(&east), "east written twice");
    stop.cancel();
    status_loop.await.unwrap();
}

/// Sharded mode: a `ClusterIdentityStatus` is written only while the cluster fence says
/// this replica owns its spoke, asked right before each write; one it does not own is
/// dropped from the writer and the flush goes on with the others (nothing is deleted:
/// another replica's object stays as it wrote it). The report follows its own fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sharded_mode_only_owned_cluster_statuses_are_written() {
    use std::sync::Arc;

    let (_sim, hub, client) = start().await;
    let mut profiles = Vec::new();
    for name in ["east", "west", "north"] {
        profiles.push(create_profile(&client, name).await);
    }
    // Another replica owns `west` and wrote its status already.
    let mut other = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::ZERO,
            sync_refresh: Duration::from_secs(300),
        },
    );
    other.submit_cluster(profiles[1].clone(), status_at(500, false, 1));
    assert_eq!(other.flush(Instant::now()).await.written, 1);
    let theirs = cis(&client, "west").await.unwrap();

    let mut writer = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::ZERO,
            sync_refresh: Duration::from_secs(300),
        },
    )
    .with_cluster_fence(Arc::new(|_ns: &str, name: &str| name != "west"))
    .with_report_fence(Arc::new(|| false));
    for p in &profiles {
        writer.submit_cluster(p.clone(), status_at(1_000, true, 2));
    }
    writer.submit_report(bound_report(
        &FullReport::build(
            &[spoke(1_000, true, 2)],
            Utc.timestamp_opt(1_000, 0).unwrap(),
        )
        .summary,
        &Caps::default(),
    ));
    let stats = writer.flush(Instant::now()).await;
    assert_eq!((stats.written, stats.failed), (2, 0), "{stats:?}");
    assert!(stats.fenced, "the report's fence said no: {stats:?}");
    assert_eq!(written_statuses(&hub), 3);
    let west = cis(&client, "west").await.unwrap();
    assert_eq!(
        rv(&west),
        rv(&theirs),
        "the other replica's status was rewritten"
    );
    assert!(cis(&client, "east").await.unwrap().status.is_some());
    // Dropped: no longer tracked, so no later flush writes it either.
    let tracked: Vec<String> = writer
        .tracked_clusters()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(!tracked.contains(&"west".to_string()), "{tracked:?}");
    assert!(
        Api::<FleetIdentityReport>::all(client.clone())
            .get_opt(FLEET_REPORT_NAME)
            .await
            .unwrap()
            .is_none(),
        "the report was written by a replica that does not lead"
    );
}

/// Sharded mode: `/v1/clusters` answers on every replica, the leader too, from the published
/// `ClusterIdentityStatus` objects (fleet-wide: other replicas' spokes included), never
/// from the replica's own share; in leader mode the leader answers from its own state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sharded_mode_the_api_answers_from_the_published_statuses() {
    use kleym_hub::fleet::{FleetState, Phase};
    use kleym_hub::http::HubView;
    use kleym_hub::inventory::InventorySynced;
    use kleym_hub::runtime::{FleetHubView, LeaderInfo, PublishedStatus};
    use kleym_spoke::reconciler::CancellationToken;

    let (_sim, _hub, client) = start().await;
    // Another replica's spoke, published.
    let west = create_profile(&client, "west").await;
    let mut other = StatusWriter::new(
        client.clone(),
        WriterOptions {
            min_interval: Duration::ZERO,
            sync_refresh: Duration::from_secs(300),
        },
    );
    other.submit_cluster(west, status_at(500, true, 1));
    assert_eq!(other.flush(Instant::now()).await.written, 1);
    // This replica leads and runs `east` only (not published yet).
    let state = FleetState::new();
    state.set_leader(true);
    state.update(&format!("{NS}/east"), |s| s.phase = Phase::Engaged);
    let stop = CancellationToken::new();
    let view = |sharded: bool| {
        let v = FleetHubView::new(
            state.clone(),
            InventorySynced::default(),
            LeaderInfo::default(),
        )
        .with_published(PublishedStatus::watch(client.clone(), stop.clone()));
        if sharded { v.sharded() } else { v }
    };
    let sharded = view(true);
    let names = |items: Vec<serde_json::Value>| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| i["cluster"].as_str().map(str::to_string))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while names(sharded.clusters()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the published statuses never synced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(names(sharded.clusters()), [format!("{NS}/west")]);
    assert!(sharded.cluster(NS, "west").is_some());
    assert!(
        sharded.cluster(NS, "east").is_none(),
        "answered from the replica's own state"
    );
    // Leader mode: the leader answers from its own state.
    let leader = view(false);
    assert_eq!(names(leader.clusters()), [format!("{NS}/east")]);
    stop.cancel();
}
