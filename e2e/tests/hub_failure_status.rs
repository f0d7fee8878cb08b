//! What a failing spoke's `ClusterIdentityStatus` shows while the hub retries, and what of a
//! failing credential plugin's output gets out of the hub, on kubesim with the status loop.
//!
//! 1. Four spokes fail from the start: a plugin exiting non-zero, a plugin hanging until the
//!    exec timeout, a server answering 401 (the token revoked by a kubesim fault) and a
//!    blackholed server. Every version of their `ClusterIdentityStatus` written after the
//!    first failure, and the status computed from every state the supervisor publishes, is
//!    `Ready=False` with the failure's reason, while `consecutiveFailures` grows and
//!    `nextRetryTime` is set; the retry attempts themselves are sampled (before the fix they
//!    showed `Ready=Unknown`, `Pending`, "not observed yet"). Once each fault is cleared the
//!    status turns `Ready=True` without the failure fields.
//! 2. Plugins print `client secret is swordfishcorrecthorse` (no redaction pattern matches
//!    it) and exit 1, print it and hang until killed, or print it around invalid JSON. Their
//!    statuses name the exit code, the timeout or the broken rule and stderr's hash; the
//!    string is in no object of any cluster (statuses, the fleet report, Events) and in no
//!    response of the hub API.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use http_body_util::BodyExt;
use kleym_api::hub_status::{ClusterIdentityStatus, ClusterIdentityStatusStatus, condition_types};
use kleym_e2e::fixtures::harness::{FleetHarness, RunningHub, parse_hub_args, wait_for};
use kleym_e2e::fixtures::plugins::{static_token_plugin, write_script};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, register_admin_token_spoke};
use kleym_hub::fleet::Phase;
use kleym_hub::report::{SpokeObservation, cluster_status};
use kleym_hub::runtime::{HubStartOptions, api_router, start_hub_with};
use kleym_hub::status::{StatusLoopOptions, WriterOptions};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use sha2::Digest;

const LIMIT: Duration = Duration::from_secs(90);
const TOKEN: &str = "tok-failing-0123456789";
const BINDINGS: usize = 2;
const SECRET: &str = "swordfishcorrecthorse";

/// A status loop fast enough to write (nearly) every state: test timescales.
fn status_options() -> StatusLoopOptions {
    StatusLoopOptions {
        writer: WriterOptions {
            min_interval: Duration::from_millis(100),
            sync_refresh: Duration::from_secs(300),
        },
        min_rebuild: Duration::from_millis(50),
        tick: Duration::from_millis(500),
        ..StatusLoopOptions::default()
    }
}

/// An in-process hub with the status loop (as `kleym hub` runs it) and its API router
/// (`--api-auth-mode off`: the API's content is under test here, not its authentication).
/// kleym's admission policy is installed on the spokes first, as `FleetHarness::start_hub` does.
async fn start(
    f: &FleetHarness,
    providers: &[(&str, String)],
    extra: &[&str],
) -> (RunningHub, axum::Router) {
    let pf = f.dir.join("providers.json");
    let entries: Vec<Value> = providers
        .iter()
        .map(|(name, command)| {
            json!({"name": name, "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": command,
                "interactiveMode": "Never"}})
        })
        .collect();
    std::fs::write(&pf, json!({"providers": entries}).to_string()).unwrap();
    let flags: Vec<String> = [
        "--clusterprofile-provider-file",
        pf.to_str().unwrap(),
        "--trust-domain",
        "fleet.example",
        "--leader-elect=false",
        "--exec-timeout-seconds",
        "1",
        "--request-timeout-seconds",
        "2",
        "--connect-timeout-seconds",
        "2",
        "--max-backoff-seconds",
        "1",
        "--api-insecure-http",
        "--api-auth-mode",
        "off",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let args = parse_hub_args(&flags).unwrap();
    f.install_admission_policies(&flags).unwrap();
    let client = f.hub.kube_client().await.unwrap();
    let shutdown = CancellationToken::new();
    let handle = start_hub_with(
        &args,
        client.clone(),
        HubStartOptions {
            status: Some(status_options()),
            coordination: None,
        },
        shutdown.clone(),
    )
    .unwrap();
    let app = api_router(&handle, &args.api, client);
    (RunningHub { handle, shutdown }, app)
}

