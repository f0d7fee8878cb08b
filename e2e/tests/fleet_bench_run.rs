//! `fleet-bench` itself, on a tiny fleet (2 spokes × 3 bindings): both scenarios and both hub
//! modes converge (the bench exits non-zero unless every binding is Ready with its
//! ClusterSPIFFEID), and the figures it prints are parsed from its `summary:` line and
//! checked for consistency: one credential exec per spoke, at least the three writes per
//! binding (finalizer, ClusterSPIFFEID apply, status apply), percentiles in order and within
//! the convergence time. Their magnitudes are not asserted (they are measurements).

use std::collections::HashMap;
use std::process::Command;

use kleym_e2e::fixtures::plugins::kleym_binary;

const SPOKES: f64 = 2.0;
const BINDINGS: f64 = 3.0;

/// The `key=value` pairs of the bench's `summary:` line.
struct Summary(HashMap<String, String>);

impl Summary {
    fn parse(stdout: &str) -> Self {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("summary: "))
            .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"));
        Self(
            line.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn str(&self, key: &str) -> &str {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in the summary {:?}", self.0))
    }

    fn num(&self, key: &str) -> f64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("{key}={v} is not a number ({:?})", self.0))
    }
}

/// Runs `fleet-bench` with `args` and returns its output; a non-zero exit fails the test.
fn bench_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
        .args(args)
        .output()
        .expect("fleet-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fleet-bench {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn run_bench(extra: &[&str]) -> (String, Summary) {
    let mut args = vec![
        "--spokes",
        "2",
        "--bindings",
        "3",
        "--timeout-seconds",
        "120",
    ];
    args.extend_from_slice(extra);
    let stdout = bench_stdout(&args);
    for figure in [
        "time to engage 2 spokes",
        "time to converge",
        "converged 6 of 6 bindings",
        "binding latency",
        "API requests per spoke",
        "credential execs per spoke: 1.00 (2 total)",
        "bench process (",
    ] {
        assert!(stdout.contains(figure), "missing {figure:?} in:\n{stdout}");
    }
    let summary = Summary::parse(&stdout);
    check_figures(&summary, &stdout);
    (stdout, summary)
}

/// What holds for every run, whatever the machine's speed.
fn check_figures(s: &Summary, stdout: &str) {
    let ctx = format!("in:\n{stdout}");
    assert_eq!(s.num("spokes"), SPOKES, "{ctx}");
    assert_eq!(s.num("bindings_per_spoke"), BINDINGS, "{ctx}");
    assert_eq!(s.num("converged"), SPOKES * BINDINGS, "{ctx}");
    // One static-token plugin exec per spoke: the credential cache works across reconciles.
    assert_eq!(s.str("execs"), "1.00", "{ctx}");
    // Every binding needs its finalizer, its ClusterSPIFFEID and its status written at least
    // once (per spoke: at least one of each per binding).
    for kind in [
        "writes_finalizer",
        "writes_csid_apply",
        "writes_status_apply",
    ] {
        assert!(
            s.num(kind) >= BINDINGS,
            "{kind} < {BINDINGS} per spoke {ctx}"
        );
    }
    let writes = s.num("writes");
    assert!(writes >= 3.0 * BINDINGS, "{ctx}");
    // Reads (preflight, discovery, initial lists and watches) come on top of the writes.
    let (reads, total) = (s.num("reads"), s.num("requests_total"));
    assert!(reads >= 1.0, "{ctx}");
    assert!((total - (reads + writes)).abs() < 0.01, "{ctx}");
    let to_engage = s.num("requests_to_engage");
    assert!(to_engage >= 1.0 && to_engage <= total, "{ctx}");
    // Times: positive, latencies ordered and never beyond the convergence time.
    let (engage, converge) = (s.num("engage_s"), s.num("converge_s"));
    assert!(engage > 0.0 && converge > 0.0, "{ctx}");
    let (p50, p99, max) = (s.num("p50_ms"), s.num("p99_ms"), s.num("max_ms"));
    assert!(max > 0.0 && p50 <= p99 && p99 <= max, "{ctx}");
    assert!(max <= converge * 1000.0 + 1.0, "{ctx}");
}

