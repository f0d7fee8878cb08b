//! Credential cache and spoke client: expiry-driven refresh before expiry in the background
//! (a hung plugin blocks nobody), one exec under concurrency, 401 → one re-exec and one retry,
//! 401-driven re-execs backing off exponentially when the server keeps rejecting (also when
//! the 401 arrives during a background refresh), credentials without expiry kept, expired
//! plugin output refused, runs that die without a result or whose cache is dropped cleaned up.

use crate::http401;
use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use kleym_hub::access::ExecApiVersion;
use kleym_hub::backoff::BackoffOptions;
use kleym_hub::credentials::cache::refresh_deadline;
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialCache, CredentialMetrics, ExecOptions, SpokeClient,
    SpokeCredentials, build_spoke_client,
};
use prometheus_client::registry::Registry;
use support::*;

const V1: &str = "client.authentication.k8s.io/v1";

fn cache_opts() -> CacheOptions {
    CacheOptions {
        failure_backoff: Duration::from_millis(0),
        exec: ExecOptions {
            timeout: Duration::from_secs(20),
            ..ExecOptions::default()
        },
        ..CacheOptions::default()
    }
}

fn spoke(
    script_body: &str,
    server: &str,
) -> (tempfile::TempDir, Arc<SpokeCredentials>, CredentialMetrics) {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", script_body);
    let mut registry = Registry::default();
    let metrics = CredentialMetrics::register(&mut registry);
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, server),
        cache_opts(),
        metrics.clone(),
    ));
    (dir, creds, metrics)
}

/// A plugin driven by files the test writes: run `n` prints `cred-<n>.json` (and fails when it
/// does not exist), and blocks while `hold-<n>` exists. `started-<n>` marks that run `n` began.
fn file_plugin() -> String {
    format!(
        r#"{COUNT}
touch "$KLEYM_TEST_DIR/started-$n"
while [ -f "$KLEYM_TEST_DIR/hold-$n" ]; do sleep 0.02; done
cat "$KLEYM_TEST_DIR/cred-$n.json""#
    )
}

fn write_cred(dir: &Path, n: usize, token: &str, expires_at: DateTime<Utc>) {
    let doc = serde_json::json!({
        "apiVersion": V1, "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)},
    });
    std::fs::write(dir.join(format!("cred-{n}.json")), doc.to_string()).unwrap();
}

fn file_spoke(opts: CacheOptions) -> (tempfile::TempDir, Arc<SpokeCredentials>, CredentialMetrics) {
    file_spoke_for(opts, "https://spoke:6443")
}

fn file_spoke_for(
    opts: CacheOptions,
    server: &str,
) -> (tempfile::TempDir, Arc<SpokeCredentials>, CredentialMetrics) {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &file_plugin());
    let metrics = CredentialMetrics::default();
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, server),
        opts,
        metrics.clone(),
    ));
    (dir, creds, metrics)
}

/// Options under which a credential valid for 60 s is due for a background refresh 200 ms
/// after it was obtained.
fn early_refresh(opts: CacheOptions) -> CacheOptions {
    CacheOptions {
        refresh_fraction: 1.0,
        min_refresh_interval: Duration::from_millis(200),
        ..opts
    }
}

fn in_an_hour() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::hours(1)
}

fn in_a_minute() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::seconds(60)
}

/// Polls `done` every 20 ms, up to 1000 times (a bound for a broken build, not a timing claim).
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

