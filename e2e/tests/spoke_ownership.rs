//! A binding's status is kleym's output, never proof of ownership: a tenant who may write
//! its bindings and their status subresource in its own namespace (and read
//! ClusterSPIFFEIDs to learn a UID, but not delete them) forges `status.clusterSPIFFEID`
//! to name an object that is not its binding's output, then edits or deletes the binding.
//! Whatever object the forged status names — a platform ClusterSPIFFEID, another
//! namespace's kleym output, a foreign object at the binding's own name — kleym (running
//! with exactly `deploy/spoke/clusterrole.yaml`) leaves it untouched: same UID, same
//! resourceVersion. Also: a foreign default identity carrying kleym's labels still gets the
//! overlap warning, an object an earlier kleym wrote (legacy UID annotation) is adopted
//! and migrated in place, kleym's labels (output, not proof) edited or stripped by someone
//! else are restored on the object kleym proves its own, and a tenant's SVID DNS names stay
//! within its namespace and never name the hub.
//!
//! The tenant acts through the API with its own ServiceAccount token, authorized by real
//! RBAC; every wait is on a signal kleym writes (observedGeneration, conditions), never on
//! a fixed sleep.

use kleym_e2e::single::{
    condition, create, create_manifest, eventually, inference_namespace, repo_yaml_docs,
    start_spoke, wait_observed,
};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, conditions};
use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kleym_spoke::compiler::{SvidPolicy, SvidPolicySettings};
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kubesim::{ClusterHandle, Kubesim};
use serde_json::{Value, json};

const TD: &str = "prod.example.org";
/// The forging tenant's namespace.
const TENANT_NS: &str = "t5";
/// Another tenant's namespace, whose kleym output is a victim.
const OTHER_NS: &str = "t1";
/// A ClusterSPIFFEID the platform team created (not kleym's).
const PLATFORM: &str = "platform-default";

/// A ServiceAccount token client for `namespace/name`.
async fn sa_client(cluster: &ClusterHandle, namespace: &str, name: &str) -> Client {
    let token = cluster
        .issue_sa_token(namespace, name, &[], Duration::from_secs(3600), None)
        .await
        .unwrap();
    cluster.client_for_token(&token).await.unwrap()
}

/// kleym's spoke reconciler, authenticated with exactly the shipped ClusterRole.
struct Operator {
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), kleym_spoke::reconciler::Error>>,
}

impl Operator {
    async fn start(cluster: &ClusterHandle, admin: &Client) -> Self {
        Self::start_with(cluster, admin, SpokeConfig::new(TD)).await
    }

    /// [`Operator::start`] with `config` (its timings are set here).
    async fn start_with(cluster: &ClusterHandle, admin: &Client, mut config: SpokeConfig) -> Self {
        for doc in repo_yaml_docs("deploy/spoke/namespace.yaml")
            .into_iter()
            .chain(repo_yaml_docs("deploy/spoke/serviceaccount.yaml"))
            .chain(repo_yaml_docs("deploy/spoke/clusterrole.yaml"))
            .chain(repo_yaml_docs("deploy/spoke/clusterrolebinding.yaml"))
        {
            create_manifest(admin, &doc).await;
        }
        let client = sa_client(cluster, "kleym-system", "kleym-spoke").await;
        config.discovery_interval = Duration::from_millis(200);
        config.error_backoff = Duration::from_millis(100);
        let spoke = Spoke::new(client, config, Arc::new(SpokeMetrics::default())).unwrap();
        let token = CancellationToken::new();
        let task = tokio::spawn(spoke.run(token.clone()));
        Operator { token, task }
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("operator stops")
            .unwrap()
            .unwrap();
    }
}

fn binding(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "targetRef": {"name": "chat"},
            "mode": "PerObjective",
            "containerDiscriminator": {"type": "ContainerName", "value": "chat"},
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"]
        }
    })
}