#[test]
fn cold_start_with_the_real_hub_binary_converges_and_reports_its_figures() {
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().expect("utf-8 path");
    let (stdout, s) = run_bench(&[
        "--scenario",
        "cold-start",
        "--hub",
        "process",
        "--kleym-bin",
        kleym,
    ]);
    assert_eq!(s.str("scenario"), "cold-start");
    assert!(
        stdout.contains("bindings created before the hub starts: 6"),
        "{stdout}"
    );
    // From hub start, the slowest binding is the convergence time itself.
    assert!(
        (s.num("max_ms") - s.num("converge_s") * 1000.0).abs() <= 1.0,
        "{stdout}"
    );
    assert!(
        stdout.contains("hub process (kleym, pid"),
        "the child hub's own figures are missing:\n{stdout}"
    );
    assert!(s.num("hub_peak_rss_mib") > 0.0, "{stdout}");
    assert!(s.num("hub_cpu_s") > 0.0, "{stdout}");
}

#[test]
fn new_bindings_with_the_real_hub_binary_converge_and_report_their_figures() {
    let kleym = kleym_binary().expect("kleym binary");
    let kleym = kleym.to_str().expect("utf-8 path");
    let (stdout, s) = run_bench(&[
        "--scenario",
        "new-bindings",
        "--hub",
        "process",
        "--kleym-bin",
        kleym,
    ]);
    assert_eq!(s.str("scenario"), "new-bindings");
    assert!(stdout.contains("bindings created in"), "{stdout}");
    assert!(s.num("hub_peak_rss_mib") > 0.0, "{stdout}");
}

#[test]
fn cold_start_with_the_hub_in_process() {
    let (stdout, s) = run_bench(&["--hub", "in-process"]);
    // cold-start is the default.
    assert_eq!(s.str("scenario"), "cold-start");
    assert!(
        !stdout.contains("hub process (kleym"),
        "no child hub expected in-process:\n{stdout}"
    );
    assert!(!s.0.contains_key("hub_peak_rss_mib"), "{stdout}");
}

#[test]
fn bench_refuses_a_missing_hub_binary_with_the_build_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
        .args([
            "--spokes",
            "1",
            "--bindings",
            "1",
            "--kleym-bin",
            "/nonexistent/kleym",
        ])
        .output()
        .expect("fleet-bench runs");
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("/nonexistent/kleym"), "{all}");
}

#[test]
fn trickle_measures_new_bindings_on_the_converged_fleet() {
    let (stdout, s) = run_bench(&[
        "--scenario",
        "trickle",
        "--duration-seconds",
        "3",
        "--hub",
        "in-process",
    ]);
    assert_eq!(s.str("scenario"), "trickle");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("trickle summary: "))
        .unwrap_or_else(|| panic!("no trickle summary in:\n{stdout}"));
    let t: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    assert_eq!(t.get("bindings"), Some(&"3"), "{stdout}");
    assert_eq!(t.get("seen"), Some(&"3"), "{stdout}");
    // Writes unchanged: exactly finalizer, ClusterSPIFFEID apply and status apply.
    assert_eq!(t.get("writes_per_binding"), Some(&"3.00"), "{stdout}");
    let ms = |k: &str| -> f64 {
        t.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {line}"))
    };
    assert!(
        ms("p50_ms") <= ms("p99_ms") && ms("p99_ms") <= ms("max_ms"),
        "{stdout}"
    );
}