async fn sleep_until(at: DateTime<Utc>) {
    if let Ok(d) = (at - Utc::now()).to_std() {
        tokio::time::sleep(d + Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn refreshes_before_expiry_and_callers_never_see_a_gap() {
    // An 8 s token with a 75 % margin: refresh due 2 s after it was obtained, 6 s before it
    // expires. A refresh at (or after) expiry would fail the `< expires_at` assertions.
    let opts = CacheOptions {
        refresh_fraction: 0.75,
        min_refresh_interval: Duration::from_secs(1),
        ..cache_opts()
    };
    let (dir, creds, metrics) = file_spoke(opts);
    write_cred(
        dir.path(),
        1,
        "tok-1",
        Utc::now() + chrono::Duration::seconds(8),
    );
    write_cred(
        dir.path(),
        2,
        "tok-2",
        Utc::now() + chrono::Duration::hours(1),
    );
    let first = creds.get().await.unwrap();
    assert_eq!(first.credential.token.as_ref().unwrap().expose(), "tok-1");
    let old_expiry = first.credential.expires_at.unwrap();
    let deadline = refresh_deadline(first.obtained_at, old_expiry, &opts);
    assert!(deadline < old_expiry);
    assert_eq!(creds.get().await.unwrap().generation, first.generation);
    assert_eq!(count(dir.path()), 1);

    let mut refreshed = None;
    for _ in 0..1000 {
        let c = creds.get().await.unwrap();
        let seen_at = Utc::now();
        // Every caller gets an unexpired credential, right up to the switch.
        assert!(
            seen_at < c.credential.expires_at.unwrap(),
            "served an expired credential (generation {})",
            c.generation
        );
        if c.generation != first.generation {
            refreshed = Some((c, seen_at));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (refreshed, seen_at) = refreshed.expect("credential was never refreshed");
    assert_eq!(
        refreshed.credential.token.as_ref().unwrap().expose(),
        "tok-2"
    );
    // The new exec ran inside [refresh deadline, old expiry), and a caller had it before the
    // old credential expired.
    assert!(refreshed.obtained_at >= deadline, "refreshed too early");
    assert!(refreshed.obtained_at < old_expiry, "refreshed after expiry");
    assert!(
        seen_at < old_expiry,
        "callers saw the new credential only after expiry"
    );
    assert_eq!(count(dir.path()), 2);
    assert_eq!(metrics.exec_count("test", "success"), 2);
}

#[tokio::test]
async fn a_hung_refresh_never_blocks_callers_while_the_credential_is_valid() {
    let opts = CacheOptions {
        refresh_fraction: 1.0,
        min_refresh_interval: Duration::from_millis(200),
        exec: ExecOptions {
            timeout: Duration::from_secs(30),
            ..ExecOptions::default()
        },
        ..cache_opts()
    };
    let (dir, creds, metrics) = file_spoke(opts);
    write_cred(
        dir.path(),
        1,
        "tok-1",
        Utc::now() + chrono::Duration::seconds(60),
    );
    write_cred(
        dir.path(),
        2,
        "tok-2",
        Utc::now() + chrono::Duration::hours(1),
    );
    // Run 2 (the refresh) hangs until the test lets it go.
    std::fs::write(dir.path().join("hold-2"), "").unwrap();
    let first = creds.get().await.unwrap();
    sleep_until(refresh_deadline(
        first.obtained_at,
        first.credential.expires_at.unwrap(),
        &opts,
    ))
    .await;

    // Due for refresh: served at once, the refresh starts in the background.
    assert_eq!(creds.get().await.unwrap().generation, first.generation);
    eventually("the refresh started", || {
        dir.path().join("started-2").exists()
    })
    .await;
    for _ in 0..20 {
        assert_eq!(creds.get().await.unwrap().generation, first.generation);
    }
    // One run in flight, and it has not ended: had a caller waited for it, it would have
    // timed out (and later callers would have started more runs).
    assert_eq!(count(dir.path()), 2);
    assert_eq!(metrics.exec_count("test", "success"), 1);
    assert_eq!(metrics.exec_count("test", "timeout"), 0);

    std::fs::remove_file(dir.path().join("hold-2")).unwrap();
    eventually("the refresh finished", || {
        metrics.exec_count("test", "success") == 2
    })
    .await;
    let second = creds.get().await.unwrap();
    assert_eq!(second.credential.token.as_ref().unwrap().expose(), "tok-2");
    assert_eq!(count(dir.path()), 2);
}

#[tokio::test]
async fn an_exec_survives_the_caller_that_started_it() {
    let (dir, creds, metrics) = file_spoke(cache_opts());
    std::fs::write(dir.path().join("hold-1"), "").unwrap();
    let caller = {
        let creds = creds.clone();
        tokio::spawn(async move { creds.get().await })
    };
    eventually("the exec started", || dir.path().join("started-1").exists()).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    write_cred(
        dir.path(),
        1,
        "tok-1",
        Utc::now() + chrono::Duration::hours(1),
    );
    std::fs::remove_file(dir.path().join("hold-1")).unwrap();
    eventually("the exec finished", || {
        metrics.exec_count("test", "success") == 1
    })
    .await;
    // Cached: the next caller needs no exec.
    let c = creds.get().await.unwrap();
    assert_eq!(c.credential.token.as_ref().unwrap().expose(), "tok-1");
    assert_eq!(count(dir.path()), 1);
}

#[tokio::test]
async fn an_expiry_in_the_past_is_invalid_output_and_backs_off() {
    let body = format!(
        "{COUNT}\n{}",
        print_token(V1, "tok-$n", Some("2020-01-01T00:00:00Z"))
    );
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &body);
    let metrics = CredentialMetrics::default();
    let creds = SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        CacheOptions {
            failure_backoff: Duration::from_secs(600),
            ..cache_opts()
        },
        metrics.clone(),
    );
    for _ in 0..10 {
        let err = creds.get().await.unwrap_err();
        assert!(
            err.to_string()
                .contains("status.expirationTimestamp that is not in the future"),
            "{err}"
        );
    }
    assert_eq!(count(dir.path()), 1);
    assert_eq!(metrics.exec_count("test", "invalid_output"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_exec_for_fifty_concurrent_callers() {
    let body = format!("{COUNT}\nsleep 0.3\n{}", print_token(V1, "tok-$n", None));
    let (dir, creds, metrics) = spoke(&body, "https://spoke:6443");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let creds = creds.clone();
            tokio::spawn(async move { creds.get().await.unwrap().generation })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 1);
    }
    assert_eq!(count(dir.path()), 1);
    assert_eq!(metrics.exec_count("test", "success"), 1);
}

#[tokio::test]
async fn credential_without_expiry_is_kept_until_a_401() {
    let body = format!("{COUNT}\n{}", print_token(V1, "tok-$n", None));
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &body);
    // Options under which a credential with any expiry would be refreshed 10 ms after it was
    // obtained, many times over during the half second below.
    let creds = SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        CacheOptions {
            refresh_fraction: 1.0,
            min_refresh_interval: Duration::from_millis(10),
            ..cache_opts()
        },
        CredentialMetrics::default(),
    );
    let first = creds.get().await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(creds.get().await.unwrap().generation, first.generation);
    }
    assert_eq!(count(dir.path()), 1);
    creds.invalidate_after_401(first.generation);
    creds.invalidate_after_401(first.generation);
    let second = creds.get().await.unwrap();
    assert_eq!(second.credential.token.as_ref().unwrap().expose(), "tok-2");
    // A late 401 report about the replaced credential changes nothing.
    creds.invalidate_after_401(first.generation);
    assert_eq!(creds.get().await.unwrap().generation, second.generation);
    assert_eq!(count(dir.path()), 2);
}

#[tokio::test]
async fn failed_refresh_keeps_a_still_valid_credential_but_not_after_a_401() {
    // Run 1 succeeds with a token valid for 60 s, refresh due after 200 ms; run 2 fails (no
    // cred-2.json).
    let opts = CacheOptions {
        refresh_fraction: 1.0,
        min_refresh_interval: Duration::from_millis(200),
        failure_backoff: Duration::from_secs(600),
        ..cache_opts()
    };
    let (dir, creds, metrics) = file_spoke(opts);
    write_cred(
        dir.path(),
        1,
        "tok-1",
        Utc::now() + chrono::Duration::seconds(60),
    );
    let first = creds.get().await.unwrap();
    sleep_until(refresh_deadline(
        first.obtained_at,
        first.credential.expires_at.unwrap(),
        &opts,
    ))
    .await;
    // Past the refresh deadline, before expiry: the refresh fails in the background and the
    // still-valid credential keeps being served, without another run during the backoff.
    assert_eq!(creds.get().await.unwrap().generation, first.generation);
    eventually("the refresh failed", || {
        metrics.exec_count("test", "exit_error") == 1
    })
    .await;
    for _ in 0..5 {
        assert_eq!(creds.get().await.unwrap().generation, first.generation);
    }
    // After a 401 the old credential must not be served again: the failure surfaces.
    creds.invalidate_after_401(first.generation);
    let err = creds.get().await.unwrap_err();
    assert!(err.to_string().contains("exit code 1"), "{err}");
    assert_eq!(metrics.exec_count("test", "exit_error"), 1);
    assert_eq!(count(dir.path()), 2);
}

#[tokio::test]
async fn cache_reuses_slot_until_effective_access_changes() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &print_token(V1, "t", None));
    let cache = CredentialCache::new(cache_opts(), CredentialMetrics::default());
    let a = access_for(&s, ExecApiVersion::V1, "https://spoke:6443");
    let one = cache.for_access(&a);
    assert!(Arc::ptr_eq(&one, &cache.for_access(&a.clone())));
    let mut moved = a.clone();
    moved.cluster.server = "https://elsewhere:6443".into();
    assert!(!Arc::ptr_eq(&one, &cache.for_access(&moved)));
}

