//! From a real ClusterProfile (typed `kleym_api` object, KEP example in YAML) and a real
//! provider file to the effective access configuration and the plugin's KUBERNETES_EXEC_INFO.

use base64::Engine as _;
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_hub::access::{AccessProfile, ProviderSet, SelectOptions, select};
use kleym_hub::credentials::exec_info;

fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["spoke-ca".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn kep_example_profile_to_effective_access() {
    let ca = ca_pem();
    let yaml = std::fs::read_to_string(fixture("clusterprofile-secretreader.yaml"))
        .unwrap()
        .replace(
            "CA_PLACEHOLDER",
            &base64::engine::general_purpose::STANDARD.encode(&ca),
        );
    let cp: ClusterProfile = kleym_api::yaml::from_str(&yaml).unwrap();
    let profile = AccessProfile::from(&cp);
    assert_eq!(profile.spoke_name(), "fleet/my-cluster-1");
    // The JSON path gives the same view as the typed path.
    let as_json = serde_json::to_value(&cp).unwrap();
    assert_eq!(AccessProfile::from_profile_json(&as_json).unwrap(), profile);

    let providers = ProviderSet::load(Some(&fixture("providers.json")), &[]).unwrap();
    // Hub order: secretreader first, so it wins although the profile lists google first.
    let eff = select(&providers, &profile, &SelectOptions::default()).unwrap();
    assert_eq!(eff.provider, "secretreader");
    assert_eq!(eff.cluster.server, "https://spoke-1.example:6443");
    assert_eq!(
        eff.cluster.certificate_authority_pem.as_deref(),
        Some(ca.as_bytes())
    );
    assert_eq!(
        eff.cluster.tls_server_name.as_deref(),
        Some("api.spoke-1.internal")
    );
    assert!(eff.cluster.disable_compression);
    assert_eq!(
        eff.exec.args,
        vec![
            "credential",
            "secret-reader",
            "--namespace",
            "kleym-system",
            "--audience",
            "https://spoke-1.example:6443"
        ]
    );
    // AppendIfNotExists: the hub's TENANT_ID wins.
    assert_eq!(eff.exec.env.len(), 1);
    assert_eq!(eff.exec.env[0].value, "hub-default");

    let info = exec_info(&eff);
    assert_eq!(
        info["spec"]["cluster"]["config"],
        serde_json::json!({"clusterName": "spoke-1"})
    );
    assert_eq!(
        info["spec"]["cluster"]["certificate-authority-data"],
        base64::engine::general_purpose::STANDARD.encode(&ca)
    );
    // Reserved args/envs extensions are not passed to the plugin.
    assert_eq!(
        info["spec"]["cluster"].as_object().unwrap().len(),
        5,
        "{info}"
    );
}

#[test]
fn profile_without_cluster_is_refused_not_a_crash() {
    let cp: ClusterProfile = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": "p", "namespace": "fleet"},
        "spec": {"clusterManager": {"name": "m"}},
        "status": {"accessProviders": [{"name": "google"}]}
    }))
    .unwrap();
    let providers = ProviderSet::load(Some(&fixture("providers.json")), &[]).unwrap();
    let err = select(
        &providers,
        &AccessProfile::from(&cp),
        &SelectOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("cluster field cluster"), "{err}");
}
