//! The real `kleym spoke` binary against kubesim: it converges 200 bindings, stops on
//! SIGTERM, and a restart with an invalid `--trust-domain` (flag, environment variable, or
//! empty) is refused at start-up with exit code 2 naming the flag — before it connects —
//! so no ClusterSPIFFEID is touched. Before this check such a restart refused every binding
//! (`InvalidTrustDomain`) and deleted all 200 ClusterSPIFFEIDs within seconds.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kubesim_store::Cluster;

const BINDINGS: usize = 200;
const LIMIT: Duration = Duration::from_secs(120);

/// `name → resourceVersion` of every ClusterSPIFFEID.
fn csid_versions(store: &Cluster) -> BTreeMap<String, String> {
    env::csids(store)
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// `kleym spoke` with `args`, without inheriting the variables its flags read.
fn kleym_spoke(kubeconfig: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kleym_binary().expect("kleym binary"));
    cmd.arg("spoke")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        // A port of its own choosing: nothing here reads it.
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(args)
        .env_remove("KLEYM_TRUST_DOMAIN")
        .env_remove("KLEYM_SPIRE_CLASS_NAME")
        .env_remove("KLEYM_LOG")
        .env_remove("POD_NAME")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_an_invalid_trust_domain_is_refused_and_withdraws_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let spoke = f.spoke("spoke");
    let store = spoke.store();
    env::seed_environment(&store, BINDINGS).unwrap();
    env::create_bindings(&store, 0..BINDINGS).unwrap();
    let kubeconfig = dir.path().join("spoke.kubeconfig");
    std::fs::write(&kubeconfig, spoke.kubeconfig_yaml()).unwrap();

    // Converge with a valid trust domain, then stop.
    let mut child = kleym_spoke(&kubeconfig, &["--trust-domain", "prod.example.org"])
        .spawn()
        .unwrap();
    wait_for("200 bindings compiled by kleym spoke", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, BINDINGS).then_some(()) }
    })
    .await
    .unwrap();
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("kleym spoke exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let before = csid_versions(&store);
    assert_eq!(before.len(), BINDINGS);

    // Restarts with an invalid trust domain: usage error, nothing written.
    let bad: [(&[&str], Option<&str>, &str); 4] = [
        (
            &["--trust-domain", "Fleet.Example"],
            None,
            "not a SPIFFE trust domain",
        ),
        (
            &["--trust-domain", "spiffe://prod.example.org"],
            None,
            "without spiffe://",
        ),
        (
            &["--trust-domain", ""],
            None,
            "a SPIFFE trust domain is required",
        ),
        (&[], Some("Fleet.Example"), "not a SPIFFE trust domain"),
    ];
    for (args, env_value, needle) in bad {
        let mut cmd = kleym_spoke(&kubeconfig, args);
        if let Some(v) = env_value {
            cmd.env("KLEYM_TRUST_DOMAIN", v);
        }
        // A hang guard: a binary that accepted the value would run until killed.
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{args:?} {env_value:?}: kleym spoke kept running"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} {env_value:?}: {stderr}"
        );
        assert!(
            stderr.contains("--trust-domain") && stderr.contains(needle),
            "{args:?} {env_value:?}: {stderr}"
        );
    }
    assert_eq!(
        csid_versions(&store),
        before,
        "no ClusterSPIFFEID was deleted or written"
    );
}