/// A server that takes the bearer tokens `accept` takes, a plugin that prints `tok-1`,
/// `tok-2`, … (counting its runs in the returned directory), and a spoke client of both.
async fn token_server_client(
    accept: fn(&str) -> bool,
) -> (http401::Seen, tempfile::TempDir, SpokeClient) {
    let (addr, seen) = http401::start(accept).await;
    let body = format!("{COUNT}\n{}", print_token(V1, "tok-$n", None));
    let (dir, creds, _) = spoke(&body, &format!("http://{addr}"));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    (seen, dir, client)
}

fn accept_second(token: &str) -> bool {
    token == "tok-2"
}

#[tokio::test]
async fn a_401_triggers_one_reexec_and_one_retry() {
    let (seen, dir, client) = token_server_client(accept_second).await;
    let v = client.client.apiserver_version().await.unwrap();
    assert_eq!(v.git_version, "v1.33.0");
    assert_eq!(seen.list(), vec!["Bearer tok-1", "Bearer tok-2"]);
    assert_eq!(count(dir.path()), 2);
    // Subsequent requests reuse the refreshed credential.
    client.client.apiserver_version().await.unwrap();
    assert_eq!(seen.list().last().unwrap(), "Bearer tok-2");
    assert_eq!(count(dir.path()), 2);
    assert!(!client.needs_rebuild().await);
}

