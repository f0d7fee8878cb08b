//! How the real `kleym` binary finds its cluster and talks TLS to it, seen from servers of the
//! test's own on 127.0.0.1: `kleym report` is run with a controlled environment, and the test
//! records which server it connects to and what its TLS ClientHello offers.
//!
//! - The cipher-suite order the binary offers: AES-128-GCM first, as client-go does (`main`
//!   installs the order as the process's default; without that line rustls offers AES-256
//!   first).
//! - `--kubeconfig`, `--context`, `KUBECONFIG` with several files, `~/.kube/config`, and the
//!   error when none is found (the in-cluster fallback without a ServiceAccount), and a
//!   missing context named in the error.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use rustls::CipherSuite;

const KLEYM: &str = env!("CARGO_BIN_EXE_kleym");

/// A TCP server on 127.0.0.1 that counts the connections made to it and closes each at once
/// (the client fails right away instead of waiting for a TLS answer). A connection is
/// counted before it is closed, so once the client has exited every connection it made is
/// counted.
struct Recorder {
    addr: SocketAddr,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    seen: std::sync::atomic::AtomicUsize,
}

impl Recorder {
    fn new() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = count.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        Self {
            addr,
            count,
            seen: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// How many connections were made to it since the last call (call once the client has
    /// exited).
    fn connections(&self) -> usize {
        let now = self.count.load(std::sync::atomic::Ordering::SeqCst);
        now - self.seen.swap(now, std::sync::atomic::Ordering::SeqCst)
    }
}

/// A kubeconfig of contexts `a` and `b` (clusters `cluster-a`, `cluster-b` at the URLs
/// given), current context `current`.
fn kubeconfig(current: &str, a: &str, b: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {current}\n\
         clusters:\n- name: cluster-a\n  cluster: {{server: '{a}'}}\n\
         - name: cluster-b\n  cluster: {{server: '{b}'}}\n\
         contexts:\n- name: a\n  context: {{cluster: cluster-a, user: u}}\n\
         - name: b\n  context: {{cluster: cluster-b, user: u}}\n\
         users:\n- name: u\n  user: {{token: not-a-secret}}\n"
    )
}

