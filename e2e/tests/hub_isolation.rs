//! Isolation: with one spoke blackholed, one answering every request with 500, one whose
//! InferencePool lists fail (it passes the preflight and fails during its initial sync) and
//! one whose credential plugin fails, the healthy spokes converge as they do without them.
//! The bad spokes' requests time out only after 30 s, so a hub that let them hold up the
//! healthy ones would converge at least 30 s late: the healthy convergence with them is
//! asserted against the run without them as a ratio with generous slack (3x + 8 s), never
//! against a wall-clock limit; the bad spokes back off with the right error category. Spokes whose lists fail give their sync slot back at once, even
//! with one slot and an initial-sync deadline longer than the test. A spoke slow to sync is
//! reported as syncing, never as Ready without its bindings.

use std::time::{Duration, Instant};

use kleym_api::hub_status::condition_types;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fixtures::plugins::{static_token_plugin, write_script};
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kleym_hub::fleet::{ErrorCategory, Phase};
use kleym_hub::report::from_fleet::SYNCING_MESSAGE;
use kleym_hub::report::{SpokeObservation, cluster_status};
use kubesim::ErrorRule;
use serde_json::json;

const BINDINGS: usize = 5;
const TOKEN: &str = "tok-healthy-0123456789";
const HEALTHY: [&str; 3] = ["ok-1", "ok-2", "ok-3"];
const LIMIT: Duration = Duration::from_secs(90);

/// Every request of `verb` (all verbs: `None`) on `resource` fails with 500.
fn fail_with_500(f: &FleetHarness, spoke: &str, verb: Option<&str>, resource: Option<&str>) {
    f.spoke(spoke)
        .faults()
        .add_error_rule(ErrorRule {
            verb: verb.map(str::to_string),
            resource: resource.map(str::to_string),
            rate: 1.0,
            code: 500,
        })
        .unwrap();
}

/// A provider file with `ok` (the static token) and `broken` (the plugin exits 3).
fn providers_file(dir: &std::path::Path) -> std::path::PathBuf {
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
    pf
}

async fn register(f: &FleetHarness, name: &str) {
    let provider = if name == "no-creds" { "broken" } else { "ok" };
    register_admin_token_spoke(
        &f.hub_client,
        name,
        &f.spoke(name),
        provider,
        TOKEN,
        BINDINGS,
        0..BINDINGS,
    )
    .await
    .unwrap();
}

fn flags(pf: &std::path::Path, concurrency: u16, timeout_seconds: u16) -> Vec<String> {
    vec![
        "--clusterprofile-provider-file".to_string(),
        pf.display().to_string(),
        "--trust-domain".into(),
        "fleet.example".into(),
        "--leader-elect=false".into(),
        "--request-timeout-seconds".into(),
        timeout_seconds.to_string(),
        "--connect-timeout-seconds".into(),
        timeout_seconds.to_string(),
        "--concurrency".into(),
        concurrency.to_string(),
    ]
}

async fn setup(bad: bool, dir: &std::path::Path) -> (FleetHarness, Vec<String>) {
    let mut names: Vec<&str> = HEALTHY.to_vec();
    if bad {
        names.extend(["blackholed", "failing", "pools-failing", "no-creds"]);
    }
    let f = FleetHarness::start(&names, dir).await.unwrap();
    let pf = providers_file(dir);
    for n in &names {
        register(&f, n).await;
    }
    if bad {
        f.spoke("blackholed").faults().set_blackhole(true);
        fail_with_500(&f, "failing", None, None);
        fail_with_500(&f, "pools-failing", Some("list"), Some("inferencepools"));
    }
    // Long timeouts: a stall behind a bad spoke costs at least this much.
    (f, flags(&pf, 2, STALL_SECONDS))
}

/// Request and connect timeout of the isolation test: what a healthy spoke would wait if a
/// bad one held it up.
const STALL_SECONDS: u16 = 30;

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

    // Same healthy spokes plus four bad ones.
    let dir = tempfile::tempdir().unwrap();
    let (f, flags) = setup(true, dir.path()).await;
    let started = Instant::now();
    let hub = f.start_hub(&flags).await.unwrap();
    let with_bad = healthy_convergence(&f, &hub, started).await;
    println!(
        "healthy spokes ({} x {BINDINGS} bindings) converged in {baseline:?} alone, {with_bad:?} with a blackholed, a 500-returning, an InferencePool-list-failing and a credential-failing spoke",
        HEALTHY.len()
    );
    // Generous slack for a loaded machine, well below the 30 s a stall behind a bad spoke
    // costs.
    let bound = baseline * 3 + Duration::from_secs(8);
    assert!(
        with_bad <= bound,
        "the bad spokes held up the healthy ones: {with_bad:?} with them, {baseline:?} without \
         (bound {bound:?})"
    );

    let state = hub.handle.state.clone();
    for (name, category) in [
        ("fleet/blackholed", ErrorCategory::Unreachable),
        ("fleet/failing", ErrorCategory::ServerError),
        ("fleet/pools-failing", ErrorCategory::ServerError),
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
    let pools = state
        .get("fleet/pools-failing")
        .unwrap()
        .last_error
        .unwrap();
    assert!(
        pools.message.contains("inferencepools") && pools.message.contains("500"),
        "{}",
        pools.message
    );
    hub.stop().await.unwrap();
}

/// One sync slot (`--concurrency 1`) and an initial-sync deadline (600 s) far beyond this
/// test's waits: a spoke answering 500 to ClusterSPIFFEID requests (caught by the preflight,
/// before it queues for the slot) and one whose InferencePool lists fail (it passes the
/// preflight, takes the slot and fails during its initial sync) both back off with
/// `ServerError` while the healthy spokes converge, including one registered after both
/// failed. Before the fix a spoke whose watch could not list held the slot until the
/// deadline, so nothing else could sync meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spokes_whose_lists_fail_give_the_sync_slot_back_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["ok-1", "ok-2", "csid-failing", "pools-failing", "late"];
    let f = FleetHarness::start(&names, dir.path()).await.unwrap();
    let pf = providers_file(dir.path());
    for n in &names[..4] {
        register(&f, n).await;
    }
    fail_with_500(&f, "csid-failing", None, Some("clusterspiffeids"));
    fail_with_500(&f, "pools-failing", Some("list"), Some("inferencepools"));
    let mut flags = flags(&pf, 1, 2);
    flags.extend(["--initial-sync-timeout-seconds".into(), "600".into()]);
    let hub = f.start_hub(&flags).await.unwrap();
    let state = hub.handle.state.clone();

    for (name, what) in [
        ("fleet/csid-failing", "list ClusterSPIFFEIDs: 500"),
        (
            "fleet/pools-failing",
            "watch of inferencepools.inference.networking",
        ),
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
        assert_eq!(
            err.category,
            ErrorCategory::ServerError,
            "{name}: {}",
            err.message
        );
        assert!(err.message.contains(what), "{name}: {}", err.message);
        println!("{name}: {:?} {}", err.category, err.message);
    }
    for n in ["ok-1", "ok-2"] {
        let store = f.spoke(n).store();
        wait_for(&format!("{n} converged"), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
    // Registered after the failing spokes failed (and keep retrying): it gets the slot too.
    register(&f, "late").await;
    let store = f.spoke("late").store();
    wait_for("late converged", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS).then_some(()) }
    })
    .await
    .unwrap();
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