#[tokio::test]
async fn the_reconcilers_writes_get_the_token_and_the_401_retry_beside_kubes_buffer() {
    let (seen, dir, client) = token_server_client(accept_second).await;
    let writes = client
        .cluster_client()
        .writes
        .expect("a spoke client sends writes directly");
    let get = || http::Request::get("/version").body(Vec::new()).unwrap();
    let (status, body) = writes.send_write(get()).await.unwrap();
    assert_eq!(status, http::StatusCode::OK);
    assert!(
        String::from_utf8_lossy(&body).contains("v1.33.0"),
        "{body:?}"
    );
    assert_eq!(seen.list(), vec!["Bearer tok-1", "Bearer tok-2"]);
    assert_eq!(count(dir.path()), 2);
    // Both ways share one credential layer: kube's client sends the refreshed token too.
    client.client.apiserver_version().await.unwrap();
    writes.send_write(get()).await.unwrap();
    assert_eq!(
        seen.list()[2..],
        ["Bearer tok-2".to_string(), "Bearer tok-2".to_string()]
    );
    assert_eq!(count(dir.path()), 2);
}

#[tokio::test]
async fn a_write_rejected_twice_returns_the_401_after_one_retry() {
    let (seen, dir, client) = token_server_client(accept_none).await;
    let writes = client.cluster_client().writes.unwrap();
    let request = http::Request::patch("/apis/kleym.io/v1alpha1/namespaces/a/x/b")
        .body(b"{}".to_vec())
        .unwrap();
    let (status, _) = writes.send_write(request).await.unwrap();
    assert_eq!(status, http::StatusCode::UNAUTHORIZED);
    assert_eq!(seen.list(), vec!["Bearer tok-1", "Bearer tok-2"]);
    assert_eq!(count(dir.path()), 2);
}

fn accept_none(_: &str) -> bool {
    false
}

#[tokio::test]
async fn a_persistent_401_is_retried_only_once() {
    let (seen, dir, client) = token_server_client(accept_none).await;
    let err = client.client.apiserver_version().await.unwrap_err();
    assert!(
        err.to_string().contains("401") || err.to_string().contains("Unauthorized"),
        "{err}"
    );
    assert_eq!(seen.list(), vec!["Bearer tok-1", "Bearer tok-2"]);
    assert_eq!(count(dir.path()), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_401s_cause_a_single_reexec() {
    let (addr, seen) = http401::start(accept_second).await;
    let body = format!("{COUNT}\nsleep 0.2\n{}", print_token(V1, "tok-$n", None));
    let (dir, creds, _) = spoke(&body, &format!("http://{addr}"));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let c = client.client.clone();
            tokio::spawn(async move { c.apiserver_version().await.map(|v| v.git_version) })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "v1.33.0");
    }
    assert_eq!(count(dir.path()), 2, "requests seen: {:?}", seen.list());
}