/// `kleym report` with exactly `env` (nothing inherited: no stray `KUBECONFIG`, `HOME` or
/// in-cluster variables), `args` added.
fn kleym_report(env: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(KLEYM);
    cmd.arg("report").args(args).env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Which of `a` and `b` the client connected to (at least once) since the last call.
fn reached(a: &Recorder, b: &Recorder) -> (bool, bool) {
    (a.connections() > 0, b.connections() > 0)
}

#[test]
fn kubeconfig_variable_with_several_files_merges_them_and_uses_the_first_current_context() {
    let (a, b) = (Recorder::new(), Recorder::new());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    // The first file names the current context (b); the second defines it too, with a
    // different current context, which must lose (the first file's setting wins).
    let first = dir.path().join("first.yaml");
    std::fs::write(
        &first,
        "apiVersion: v1\nkind: Config\ncurrent-context: b\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    let second = dir.path().join("second.yaml");
    std::fs::write(&second, kubeconfig("a", &a.url(), &b.url())).unwrap();
    let list = std::env::join_paths([&first, &second]).unwrap();
    let out = kleym_report(&[("HOME", &home), ("KUBECONFIG", Path::new(&list))], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(reached(&a, &b), (false, true), "{}", stderr(&out));

    // --context picks another context of the same merged files.
    let out = kleym_report(
        &[("HOME", &home), ("KUBECONFIG", Path::new(&list))],
        &["--context", "a"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(reached(&a, &b), (true, false), "{}", stderr(&out));
}

#[test]
fn context_flag_selects_a_context_of_the_kubeconfig_flag_and_a_missing_one_is_named() {
    let (a, b) = (Recorder::new(), Recorder::new());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubeconfig");
    std::fs::write(&file, kubeconfig("b", &a.url(), &b.url())).unwrap();
    let kc = file.to_str().unwrap();
    // The file's current context without --context.
    let out = kleym_report(&[("HOME", dir.path())], &["--kubeconfig", kc]);
    assert_eq!(reached(&a, &b), (false, true), "{}", stderr(&out));
    // --context over the file's current context.
    let out = kleym_report(
        &[("HOME", dir.path())],
        &["--kubeconfig", kc, "--context", "a"],
    );
    assert_eq!(reached(&a, &b), (true, false), "{}", stderr(&out));
    // A context the file does not have: an error naming it, and no connection anywhere.
    let out = kleym_report(
        &[("HOME", dir.path())],
        &["--kubeconfig", kc, "--context", "staging-eu"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("staging-eu"), "{}", stderr(&out));
    assert!(stderr(&out).contains(kc), "{}", stderr(&out));
    assert_eq!(reached(&a, &b), (false, false), "{}", stderr(&out));
}

#[test]
fn home_kubeconfig_is_the_fallback_and_without_any_the_error_names_every_place_looked() {
    let (a, b) = (Recorder::new(), Recorder::new());
    let dir = tempfile::tempdir().unwrap();
    // ~/.kube/config when neither --kubeconfig nor KUBECONFIG is given.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    std::fs::write(
        home.join(".kube").join("config"),
        kubeconfig("a", &a.url(), &b.url()),
    )
    .unwrap();
    let out = kleym_report(&[("HOME", &home)], &[]);
    assert_eq!(reached(&a, &b), (true, false), "{}", stderr(&out));
    // ...with --context too.
    let out = kleym_report(&[("HOME", &home)], &["--context", "b"]);
    assert_eq!(reached(&a, &b), (false, true), "{}", stderr(&out));

    // No kubeconfig anywhere: the in-cluster fallback, here with the service variables
    // pointing at server a but no ServiceAccount token mounted, fails, and the error says
    // where kleym looked. Nothing is contacted.
    let empty = dir.path().join("empty-home");
    std::fs::create_dir(&empty).unwrap();
    let port = a.addr.port().to_string();
    let mut cmd = std::process::Command::new(KLEYM);
    let out = cmd
        .arg("report")
        .env_clear()
        .env("HOME", &empty)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no kubeconfig (KUBECONFIG, ~/.kube/config) and not running in a cluster"),
        "{err}"
    );
    assert_eq!(reached(&a, &b), (false, false), "{err}");
}

/// The cipher suites the real binary's Kubernetes client offers, in order, as a rustls server
/// on 127.0.0.1 reads them from its ClientHello.
async fn offered_cipher_suites() -> Vec<CipherSuite> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubeconfig");
    let url = format!("https://{addr}");
    std::fs::write(&file, kubeconfig("a", &url, &url)).unwrap();
    let mut child = tokio::process::Command::new(KLEYM)
        .args(["report", "--kubeconfig"])
        .arg(&file)
        .env_clear()
        .env("HOME", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (stream, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
        .await
        .expect("kleym connected in time")
        .unwrap();
    let acceptor =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = tokio::time::timeout(Duration::from_secs(60), acceptor)
        .await
        .expect("a ClientHello in time")
        .expect("a TLS ClientHello");
    let suites = start.client_hello().cipher_suites().to_vec();
    // The handshake is not answered: the client gives up, and is killed if it has not.
    drop(start);
    let _ = child.kill().await;
    suites
}

#[tokio::test]
async fn the_binary_offers_aes_128_gcm_first_as_client_go_does() {
    let suites = offered_cipher_suites().await;
    let position = |s: CipherSuite| suites.iter().position(|x| *x == s);
    let aes128 = position(CipherSuite::TLS13_AES_128_GCM_SHA256).expect("AES-128-GCM offered");
    let aes256 = position(CipherSuite::TLS13_AES_256_GCM_SHA384).expect("AES-256-GCM offered");
    assert_eq!(
        aes128, 0,
        "AES-128-GCM is the first suite offered: {suites:?}"
    );
    assert!(aes128 < aes256, "{suites:?}");
    // The TLS 1.2 suites too: AES-128 before AES-256 for each key type.
    for (a, b) in [
        (
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
    ] {
        if let (Some(a), Some(b)) = (position(a), position(b)) {
            assert!(a < b, "{suites:?}");
        }
    }
}