/// A chaos run keeps its seed and report with the replicas' logs (with `--keep-dir` here; a
/// failed run always keeps them), so a failure can be read and replayed when its console
/// output is gone.
#[test]
fn chaos_keeps_its_seed_and_report_with_the_logs() {
    let kleym = kleym_binary().expect("the kleym binary (cargo build -p kleym-hub --bin kleym)");
    let kleym = kleym.to_str().expect("a UTF-8 path");
    let stdout = bench_stdout(&[
        "--scenario",
        "chaos",
        "--spokes",
        "2",
        "--bindings",
        "2",
        "--duration-seconds",
        "5",
        "--quiet-seconds",
        "2",
        "--process-faults",
        "0",
        "--seed",
        "7",
        "--keep-dir",
        "--kleym-bin",
        kleym,
    ]);
    let kept = stdout
        .lines()
        .find_map(|l| l.strip_prefix("kept "))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("no kept dir in:\n{stdout}"));
    let read = |name: &str| {
        std::fs::read_to_string(kept.join(name))
            .unwrap_or_else(|e| panic!("{name} in {}: {e}", kept.display()))
    };
    assert_eq!(read("seed"), "7\n");
    let report = read("report.txt");
    assert!(
        report.contains("summary: scenario=chaos seed=7 "),
        "{report}"
    );
    assert!(
        stdout.contains(report.trim_end()),
        "{report}\n---\n{stdout}"
    );
    assert!(kept.join("hub-a.1.log").is_file(), "{}", kept.display());
    std::fs::remove_dir_all(&kept).unwrap();
}

/// `--scenario failover` with 2 replicas, a 2 s Lease, a 1 s trickle after the kill and the
/// debug `kleym`, plus `args`; its output.
fn small_failover(args: &[&str]) -> String {
    bench_with_debug_kleym(
        &[
            "--scenario",
            "failover",
            "--replicas",
            "2",
            "--lease-duration-seconds",
            "2",
            "--duration-seconds",
            "1",
        ],
        args,
    )
}

/// `fleet-bench` with `fixed`, a 120 s limit, the debug `kleym` and then `args`; its output.
fn bench_with_debug_kleym(fixed: &[&str], args: &[&str]) -> String {
    let kleym = kleym_binary().expect("the kleym binary (cargo build -p kleym-hub --bin kleym)");
    let kleym = kleym.to_str().expect("a UTF-8 path");
    let mut all = fixed.to_vec();
    all.extend_from_slice(&["--timeout-seconds", "120", "--kleym-bin", kleym]);
    all.extend_from_slice(args);
    bench_stdout(&all)
}

/// `--scenario failover` on a tiny fleet (3 spokes × 2 bindings, 2 replicas, a 2 s Lease):
/// the fleet converges, the Lease holder is killed, the binding created on one of its spokes
/// at that moment converges on the survivor, and the figures hang together: every spoke was
/// the leader's before the kill (leader mode, read from the spokes' request logs by user
/// agent) and the survivor's after it, the survivor reached the victim's spokes after the
/// kill, and no double write was seen.
#[test]
fn failover_kills_the_leader_and_its_spokes_converge_on_the_survivor() {
    let stdout = small_failover(&["--spokes", "3", "--bindings", "2"]);
    let s = Summary::parse(&stdout);
    let ctx = format!("in:\n{stdout}");
    assert_eq!(s.str("scenario"), "failover", "{ctx}");
    assert_eq!(s.str("shard_mode"), "leader", "{ctx}");
    assert_eq!(s.num("replicas"), 2.0, "{ctx}");
    // Leader mode: the Lease holder served every spoke, and it is the one killed.
    let victim = s.str("victim").to_string();
    assert!(
        stdout.contains(&format!("killed {victim} (Lease holder: {victim})")),
        "{ctx}"
    );
    assert_eq!(s.num("victim_spokes"), 3.0, "{ctx}");
    let survivor = if victim == "hub-0" { "hub-1" } else { "hub-0" };
    let before = if victim == "hub-0" {
        "hub-0:100.0,hub-1:0.0"
    } else {
        "hub-0:0.0,hub-1:100.0"
    };
    assert_eq!(s.str("share_before"), before, "{ctx}");
    assert!(
        s.str("share_after").contains(&format!("{survivor}:100.0")),
        "{ctx}"
    );
    // One failover binding per victim spoke (up to 10), all converged; no trickle on the
    // survivors' spokes in leader mode (it served none).
    assert_eq!(s.num("failover_bindings"), 3.0, "{ctx}");
    assert_eq!(s.num("failover_converged"), 3.0, "{ctx}");
    assert_eq!(s.num("survivors_bindings"), 0.0, "{ctx}");
    // The survivor could not write before it reached the spoke.
    assert!(s.num("takeover_max_ms") > 0.0, "{ctx}");
    assert!(
        s.num("failover_p50_ms") <= s.num("failover_max_ms"),
        "{ctx}"
    );
    assert_eq!(s.num("double_writes"), 0.0, "{ctx}");
    assert!(s.num("hub_peak_rss_mib_max") > 0.0, "{ctx}");
    // The hub's status objects describe the fleet no sooner than it converged, and the
    // replicas' CPU by then includes the cold start's.
    assert!(s.num("status_complete_s") >= s.num("converge_s"), "{ctx}");
    assert!(
        s.num("status_cpu_s_total") >= s.num("converge_cpu_s_total"),
        "{ctx}"
    );
}