fn persistent_401_opts(initial: Duration) -> CacheOptions {
    CacheOptions {
        unauthorized_backoff: BackoffOptions {
            initial,
            max: initial,
        },
        ..cache_opts()
    }
}

#[tokio::test]
async fn a_server_that_always_401s_causes_a_bounded_number_of_execs() {
    let (addr, seen) = http401::start(accept_none).await;
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!("{COUNT}\n{}", print_token(V1, "tok-$n", None)),
    );
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, &format!("http://{addr}")),
        persistent_401_opts(Duration::from_secs(600)),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    const N: usize = 30;
    for _ in 0..N {
        assert!(client.client.apiserver_version().await.is_err());
    }
    // tok-1 rejected → one re-exec (tok-2), rejected too → re-execs back off; the rejected
    // token keeps being sent, so every request still reaches the server once.
    assert_eq!(count(dir.path()), 2, "execs for {N} requests");
    let sent = seen.list();
    assert_eq!(sent.len(), N + 1);
    assert!(sent[2..].iter().all(|a| a == "Bearer tok-2"), "{sent:?}");
}

#[tokio::test]
async fn a_server_that_always_401s_gets_doubling_delays_between_reexecs() {
    let (addr, seen) = http401::start(accept_none).await;
    let dir = tempfile::tempdir().unwrap();
    // Each run records when it started (ns since the epoch).
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!(
            "{COUNT}\ndate +%s%N >> \"$KLEYM_TEST_DIR/starts\"\n{}",
            print_token(V1, "tok-$n", None)
        ),
    );
    let initial = Duration::from_millis(100);
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, &format!("http://{addr}")),
        CacheOptions {
            unauthorized_backoff: BackoffOptions {
                initial,
                max: Duration::from_secs(60),
            },
            ..cache_opts()
        },
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    // Run 1 builds the client, run 2 is the 401-driven re-exec, then one run per backoff.
    const BACKOFFS: usize = 4;
    let mut requests = 0;
    while count(dir.path()) < 2 + BACKOFFS {
        assert!(requests < 5000, "only {} runs", count(dir.path()));
        assert!(client.client.apiserver_version().await.is_err());
        requests += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A run only starts on a request, and a request starts at most one.
    assert_eq!(count(dir.path()), 2 + BACKOFFS);
    let starts: Vec<u128> = std::fs::read_to_string(dir.path().join("starts"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(starts.len(), 2 + BACKOFFS);
    // After the k-th consecutive rejection the next re-exec waits initial × 2^(k-1), times a
    // jitter factor in [0.5, 1): lower bounds only, which no slowness can break.
    for k in 1..=BACKOFFS {
        let gap = Duration::from_nanos((starts[k + 1] - starts[k]) as u64);
        let floor = initial * (1 << (k - 1)) / 2;
        assert!(
            gap >= floor,
            "re-exec after rejection {k} came {gap:?} after the previous one, under {floor:?}"
        );
    }
    // Every request reached the server once, plus one retry per re-exec made after a 401: the
    // first request's (run 2), and any whose backoff ran out while the request was in flight
    // (otherwise the re-exec happens as a request starts, and is not retried).
    let sent = seen.list().len();
    assert!(
        (requests + 1..=requests + 1 + BACKOFFS).contains(&sent),
        "{sent} sends for {requests} requests"
    );
}

static ACCEPTED: AtomicUsize = AtomicUsize::new(0);

fn accept_current(token: &str) -> bool {
    token == format!("tok-{}", ACCEPTED.load(Ordering::SeqCst))
}

#[tokio::test]
async fn the_401_backoff_expires_and_a_success_resets_it() {
    ACCEPTED.store(3, Ordering::SeqCst);
    let (addr, _seen) = http401::start(accept_current).await;
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!("{COUNT}\n{}", print_token(V1, "tok-$n", None)),
    );
    // Long enough that the two requests below, one right after the other, fall inside the
    // shortest jittered backoff (half of it) however slow the machine; the test waits it out
    // once.
    let backoff = Duration::from_secs(2);
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, &format!("http://{addr}")),
        persistent_401_opts(backoff),
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
    // tok-1 and its replacement tok-2 are rejected: backing off.
    assert!(client.client.apiserver_version().await.is_err());
    assert!(client.client.apiserver_version().await.is_err());
    assert_eq!(count(dir.path()), 2);
    // After the backoff (at most 2 s with jitter) the next 401 re-execs: tok-3 is accepted.
    tokio::time::sleep(backoff + Duration::from_millis(100)).await;
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "v1.33.0"
    );
    assert_eq!(count(dir.path()), 3);
    // The server rotates: tok-3 is rejected now. tok-3 was accepted, so this is an ordinary
    // rotation: one re-exec and one retry at once, no backoff.
    ACCEPTED.store(4, Ordering::SeqCst);
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "v1.33.0"
    );
    assert_eq!(count(dir.path()), 4);
}

