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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, grant_admin, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::static_token_plugin;
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kleym_e2e::fixtures::recording::RecordingAuthenticator;
use kleym_hub::fleet::{FleetState, Phase};
use kleym_hub::runtime::{HubHandle, start_hub};
use kleym_spoke::reconciler::CancellationToken;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

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
    let flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--namespace",
        HUB_NS,
        "--shard-mode",
        "sharded",
        // Renew deadline 2 s, retry period 0.4 s.
        "--lease-duration-seconds",
        "3",
        "--instance",
        &user,
        "--shard-weight",
        &weight.to_string(),
        "--discovery-interval-seconds",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args = parse_hub_args(&flags).unwrap();
    let client = f.hub.client_for_token(&hub_token).await.unwrap();
    let shutdown = CancellationToken::new();
    let handle = start_hub(&args, client, shutdown.clone()).unwrap();
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
