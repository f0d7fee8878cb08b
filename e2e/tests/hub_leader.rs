//! Leader election: of two hub replicas only the Lease holder engages spokes; the standby
//! never even runs its credential plugin (so it cannot write). When the leader stops it
//! releases the Lease and the standby takes over and converges new bindings. A leader that
//! cannot renew (its hub credential revoked) steps down and stops sending anything to its
//! spokes before the standby takes over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, grant_admin, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::{count_runs, static_token_plugin};
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kleym_e2e::fixtures::recording::RecordingAuthenticator;
use kleym_hub::fleet::Phase;
use kleym_hub::runtime::{HubHandle, start_hub};
use kleym_spoke::reconciler::CancellationToken;
use kube::Api;
use serde_json::json;

const TOKEN: &str = "tok-leader-0123456789";
const LIMIT: Duration = Duration::from_secs(60);

fn flags(pf: &std::path::Path) -> Vec<String> {
    [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--namespace",
        HUB_NS,
        "--lease-duration-seconds",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_engages_and_the_standby_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, 3, 0..1)
        .await
        .unwrap();
    let store = s.store();
    // Each replica has its own plugin script so their execs can be told apart.
    let mut pfs = Vec::new();
    let mut counts = Vec::new();
    for r in ["a", "b"] {
        let count = dir.path().join(format!("{r}.count"));
        let plugin =
            static_token_plugin(dir.path(), &format!("{r}.sh"), TOKEN, Some(&count)).unwrap();
        let pf = dir.path().join(format!("{r}.json"));
        std::fs::write(&pf, json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]}).to_string()).unwrap();
        pfs.push(pf);
        counts.push(count);
    }

    let a = f.start_hub(&flags(&pfs[0])).await.unwrap();
    let a_state = a.handle.state.clone();
    wait_for("replica a leads", LIMIT, || {
        let st = a_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    let b = f.start_hub(&flags(&pfs[1])).await.unwrap();
    wait_for("binding 0 compiled by the leader", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 1).then_some(()) }
    })
    .await
    .unwrap();
    let b_state = b.handle.state.clone();
    wait_for("replica b lists the profile as standby", LIMIT, || {
        let st = b_state.clone();
        async move { (st.get("fleet/spoke")?.phase == Phase::Standby).then_some(()) }
    })
    .await
    .unwrap();
    // A second binding is compiled while both run; b still never ran its plugin.
    env::create_bindings(&store, 1..2).unwrap();
    wait_for("binding 1 compiled", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 2).then_some(()) }
    })
    .await
    .unwrap();
    assert!(!b_state.is_leader());
    assert_eq!(
        count_runs(&counts[1]),
        0,
        "the standby never exec'ed (never contacted a spoke)"
    );
    assert_eq!(count_runs(&counts[0]), 1);
    let leases: Api<Lease> = Api::namespaced(f.hub_client.clone(), HUB_NS);
    let holder = leases
        .get("kleym-hub")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert!(holder.is_some());

    // The leader stops (releasing the Lease): the standby takes over.
    a.stop().await.unwrap();
    wait_for("replica b leads", LIMIT, || {
        let st = b_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    env::create_bindings(&store, 2..3).unwrap();
    wait_for("binding 2 compiled by the new leader", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 3).then_some(()) }
    })
    .await
    .unwrap();
    assert!(count_runs(&counts[1]) >= 1);
    let new_holder = leases
        .get("kleym-hub")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_ne!(new_holder, holder);
    b.stop().await.unwrap();
}

/// A replica with hub credentials of its own (so they can be revoked on their own).
struct Replica {
    handle: HubHandle,
    shutdown: CancellationToken,
}

async fn start_replica(f: &FleetHarness, name: &str, pf: &std::path::Path) -> Replica {
    let user = format!("replica-{name}");
    let token = format!("tok-hub-{user}-0123456789");
    f.hub.add_static_token(
        &token,
        kubesim_auth::UserInfo {
            username: user.clone(),
            ..Default::default()
        },
    );
    grant_admin(&f.hub, &user).unwrap();
    let mut flags = self::flags(pf);
    // Renew deadline 2 s: the standby takes over no sooner than 1 s after the leader stepped
    // down, however late it observed the last renewal.
    if let Some(duration) = flags.last_mut() {
        *duration = "3".into();
    }
    flags.extend(["--instance".into(), user]);
    let args = parse_hub_args(&flags).unwrap();
    let client = f.hub.client_for_token(&token).await.unwrap();
    let shutdown = CancellationToken::new();
    let handle = start_hub(&args, client, shutdown.clone()).unwrap();
    Replica { handle, shutdown }
}