fn accept_third(token: &str) -> bool {
    token == "tok-3"
}

#[tokio::test]
async fn a_401_blames_the_bearer_token_sent_even_when_refreshed_after_the_client_was_built() {
    // Bearer tokens are set per request from the cache, so a client built with generation 1
    // sends generation 2 after a background refresh, and a 401 must reject generation 2.
    let (addr, seen) = http401::start(accept_third).await;
    let opts = early_refresh(cache_opts());
    let (dir, creds, metrics) = file_spoke_for(opts, &format!("http://{addr}"));
    write_cred(dir.path(), 1, "tok-1", in_a_minute());
    write_cred(dir.path(), 2, "tok-2", in_an_hour());
    write_cred(dir.path(), 3, "tok-3", in_an_hour());
    let client = build_spoke_client(creds.clone(), &ClientOptions::default())
        .await
        .unwrap();
    let first = creds.get().await.unwrap();
    sleep_until(refresh_deadline(
        first.obtained_at,
        first.credential.expires_at.unwrap(),
        &opts,
    ))
    .await;
    creds.get().await.unwrap();
    eventually("the background refresh finished", || {
        metrics.exec_count("test", "success") == 2
    })
    .await;
    assert_eq!(
        client.client.apiserver_version().await.unwrap().git_version,
        "v1.33.0"
    );
    assert_eq!(seen.list(), vec!["Bearer tok-2", "Bearer tok-3"]);
    assert_eq!(count(dir.path()), 3);
    assert!(!client.needs_rebuild().await);
}

#[tokio::test]
async fn a_401_during_a_background_refresh_puts_the_refreshed_credential_on_probation() {
    let (addr, seen) = http401::start(accept_none).await;
    let opts = early_refresh(persistent_401_opts(Duration::from_secs(600)));
    let (dir, creds, _) = file_spoke_for(opts, &format!("http://{addr}"));
    write_cred(dir.path(), 1, "tok-1", in_a_minute());
    // The plugin caches its token: the refresh returns the one the server just revoked.
    write_cred(dir.path(), 2, "tok-1", in_an_hour());
    write_cred(dir.path(), 3, "tok-3", in_an_hour());
    std::fs::write(dir.path().join("hold-2"), "").unwrap();
    let client = build_spoke_client(creds.clone(), &ClientOptions::default())
        .await
        .unwrap();
    let first = creds.get().await.unwrap();
    sleep_until(refresh_deadline(
        first.obtained_at,
        first.credential.expires_at.unwrap(),
        &opts,
    ))
    .await;
    // The background refresh starts, and hangs until released.
    assert_eq!(creds.get().await.unwrap().generation, first.generation);
    eventually("the refresh started", || {
        dir.path().join("started-2").exists()
    })
    .await;
    // Meanwhile a request is rejected: its retry waits for the refresh in flight.
    let request = {
        let c = client.client.clone();
        tokio::spawn(async move { c.apiserver_version().await })
    };
    eventually("the 401 was reported", || {
        creds.get().now_or_never().is_none()
    })
    .await;
    std::fs::remove_file(dir.path().join("hold-2")).unwrap();
    assert!(request.await.unwrap().is_err());
    assert_eq!(seen.list(), vec!["Bearer tok-1", "Bearer tok-1"]);
    assert_eq!(count(dir.path()), 2);
    // The refreshed credential replaced a rejected one and was rejected too: 401-driven
    // re-execs back off, as after any re-exec'ed credential that is rejected.
    for _ in 0..3 {
        assert!(client.client.apiserver_version().await.is_err());
    }
    assert_eq!(count(dir.path()), 2);
    assert_eq!(seen.list().len(), 5);
}

