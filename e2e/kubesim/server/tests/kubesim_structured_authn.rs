//! kube-apiserver's structured authentication in kubesim: a cluster started with an
//! `AuthenticationConfiguration` trusts another cluster's ServiceAccount issuer through OIDC
//! discovery, maps the user with a prefix and refuses tokens for other audiences; an invalid
//! configuration is refused with the field named and keeps the previous one.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use std::time::Duration;

fn authn_config(issuer: &ClusterHandle, audience: &str) -> String {
    let ca = issuer.ca_pem().replace('\n', "\n          ");
    format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
  - issuer:
      url: {url}
      audiences: ["{audience}"]
      certificateAuthority: |
          {ca}
    claimValidationRules:
      - expression: "claims.sub == 'system:serviceaccount:kleym:hub'"
        message: sub must be the hub
    claimMappings:
      username:
        claim: sub
        prefix: "kleym:"
    userValidationRules:
      - expression: "!user.username.startsWith('system:')"
        message: no system users
"#,
        url = issuer.url(),
    )
}

async fn hub_token(hub: &ClusterHandle, sa: &str, audience: &str) -> String {
    let client = hub.kube_client().await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client, "kleym");
    let _ = sas
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await;
    hub.issue_sa_token(
        "kleym",
        sa,
        &[audience.to_string()],
        Duration::from_secs(600),
        None,
    )
    .await
    .unwrap()
}

async fn whoami(cluster: &ClusterHandle, token: &str) -> Option<String> {
    let reviews: Api<TokenReview> = Api::all(cluster.kube_client().await.unwrap());
    let review = reviews
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let status = review.status.unwrap_or_default();
    status
        .authenticated
        .unwrap_or(false)
        .then(|| status.user.and_then(|u| u.username).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoke_trusts_the_issuer_of_its_authentication_configuration() {
    let sim = Kubesim::start(&["hub", "spoke-a", "spoke-b"], KubesimOptions::default())
        .await
        .unwrap();
    let (hub, a, b) = (
        sim.cluster("hub").unwrap(),
        sim.cluster("spoke-a").unwrap(),
        sim.cluster("spoke-b").unwrap(),
    );
    let hub_client = hub.kube_client().await.unwrap();
    Api::<Namespace>::all(hub_client)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("kleym".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    a.set_authentication_config(&authn_config(&hub, &a.url()))
        .unwrap();
    b.set_authentication_config(&authn_config(&hub, &b.url()))
        .unwrap();

    let for_a = hub_token(&hub, "hub", &a.url()).await;
    assert_eq!(
        whoami(&a, &for_a).await.as_deref(),
        Some("kleym:system:serviceaccount:kleym:hub")
    );
    // Audience confinement: spoke B refuses the token minted for spoke A.
    assert_eq!(whoami(&b, &for_a).await, None);
    // The mapped user is authenticated (403 without RBAC, not 401).
    let as_hub = a.client_for_token(&for_a).await.unwrap();
    let err = Api::<Namespace>::all(as_hub)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );
    // The claim validation rule: another ServiceAccount of the hub is refused.
    let other = hub_token(&hub, "other", &a.url()).await;
    assert_eq!(whoami(&a, &other).await, None);

    // An invalid configuration is refused, named, and the previous one stays.
    let bad = authn_config(&hub, &a.url()).replace("prefix: \"kleym:\"", "");
    let err = a.set_authentication_config(&bad).unwrap_err().to_string();
    assert!(
        err.contains("jwt[0].claimMappings.username.prefix"),
        "{err}"
    );
    assert!(whoami(&a, &for_a).await.is_some());
    // Start-up from options refuses the same way.
    let mut options = KubesimOptions::default();
    options.authentication_configs.insert("x".into(), bad);
    let err = Kubesim::start(&["x"], options)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("prefix"), "{err}");
}

async fn client_with_cert(c: &ClusterHandle, cert_pem: String, key_pem: String) -> kube::Client {
    let yaml =
        c.kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::ClientCert { cert_pem, key_pem });
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_adds_a_certificate_authority() {
    let outside = kubesim_auth::pki::ClusterPki::generate("outside").unwrap();
    let stranger = kubesim_auth::pki::ClusterPki::generate("stranger").unwrap();
    let mut options = KubesimOptions::default();
    options
        .client_cas
        .insert("a".into(), outside.ca_cert_pem().to_string());
    let sim = Kubesim::start(&["a"], options).await.unwrap();
    let a = sim.cluster("a").unwrap();
    let groups = ["system:masters".to_string()];
    let (cert, key) = outside
        .issue_client_cert("hub", &groups, Duration::from_secs(600))
        .unwrap();
    Api::<Namespace>::all(client_with_cert(&a, cert, key).await)
        .list(&ListParams::default())
        .await
        .expect("a certificate of the added CA authenticates");
    let (cert, key) = stranger
        .issue_client_cert("hub", &groups, Duration::from_secs(600))
        .unwrap();
    let refused = Api::<Namespace>::all(client_with_cert(&a, cert, key).await)
        .list(&ListParams::default())
        .await;
    assert!(refused.is_err(), "a certificate of another CA is refused");
}
