//! Isolation: with one spoke blackholed, one answering every request with 500 and one whose
//! credential plugin fails, the healthy spokes converge as they do without them. Both
//! convergence times are printed (never asserted); the bad spokes back off with the right
//! error category. A spoke slow to sync is reported as syncing, never as Ready without its
//! bindings.

use std::time::{Duration, Instant};

use kleym_api::fleet::condition_types;
use kleym_e2e::fleet::env;
use kleym_e2e::fleet::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fleet::plugins::{static_token_plugin, write_script};
use kleym_e2e::fleet::profiles::register_admin_token_spoke;
use kleym_e2e::kubesim::ErrorRule;
use kleym_hub::fleet::{ErrorCategory, Phase};
use kleym_hub::report::from_fleet::SYNCING_MESSAGE;
use kleym_hub::report::{SpokeObservation, cluster_status};
use serde_json::json;

const BINDINGS: usize = 5;
const TOKEN: &str = "tok-healthy-0123456789";
const HEALTHY: [&str; 3] = ["ok-1", "ok-2", "ok-3"];
const LIMIT: Duration = Duration::from_secs(90);

async fn setup(bad: bool, dir: &std::path::Path) -> (FleetHarness, Vec<String>) {
    let mut names: Vec<&str> = HEALTHY.to_vec();
    if bad {
        names.extend(["blackholed", "failing", "no-creds"]);
    }
    let f = FleetHarness::start(&names, dir).await.unwrap();
    let ok = static_token_plugin(dir, "ok.sh", TOKEN, None).unwrap();
    let broken = write_script(
        dir,
        "broken.sh",
        "#!/bin/sh\necho 'no credential for you' >&2\nexit 3\n",
    )
    .unwrap();
    let providers = json!({"providers": [
        {"name": "ok", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": ok.to_str().unwrap()}},
        {"name": "broken", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": broken.to_str().unwrap()}}
    ]});
    let pf = dir.join("providers.json");
    std::fs::write(&pf, providers.to_string()).unwrap();
    for n in &names {
        let provider = if *n == "no-creds" { "broken" } else { "ok" };
        register_admin_token_spoke(
            &f.hub_client,
            n,
            &f.spoke(n),
            provider,
            TOKEN,
            BINDINGS,
            0..BINDINGS,
        )
        .await
        .unwrap();
    }
    if bad {
        f.spoke("blackholed").faults().set_blackhole(true);
        f.spoke("failing")
            .faults()
            .add_error_rule(ErrorRule {
                verb: None,
                resource: None,
                rate: 1.0,
                code: 500,
            })
            .unwrap();
    }
    let flags = vec![
        "--clusterprofile-provider-file".to_string(),
        pf.display().to_string(),
        "--trust-domain".into(),
        "fleet.example".into(),
        "--leader-elect=false".into(),
        "--request-timeout-seconds".into(),
        "2".into(),
        "--connect-timeout-seconds".into(),
        "2".into(),
        "--concurrency".into(),
        "2".into(),
    ];
    (f, flags)
}

async fn healthy_convergence(f: &FleetHarness, hub: &RunningHub, started: Instant) -> Duration {
    for n in HEALTHY {
        let store = f.spoke(n).store();
        wait_for(&format!("{n} converged"), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
    let elapsed = started.elapsed();
    for n in HEALTHY {
        assert_ne!(
            hub.handle.state.get(&format!("fleet/{n}")).unwrap().phase,
            Phase::BackingOff
        );
    }
    elapsed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_spokes_converge_despite_blackholed_failing_and_credential_less_spokes() {
    // Baseline: healthy spokes only.
    let dir = tempfile::tempdir().unwrap();
    let (f, flags) = setup(false, dir.path()).await;
    let started = Instant::now();
    let hub = f.start_hub(&flags).await.unwrap();
    let baseline = healthy_convergence(&f, &hub, started).await;
    hub.stop().await.unwrap();
    drop(f);

    // Same healthy spokes plus three bad ones.
    let dir = tempfile::tempdir().unwrap();
    let (f, flags) = setup(true, dir.path()).await;
    let started = Instant::now();
    let hub = f.start_hub(&flags).await.unwrap();
    let with_bad = healthy_convergence(&f, &hub, started).await;
    println!(
        "healthy spokes ({} x {BINDINGS} bindings) converged in {baseline:?} alone, {with_bad:?} with a blackholed, a 500-returning and a credential-failing spoke",
        HEALTHY.len()
    );

    let state = hub.handle.state.clone();
    for (name, category) in [
        ("fleet/blackholed", ErrorCategory::Unreachable),
        ("fleet/failing", ErrorCategory::ServerError),
        ("fleet/no-creds", ErrorCategory::Credentials),
    ] {
        let s = wait_for(&format!("{name} backing off"), LIMIT, || {
            let state = state.clone();
            async move {
                let s = state.get(name)?;
                (s.phase == Phase::BackingOff && s.last_error.is_some()).then_some(s)
            }
        })
        .await
        .unwrap();
        let err = s.last_error.unwrap();
        assert_eq!(err.category, category, "{name}: {}", err.message);
        assert!(s.consecutive_failures >= 1);
        println!("{name}: {:?} {}", err.category, err.message);
    }
    let no_creds = state.get("fleet/no-creds").unwrap().last_error.unwrap();
    assert!(no_creds.message.contains("exit"), "{}", no_creds.message);
    hub.stop().await.unwrap();
}

/// Right after engage, while the spoke's caches do their initial sync (every request to it
/// delayed), every state the hub publishes for it gives a status that is not Ready; it turns
/// Ready only with all its bindings counted (before the fix it was briefly "Ready, all 0
/// bindings ready" between engaging and the first bindings snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowly_syncing_spoke_is_never_ready_without_its_bindings() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["slow"], dir.path()).await.unwrap();
    let ok = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": ok.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    let spoke = f.spoke("slow");
    register_admin_token_spoke(
        &f.hub_client,
        "slow",
        &spoke,
        "ok",
        TOKEN,
        BINDINGS,
        0..BINDINGS,
    )
    .await
    .unwrap();
    spoke.faults().set_latency(Duration::from_millis(250));
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "fleet.example".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    let state = hub.handle.state.clone();
    let mut changes = state.subscribe();
    let mut saw_syncing = false;
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(s) = state.get("fleet/slow") {
            let status = cluster_status(&SpokeObservation::from(&s), chrono::Utc::now(), None);
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == condition_types::READY)
                .unwrap();
            if s.phase == Phase::Syncing {
                assert_eq!(ready.status, "Unknown", "{}", ready.message);
                assert!(ready.message.contains(SYNCING_MESSAGE), "{}", ready.message);
                saw_syncing = true;
            }
            if ready.status == "True" {
                assert_eq!(
                    status.bindings.total, BINDINGS as i64,
                    "Ready in phase {:?} with {} of {BINDINGS} bindings: {}",
                    s.phase, status.bindings.total, ready.message
                );
                break;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, changes.changed())
            .await
            .expect("the slow spoke became Ready in time")
            .unwrap();
    }
    assert!(saw_syncing, "the spoke was observed while syncing");
    hub.stop().await.unwrap();
}