/// The tenant of `t5`: bindings and their status in its namespace, `get` on
/// ClusterSPIFFEIDs, nothing else.
async fn tenant(cluster: &ClusterHandle, admin: &Client) -> Client {
    create(
        &Api::<ServiceAccount>::namespaced(admin.clone(), TENANT_NS),
        json!({"metadata": {"name": "tenant"}}),
    )
    .await;
    let subject = json!([{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}]);
    for doc in [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "bindings", "namespace": TENANT_NS},
            "rules": [
                {"apiGroups": ["kleym.io"], "resources": ["inferenceidentitybindings"],
                 "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": ["kleym.io"], "resources": ["inferenceidentitybindings/status"],
                 "verbs": ["get", "update", "patch"]}
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tenant-bindings", "namespace": TENANT_NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"},
            "subjects": subject
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "clusterspiffeid-reader"},
            "rules": [{"apiGroups": ["spire.spiffe.io"], "resources": ["clusterspiffeids"],
                       "verbs": ["get"]}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "tenant-clusterspiffeid-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "clusterspiffeid-reader"},
            "subjects": subject
        }),
    ] {
        create_manifest(admin, &doc).await;
    }
    sa_client(cluster, TENANT_NS, "tenant").await
}

/// `(uid, resourceVersion)` of a ClusterSPIFFEID.
async fn identity(csids: &Api<ClusterSPIFFEID>, name: &str) -> (String, String) {
    let o = csids.get(name).await.unwrap();
    (o.uid().unwrap(), o.resource_version().unwrap())
}

/// A cluster with the two tenant namespaces, the platform's ClusterSPIFFEID, another
/// tenant's kleym output, the forging tenant, and kleym running.
struct World {
    _sim: Kubesim,
    admin: Client,
    csids: Api<ClusterSPIFFEID>,
    /// The forging tenant's bindings, through its own token.
    forger: Api<InferenceIdentityBinding>,
    /// The name of `t1/chat`'s kleym output.
    other_output: String,
    op: Operator,
}

impl World {
    async fn start() -> Self {
        let (sim, cluster, admin) =
            start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
        inference_namespace(&admin, TENANT_NS).await;
        inference_namespace(&admin, OTHER_NS).await;
        let csids: Api<ClusterSPIFFEID> = Api::all(admin.clone());
        // The platform's identity for one of its own workloads (not kleym's).
        create(
            &csids,
            json!({
                "apiVersion": "spire.spiffe.io/v1alpha1",
                "kind": "ClusterSPIFFEID",
                "metadata": {"name": PLATFORM},
                "spec": {
                    "spiffeIDTemplate": format!("spiffe://{TD}/platform/ingress"),
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}},
                    "podSelector": {"matchLabels": {"app": "ingress"}}
                }
            }),
        )
        .await;
        let op = Operator::start(&cluster, &admin).await;
        let other: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), OTHER_NS);
        create(&other, binding(OTHER_NS, "chat")).await;
        let b = wait_observed(&other, "chat", conditions::READY).await;
        let other_output = b.status.unwrap().cluster_spiffe_id.unwrap().name;
        let tenant = tenant(&cluster, &admin).await;
        let forger = Api::namespaced(tenant.clone(), TENANT_NS);
        // The tenant's rights are what the scenario says: no delete of ClusterSPIFFEIDs,
        // nothing in another namespace.
        let tenant_csids: Api<ClusterSPIFFEID> = Api::all(tenant.clone());
        tenant_csids.get(PLATFORM).await.expect("tenant may get");
        let denied = tenant_csids
            .delete(PLATFORM, &DeleteParams::default())
            .await
            .expect_err("tenant may not delete ClusterSPIFFEIDs");
        assert!(
            matches!(&denied, kube::Error::Api(s) if s.code == 403),
            "{denied:?}"
        );
        let foreign_ns: Api<InferenceIdentityBinding> = Api::namespaced(tenant, OTHER_NS);
        assert!(
            foreign_ns.get("chat").await.is_err(),
            "tenant confined to t5"
        );
        World {
            _sim: sim,
            admin,
            csids,
            forger,
            other_output,
            op,
        }
    }

    /// The tenant creates `name` and waits until it is Ready.
    async fn ready_binding(&self, name: &str) -> InferenceIdentityBinding {
        create(&self.forger, binding(TENANT_NS, name)).await;
        wait_observed(&self.forger, name, conditions::READY).await
    }

    /// The tenant writes `status.clusterSPIFFEID` of `name` to name the object `victim`.
    /// kleym may still be writing the binding's status right after it became Ready (the
    /// SPIRE stats read back from the ClusterSPIFFEID), which replaces the forged record
    /// with the true one; the tenant forges again until the forgery is what it reads back.
    async fn forge(&self, name: &str, victim: &str) {
        let (uid, _) = identity(&self.csids, victim).await;
        eventually(
            &format!("{name}: status forged to name {victim}"),
            || async {
                self.forger
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"status": {"clusterSPIFFEID": {"name": victim, "uid": uid}}}),
                        ),
                    )
                    .await
                    .expect("the tenant may write its binding's status");
                let b = self.forger.get(name).await.ok()?;
                (b.status?.cluster_spiffe_id?.name == victim).then_some(())
            },
        )
        .await;
    }

    /// The tenant edits the spec of `name` (a new generation kleym reconciles).
    async fn edit(&self, name: &str, ttl: &str) {
        self.forger
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"svid": {"ttl": ttl}}})),
            )
            .await
            .unwrap();
    }

    /// The tenant deletes `name`; waits until kleym's finalizer let it go.
    async fn delete_and_wait(&self, name: &str) {
        self.forger
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        eventually(&format!("{name} gone"), || async {
            self.forger
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    }

    async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), TENANT_NS);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

