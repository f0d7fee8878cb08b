//! The chaos soak, short and with a fixed seed (6 spokes × 10 bindings, a 60 s window): two
//! real `kleym hub` replicas with leader election under churn, kubesim faults, credential
//! plugin faults and `kill -9` of the leader and of both replicas must settle to exactly
//! what the oracle (the pure compiler over the final objects) implies, touch no foreign
//! object and then stay quiet.
//! The per-invariant table is printed; any violation fails the test. Needs the `kleym`
//! binary: `cargo build -p kleym-hub --bin kleym`.

use std::time::Duration;

use kleym_e2e::chaos::{ChaosOptions, run};
use kleym_e2e::fixtures::plugins::kleym_binary;

/// The seed of the suite's run (a failing seed replays with `fleet-bench --scenario chaos
/// --seed 16 --spokes 6 --bindings 10 --duration-seconds 60`).
const SEED: u64 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_under_churn_and_faults_settles_to_the_oracle() {
    let kleym = kleym_binary().expect("the kleym binary (cargo build -p kleym-hub --bin kleym)");
    let dir = tempfile::tempdir().unwrap();
    let mut o = ChaosOptions::new(SEED, 6, 10, Duration::from_secs(60), &kleym, dir.path());
    o.churn_per_second = 3.0;
    o.fault_every = Duration::from_secs(10);
    o.process_faults = Some(2);
    o.settle_limit = Duration::from_secs(180);
    o.quiet = Duration::from_secs(30);
    o.concurrency = 8;
    let report = run(&o, &|line| println!("{line}")).await.unwrap();
    println!("{report}");
    // The run exercised what it claims to (else a 0 would prove nothing).
    assert!(report.churn_applied() >= 100, "churn: {:?}", report.churn);
    assert!(
        report
            .faults
            .keys()
            .filter(|k| !k.starts_with("kill"))
            .count()
            >= 4,
        "faults: {:?}",
        report.faults
    );
    // The plugin faults reached the hub's credential path (a 401 made it re-exec).
    assert!(
        report.plugin_faults_fired.values().sum::<usize>() >= 1,
        "plugin faults injected {:?}, none changed a plugin run",
        report.faults
    );
    assert_eq!(
        report.faults.get("kill_leader"),
        Some(&1),
        "{:?}",
        report.faults
    );
    assert_eq!(
        report.faults.get("kill_both"),
        Some(&1),
        "{:?}",
        report.faults
    );
    assert_eq!(
        report.hub.starts, 5,
        "2 replicas, the leader restarted once, both once"
    );
    assert!(
        report.leader_changes >= 2,
        "leader changes: {}",
        report.leader_changes
    );
    // The oracle had both Ready and refused bindings, and foreign objects, to check.
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
