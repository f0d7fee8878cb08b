//! Credential cache and spoke client: expiry-driven refresh, one exec under concurrency,
//! 401 → one re-exec and one retry, credentials without expiry kept.

#[path = "fixtures/http401.rs"]
mod http401;
#[path = "fixtures/support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use kleym_hub::access::ExecApiVersion;
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialCache, CredentialMetrics, ExecOptions, SpokeCredentials,
    build_spoke_client,
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

#[tokio::test]
async fn refreshes_ahead_of_expiry() {
    // Each exec issues tok-<n> valid for 2 s; 10% of that (0.2 s) is the early-refresh margin.
    let body = format!(
        "{COUNT}\nexp=$(date -u -d '+2 seconds' +%Y-%m-%dT%H:%M:%SZ)\n{}",
        print_token(V1, "tok-$n", Some("$exp"))
    );
    let (dir, creds, metrics) = spoke(&body, "https://spoke:6443");
    let first = creds.get().await.unwrap();
    let again = creds.get().await.unwrap();
    assert_eq!(count(dir.path()), 1);
    assert_eq!(first.generation, again.generation);
    assert_eq!(first.credential.token.as_ref().unwrap().expose(), "tok-1");
    let mut refreshed = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = creds.get().await.unwrap();
        if c.generation != first.generation {
            refreshed = Some(c);
            break;
        }
    }
    let refreshed = refreshed.expect("credential was not refreshed before/at expiry");
    assert_eq!(
        refreshed.credential.token.as_ref().unwrap().expose(),
        "tok-2"
    );
    // Refreshed no later than the old expiry.
    assert!(
        chrono::Utc::now() <= first.credential.expires_at.unwrap() + chrono::Duration::seconds(1)
    );
    assert_eq!(count(dir.path()), 2);
    assert_eq!(metrics.exec_count("test", "success"), 2);
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
    let (dir, creds, _) = spoke(&body, "https://spoke:6443");
    let first = creds.get().await.unwrap();
    for _ in 0..5 {
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
    // First run succeeds with a token valid for ~4 s, later runs fail.
    let body = format!(
        "{COUNT}\nif [ \"$n\" -gt 1 ]; then echo nope >&2; exit 1; fi\nexp=$(date -u -d '+4 seconds' +%Y-%m-%dT%H:%M:%SZ)\n{}",
        print_token(V1, "tok-$n", Some("$exp"))
    );
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &body);
    let metrics = CredentialMetrics::default();
    let opts = CacheOptions {
        refresh_fraction: 0.9,
        ..cache_opts()
    };
    let creds = SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        opts,
        metrics.clone(),
    );
    let first = creds.get().await.unwrap();
    // Past the refresh deadline (≈ 10% into the lifetime) but before expiry: the refresh
    // fails and the still-valid credential is served.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let again = creds.get().await.unwrap();
    assert_eq!(again.generation, first.generation);
    assert_eq!(metrics.exec_count("test", "exit_error"), 1);
    // After a 401 the old credential must not be served again: the failure surfaces.
    creds.invalidate_after_401(first.generation);
    let err = creds.get().await.unwrap_err();
    assert!(err.to_string().contains("exit code 1"), "{err}");
    assert_eq!(metrics.exec_count("test", "exit_error"), 2);
    assert_eq!(count(dir.path()), 3);
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

fn accept_second(token: &str) -> bool {
    token == "tok-2"
}

#[tokio::test]
async fn a_401_triggers_one_reexec_and_one_retry() {
    let (addr, seen) = http401::start(accept_second).await;
    let body = format!("{COUNT}\n{}", print_token(V1, "tok-$n", None));
    let (dir, creds, _) = spoke(&body, &format!("http://{addr}"));
    let client = build_spoke_client(creds.clone(), &ClientOptions::default())
        .await
        .unwrap();
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

fn accept_none(_: &str) -> bool {
    false
}

#[tokio::test]
async fn a_persistent_401_is_retried_only_once() {
    let (addr, seen) = http401::start(accept_none).await;
    let body = format!("{COUNT}\n{}", print_token(V1, "tok-$n", None));
    let (dir, creds, _) = spoke(&body, &format!("http://{addr}"));
    let client = build_spoke_client(creds, &ClientOptions::default())
        .await
        .unwrap();
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