/// Forged status, then a spec edit: the platform's object and another namespace's output
/// are not deleted (before: the edit deleted the object the status named); the status is
/// corrected to the binding's own output and the forgery is reported as an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_status_and_a_spec_edit_touch_no_foreign_object() {
    let w = World::start().await;
    let own = cluster_spiffe_id_name(TENANT_NS, "forger");
    w.ready_binding("forger").await;
    for (victim, ttl) in [(PLATFORM.to_string(), "2h"), (w.other_output.clone(), "3h")] {
        let before = identity(&w.csids, &victim).await;
        let own_before = identity(&w.csids, &own).await;
        w.forge("forger", &victim).await;
        w.edit("forger", ttl).await;
        let b = wait_observed(&w.forger, "forger", conditions::READY).await;
        assert_eq!(
            identity(&w.csids, &victim).await,
            before,
            "{victim}: same UID and resourceVersion"
        );
        let recorded = b.status.unwrap().cluster_spiffe_id.unwrap();
        assert_eq!(recorded.name, own, "the record is kleym's again");
        assert_eq!(
            recorded.uid, own_before.0,
            "its own output, updated in place"
        );
    }
    // A repeated event is a series of the first one (which names the first victim).
    let (_, note) = eventually("the forgery is reported", || async {
        w.events_of("forger")
            .await
            .into_iter()
            .find(|(r, _)| r == "UntrustedClusterSPIFFEIDRecord")
    })
    .await;
    assert!(
        note.contains(PLATFORM) && note.contains("not touched"),
        "{note}"
    );
    w.op.stop().await;
}

/// Forged status, then deleting the binding: the finalizer's cleanup deletes the binding's
/// own output, never the object the status names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_status_and_deleting_the_binding_touch_no_foreign_object() {
    let w = World::start().await;
    for (name, victim) in [
        ("forger-a", PLATFORM.to_string()),
        ("forger-b", w.other_output.clone()),
    ] {
        w.ready_binding(name).await;
        let before = identity(&w.csids, &victim).await;
        w.forge(name, &victim).await;
        w.delete_and_wait(name).await;
        assert_eq!(
            identity(&w.csids, &victim).await,
            before,
            "{victim}: same UID and resourceVersion"
        );
        let own = cluster_spiffe_id_name(TENANT_NS, name);
        assert!(
            w.csids.get_opt(&own).await.unwrap().is_none(),
            "its own output is deleted with it"
        );
    }
    w.op.stop().await;
}

