//! A spec edit that lands while kleym's status write is on its way, with the watch broken
//! at that moment, is still reconciled.
//!
//! The write's response then carries the edit (a new generation under the status kleym
//! computed for the old one), and the relist after the broken watch shows only that
//! version, which the watch handler takes for the echo of kleym's own write. The chaos
//! soak found a binding left this way for good (seed 1106: status at generation 1 for
//! generation 2, its ClusterSPIFFEID still the old spec). The reconcile that wrote now
//! sees the edit in its response and queues the binding again.
//!
//! The timing is made, not hoped for: kubesim delays every request by a second, the test
//! waits until it sees kleym's status write pending in kubesim, every watch is dropped and
//! answered 410 on reconnect (so the edit reaches the reconciler only through the relist),
//! and the edit is written to the store directly, between the two; the test checks that the
//! write was still waiting out its delay when the edit landed.

use std::sync::Arc;
use std::time::Duration;

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_e2e::single::{create, inference_namespace, start_spoke, wait_observed};
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::Api;
use kubesim_store::{PatchType, Subresource, WriteOptions};
use serde_json::json;

const TD: &str = "prod.example.org";
/// The latency of every request while the race is set up.
const LATENCY: Duration = Duration::from_secs(1);
/// How long a step of the set-up may take on a loaded machine.
const LIMIT: Duration = Duration::from_secs(60);

/// Polls `f` every 10 ms until it returns `Some`, or panics after [`LIMIT`] naming `what`.
async fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
const NS: &str = "llm";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_carried_only_by_the_response_of_our_status_write_is_reconciled() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, NS).await;

    let mut config = SpokeConfig::new(TD);
    config.discovery_interval = Duration::from_millis(200);
    config.error_backoff = Duration::from_millis(100);
    let spoke = Spoke::new(admin.clone(), config, Arc::new(SpokeMetrics::default())).unwrap();
    let token = CancellationToken::new();
    let task = tokio::spawn(spoke.run(token.clone()));

    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), NS);
    create(
        &bindings,
        json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "InferenceIdentityBinding",
            "metadata": {"name": "chat"},
            "spec": {
                "targetRef": {"name": "chat"},
                "mode": "PerObjective",
                "containerDiscriminator": {"type": "ContainerName", "value": "chat"},
                "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]
            }
        }),
    )
    .await;
    let before = wait_observed(&bindings, "chat", conditions::READY).await;
    assert_eq!(before.metadata.generation, Some(1));
    let output = before.status.unwrap().cluster_spiffe_id.unwrap().name;

    let store = cluster.store();
    let res = store
        .resolve("kleym.io", "v1alpha1", "inferenceidentitybindings")
        .expect("bindings served");
    let user = WriteOptions {
        field_manager: "tenant".into(),
        ..WriteOptions::default()
    };
    let faults = cluster.faults();
    let requests = cluster.requests();
    let status_path =
        format!("/apis/kleym.io/v1alpha1/namespaces/{NS}/inferenceidentitybindings/chat/status");
    // Every request from now on waits LATENCY before kubesim handles it.
    faults.set_latency(LATENCY);
    // The status removed (as by a tenant): kleym's reconcile writes it again, and that
    // write waits.
    store
        .patch(
            &res,
            Some(NS),
            "chat",
            PatchType::Merge,
            &json!({"status": null}),
            Subresource::Status,
            &user,
        )
        .expect("status written");
    // Seen, not hoped for: kleym's status write has reached kubesim and waits out the latency.
    let write_received = wait_until("kleym's status write is pending", || {
        requests
            .pending()
            .into_iter()
            .find(|p| p.method == "PATCH" && p.path == status_path)
            .map(|p| p.since)
    })
    .await;
    // The watches break (their reconnects get 410, so the caches relist), then the spec is
    // edited: the only event left to carry the edit is the relist.
    faults.force_gone_on_next_watches(20);
    faults.drop_watches();
    let edited = store
        .patch(
            &res,
            Some(NS),
            "chat",
            PatchType::Merge,
            &json!({"spec": {"svid": {"ttl": "30m"}}}),
            Subresource::Main,
            &user,
        )
        .expect("spec edited");
    let edited_at = tokio::time::Instant::now();
    assert_eq!(edited.object["metadata"]["generation"], json!(2));
    // The race this test reproduces was hit: the write was still waiting out its latency
    // when the edit landed, so kubesim handles it after the edit and its response carries
    // generation 2; and every reconnecting watch, sent after the drop, is handled after the
    // edit too.
    assert!(
        edited_at < write_received + LATENCY,
        "the status write was received {:?} before the edit: it may have been handled \
         before it, and the race is not reproduced",
        edited_at - write_received
    );
    // Keep the latency until the status write is answered and a watch of the bindings has
    // reconnected after the drop (both handled after the edit), then lift it.
    wait_until(
        "the status write answered, a bindings watch reconnected",
        || {
            let log = requests.entries();
            let written = log
                .iter()
                .any(|r| r.method == "PATCH" && r.path == status_path && r.at > edited_at);
            let relisted = log.iter().any(|r| {
                r.method == "GET"
                    && r.path.ends_with("/inferenceidentitybindings")
                    && r.at > edited_at
            });
            (written && relisted).then_some(())
        },
    )
    .await;
    faults.set_latency(Duration::ZERO);

    let after = wait_observed(&bindings, "chat", conditions::READY).await;
    assert_eq!(after.metadata.generation, Some(2));
    let csid = Api::<ClusterSPIFFEID>::all(admin.clone())
        .get(&output)
        .await
        .expect("the output exists");
    assert_eq!(
        csid.spec.ttl.as_deref(),
        Some("30m"),
        "the output carries the edit: {:?}",
        csid.spec
    );

    token.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("reconciler stops")
        .unwrap()
        .unwrap();
}
