//! The chaos soak in sharded mode, short and with a fixed seed (6 spokes × 10 bindings, a
//! 30 s window, three real `kleym hub` replicas with `--shard-mode sharded`): besides the
//! churn, the spoke and plugin faults and the kills of the leader-mode soak, the last
//! replica joins late, a replica is killed for longer than the lease duration, running
//! replicas' own Leases are deleted under them, and one replica is cut from the hub
//! cluster (its own credential revoked) while it still reaches the spokes. The fleet must
//! settle to the oracle, and no spoke's request log may show two replicas writing in turn
//! within the lease duration. Each sharded fault must be seen to take effect (counted from
//! what the clusters saw). Needs the `kleym` binary: `cargo build -p kleym-hub --bin kleym`.

use std::time::Duration;

use kleym_e2e::chaos::{ChaosOptions, run};
use kleym_e2e::fixtures::plugins::kleym_binary;

/// The seed of the suite's run (a failing seed replays with `fleet-bench --scenario chaos
/// --replicas 3 --shard-mode sharded --seed 16 --spokes 6 --bindings 10
/// --duration-seconds 30 --churn-per-second 3 --fault-every-seconds 10 --process-faults 2`).
const SEED: u64 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_under_joins_lease_loss_and_partitions_settle() {
    let kleym = kleym_binary().expect("the kleym binary (cargo build -p kleym-hub --bin kleym)");
    let dir = tempfile::tempdir().unwrap();
    let mut o = ChaosOptions::new(SEED, 6, 10, Duration::from_secs(30), &kleym, dir.path());
    o.churn_per_second = 3.0;
    o.fault_every = Duration::from_secs(10);
    o.process_faults = Some(2);
    o.settle_limit = Duration::from_secs(180);
    o.quiet = Duration::from_secs(15);
    o.concurrency = 8;
    o.replicas = 3;
    o.hub_args = vec!["--shard-mode".into(), "sharded".into()];
    let report = run(&o, &|line| println!("{line}")).await.unwrap();
    println!("{report}");
    assert!(report.churn_applied() >= 50, "churn: {:?}", report.churn);
    // Every sharded fault was injected and had its effect (else a 0 would prove nothing).
    for kind in ["replica_join", "kill_pause", "lease_loss", "hub_partition"] {
        assert!(
            report.faults.get(kind).is_some_and(|n| *n >= 1),
            "{kind} not injected: {:?}",
            report.faults
        );
        assert!(
            report.shard_faults_fired.get(kind).is_some_and(|n| *n >= 1),
            "{kind} injected, no effect seen: {:?}",
            report.shard_faults_fired
        );
    }
    assert_eq!(report.faults.get("kill_leader"), Some(&1));
    assert_eq!(report.faults.get("kill_both"), Some(&1));
    let c = &report.coverage;
    assert!(c.ready > 0 && !c.refused.is_empty() && c.foreign > 0, "{c}");
    if report.violations.total() > 0 {
        let kept = dir.keep();
        panic!(
            "{} invariant violations (seed {SEED}); hub logs in {}:\n{}",
            report.violations.total(),
            kept.display(),
            report.violations
        );
    }
}