/// A foreign object holds the binding's own name; the forged status records that object's
/// UID, as if kleym had created it. kleym neither takes it over (before: force-applied, spec
/// replaced, kleym's labels added) nor deletes it with the binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_status_never_makes_a_foreign_object_at_the_bindings_name_kleyms() {
    let w = World::start().await;
    let name = cluster_spiffe_id_name(TENANT_NS, "squat");
    let foreign = create(
        &w.csids,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1",
            "kind": "ClusterSPIFFEID",
            "metadata": {"name": name},
            "spec": {
                "spiffeIDTemplate": format!("spiffe://{TD}/somebody-else"),
                "podSelector": {"matchLabels": {"app": "other"}}
            }
        }),
    )
    .await;
    create(&w.forger, binding(TENANT_NS, "squat")).await;
    let b = wait_observed(&w.forger, "squat", conditions::RENDER_FAILURE).await;
    let (_, reason, message) = condition(&b, conditions::RENDER_FAILURE).unwrap();
    assert_eq!(reason, "ForeignObjectHoldsName");
    assert!(message.contains(&name), "{message}");
    let before = identity(&w.csids, &name).await;

    w.forge("squat", &name).await;
    w.edit("squat", "2h").await;
    let b = wait_observed(&w.forger, "squat", conditions::RENDER_FAILURE).await;
    let (_, reason, _) = condition(&b, conditions::RENDER_FAILURE).unwrap();
    assert_eq!(reason, "ForeignObjectHoldsName", "still refused");
    let after = w.csids.get(&name).await.unwrap();
    assert_eq!(
        (after.uid().unwrap(), after.resource_version().unwrap()),
        before,
        "same UID and resourceVersion"
    );
    assert_eq!(after.spec, foreign.spec, "never taken over");
    assert!(after.labels().is_empty() && after.annotations().is_empty());

    w.forge("squat", &name).await;
    w.delete_and_wait("squat").await;
    assert_eq!(
        identity(&w.csids, &name).await,
        before,
        "not deleted with the binding"
    );
    w.op.stop().await;
}

/// The overlap warning decides "kleym's own object" by the ownership proof: a platform
/// default identity that selects every pod stays in the analysis although it carries
/// kleym's labels (before: the label hid it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_default_identity_with_kleyms_labels_still_gets_the_overlap_warning() {
    let w = World::start().await;
    create(
        &w.csids,
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1",
            "kind": "ClusterSPIFFEID",
            "metadata": {
                "name": "everything",
                "labels": {
                    "kleym.io/managed-by": "kleym",
                    "kleym.io/binding-namespace": TENANT_NS,
                    "kleym.io/binding-name": "forger"
                }
            },
            "spec": {"spiffeIDTemplate": format!("spiffe://{TD}/ns/{{{{ .PodMeta.Namespace }}}}/default")}
        }),
    )
    .await;
    w.ready_binding("forger").await;
    // The warning may come with a later status write than the first Ready one (the foreign
    // object can reach kleym's cache after the binding's first reconcile).
    eventually(
        "the overlap warning naming the foreign default identity",
        || async {
            let b = w.forger.get("forger").await.ok()?;
            b.status?
                .warnings
                .iter()
                .any(|w| {
                    w.reason == "OverlappingDefaultIdentity" && w.message.contains("everything")
                })
                .then_some(())
        },
    )
    .await;
    w.op.stop().await;
}

/// An object an earlier kleym wrote for a binding (server-side applied by `kleym`, legacy
/// annotation `kleym.io/binding-uid`) is adopted in place: same UID, now with the owner
/// annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_written_by_an_earlier_kleym_is_adopted_and_migrated() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, TENANT_NS).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), TENANT_NS);
    let b = create(&bindings, binding(TENANT_NS, "chat")).await;
    let name = cluster_spiffe_id_name(TENANT_NS, "chat");
    let csids: Api<ClusterSPIFFEID> = Api::all(admin.clone());
    let legacy = csids
        .patch(
            &name,
            &PatchParams::apply("kleym"),
            &Patch::Apply(json!({
                "apiVersion": "spire.spiffe.io/v1alpha1",
                "kind": "ClusterSPIFFEID",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kleym.io/managed-by": "kleym",
                        "kleym.io/binding-namespace": TENANT_NS,
                        "kleym.io/binding-name": "chat"
                    },
                    "annotations": {"kleym.io/binding-uid": b.uid().unwrap()}
                },
                "spec": {"spiffeIDTemplate": format!("spiffe://{TD}/ns/{TENANT_NS}/objective/chat")}
            })),
        )
        .await
        .unwrap();
    let op = Operator::start(&cluster, &admin).await;
    let b = wait_observed(&bindings, "chat", conditions::READY).await;
    let after = csids.get(&name).await.unwrap();
    assert_eq!(after.uid(), legacy.uid(), "adopted in place");
    assert_eq!(
        b.status.unwrap().cluster_spiffe_id.unwrap().uid,
        after.uid().unwrap()
    );
    let annotations = after.annotations();
    assert_eq!(
        annotations.get("kleym.io/owner"),
        Some(&format!("{TENANT_NS}/chat/{}", b.metadata.uid.unwrap()))
    );
    assert!(
        !annotations.contains_key("kleym.io/binding-uid"),
        "the legacy annotation goes: {annotations:?}"
    );
    op.stop().await;
}