/// `--replica-weights` gives each sharded replica its own `--shard-weight`: at `100,1` the
/// first replica serves nearly every spoke. The share is read from the spokes' own request
/// logs (who last reached each spoke), not from the hub; with weights 100 and 1 the chance
/// that hub-1 wins a given spoke is 1/101, so hub-1 serving 4 of 16 spokes or more (what
/// the assertion refuses) is as good as impossible, while equal weights give it about half.
#[test]
fn failover_gives_each_replica_its_own_weight() {
    let stdout = small_failover(&[
        "--shard-mode",
        "sharded",
        "--replica-weights",
        "100,1",
        "--spokes",
        "16",
        "--bindings",
        "1",
    ]);
    let s = Summary::parse(&stdout);
    let ctx = format!("in:\n{stdout}");
    assert!(stdout.contains("sharded mode, weights 100,1,"), "{ctx}");
    let share: HashMap<&str, f64> = s
        .str("share_before")
        .split(',')
        .filter_map(|kv| kv.split_once(':'))
        .map(|(k, v)| (k, v.parse().expect("a percentage")))
        .collect();
    let (heavy, light) = (share["hub-0"], share["hub-1"]);
    assert!(
        heavy > 75.0 && light < 25.0,
        "hub-0 {heavy} %, hub-1 {light} %: {ctx}"
    );
    // The replica serving the most spokes is the one killed.
    assert_eq!(s.str("victim"), "hub-0", "{ctx}");
    assert_eq!(s.num("double_writes"), 0.0, "{ctx}");
}

/// `--replica-weights` is refused, naming the flag, where it would mean nothing: in leader
/// mode, with a count other than one per replica, outside the failover scenario, and a
/// weight the hub would refuse.
#[test]
fn replica_weights_are_refused_where_they_mean_nothing() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--scenario", "failover", "--replica-weights", "2,1,1"],
            "needs --shard-mode sharded",
        ),
        (
            &[
                "--scenario",
                "failover",
                "--shard-mode",
                "sharded",
                "--replicas",
                "3",
                "--replica-weights",
                "2,1",
            ],
            "2 weights for 3 replicas",
        ),
        (
            &["--scenario", "chaos", "--replica-weights", "1,1"],
            "failover only",
        ),
        (
            &[
                "--scenario",
                "failover",
                "--shard-mode",
                "sharded",
                "--replica-weights",
                "0,1,1",
            ],
            "--replica-weights",
        ),
    ];
    assert_refused(&cases);
}

/// The bench allocates with jemalloc, as the `kleym` binary does: asked through
/// `_RJEM_MALLOC_CONF`, jemalloc prints its statistics at exit, which the platform's malloc
/// never does. Its figures (how fast a fleet converges while kubesim shares the cores)
/// depend on it (docs/benchmarks.md, "The commands").
#[cfg(not(target_env = "msvc"))]
#[test]
fn the_bench_allocates_with_jemalloc() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
        .arg("--help")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("fleet-bench runs");
    assert!(out.status.success(), "fleet-bench --help failed: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Begin jemalloc statistics"),
        "fleet-bench did not print jemalloc's statistics, so jemalloc is not its allocator; \
         stderr: {stderr}"
    );
}