impl Replica {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(LIMIT, self.handle.task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// The leader's hub credential is revoked while it reconciles 23 new bindings (each of its
/// requests to the spoke held 6 s, so reconciles are in flight): it cannot renew the Lease,
/// steps down by its renew deadline and stops its spoke reconciler at once. No request of
/// the deposed leader reaches the spoke, nor is let through, after the standby acquired the
/// Lease (before, stopping waited for the reconciles in flight: their requests went on for
/// seconds); the standby, whose Lease identity is its `--instance`, converges every binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_writing_before_the_standby_takes_over() {
    const N: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, N, 0..1)
        .await
        .unwrap();
    let store = s.store();
    let mut recorders = Vec::new();
    let mut pfs = Vec::new();
    for r in ["a", "b"] {
        let rec = RecordingAuthenticator::install(&s, &format!("replica-{r}"));
        let plugin =
            static_token_plugin(dir.path(), &format!("{r}.sh"), rec.token(), None).unwrap();
        let pf = dir.path().join(format!("{r}.json"));
        std::fs::write(&pf, json!({"providers": [{"name": "ok", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]}).to_string()).unwrap();
        recorders.push(rec);
        pfs.push(pf);
    }
    let (rec_a, rec_b) = (recorders[0].clone(), recorders[1].clone());

    let a = start_replica(&f, "a", &pfs[0]).await;
    let a_state = a.handle.state.clone();
    wait_for("replica a leads", LIMIT, || {
        let st = a_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    let b = start_replica(&f, "b", &pfs[1]).await;
    let b_state = b.handle.state.clone();
    wait_for("binding 0 compiled by a", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 1).then_some(()) }
    })
    .await
    .unwrap();
    wait_for("replica b on standby", LIMIT, || {
        let st = b_state.clone();
        async move { (st.get("fleet/spoke")?.phase == Phase::Standby).then_some(()) }
    })
    .await
    .unwrap();

    // a reconciles new bindings slowly; once its requests for them arrive, it loses the hub.
    rec_a.set_delay(Duration::from_secs(6));
    let before = rec_a.count();
    env::create_bindings(&store, 1..N).unwrap();
    wait_for("a reconciling the new bindings", LIMIT, || {
        let rec = rec_a.clone();
        async move { (rec.count() >= before + 4).then_some(()) }
    })
    .await
    .unwrap();
    f.hub.faults().revoke_token("tok-hub-replica-a-0123456789");

    wait_for("replica b leads", LIMIT, || {
        let st = b_state.clone();
        async move { st.is_leader().then_some(()) }
    })
    .await
    .unwrap();
    assert!(!a_state.is_leader(), "the deposed leader still leads");
    assert_eq!(
        a_state.get("fleet/spoke").map(|s| s.phase),
        Some(Phase::Standby)
    );
    wait_for("every binding compiled by b", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, N).then_some(()) }
    })
    .await
    .unwrap();
    assert!(rec_b.count() > 0, "b reached the spoke");

    let lease = Api::<Lease>::namespaced(f.hub_client.clone(), HUB_NS)
        .get("kleym-hub")
        .await
        .unwrap()
        .spec
        .unwrap();
    let holder = lease.holder_identity.unwrap();
    assert!(holder.starts_with("replica-b_"), "{holder}");
    let acquired = lease.acquire_time.unwrap().0;
    let acquired = chrono::DateTime::from_timestamp_micros(acquired.as_microsecond()).unwrap();
    let last_a = rec_a.arrivals().into_iter().max().unwrap();
    println!("last request of the deposed leader {last_a}, standby acquired the Lease {acquired}");
    assert_eq!(
        rec_a.arrived_after(acquired),
        Vec::<chrono::DateTime<chrono::Utc>>::new(),
        "requests of the deposed leader after the standby took over"
    );
    // Its requests held when it stepped down would be let through by now (6 s each).
    wait_for("the held requests' 6 s", LIMIT, || {
        let rec = rec_a.clone();
        async move {
            (rec.arrivals().into_iter().max()? + chrono::Duration::seconds(7) < chrono::Utc::now())
                .then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(
        rec_a.passed_after(acquired),
        Vec::<chrono::DateTime<chrono::Utc>>::new(),
        "requests of the deposed leader handled after the standby took over"
    );
    a.stop().await;
    b.stop().await;
}
