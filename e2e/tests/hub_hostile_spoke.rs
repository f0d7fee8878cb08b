//! A hostile spoke API server, or a hostile plugin, cannot exhaust the real `kleym hub`
//! process:
//! - a spoke whose watch streams one endless line (64 MiB without a newline, again on every
//!   retry) and one whose list answers with a 64 MiB body cost the hub a bounded amount of
//!   memory (its peak RSS, `VmHWM` of the child process, grows by far less than one such
//!   response), each fails with an error naming the limit, and a binding created meanwhile
//!   on a healthy spoke still converges;
//! - run as PID 1 (in a pid namespace of its own, as in the image), the hub leaves no
//!   zombies behind after plugins that started children were killed on timeout.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::hub_process::{HubProcess, log_tail};
use kleym_e2e::fixtures::plugins::{count_runs, kleym_binary, static_token_plugin, write_script};
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use kubesim::ErrorRule;
use kubesim::faults::EndlessBody;
use serde_json::json;

const BINDINGS: usize = 3;
const TOKEN: &str = "tok-hostile-0123456789";
const LIMIT: Duration = Duration::from_secs(90);
/// What each hostile response holds: far more than any limit of the hub.
const ENDLESS: u64 = 64 * 1024 * 1024;
/// The peak RSS growth allowed: the watch event limit (8 MiB) and the response limit of the
/// test (4 MiB), with room for the allocator and the connection's buffers; far below the
/// 64 MiB the hub held for one endless line before lines were limited.
const GROWTH_BOUND_MIB: u64 = 32;

fn providers_file(dir: &Path, plugin: &Path) -> std::path::PathBuf {
    let pf = dir.join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "p", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();
    pf
}