/// `--running-replicas 1` of 3 sharded replicas on 30 spokes: the running replica counts
/// the two replica Leases the bench holds for the others (it owns a share, not the fleet;
/// owning all 30 by chance has odds of 3^-30), converges that share, and the bench found
/// from the spokes' own request logs that the spokes it reached are the ones that converged
/// (it exits non-zero otherwise). The figures hang together.
#[test]
fn running_replicas_converge_their_share_beside_the_stand_ins() {
    let stdout = share_alone(&[]);
    let s = Summary::parse(&stdout);
    let ctx = &stdout;
    assert_eq!(s.str("scenario"), "failover-share-alone", "{ctx}");
    assert_eq!(s.num("replicas"), 3.0, "{ctx}");
    assert_eq!(s.num("running"), 1.0, "{ctx}");
    // Read from the leader Lease in the hub cluster: the running replica leads.
    assert_eq!(s.str("leader"), "running", "{ctx}");
    let owned = s.num("owned");
    assert!((1.0..30.0).contains(&owned), "owned {owned}: {ctx}");
    let pct = s.num("share_pct");
    assert!(
        (pct - 100.0 * owned / 30.0).abs() < 0.06,
        "share {pct} % for {owned} of 30: {ctx}"
    );
    assert!(s.num("converge_s") > 0.0, "{ctx}");
    let cpu = s.num("converge_cpu_s_total");
    let estimate = s.num("fleet_cpu_s_estimate");
    assert!(
        (estimate - cpu * 30.0 / owned).abs() < 0.02,
        "estimate {estimate} from {cpu} s on {owned} spokes: {ctx}"
    );
    assert!(stdout.contains("replica hub-0 at converge"), "{ctx}");
    assert!(!stdout.contains("replica hub-1"), "only hub-0 runs: {ctx}");
}

/// With `--stand-in-leads` the bench holds the leader Lease too: at converge the Lease in
/// the hub cluster names a stand-in, and the running replica still converged its share.
#[test]
fn a_stand_in_can_hold_the_leader_lease() {
    let stdout = share_alone(&["--stand-in-leads"]);
    let s = Summary::parse(&stdout);
    assert_eq!(s.str("leader"), "stand-in", "{stdout}");
    assert!((1.0..30.0).contains(&s.num("owned")), "{stdout}");
}

/// `--scenario failover --shard-mode sharded --replicas 3 --running-replicas 1` on 30
/// spokes × 1 binding with the debug `kleym`, plus `args`; its output.
fn share_alone(args: &[&str]) -> String {
    bench_with_debug_kleym(
        &[
            "--scenario",
            "failover",
            "--shard-mode",
            "sharded",
            "--replicas",
            "3",
            "--running-replicas",
            "1",
            "--spokes",
            "30",
            "--bindings",
            "1",
        ],
        args,
    )
}

/// `--running-replicas` is refused, naming the flag, where it would mean nothing: in leader
/// mode, with as many running as there are replicas, and outside the failover scenario; so
/// is `--stand-in-leads` without it.
#[test]
fn running_replicas_are_refused_where_they_mean_nothing() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--scenario", "failover", "--running-replicas", "1"],
            "--running-replicas needs --shard-mode sharded",
        ),
        (
            &[
                "--scenario",
                "failover",
                "--shard-mode",
                "sharded",
                "--replicas",
                "2",
                "--running-replicas",
                "2",
            ],
            "must be below --replicas (2)",
        ),
        (
            &["--scenario", "trickle", "--running-replicas", "1"],
            "--running-replicas is a flag of --scenario failover only",
        ),
        (
            &["--scenario", "failover", "--stand-in-leads"],
            "--stand-in-leads needs --running-replicas",
        ),
    ];
    assert_refused(&cases);
}

/// Each `(args, says)`: fleet-bench refuses `args` (a non-zero exit before any work) with a
/// message containing `says`.
fn assert_refused(cases: &[(&[&str], &str)]) {
    for (args, says) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_fleet-bench"))
            .args(*args)
            .args(["--kleym-bin", env!("CARGO_BIN_EXE_fleet-bench")])
            .output()
            .expect("fleet-bench runs");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} was accepted:\n{all}");
        assert!(all.contains(says), "{args:?} did not say {says:?}:\n{all}");
    }
}
