//! Several clusters in one process: separate CAs and identities, a spoke trusting the hub's
//! ServiceAccount issuer (JWKS over HTTPS), clusters added at run time.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kubesim::{Kubesim, KubesimOptions};
use std::time::Duration;

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoke_trusts_the_hub_issuer_for_its_own_audience() {
    let sim = Kubesim::start(&["hub", "spoke-1", "spoke-2"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let spoke = sim.cluster("spoke-1").unwrap();
    let other = sim.cluster("spoke-2").unwrap();
    assert_ne!(hub.ca_pem(), spoke.ca_pem());
    assert_ne!(hub.admin_token(), spoke.admin_token());

    // The hub's admin token means nothing on a spoke.
    let wrong = spoke.client_for_token(&hub.admin_token()).await.unwrap();
    let err = Api::<Namespace>::all(wrong)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(is_status(&err, 401));

    // A hub ServiceAccount token for the spoke's audience.
    let hub_admin = hub.kube_client().await.unwrap();
    Api::<ServiceAccount>::namespaced(hub_admin, "default")
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("kleym-hub".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let token = hub
        .issue_sa_token(
            "default",
            "kleym-hub",
            &[spoke.url()],
            Duration::from_secs(3600),
            None,
        )
        .await
        .unwrap();
    let on_spoke = spoke.client_for_token(&token).await.unwrap();
    let cms = Api::<ConfigMap>::namespaced(on_spoke.clone(), "default");
    assert!(
        is_status(&cms.list(&ListParams::default()).await.unwrap_err(), 401),
        "not trusted yet"
    );

    spoke.trust_issuer(&hub, &[spoke.url()]).await.unwrap();
    let err = cms.list(&ListParams::default()).await.unwrap_err();
    assert!(
        is_status(&err, 403),
        "authenticated, not yet authorized: {err:?}"
    );

    // Grant the hub identity on the spoke.
    let spoke_admin = spoke.kube_client().await.unwrap();
    Api::<ClusterRole>::all(spoke_admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta {
                    name: Some("kleym-reader".into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["".into()]),
                    resources: Some(vec!["configmaps".into()]),
                    verbs: vec!["list".into()],
                    ..Default::default()
                }]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(spoke_admin)
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some("kleym-hub".into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: "kleym-reader".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    name: "system:serviceaccount:default:kleym-hub".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    cms.list(&ListParams::default())
        .await
        .expect("the hub identity may list on the spoke");

    // The same token is not valid for another spoke (audience), even one that trusts the hub.
    other.trust_issuer(&hub, &[other.url()]).await.unwrap();
    let on_other =
        Api::<ConfigMap>::namespaced(other.client_for_token(&token).await.unwrap(), "default");
    assert!(is_status(
        &on_other.list(&ListParams::default()).await.unwrap_err(),
        401
    ));

    // Rotating the hub's key: old tokens still verify (previous key published), new ones too
    // (the spoke refetches the JWKS for an unknown kid).
    hub.rotate_sa_signing_key().await.unwrap();
    let fresh = hub
        .issue_sa_token(
            "default",
            "kleym-hub",
            &[spoke.url()],
            Duration::from_secs(3600),
            None,
        )
        .await
        .unwrap();
    let fresh_api =
        Api::<ConfigMap>::namespaced(spoke.client_for_token(&fresh).await.unwrap(), "default");
    let mut ok = false;
    for _ in 0..30 {
        if fresh_api.list(&ListParams::default()).await.is_ok() {
            ok = true;
            break;
        }
        // The JWKS refetch is rate limited; wait it out.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(ok, "token signed with the rotated key is accepted");
    cms.list(&ListParams::default())
        .await
        .expect("old token still valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_can_be_added_and_removed_at_run_time() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let added = sim.add_cluster("late").await.unwrap();
    assert!(sim.add_cluster("late").await.is_err(), "names are unique");
    let client = added.kube_client().await.unwrap();
    Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(sim.clusters().len(), 2);
    let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml()).unwrap();
    assert_eq!(kc.contexts.len(), 2);
    sim.remove_cluster("late").unwrap();
    assert!(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await
            .is_err()
    );
    assert!(
        Kubesim::start(&["a", "a"], KubesimOptions::default())
            .await
            .is_err()
    );
}

/// With `shared_port`, every cluster is served through one listening socket, each at a
/// loopback address of its own: each answers as itself under its own CA, a refusal fault on
/// one leaves the others serving, and a cluster with a runtime of its own keeps its own socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_on_a_shared_port_answer_at_their_own_addresses() {
    let sim = Kubesim::start(
        &["hub", "a", "b"],
        KubesimOptions {
            shared_port: true,
            own_threads: ["hub".to_string()].into(),
            ..KubesimOptions::default()
        },
    )
    .await
    .unwrap();
    let (hub, a, b) = (
        sim.cluster("hub").unwrap(),
        sim.cluster("a").unwrap(),
        sim.cluster("b").unwrap(),
    );
    let (addr_a, addr_b) = (a.server().addr, b.server().addr);
    assert_eq!(addr_a.port(), addr_b.port(), "one port");
    assert_ne!(addr_a.ip(), addr_b.ip(), "an address each");
    assert!(addr_a.ip().is_loopback() && addr_b.ip().is_loopback());
    assert_ne!(
        hub.server().addr.port(),
        addr_a.port(),
        "the hub has its own socket"
    );

    // Each client trusts only its cluster's CA and checks the address in its certificate.
    let api_a = Api::<Namespace>::all(a.kube_client().await.unwrap());
    let api_b = Api::<Namespace>::all(b.kube_client().await.unwrap());
    let ns = |name: &str| Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api_a
        .create(&PostParams::default(), &ns("only-in-a"))
        .await
        .unwrap();
    assert!(api_a.get_opt("only-in-a").await.unwrap().is_some());
    assert!(
        api_b.get_opt("only-in-a").await.unwrap().is_none(),
        "b is not a"
    );
    // a's credentials mean nothing at b's address.
    let wrong = b.client_for_token(&a.admin_token()).await.unwrap();
    let err = Api::<Namespace>::all(wrong)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(is_status(&err, 401), "{err}");

    // Refusing connections at a: a's clients fail, b's are served.
    a.faults().set_refuse_connections(true);
    assert!(
        lists_become(&api_a, false).await,
        "a still served while refusing connections"
    );
    api_b.list(&ListParams::default()).await.unwrap();
    a.faults().set_refuse_connections(false);
    assert!(
        lists_become(&api_a, true).await,
        "a serves again once the refusal is lifted"
    );

    // A removed cluster's address answers no more (closed before any TLS).
    sim.remove_cluster("b");
    assert!(
        lists_become(&api_b, false).await,
        "b still served after its removal"
    );
}

/// Whether listing through `api` comes to succeed (`ok`) or fail within 5 s.
async fn lists_become(api: &Api<Namespace>, ok: bool) -> bool {
    for _ in 0..100 {
        if api.list(&ListParams::default()).await.is_ok() == ok {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