#[test]
fn a_background_refresh_that_dies_with_its_runtime_does_not_block_the_next_one() {
    let opts = early_refresh(cache_opts());
    let (dir, creds, metrics) = file_spoke(opts);
    write_cred(dir.path(), 1, "tok-1", in_a_minute());
    write_cred(dir.path(), 2, "tok-2", in_an_hour());
    write_cred(dir.path(), 3, "tok-3", in_an_hour());
    std::fs::write(dir.path().join("hold-2"), "").unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first_runtime = runtime();
    let first = first_runtime.block_on(async {
        let first = creds.get().await.unwrap();
        sleep_until(refresh_deadline(
            first.obtained_at,
            first.credential.expires_at.unwrap(),
            &opts,
        ))
        .await;
        assert_eq!(creds.get().await.unwrap().generation, first.generation);
        eventually("the refresh started", || {
            dir.path().join("started-2").exists()
        })
        .await;
        first
    });
    // The refresh task goes away with its runtime, without a result and without a waiter.
    drop(first_runtime);
    runtime().block_on(async {
        // Still valid, still due: served at once, and a new refresh starts.
        assert_eq!(creds.get().await.unwrap().generation, first.generation);
        eventually("a new refresh ran", || {
            metrics.exec_count("test", "success") == 2
        })
        .await;
        let c = creds.get().await.unwrap();
        assert_eq!(c.credential.token.as_ref().unwrap().expose(), "tok-3");
    });
    assert_eq!(count(dir.path()), 3);
}

#[test]
fn a_run_that_dies_with_its_runtime_is_recorded_as_a_failure() {
    let (dir, creds, _) = file_spoke(CacheOptions {
        failure_backoff: Duration::from_secs(600),
        ..cache_opts()
    });
    write_cred(dir.path(), 1, "tok-1", in_an_hour());
    write_cred(dir.path(), 2, "tok-2", in_an_hour());
    std::fs::write(dir.path().join("hold-1"), "").unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first_runtime = runtime();
    first_runtime.block_on(async {
        // Starts run 1; nobody waits for it.
        assert!(creds.get().now_or_never().is_none());
        eventually("the run started", || dir.path().join("started-1").exists()).await;
    });
    drop(first_runtime);
    runtime().block_on(async {
        // The failure is remembered like any other: no new run during the failure backoff.
        for _ in 0..3 {
            let err = creds.get().await.unwrap_err();
            assert!(
                err.to_string()
                    .contains("the plugin run ended without a result"),
                "{err}"
            );
        }
    });
    assert_eq!(count(dir.path()), 1);
}

#[tokio::test]
async fn dropping_the_cache_kills_its_plugin_run() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        r#"echo $$ > "$KLEYM_TEST_DIR/self.pid"
sleep 300 & echo $! > "$KLEYM_TEST_DIR/child.tmp"; mv "$KLEYM_TEST_DIR/child.tmp" "$KLEYM_TEST_DIR/child.pid"
wait"#,
    );
    let creds = SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        CacheOptions {
            // Far beyond the polling below: only the drop can end this run in time.
            exec: ExecOptions {
                timeout: Duration::from_secs(600),
                ..ExecOptions::default()
            },
            ..cache_opts()
        },
        CredentialMetrics::default(),
    );
    // Starts the run; nobody waits for it.
    assert!(creds.get().now_or_never().is_none());
    let child_file = dir.path().join("child.pid");
    eventually("the plugin started its child", || child_file.exists()).await;
    let pid = |f: &str| -> u32 {
        std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (plugin, child) = (pid("self.pid"), pid("child.pid"));
    assert!(!process_gone(plugin) && !process_gone(child));
    drop(creds);
    eventually("the plugin's process group was killed", || {
        process_gone(plugin) && process_gone(child)
    })
    .await;
}