/// One observed status of a spoke: from a written object, or computed from a published
/// state (then with the phase it was computed in).
#[derive(Debug, Clone)]
struct Sample {
    phase: Option<Phase>,
    ready: String,
    reason: String,
    message: String,
    failures: Option<i64>,
    next_retry: bool,
}

impl Sample {
    fn of(phase: Option<Phase>, status: &ClusterIdentityStatusStatus) -> Option<Self> {
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == condition_types::READY)?;
        Some(Sample {
            phase,
            ready: ready.status.clone(),
            reason: ready.reason.clone(),
            message: ready.message.clone(),
            failures: status.consecutive_failures,
            next_retry: status.next_retry_time.is_some(),
        })
    }
}

/// Samples per spoke (profile name), in the order they were seen.
type Samples = Arc<Mutex<BTreeMap<String, Vec<Sample>>>>;

fn push(samples: &Samples, spoke: &str, s: Sample) {
    samples
        .lock()
        .unwrap()
        .entry(spoke.to_string())
        .or_default()
        .push(s);
}

fn snapshot(samples: &Samples, spoke: &str) -> Vec<Sample> {
    samples
        .lock()
        .unwrap()
        .get(spoke)
        .cloned()
        .unwrap_or_default()
}

/// Records every version of every `ClusterIdentityStatus` in the profile namespace (a watch
/// delivers each write) until `stop`.
fn sample_objects(client: kube::Client, samples: Samples, stop: CancellationToken) {
    tokio::spawn(async move {
        let api: Api<ClusterIdentityStatus> = Api::namespaced(client, PROFILE_NS);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.next() => e,
            };
            let obj = match event {
                Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => o,
                Some(_) => continue,
                None => return,
            };
            let (Some(name), Some(status)) = (obj.metadata.name.as_deref(), obj.status.as_ref())
            else {
                continue;
            };
            if let Some(s) = Sample::of(None, status) {
                push(&samples, name, s);
            }
        }
    });
}