fn hub_flags(pf: &Path, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

fn peak_rss_kib(hub: &HubProcess) -> u64 {
    hub.usage().expect("the hub is running").peak_rss_kib
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_watch_line_or_body_costs_the_hub_a_bounded_amount_and_spares_the_others() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let names = ["healthy", "endless-watch", "endless-list"];
    let f = FleetHarness::start(&names, dir.path()).await.unwrap();
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = providers_file(dir.path(), &plugin);
    for n in names {
        // One objective more than bindings: room for the binding created later.
        register_admin_token_spoke(
            &f.hub_client,
            n,
            &f.spoke(n),
            "p",
            TOKEN,
            BINDINGS + 1,
            0..BINDINGS,
        )
        .await
        .unwrap();
    }
    // Every list of InferencePools answers with a body of 64 MiB, from the start.
    f.spoke("endless-list")
        .faults()
        .add_endless_body(EndlessBody {
            verb: "list".into(),
            resource: "inferencepools".into(),
            bytes: ENDLESS,
        });
    let flags = hub_flags(
        &pf,
        &["--max-response-mib", "4", "--max-backoff-seconds", "2"],
    );
    f.install_admission_policies(&flags).unwrap();
    let log = dir.path().join("hub.log");
    let mut hub = HubProcess::spawn(&kleym, &f.hub_kubeconfig(), &flags, &log).unwrap();
    for n in ["healthy", "endless-watch"] {
        let store = f.spoke(n).store();
        wait_for(&format!("{n} converged"), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));
    }
    let list_faults = f.spoke("endless-list").faults();
    wait_for("two endless lists read", LIMIT, || {
        let ended = list_faults.endless_stats().ended;
        async move { (ended >= 2).then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));
    // From now on its lists just fail: what follows measures the endless watch alone.
    list_faults.clear();
    list_faults
        .add_error_rule(ErrorRule {
            verb: Some("list".into()),
            resource: Some("inferencepools".into()),
            rate: 1.0,
            code: 500,
        })
        .unwrap();
    let before = peak_rss_kib(&hub);

    // Now every watch of namespaces streams 64 MiB of one line, and the open ones end.
    let watch_faults = f.spoke("endless-watch").faults();
    watch_faults.add_endless_body(EndlessBody {
        verb: "watch".into(),
        resource: "namespaces".into(),
        bytes: ENDLESS,
    });
    watch_faults.drop_watches();
    wait_for("three endless watches read", LIMIT, || {
        let ended = watch_faults.endless_stats().ended;
        async move { (ended >= 3).then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));
    hub.check_running().unwrap();

    // A binding created now on the healthy spoke converges.
    let healthy = f.spoke("healthy").store();
    env::create_bindings(&healthy, BINDINGS..BINDINGS + 1).unwrap();
    wait_for("the new binding converged", LIMIT, || {
        let store = healthy.clone();
        async move { env::converged(&store, BINDINGS + 1).then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));

    let after = peak_rss_kib(&hub);
    let grown_mib = after.saturating_sub(before) / 1024;
    let watch_stats = watch_faults.endless_stats();
    let list_stats = list_faults.endless_stats();
    println!(
        "hub peak RSS {} MiB before the endless watches, {} MiB after (+{grown_mib} MiB); \
         endless watches {watch_stats:?}, endless lists {list_stats:?}",
        before / 1024,
        after / 1024,
    );
    assert!(
        grown_mib < GROWTH_BOUND_MIB,
        "the hub's peak RSS grew by {grown_mib} MiB (bound {GROWTH_BOUND_MIB} MiB) while \
         {watch_stats:?} endless watch lines were served"
    );

    // Each failure names the limit, and the watch's names the cluster.
    let text = std::fs::read_to_string(&log).unwrap();
    let watch_failure = text
        .lines()
        .find(|l| l.contains("watch failed") && l.contains("fleet/endless-watch"))
        .unwrap_or_else(|| {
            panic!(
                "no watch failure of fleet/endless-watch:\n{}",
                log_tail(&log, 40)
            )
        });
    assert!(
        watch_failure.contains("larger than 8 MiB (8388608 bytes)")
            && watch_failure.contains("ServerError"),
        "{watch_failure}"
    );
    let list_failure = text
        .lines()
        .find(|l| l.contains("spoke engagement failed") && l.contains("fleet/endless-list"))
        .unwrap_or_else(|| {
            panic!(
                "no engagement failure of fleet/endless-list:\n{}",
                log_tail(&log, 40)
            )
        });
    assert!(
        list_failure.contains("larger than 4 MiB (4194304 bytes)")
            && list_failure.contains("--max-response-mib"),
        "{list_failure}"
    );
    hub.kill().await.unwrap();
}

/// The process tree under `root`, by `/proc`: pid → (parent pid, state letter).
fn processes() -> HashMap<u32, (u32, char)> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        out.insert(pid, (ppid, state));
    }
    out
}

/// Zombies among the descendants of `root`.
fn zombies_under(root: u32) -> Vec<u32> {
    let procs = processes();
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            match procs.get(&pid) {
                Some((ppid, _)) if *ppid == root => return true,
                Some((ppid, _)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    let mut zombies: Vec<u32> = procs
        .iter()
        .filter(|(pid, (_, state))| *state == 'Z' && descends(**pid))
        .map(|(pid, _)| *pid)
        .collect();
    zombies.sort_unstable();
    zombies
}

/// As PID 1 of a pid namespace (`unshare --pid --fork --mount-proc`, which needs root or
/// CAP_SYS_ADMIN; the image runs kleym as its entrypoint, PID 1 of the container), the hub
/// runs a plugin
/// that starts a child in its process group and one in a session of its own, then hangs;
/// each run is killed on timeout. Whatever those runs left behind is reaped: no zombie
/// stays under the hub. Before kleym reaped as PID 1, every run left two zombies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_the_hub_reaps_what_plugins_killed_on_timeout_leave() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["stuck"], dir.path()).await.unwrap();
    let runs = dir.path().join("runs");
    let plugin = write_script(
        dir.path(),
        "stuck.sh",
        &format!(
            "#!/bin/sh\necho run >> '{}'\nsleep 600 &\nsetsid sh -c 'sleep 0.2' &\nexec sleep 600\n",
            runs.display()
        ),
    )
    .unwrap();
    let pf = providers_file(dir.path(), &plugin);
    register_admin_token_spoke(
        &f.hub_client,
        "stuck",
        &f.spoke("stuck"),
        "p",
        TOKEN,
        1,
        0..1,
    )
    .await
    .unwrap();
    // The hub as PID 1 of a new pid namespace (and a /proc of its own).
    let wrapper = write_script(
        dir.path(),
        "pid1.sh",
        &format!(
            "#!/bin/sh\nexec unshare --pid --fork --mount-proc '{}' \"$@\"\n",
            kleym.display()
        ),
    )
    .unwrap();
    let flags = hub_flags(
        &pf,
        &["--exec-timeout-seconds", "1", "--max-backoff-seconds", "1"],
    );
    f.install_admission_policies(&flags).unwrap();
    let log = dir.path().join("hub.log");
    let mut hub = HubProcess::spawn(&wrapper, &f.hub_kubeconfig(), &flags, &log).unwrap();
    // Four runs started: at least three were killed on timeout.
    wait_for("four plugin runs", LIMIT, || {
        let n = count_runs(&runs);
        async move { (n >= 4).then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));
    hub.check_running()
        .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&log, 40)));
    let root = hub.pid();
    // Left behind at every run: an orphan killed with the plugin's group, one that exits
    // 0.2 s later. Reaped, none stays a zombie.
    let reaped = wait_for("no zombie under the hub", Duration::from_secs(20), || {
        let zombies = zombies_under(root);
        async move { zombies.is_empty().then_some(()) }
    })
    .await;
    let zombies = zombies_under(root);
    hub.kill().await.unwrap();
    assert!(
        reaped.is_ok(),
        "zombies under the hub running as PID 1 after {} plugin runs: {zombies:?}",
        count_runs(&runs)
    );
}
