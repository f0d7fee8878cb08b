//! The real `kleym hub` binary against kubesim: engages a spoke through a plugin script,
//! compiles its bindings, serves `/healthz`, `/readyz` and `/metrics` (and the probes alone
//! on `--health-addr`), never logs the token
//! (logs captured at trace level for kleym), and exits cleanly on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, wait_for};
use kleym_e2e::fixtures::hub_process::read_listen_addrs;
use kleym_e2e::fixtures::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::profiles::register_admin_token_spoke;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "tok-binary-secret-0123456789abcdef";
const LIMIT: Duration = Duration::from_secs(60);

async fn get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleym_hub_binary_converges_serves_health_and_stops_on_sigterm() {
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke"], dir.path()).await.unwrap();
    let s = f.spoke("spoke");
    register_admin_token_spoke(&f.hub_client, "spoke", &s, "ok", TOKEN, 2, 0..2)
        .await
        .unwrap();
    let store = s.store();
    let plugin = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "ok", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str().unwrap()}}]})
        .to_string(),
    )
    .unwrap();

    // kleym's admission policy bounds the hub's user on the spoke, as on every fleet test's.
    f.install_admission_policies(&["--trust-domain".into(), "bin.example".into()])
        .unwrap();
    // Both listeners on ports the child chooses; it names them in --listen-addrs-file.
    let addrs_file = dir.path().join("listen-addrs.json");
    let mut child = tokio::process::Command::new(&kleym)
        .args(["hub", "--kubeconfig"])
        .arg(f.hub_kubeconfig())
        .arg("--clusterprofile-provider-file")
        .arg(&pf)
        .args([
            "--trust-domain",
            "bin.example",
            "--leader-elect=false",
            "--log-format",
            "json",
        ])
        .args(["--log-level", "info,kleym_hub=trace,kleym_spoke=trace"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--health-addr", "127.0.0.1:0"])
        .arg("--listen-addrs-file")
        .arg(&addrs_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_task = tokio::spawn(async move {
        let mut o = String::new();
        let _ = stdout.read_to_string(&mut o).await;
        o
    });
    let err_task = tokio::spawn(async move {
        let mut e = String::new();
        let _ = stderr.read_to_string(&mut e).await;
        e
    });

    let addrs = read_listen_addrs(&addrs_file, LIMIT)
        .await
        .expect("the hub names its listeners");
    let (addr, health_addr) = (addrs["metrics"], addrs["health"]);
    assert_ne!(addr, health_addr, "two listeners");
    wait_for("bindings compiled by the kleym binary", LIMIT, || {
        let store = store.clone();
        async move { env::converged(&store, 2).then_some(()) }
    })
    .await
    .unwrap();
    assert!(env::csids(&store).iter().all(|o| {
        o["spec"]["spiffeIDTemplate"]
            .as_str()
            .unwrap()
            .starts_with("spiffe://bin.example/")
    }));
    let healthz = get(addr, "/healthz").await.unwrap();
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let readyz = wait_for("readyz", LIMIT, || async move {
        get(addr, "/readyz")
            .await
            .filter(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await
    .unwrap();
    assert!(readyz.ends_with("ok"));
    // The probe port answers the probes the same, and serves no metrics.
    let healthz = get(health_addr, "/healthz").await.unwrap();
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let readyz = get(health_addr, "/readyz").await.unwrap();
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    let none = get(health_addr, "/metrics").await.unwrap();
    assert!(none.starts_with("HTTP/1.1 404"), "{none}");
    let metrics = wait_for("engaged in metrics", LIMIT, || async move {
        get(addr, "/metrics")
            .await
            .filter(|m| m.contains("kleym_hub_spokes{phase=\"Engaged\"} 1"))
    })
    .await
    .unwrap();
    // The one engagement was observed by the engage-latency histogram.
    assert!(
        metrics.contains("kleym_hub_spoke_engage_duration_seconds_count 1"),
        "engage latency: {metrics}"
    );
    assert!(
        metrics.contains("provider=\"ok\""),
        "exec metrics by provider: {metrics}"
    );

    // SIGTERM → clean exit.
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("kleym hub exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let logs = format!("{}{}", out_task.await.unwrap(), err_task.await.unwrap());
    assert!(logs.contains("spoke engaged"), "{logs}");
    assert!(logs.contains("kleym hub stopped"), "{logs}");
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
}
