//! `kleym report` as a user runs it: the real binary, table and JSON/YAML output, the
//! `--fail-on` exit codes, the hub API form (`--server`, bearer token), and errors (exit 2).
//! Also how `kleym report --server` and `kleym explain --hub-url` (one client) treat the hub's
//! answers: any answer is final, only a request without an answer is retried.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;

use chrono::{TimeZone, Utc};
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};
use kleym_hub::report::{
    BindingSnapshot, Caps, FullReport, Health, SpokeObservation, bound_report, shared,
};

fn kleym(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kleym runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn binding(ns: &str, name: &str, id: &str, sa: &str) -> BindingSnapshot {
    BindingSnapshot {
        namespace: ns.into(),
        name: name.into(),
        mode: IdentityMode::PerObjective,
        spiffe_ids: vec![id.into()],
        service_account: Some(sa.into()),
        container_discriminator: Some("k8s:container-name:vllm".into()),
        pool_selector: vec![("app".into(), "vllm".into())],
        ready: true,
        ..Default::default()
    }
}

fn spoke(cluster: &str, bindings: Vec<BindingSnapshot>) -> SpokeObservation {
    SpokeObservation {
        cluster: cluster.into(),
        credentials: Health::Ok,
        reachable: Health::Ok,
        synced: Health::Ok,
        bindings: shared(bindings),
        ..Default::default()
    }
}

/// east: a collision pair and a warning; east/west: cross-cluster drift.
fn fleet(with_collisions: bool, with_warning: bool) -> Vec<SpokeObservation> {
    let mut east = vec![binding(
        "team-d",
        "drift",
        "spiffe://td/ns/team-d/objective/o",
        "sa-east",
    )];
    if with_collisions {
        for (me, peer) in [("chat", "summarize"), ("summarize", "chat")] {
            let mut b = binding(
                "team-a",
                me,
                &format!("spiffe://td/ns/team-a/objective/{me}"),
                "vllm",
            );
            b.ready = false;
            b.reason = Some("Conflict".into());
            b.conflict_peers = vec![ConflictPeer {
                name: peer.into(),
                reason: "IdentityCollision".into(),
            }];
            east.push(b);
        }
    }
    if with_warning {
        let mut b = binding("team-b", "z", "spiffe://td/ns/team-b/objective/z", "sa");
        b.warnings = vec![IdentityWarning {
            reason: "OverlappingDefaultIdentity".into(),
            message:
                "ClusterSPIFFEID default also selects the pods; set `fallback: true` on default"
                    .into(),
        }];
        east.push(b);
    }
    let west_sa = if with_collisions {
        "sa-west"
    } else {
        "sa-east"
    };
    vec![
        spoke("fleet/east", east),
        spoke(
            "fleet/west",
            vec![binding(
                "team-d",
                "drift",
                "spiffe://td/ns/team-d/objective/o",
                west_sa,
            )],
        ),
    ]
}

fn full(with_collisions: bool, with_warning: bool) -> FullReport {
    FullReport::build(
        &fleet(with_collisions, with_warning),
        Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
    )
}

fn write_report(dir: &tempfile::TempDir, name: &str, value: &impl serde::Serialize) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, serde_json::to_vec(value).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn table_groups_by_finding() {
    let dir = tempfile::tempdir().unwrap();
    // The object as `kubectl get fleetidentityreport fleet -o json` prints it.
    let object = serde_json::json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "FleetIdentityReport",
        "metadata": {"name": "fleet"},
        "spec": {},
        "status": bound_report(&full(true, true).summary, &Caps::default()),
    });
    let file = write_report(&dir, "object.json", &object);
    let out = kleym(&["report", "--file", &file, "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("Findings: 3 (2 collisions, 1 warnings)"),
        "{text}"
    );
    assert!(text.contains("[1] COLLISION IdentityCollision"), "{text}");
    assert!(text.contains("[2] COLLISION CrossClusterDrift"), "{text}");
    assert!(
        text.contains("[3] WARNING OverlappingDefaultIdentity"),
        "{text}"
    );
    assert!(
        text.contains("SPIFFE ID: spiffe://td/ns/team-d/objective/o"),
        "{text}"
    );
    // Members as rows under a header, in each finding.
    assert!(text.contains("CLUSTER     NAMESPACE  BINDING"), "{text}");
    assert!(text.contains("fleet/east  team-a     chat"), "{text}");
    assert!(text.contains("fleet/east  team-a     summarize"), "{text}");
    assert!(text.contains("fleet/west  team-d     drift"), "{text}");
    assert!(
        text.contains(
            "Fix: in cluster fleet/east, namespace team-a: PerObjective bindings chat, summarize"
        ),
        "{text}"
    );
    assert!(text.contains("set `fallback: true` on default"), "{text}");
}

