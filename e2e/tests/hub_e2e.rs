//! End to end: an in-process `kleym hub` on kubesim engages three spokes, each through a
//! different credential plugin — the bundled `kleym credential token-request` (the spoke
//! trusts the hub's ServiceAccount issuer), the bundled `kleym credential secret-reader`
//! (token from a hub Secret named by the exec extension's `clusterName`) and a script of the
//! test's own — and every spoke's bindings compile into ClusterSPIFFEIDs there. Then: status
//! heartbeats do not re-engage (engagement and exec counts unchanged), an effective change
//! (trust domain property) re-engages exactly that spoke, and unusable/unhealthy profiles are
//! refused/waiting with their reason.

use std::time::Duration;

use kleym_e2e::fixtures::admission::install_admission_policy;
use kleym_e2e::fixtures::env::{self, NS};
use kleym_e2e::fixtures::harness::{FleetHarness, HUB_NS, grant_admin, hub_secret, wait_for};
use kleym_e2e::fixtures::plugins::{count_runs, kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::profiles::{access_provider, apply_profile, status};
use kleym_hub::access::audience::derived_audience;
use kleym_hub::fleet::Phase;
use serde_json::json;

const BINDINGS: usize = 3;
const LIMIT: Duration = Duration::from_secs(60);

fn provider_file(kleym: &str, hub_kc: &str, script: &str) -> serde_json::Value {
    json!({"providers": [
        {"name": "token-request", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
            "args": ["credential", "token-request", "--service-account", format!("{HUB_NS}/hub"), "--kubeconfig", hub_kc],
            "provideClusterInfo": true, "interactiveMode": "Never"}},
        {"name": "secret-reader", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": kleym,
            "args": ["credential", "secret-reader", "--namespace", HUB_NS, "--kubeconfig", hub_kc],
            "provideClusterInfo": true, "interactiveMode": "Never"}},
        {"name": "script", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": script,
            "interactiveMode": "Never"}}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spokes_converge_through_bundled_and_script_plugins_and_reengage_only_on_effective_change()
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let kleym = kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a", "spoke-b", "spoke-c"], dir.path())
        .await
        .unwrap();
    let (a, b, c) = (f.spoke("spoke-a"), f.spoke("spoke-b"), f.spoke("spoke-c"));

    // spoke-a trusts the hub's ServiceAccount tokens minted for its profile's audience.
    a.trust_issuer(&f.hub, &[derived_audience("fleet", a.name())])
        .await
        .unwrap();
    grant_admin(&a, &FleetHarness::hub_sa_user()).unwrap();
    // spoke-b: a static token, stored in the hub as Secret kleym/spoke-b.
    b.add_static_token("tok-b-0123456789", user("hub-b"));
    grant_admin(&b, "hub-b").unwrap();
    hub_secret(&f.hub, "spoke-b", "tok-b-0123456789").unwrap();
    // spoke-c: the test's own plugin script.
    c.add_static_token("tok-c-0123456789", user("hub-c"));
    grant_admin(&c, "hub-c").unwrap();
    let count_file = dir.path().join("script.count");
    let script = static_token_plugin(
        dir.path(),
        "plugin.sh",
        "tok-c-0123456789",
        Some(&count_file),
    )
    .unwrap();

    for s in [&a, &b, &c] {
        env::seed_environment(&s.store(), BINDINGS).unwrap();
        env::create_bindings(&s.store(), 0..BINDINGS).unwrap();
    }
    let pf = dir.path().join("providers.json");
    std::fs::write(
        &pf,
        provider_file(
            kleym.to_str().unwrap(),
            f.hub_kubeconfig().to_str().unwrap(),
            script.to_str().unwrap(),
        )
        .to_string(),
    )
    .unwrap();

    let t0 = "2026-01-01T00:00:00Z";
    apply_profile(
        &f.hub_client,
        "spoke-a",
        status(
            vec![access_provider("token-request", &a, None)],
            true,
            t0,
            &[("kleym.io/trust-domain", "a.example")],
        ),
    )
    .await
    .unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-b",
        status(
            vec![access_provider(
                "secret-reader",
                &b,
                Some(json!({"clusterName": "spoke-b"})),
            )],
            true,
            t0,
            &[],
        ),
    )
    .await
    .unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-c",
        status(vec![access_provider("script", &c, None)], true, t0, &[]),
    )
    .await
    .unwrap();
    // Unusable: no provider the hub knows; and one whose control plane is not healthy.
    apply_profile(
        &f.hub_client,
        "unknown",
        status(vec![access_provider("nope", &c, None)], true, t0, &[]),
    )
    .await
    .unwrap();
    apply_profile(
        &f.hub_client,
        "sick",
        status(vec![access_provider("script", &c, None)], false, t0, &[]),
    )
    .await
    .unwrap();

    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "fleet.example".into(),
            "--leader-elect=false".into(),
        ])
        .await
        .unwrap();
    let state = hub.handle.state.clone();

    for s in [&a, &b, &c] {
        let store = s.store();
        wait_for(&format!("{} converged", s.name()), LIMIT, || {
            let store = store.clone();
            async move { env::converged(&store, BINDINGS).then_some(()) }
        })
        .await
        .unwrap();
    }
    // Per-spoke trust domains: the profile property wins over --trust-domain.
    let ids: Vec<String> = env::csids(&a.store())
        .iter()
        .map(|o| o["spec"]["spiffeIDTemplate"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ids.iter()
            .all(|i| i.starts_with("spiffe://a.example/ns/llm/")),
        "{ids:?}"
    );
    let ids_b: Vec<String> = env::csids(&b.store())
        .iter()
        .map(|o| o["spec"]["spiffeIDTemplate"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ids_b
            .iter()
            .all(|i| i.starts_with("spiffe://fleet.example/")),
        "{ids_b:?}"
    );

    // Published state: engaged, versions, per-binding results all ready.
    let st = wait_for("bindings published as ready", LIMIT, || {
        let state = state.clone();
        async move {
            let s = state.get("fleet/spoke-c")?;
            (s.phase == Phase::Engaged
                && s.bindings.len() == BINDINGS
                && s.bindings.iter().all(|b| b.ready))
            .then_some(s)
        }
    })
    .await
    .unwrap();
    assert!(st.version.is_some());
    assert_eq!(st.trust_domain.as_deref(), Some("fleet.example"));
    assert_eq!(st.bindings[0].namespace, NS);
    assert_eq!(
        st.bindings[0].service_account.as_deref(),
        Some("model-server")
    );
    let unknown = state.get("fleet/unknown").unwrap();
    assert_eq!(unknown.phase, Phase::Refused);
    assert!(
        unknown
            .reason
            .unwrap()
            .contains("no matching cluster accessor")
    );
    let sick = state.get("fleet/sick").unwrap();
    assert_eq!(sick.phase, Phase::Waiting);
    assert!(
        sick.reason
            .unwrap()
            .contains("ControlPlaneHealthy is False")
    );
    for s in ["fleet/spoke-a", "fleet/spoke-b", "fleet/spoke-c"] {
        assert_eq!(state.get(s).unwrap().engagements, 1, "{s}");
    }
    let execs = |p: &str| hub.handle.credentials.metrics().exec_count(p, "success");
    assert_eq!(count_runs(&count_file), 1, "one exec of the script");
    let (execs_a, execs_b) = (execs("token-request"), execs("secret-reader"));
    assert!(execs_a >= 1 && execs_b >= 1);

    // Heartbeats: condition time and an unrelated property change; nothing re-engages.
    let t1 = "2026-01-01T00:05:00Z";
    apply_profile(
        &f.hub_client,
        "spoke-c",
        status(
            vec![access_provider("script", &c, None)],
            true,
            t1,
            &[("vendor.example/zone", "z1")],
        ),
    )
    .await
    .unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-b",
        status(
            vec![access_provider(
                "secret-reader",
                &b,
                Some(json!({"clusterName": "spoke-b"})),
            )],
            true,
            t1,
            &[],
        ),
    )
    .await
    .unwrap();
    // Then an effective change on spoke-a only (its trust domain). The admission policy pins
    // the trust domain, so the operator applies the one for the new trust domain first.
    install_admission_policy(&a, &[FleetHarness::hub_sa_user()], "a2.example").unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-a",
        status(
            vec![access_provider("token-request", &a, None)],
            true,
            t1,
            &[("kleym.io/trust-domain", "a2.example")],
        ),
    )
    .await
    .unwrap();
    let store_a = a.store();
    wait_for(
        "spoke-a recompiled with the new trust domain",
        LIMIT,
        || {
            let store = store_a.clone();
            async move {
                let csids = env::csids(&store);
                (csids.len() >= BINDINGS
                    && csids.iter().all(|o| {
                        o["spec"]["spiffeIDTemplate"]
                            .as_str()
                            .is_some_and(|s| s.starts_with("spiffe://a2.example/"))
                    }))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(state.get("fleet/spoke-a").unwrap().engagements, 2);
    assert_eq!(state.get("fleet/spoke-b").unwrap().engagements, 1);
    assert_eq!(state.get("fleet/spoke-c").unwrap().engagements, 1);
    assert_eq!(count_runs(&count_file), 1, "no re-exec on heartbeats");
    assert_eq!(execs("secret-reader"), execs_b, "no re-exec on heartbeats");
    println!(
        "engagements: a=2 b=1 c=1; execs: token-request={} secret-reader={} script={}",
        execs("token-request"),
        execs("secret-reader"),
        count_runs(&count_file)
    );
    hub.stop().await.unwrap();
}

fn user(name: &str) -> kubesim_auth::UserInfo {
    kubesim_auth::UserInfo {
        username: name.into(),
        ..Default::default()
    }
}

/// The hub's SVID policy flags reach every spoke's reconciler: with `--svid-dns-suffix
/// example.org` and `--hub-x509-username kleym-hub.example.org`, a spoke's binding asking for
/// `chat.example.org` is compiled, one asking for the hub's user name is refused
/// (`ReservedHubIdentity`) and gets no ClusterSPIFFEID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_svid_policy_reaches_its_spokes() {
    let dir = tempfile::tempdir().unwrap();
    let f = FleetHarness::start(&["spoke-a"], dir.path()).await.unwrap();
    let a = f.spoke("spoke-a");
    a.add_static_token("tok-a-0123456789", user("hub-a"));
    grant_admin(&a, "hub-a").unwrap();
    let script = static_token_plugin(dir.path(), "plugin.sh", "tok-a-0123456789", None).unwrap();
    env::seed_environment(&a.store(), 2).unwrap();
    let admin = a.kube_client().await.unwrap();
    let bindings: kube::Api<kleym_api::InferenceIdentityBinding> = kube::Api::namespaced(admin, NS);
    for (i, name) in [(0, "chat.example.org"), (1, "kleym-hub.example.org")] {
        let mut b = env::binding(i);
        b["spec"]["svid"] = json!({"dnsNameTemplates": [name]});
        bindings
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(b).unwrap(),
            )
            .await
            .unwrap();
    }
    let pf = dir.path().join("providers.json");
    let providers = json!({"providers": [{"name": "script", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": script,
        "interactiveMode": "Never"}}]});
    std::fs::write(&pf, providers.to_string()).unwrap();
    apply_profile(
        &f.hub_client,
        "spoke-a",
        status(
            vec![access_provider("script", &a, None)],
            true,
            "2026-01-01T00:00:00Z",
            &[],
        ),
    )
    .await
    .unwrap();
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "fleet.example".into(),
            "--leader-elect=false".into(),
            "--svid-dns-suffix".into(),
            "example.org".into(),
            "--hub-x509-username".into(),
            "kleym-hub.example.org".into(),
        ])
        .await
        .unwrap();
    let refused = wait_for("binding 1 refused", LIMIT, || {
        let bindings = bindings.clone();
        async move {
            let b = bindings.get(&env::binding_name(1)).await.ok()?;
            let ready = b
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "False" && ready.reason == "ReservedHubIdentity").then_some(ready)
        }
    })
    .await
    .unwrap();
    assert!(
        refused.message.contains("spec.svid.dnsNameTemplates[0]"),
        "{}",
        refused.message
    );
    let store = a.store();
    wait_for("binding 0 compiled", LIMIT, || {
        let store = store.clone();
        async move {
            env::csid_names(&store)
                .contains(&env::csid_name(0))
                .then_some(())
        }
    })
    .await
    .unwrap();
    let names = env::csid_names(&store);
    assert!(!names.contains(&env::csid_name(1)), "{names:?}");
    let dns: Vec<String> = env::csids(&store)
        .iter()
        .flat_map(|o| {
            o["spec"]["dnsNameTemplates"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert_eq!(dns, ["chat.example.org"]);
    hub.stop().await.unwrap();
}