/// Labels are kleym's output: an administrator or a labelling tool that changes
/// `kleym.io/binding-name` or removes `kleym.io/managed-by` (an update by another field
/// manager), or takes a label over by a forced apply, does not make kleym's own object
/// foreign. The owner annotation and kleym's field manager still prove it, so kleym puts
/// its labels back on the same object (same UID) and the binding stays Ready (before: it
/// was refused with `ForeignObjectHoldsName` for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleyms_labels_edited_by_someone_else_are_restored_on_its_own_object() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, TENANT_NS).await;
    let op = Operator::start(&cluster, &admin).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), TENANT_NS);
    create(&bindings, binding(TENANT_NS, "chat")).await;
    wait_observed(&bindings, "chat", conditions::READY).await;
    let name = cluster_spiffe_id_name(TENANT_NS, "chat");
    let csids: Api<ClusterSPIFFEID> = Api::all(admin.clone());
    let original = csids.get(&name).await.unwrap();
    let uid = original.uid().unwrap();
    let kleyms = original.labels().clone();
    assert_eq!(kleyms.len(), 3, "{kleyms:?}");

    let labeller = PatchParams {
        field_manager: Some("labeller".into()),
        ..PatchParams::default()
    };
    let edits = [
        // An update by another manager: one label rewritten, one removed.
        Patch::Merge(json!({"metadata": {"labels": {
            "kleym.io/binding-name": "renamed",
            "kleym.io/managed-by": null,
            "team": "payments"
        }}})),
        // All of kleym's labels removed.
        Patch::Merge(json!({"metadata": {"labels": {
            "kleym.io/binding-name": null,
            "kleym.io/binding-namespace": null,
            "kleym.io/managed-by": null
        }}})),
    ];
    for edit in edits {
        let edited = csids.patch(&name, &labeller, &edit).await.unwrap();
        assert_ne!(edited.labels(), &kleyms, "the edit took effect");
        let restored = eventually("kleym's labels restored", || async {
            let o = csids.get(&name).await.ok()?;
            kleyms
                .iter()
                .all(|(k, v)| o.labels().get(k) == Some(v))
                .then_some(o)
        })
        .await;
        assert_eq!(
            restored.uid().unwrap(),
            uid,
            "the same object, not a new one"
        );
        let b = bindings.get("chat").await.unwrap();
        let (ready, reason, _) = condition(&b, conditions::READY).unwrap();
        assert_eq!(
            (ready.as_str(), reason.as_str()),
            ("True", "Reconciled"),
            "{b:?}"
        );
        assert_eq!(b.status.unwrap().cluster_spiffe_id.unwrap().uid, uid);
    }
    // Another manager's label is left as it is.
    let o = csids.get(&name).await.unwrap();
    assert_eq!(o.labels().get("team").map(String::as_str), Some("payments"));

    // A forced apply by another manager that takes kleym's label over.
    let forced = PatchParams::apply("labeller").force();
    csids
        .patch(
            &name,
            &forced,
            &Patch::Apply(json!({
                "apiVersion": "spire.spiffe.io/v1alpha1",
                "kind": "ClusterSPIFFEID",
                "metadata": {"name": name, "labels": {"kleym.io/binding-name": "taken"}}
            })),
        )
        .await
        .unwrap();
    let restored = eventually("kleym's label taken back", || async {
        let o = csids.get(&name).await.ok()?;
        (o.labels().get("kleym.io/binding-name").map(String::as_str) == Some("chat")).then_some(o)
    })
    .await;
    assert_eq!(restored.uid().unwrap(), uid);
    op.stop().await;
}

/// The hub's X.509 user name on the spokes (`kleym trust-config --x509-username`).
const HUB_USER: &str = "kleym-hub.example.org";