/// Records the status computed from every state the supervisor publishes for `spokes`.
fn sample_states(
    state: kleym_hub::fleet::FleetState,
    spokes: &'static [&'static str],
    samples: Samples,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let mut changes = state.subscribe();
        loop {
            for name in spokes {
                if let Some(s) = state.get(&format!("{PROFILE_NS}/{name}")) {
                    let status =
                        cluster_status(&SpokeObservation::from(&s), chrono::Utc::now(), None);
                    if let Some(sample) = Sample::of(Some(s.phase), &status) {
                        push(&samples, name, sample);
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
    });
}

/// A phase of a retry attempt in progress (the ones that used to show "not observed yet").
fn in_retry_attempt(s: &Sample) -> bool {
    matches!(
        s.phase,
        Some(Phase::Connecting | Phase::Queued | Phase::Syncing)
    )
}

/// Checks one spoke's samples: nothing but `Unknown` before the first failure, then only
/// `Ready=False` with `reason`, a failure count that never goes back and a retry time, until
/// an attempt succeeded; from then on no failure fields, only bindings still getting ready
/// (`BindingsNotReady`) or `Ready=True`, which is reached. Returns the highest failure count
/// and how many failing samples were taken during a retry attempt.
fn check(what: &str, reason: &str, samples: &[Sample]) -> (i64, usize) {
    let first = samples
        .iter()
        .position(|s| s.ready != "Unknown")
        .unwrap_or_else(|| panic!("{what}: never failed: {samples:#?}"));
    assert_eq!(
        samples[first].ready, "False",
        "{what}: ready before it failed: {:?}",
        samples[first]
    );
    // Engaged: Ready, or bindings still getting ready.
    let recovered = samples[first..]
        .iter()
        .position(|s| s.ready == "True" || s.reason == "BindingsNotReady")
        .map(|i| i + first)
        .unwrap_or_else(|| panic!("{what}: never recovered: {:#?}", &samples[first..]));
    let mut highest = 0;
    let mut during_retry = 0;
    for s in &samples[first..recovered] {
        assert_eq!(
            (s.ready.as_str(), s.reason.as_str()),
            ("False", reason),
            "{what}: the failure is not shown: {s:?}"
        );
        let n = s
            .failures
            .unwrap_or_else(|| panic!("{what}: no failure count: {s:?}"));
        assert!(n >= highest, "{what}: the failure count went back: {s:?}");
        highest = n;
        assert!(s.next_retry, "{what}: no nextRetryTime: {s:?}");
        if in_retry_attempt(s) {
            during_retry += 1;
        }
    }
    for s in &samples[recovered..] {
        assert!(
            s.failures.is_none()
                && !s.next_retry
                && matches!(
                    (s.ready.as_str(), s.reason.as_str()),
                    ("True", "Ok") | ("False", "BindingsNotReady")
                ),
            "{what}: after an attempt succeeded: {s:?}"
        );
    }
    assert!(
        samples[recovered..].iter().any(|s| s.ready == "True"),
        "{what}: never Ready=True: {:#?}",
        &samples[recovered..]
    );
    (highest, during_retry)
}

/// A fleet of `spokes`, each registered with `BINDINGS` bindings and the provider `ok`
/// (a plugin printing `TOKEN`, whose path is returned).
async fn healthy_fleet(
    spokes: &[&str],
    dir: &std::path::Path,
) -> (FleetHarness, std::path::PathBuf) {
    let f = FleetHarness::start(spokes, dir).await.unwrap();
    let ok = static_token_plugin(dir, "ok.sh", TOKEN, None).unwrap();
    for spoke in spokes {
        register_admin_token_spoke(
            &f.hub_client,
            spoke,
            &f.spoke(spoke),
            "ok",
            TOKEN,
            BINDINGS,
            0..BINDINGS,
        )
        .await
        .unwrap();
    }
    (f, ok)
}

const FAILING: &[&str] = &["plugin-fails", "plugin-hangs", "rejected", "blackholed"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_spokes_show_their_failure_on_every_sample_until_they_recover() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(FAILING, dir.path()).await.unwrap();
    let ok = static_token_plugin(dir.path(), "ok.sh", TOKEN, None).unwrap();
    let fails = write_script(
        dir.path(),
        "fails.sh",
        "#!/bin/sh\necho 'no credential for you' >&2\nexit 3\n",
    )
    .unwrap();
    let hangs = write_script(dir.path(), "hangs.sh", "#!/bin/sh\nexec sleep 300\n").unwrap();
    let providers = [
        ("ok", ok.display().to_string()),
        ("fails", fails.display().to_string()),
        ("hangs", hangs.display().to_string()),
    ];
    for (spoke, provider) in [
        ("plugin-fails", "fails"),
        ("plugin-hangs", "hangs"),
        ("rejected", "ok"),
        ("blackholed", "ok"),
    ] {
        register_admin_token_spoke(
            &f.hub_client,
            spoke,
            &f.spoke(spoke),
            provider,
            TOKEN,
            BINDINGS,
            0..BINDINGS,
        )
        .await
        .unwrap();
    }
    f.spoke("rejected").faults().revoke_token(TOKEN);
    f.spoke("blackholed").faults().set_blackhole(true);

    let objects: Samples = Arc::default();
    let states: Samples = Arc::default();
    let stop_sampling = CancellationToken::new();
    sample_objects(f.hub_client.clone(), objects.clone(), stop_sampling.clone());
    let (hub, _app) = start(&f, &providers, &[]).await;
    sample_states(
        hub.handle.state.clone(),
        FAILING,
        states.clone(),
        stop_sampling.clone(),
    );

    // Let every spoke fail a few times, with retries of the slow failures caught in progress.
    wait_for(
        "three failed attempts each, and slow retries sampled in progress",
        LIMIT,
        || {
            let (objects, states) = (objects.clone(), states.clone());
            async move {
                FAILING
                    .iter()
                    .all(|spoke| {
                        let written = snapshot(&objects, spoke)
                            .iter()
                            .filter_map(|s| s.failures)
                            .max()
                            .unwrap_or(0);
                        let slow = matches!(*spoke, "plugin-hangs" | "blackholed");
                        let in_attempt = snapshot(&states, spoke)
                            .iter()
                            .skip_while(|s| s.ready == "Unknown")
                            .any(in_retry_attempt);
                        written >= 3 && (!slow || in_attempt)
                    })
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();

    // Clear every fault.
    static_token_plugin(dir.path(), "fails.sh", TOKEN, None).unwrap();
    static_token_plugin(dir.path(), "hangs.sh", TOKEN, None).unwrap();
    f.spoke("rejected").faults().clear();
    f.spoke("blackholed").faults().set_blackhole(false);
    wait_for("every spoke's status Ready=True", LIMIT, || {
        let objects = objects.clone();
        async move {
            FAILING
                .iter()
                .all(|spoke| snapshot(&objects, spoke).iter().any(|s| s.ready == "True"))
                .then_some(())
        }
    })
    .await
    .unwrap();
    stop_sampling.cancel();

    for (spoke, reason) in [
        ("plugin-fails", "CredentialPluginFailed"),
        ("plugin-hangs", "CredentialPluginFailed"),
        ("rejected", "Unauthorized"),
        ("blackholed", "Unreachable"),
    ] {
        let written = snapshot(&objects, spoke);
        let (highest, _) = check(&format!("{spoke} (objects)"), reason, &written);
        assert!(highest >= 3, "{spoke}: {written:#?}");
        let published = snapshot(&states, spoke);
        let (_, during_retry) = check(&format!("{spoke} (states)"), reason, &published);
        if matches!(spoke, "plugin-hangs" | "blackholed") {
            assert!(during_retry > 0, "{spoke}: no retry sampled in progress");
        }
        println!(
            "{spoke}: {} object versions, {} published states ({during_retry} during a retry), up to {highest} failures",
            written.len(),
            published.len()
        );
    }
    hub.stop().await.unwrap();
}

/// Every object of every served resource of `cluster`, as JSON text.
fn dump(cluster: &kubesim_store::Cluster) -> String {
    let mut out = String::new();
    for res in cluster.resources() {
        if let Ok(list) = cluster.list(&res, None, &kubesim_store::ListOptions::default()) {
            out.push_str(&list.to_string());
        }
    }
    out
}

/// The hub API's answer to `GET path`.
async fn api_get(app: &axum::Router, path: &str) -> String {
    let req = http::Request::get(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    assert_eq!(resp.status(), 200, "GET {path}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_output_reaches_no_status_event_or_api_response() {
    const SPOKES: [&str; 3] = ["exits", "hangs", "garbage"];
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&SPOKES, dir.path()).await.unwrap();
    let said = format!("echo 'client secret is {SECRET}' >&2");
    let scripts = [
        ("exits", format!("#!/bin/sh\n{said}\nexit 1\n")),
        (
            "hangs",
            format!("#!/bin/sh\n{said}\necho 'client secret is {SECRET}'\nexec sleep 300\n"),
        ),
        (
            "garbage",
            format!(
                "#!/bin/sh\n{said}\necho '{{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", \"status\": {{\"token\": {SECRET}'\n"
            ),
        ),
    ];
    let mut providers = Vec::new();
    for (name, body) in &scripts {
        let path = write_script(dir.path(), &format!("{name}.sh"), body).unwrap();
        providers.push((*name, path.display().to_string()));
        register_admin_token_spoke(
            &f.hub_client,
            name,
            &f.spoke(name),
            name,
            TOKEN,
            BINDINGS,
            0..BINDINGS,
        )
        .await
        .unwrap();
    }
    let (hub, app) = start(&f, &providers, &[]).await;

    // What every plugin wrote to stderr, as the status identifies it.
    let stderr = format!("client secret is {SECRET}\n");
    let hash = hex::encode(sha2::Sha256::digest(stderr.as_bytes()));
    let identified = format!("stderr: {} bytes, sha256:{}", stderr.len(), &hash[..12]);
    let api: Api<ClusterIdentityStatus> = Api::namespaced(f.hub_client.clone(), PROFILE_NS);
    for (name, how) in [
        ("exits", "failed with exit code 1"),
        ("hangs", "timed out after 1s and was killed"),
        ("garbage", "not a JSON (or YAML) document"),
    ] {
        let api = api.clone();
        let message = wait_for(&format!("{name}: failed twice, shown"), LIMIT, || {
            let api = api.clone();
            async move {
                let status = api.get_opt(name).await.ok()??.status?;
                let ready = Sample::of(None, &status)?;
                (ready.ready == "False" && status.consecutive_failures >= Some(2)).then_some(ready)
            }
        })
        .await
        .unwrap();
        assert_eq!(message.reason, "CredentialPluginFailed", "{message:?}");
        assert!(message.message.contains(how), "{name}: {}", message.message);
        assert!(
            message.message.contains(&identified),
            "{name}: {} (want {identified})",
            message.message
        );
    }

    // Nowhere outside the hub's log: no object in any cluster (statuses, the report,
    // Events, …), no API response.
    let mut places = vec![("hub cluster".to_string(), dump(&f.hub.store()))];
    for name in SPOKES {
        places.push((format!("spoke {name}"), dump(&f.spoke(name).store())));
    }
    for path in ["/v1/clusters", "/v1/report", "/metrics"]
        .into_iter()
        .map(str::to_string)
        .chain(
            SPOKES
                .iter()
                .map(|n| format!("/v1/clusters/{PROFILE_NS}/{n}")),
        )
    {
        places.push((format!("GET {path}"), api_get(&app, &path).await));
    }
    let hub_objects = &places[0].1;
    assert!(
        hub_objects.contains("ClusterIdentityStatus")
            && hub_objects.contains("FleetIdentityReport")
            && hub_objects.contains(&identified),
        "the hub's status objects were not dumped"
    );
    assert!(
        places
            .iter()
            .any(|(p, text)| p == "GET /v1/clusters" && text.contains(&identified))
    );
    for (place, text) in &places {
        assert!(!text.contains("swordfish"), "{place} carries plugin output");
    }
    hub.stop().await.unwrap();
}

/// The `AdmissionPolicy` condition of every written version of each spoke's
/// `ClusterIdentityStatus`, in order: `(status, reason)`.
type PolicySamples = Arc<Mutex<BTreeMap<String, Vec<(String, String)>>>>;

fn sample_policy_conditions(client: kube::Client, samples: PolicySamples, stop: CancellationToken) {
    tokio::spawn(async move {
        let api: Api<ClusterIdentityStatus> = Api::namespaced(client, PROFILE_NS);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.next() => e,
            };
            let obj = match event {
                Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => o,
                Some(_) => continue,
                None => return,
            };
            let (Some(name), Some(status)) = (obj.metadata.name.clone(), obj.status.as_ref())
            else {
                continue;
            };
            if let Some(c) = status
                .conditions
                .iter()
                .find(|c| c.type_ == condition_types::ADMISSION_POLICY)
            {
                let seen = (c.status.clone(), c.reason.clone());
                let mut all = samples.lock().unwrap();
                let list = all.entry(name).or_default();
                if list.last() != Some(&seen) {
                    list.push(seen);
                }
            }
        }
    });
}

fn last_policy(samples: &PolicySamples, spoke: &str) -> Option<(String, String)> {
    samples.lock().unwrap().get(spoke)?.last().cloned()
}

/// A spoke without kleym's admission policy shows `AdmissionPolicy=False`
/// (`AdmissionPolicyMissing`) in its `ClusterIdentityStatus`, found by a dry run that stores
/// nothing; installing the policy (as an admin) clears it at the next check, with the same
/// hub and the same engagement. A spoke with the policy from the start never shows it, and
/// kleym's own writes there pass the policy (its bindings converge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_admission_policy_is_a_warning_that_clears_without_a_restart() {
    use kleym_e2e::fixtures::admission::install_admission_policy;
    use kleym_e2e::fixtures::env;
    use kleym_hub::fleet::admission_probe::{PROBE_BINDING, PROBE_NAMESPACE};
    use kleym_spoke::compiler::output::cluster_spiffe_id_name;

    let dir = tempfile::tempdir().unwrap();
    let (f, ok) = healthy_fleet(&["bare", "guarded"], dir.path()).await;
    f.without_admission_policy("bare").unwrap();

    let samples: PolicySamples = Arc::default();
    let stop_sampling = CancellationToken::new();
    sample_policy_conditions(f.hub_client.clone(), samples.clone(), stop_sampling.clone());
    let (hub, _app) = start(
        &f,
        &[("ok", ok.display().to_string())],
        &["--admission-policy-check-interval-seconds", "1"],
    )
    .await;
    let state = hub.handle.state.clone();

    let missing = || {
        (
            String::from("False"),
            String::from("AdmissionPolicyMissing"),
        )
    };
    let installed = || {
        (
            String::from("True"),
            String::from("AdmissionPolicyInstalled"),
        )
    };
    wait_for(
        "bare: AdmissionPolicyMissing, guarded: installed",
        LIMIT,
        || {
            let samples = samples.clone();
            async move {
                (last_policy(&samples, "bare") == Some(missing())
                    && last_policy(&samples, "guarded") == Some(installed()))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    // The check wrote nothing, and kleym's own writes passed the policy where it is in force.
    let probe = cluster_spiffe_id_name(PROBE_NAMESPACE, PROBE_BINDING);
    for spoke in ["bare", "guarded"] {
        let store = f.spoke(spoke).store();
        assert!(
            !env::csids(&store)
                .iter()
                .any(|o| o["metadata"]["name"] == probe.as_str()),
            "{spoke}: the dry run stored {probe}"
        );
        wait_for(&format!("{spoke} converged"), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
    let engagements = state.get("fleet/bare").unwrap().engagements;

    // An admin installs the policy for the hub's user: the next check clears the warning.
    install_admission_policy(&f.spoke("bare"), &["hub".to_string()], "fleet.example").unwrap();
    wait_for("bare: AdmissionPolicyInstalled", LIMIT, || {
        let samples = samples.clone();
        async move { (last_policy(&samples, "bare") == Some(installed())).then_some(()) }
    })
    .await
    .unwrap();
    let bare = state.get("fleet/bare").unwrap();
    assert_eq!(
        (bare.phase, bare.engagements),
        (Phase::Engaged, engagements),
        "cleared by the running engagement, not a new one"
    );
    stop_sampling.cancel();
    let seen = samples.lock().unwrap().clone();
    assert!(
        !seen["guarded"].contains(&missing()),
        "the guarded spoke showed the warning: {seen:?}"
    );
    assert_eq!(
        seen["bare"].iter().filter(|s| **s == missing()).count(),
        1,
        "{seen:?}"
    );
    hub.stop().await.unwrap();
}

/// The status loop takes each status's owner, the profile's UID, from what the inventory
/// watch saw: once every spoke's `ClusterIdentityStatus` names its profile's UID as its
/// owner, the hub cluster's request log holds two requests for the collection of profiles,
/// the inventory's list and its watch, and no third (a list of every profile for their
/// UIDs, which each replica made before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_name_their_profiles_uid_without_listing_the_profiles_again() {
    const SPOKES: [&str; 2] = ["east", "west"];
    let dir = tempfile::tempdir().unwrap();
    let (f, ok) = healthy_fleet(&SPOKES, dir.path()).await;
    let profiles: Api<kleym_api::external::clusterprofile::ClusterProfile> =
        Api::namespaced(f.hub_client.clone(), PROFILE_NS);
    let mut uids = BTreeMap::new();
    for spoke in SPOKES {
        let p = profiles.get(spoke).await.unwrap();
        uids.insert(spoke, p.metadata.uid.clone().unwrap());
    }
    let requests = f.hub.requests();
    requests.clear();
    let (hub, _app) = start(&f, &[("ok", ok.display().to_string())], &[]).await;
    let api: Api<ClusterIdentityStatus> = Api::namespaced(f.hub_client.clone(), PROFILE_NS);
    for spoke in SPOKES {
        let api = api.clone();
        let want = uids[spoke].clone();
        wait_for(
            &format!("{spoke}: a status owned by its profile"),
            LIMIT,
            || {
                let api = api.clone();
                let want = want.clone();
                async move {
                    let o = api.get_opt(spoke).await.ok()??;
                    let owner = o.metadata.owner_references?.first()?.uid.clone();
                    (owner == want).then_some(())
                }
            },
        )
        .await
        .unwrap();
    }
    let collection = "/apis/multicluster.x-k8s.io/v1alpha1/clusterprofiles";
    let asked: Vec<String> = requests
        .entries()
        .iter()
        .filter(|r| r.path == collection)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        asked.len(),
        2,
        "the inventory's list and watch, nothing else: {asked:?}"
    );
    hub.stop().await.unwrap();
}