#[test]
fn json_and_yaml_print_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let report = full(true, true);
    let file = write_report(&dir, "full.json", &report);
    let out = kleym(&["report", "-f", &file, "-o", "json", "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let back: FullReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back, report);
    let out = kleym(&["report", "-f", &file, "-o", "yaml", "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let back: FullReport = kleym_api::yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(back, report);
}

#[test]
fn fail_on_sets_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let collisions = write_report(&dir, "c.json", &full(true, true));
    let warnings_only = write_report(&dir, "w.json", &full(false, true));
    let clean = write_report(&dir, "clean.json", &full(false, false));
    for (file, collision, warning) in [(&collisions, 1, 1), (&warnings_only, 0, 1), (&clean, 0, 0)]
    {
        let code = |fail_on: &str| {
            kleym(&["report", "-f", file, "--fail-on", fail_on])
                .status
                .code()
        };
        assert_eq!(code("collision"), Some(collision), "{file}");
        assert_eq!(code("warning"), Some(warning), "{file}");
        assert_eq!(code("none"), Some(0), "{file}");
    }
    // The default is --fail-on collision.
    assert_eq!(kleym(&["report", "-f", &collisions]).status.code(), Some(1));
    assert_eq!(
        kleym(&["report", "-f", &warnings_only]).status.code(),
        Some(0)
    );
    let out = kleym(&["report", "-f", &clean]);
    assert!(stdout(&out).contains("No findings."), "{}", stdout(&out));
}

#[test]
fn unreadable_reports_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let out = kleym(&["report", "-f", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("kleym report: reading"));
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "[1, 2").unwrap();
    assert_eq!(
        kleym(&["report", "-f", garbage.to_str().unwrap()])
            .status
            .code(),
        Some(2)
    );
    // Flag misuse is clap's exit 2 as well.
    assert_eq!(
        kleym(&["report", "--token-file", "x"]).status.code(),
        Some(2)
    );
}

/// Serve `responses` (status, body) one connection each on 127.0.0.1; report each request's
/// head through the channel.
fn serve(responses: Vec<(u16, String)>) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for (status, body) in responses {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    (format!("http://{addr}"), rx)
}

#[test]
fn server_form_reads_the_full_report_with_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cr3t-token\n").unwrap();
    let body = serde_json::to_string(&full(true, false)).unwrap();
    let unauthorized = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"invalid bearer token","reason":"Unauthorized","code":401}"#;
    let (url, requests) = serve(vec![(200, body), (401, unauthorized.to_string())]);
    let token = token_file.to_str().unwrap();

    let out = kleym(&[
        "report",
        "--server",
        &url,
        "--token-file",
        token,
        "-o",
        "json",
        "--fail-on",
        "collision",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let back: FullReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back.summary.finding_counts.collisions, 2);
    assert_eq!(back.spokes.len(), 2, "the full form carries every spoke");
    let head = requests.recv().unwrap();
    // The full form's table also lists the spokes.
    let (url2, _requests2) = serve(vec![(
        200,
        serde_json::to_string(&full(true, false)).unwrap(),
    )]);
    let out = kleym(&["report", "--server", &url2, "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("CLUSTER     READY  REASON            BINDINGS  NOT READY"),
        "{text}"
    );
    assert!(
        text.contains("fleet/east  False  BindingsNotReady  3         2"),
        "{text}"
    );
    assert!(head.starts_with("GET /v1/report HTTP/1.1"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer s3cr3t-token\r\n"),
        "{head}"
    );

    let out = kleym(&["report", "--server", &url, "--token-file", token]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/v1/report"), "{stderr}");
    assert!(
        !stderr.contains("s3cr3t") && !stdout(&out).contains("s3cr3t"),
        "token leaked: {stderr}"
    );
}

/// Serve every connection on 127.0.0.1 until the test ends: read the request's head, count
/// it, then close the first `drops` connections without an answer and answer the others with
/// `status` and `body`. The count is taken before answering, so once the client has its
/// answer every request it sent is counted.
fn serve_counting(drops: usize, status: u16, body: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let n = seen.fetch_add(1, Ordering::SeqCst);
            if n < drops {
                continue; // dropped: the connection closes without an answer
            }
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    (format!("http://{addr}"), count)
}

#[test]
fn a_503_from_the_hub_is_an_answer_reported_at_once() {
    // A follower that has not read the published status yet.
    let not_published = r#"{"code":503,"reason":"NotPublished","message":"the leader has not published the fleet status yet"}"#;
    let (url, requests) = serve_counting(0, 503, not_published.to_string());
    let out = kleym(&["report", "--server", &url]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/v1/report: the hub answered 503 Service Unavailable (NotPublished): the leader has not published the fleet status yet"),
        "{stderr}"
    );
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "retried a 503: {stderr}"
    );

    // A replica that does not run the spoke asked about.
    let not_here = r#"{"code":503,"reason":"SpokeNotReachable","message":"this replica does not run cluster fleet/spoke-1's spoke; the leader does","cluster":{"namespace":"fleet","name":"spoke-1"}}"#;
    let (url, requests) = serve_counting(0, 503, not_here.to_string());
    let out = kleym(&[
        "explain",
        "pod",
        "serving/vllm-0",
        "--hub-url",
        &url,
        "--cluster",
        "fleet/spoke-1",
        "--trust-domain",
        "example.org",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/v1/clusters/fleet/spoke-1/explain/pod/serving/vllm-0: the hub answered 503 Service Unavailable (SpokeNotReachable): this replica does not run cluster fleet/spoke-1's spoke; the leader does"),
        "{stderr}"
    );
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "retried a 503: {stderr}"
    );
}

#[test]
fn a_request_without_an_answer_is_retried_a_bounded_number_of_times() {
    // Two connections closed without an answer (a replica restarting), then the report.
    let body = serde_json::to_string(&full(false, false)).unwrap();
    let (url, requests) = serve_counting(2, 200, body);
    let out = kleym(&["report", "--server", &url, "--fail-on", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 3);

    // Never an answer: three attempts, then a failure that says so.
    let (url, requests) = serve_counting(usize::MAX, 200, String::new());
    let out = kleym(&["report", "--server", &url]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no answer after 3 attempts"), "{stderr}");
    assert_eq!(requests.load(Ordering::SeqCst), 3);
}