/// A binding asking for its own SVID DNS names and `names` besides, with container
/// discriminator `container` (so that bindings of one test never collide).
fn binding_with_dns_names(ns: &str, name: &str, container: &str, names: &[&str]) -> Value {
    let mut b = binding(ns, name);
    b["spec"]["containerDiscriminator"]["value"] = json!(container);
    let mut all = vec![format!("{container}.{ns}.svc.cluster.local")];
    all.extend(names.iter().map(|n| n.to_string()));
    b["spec"]["svid"] = json!({"dnsNameTemplates": all});
    b
}

/// A tenant in `t1` cannot put another namespace's Service name or the hub's X.509 user
/// name into its SVIDs (SPIRE would put it into the certificate, the first DNS name into
/// its CN, which spokes trusting SPIRE's bundle map to the hub's user): the binding is
/// `Ready=False` naming the field, and no ClusterSPIFFEID is written, or the one it had is
/// withdrawn. A name in its own namespace, or under a suffix the operator allows, still
/// works (before: every one was passed through to SPIRE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_put_another_namespaces_or_the_hubs_name_into_its_svids() {
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    inference_namespace(&admin, OTHER_NS).await;
    let mut config = SpokeConfig::new(TD);
    config.svid_policy = Arc::new(
        SvidPolicy::new(SvidPolicySettings {
            dns_suffixes: vec!["example.org".into()],
            hub_x509_usernames: vec![HUB_USER.into()],
            ..SvidPolicySettings::default()
        })
        .unwrap(),
    );
    let op = Operator::start_with(&cluster, &admin, config).await;
    let bindings: Api<InferenceIdentityBinding> = Api::namespaced(admin.clone(), OTHER_NS);
    let csids: Api<ClusterSPIFFEID> = Api::all(admin.clone());

    // Allowed: its own Service name and a name under the operator's suffix.
    create(
        &bindings,
        binding_with_dns_names(OTHER_NS, "allowed", "c1", &["chat.example.org"]),
    )
    .await;
    wait_observed(&bindings, "allowed", conditions::READY).await;
    let output = csids
        .get(&cluster_spiffe_id_name(OTHER_NS, "allowed"))
        .await
        .unwrap();
    assert_eq!(
        output.spec.dns_name_templates,
        Some(vec![
            "c1.t1.svc.cluster.local".to_string(),
            "chat.example.org".to_string()
        ])
    );

    for (name, container, asked, reason) in [
        (
            "payments",
            "c2",
            "payments.t2.svc.cluster.local",
            "DNSNameOutsideNamespace",
        ),
        ("hub", "c3", HUB_USER, "ReservedHubIdentity"),
    ] {
        create(
            &bindings,
            binding_with_dns_names(OTHER_NS, name, container, &[asked]),
        )
        .await;
        let b = wait_observed(&bindings, name, conditions::UNSAFE_SELECTOR).await;
        let (status, ready_reason, message) = condition(&b, conditions::READY).unwrap();
        assert_eq!(status, "False");
        assert_eq!(ready_reason, reason);
        assert!(
            message.contains("spec.svid.dnsNameTemplates[1]") && message.contains(asked),
            "{message}"
        );
        assert!(
            csids
                .get_opt(&cluster_spiffe_id_name(OTHER_NS, name))
                .await
                .unwrap()
                .is_none(),
            "{name}: no ClusterSPIFFEID"
        );
    }

    // The allowed binding edited to ask for the hub's name: its output is withdrawn.
    bindings
        .patch(
            "allowed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"svid": {"dnsNameTemplates": [HUB_USER]}}})),
        )
        .await
        .unwrap();
    let b = wait_observed(&bindings, "allowed", conditions::UNSAFE_SELECTOR).await;
    assert_eq!(
        condition(&b, conditions::READY).unwrap().1,
        "ReservedHubIdentity"
    );
    eventually("the allowed binding's output withdrawn", || async {
        csids
            .get_opt(&cluster_spiffe_id_name(OTHER_NS, "allowed"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let all = csids.list(&ListParams::default()).await.unwrap();
    assert!(
        all.items.iter().all(|o| o
            .spec
            .dns_name_templates
            .iter()
            .flatten()
            .all(|n| n != HUB_USER && !n.contains(".t2."))),
        "no ClusterSPIFFEID names the hub or t2"
    );
    op.stop().await;
}
