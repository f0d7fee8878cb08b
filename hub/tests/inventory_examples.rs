//! The example ClusterProfiles in deploy/examples/clusterprofiles are right in everything but
//! the CA, which is an obvious placeholder: applied as-is, each is refused for exactly
//! `certificate-authority-data`; with a real CA put in its place, each engages with the
//! example provider file.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kleym_api::external::clusterprofile::ClusterProfile;
use kleym_hub::access::ProviderSet;
use kleym_hub::inventory::{Decision, InventoryOptions, evaluate};

const PLACEHOLDER: &str = "PLACEHOLDER+base64+of+the+spoke+API+server+CA+bundle+PEM";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn example_profiles() -> Vec<(String, String)> {
    let dir = repo().join("deploy/examples/clusterprofiles");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in text.split("\n---") {
            let v: serde_json::Value = kleym_api::yaml::from_str(doc).unwrap();
            if v["kind"] == "ClusterProfile" {
                out.push((format!("{}", f.display()), doc.to_string()));
            }
        }
    }
    out
}

fn ca_b64() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["spoke-ca".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    base64::engine::general_purpose::STANDARD.encode(params.self_signed(&key).unwrap().pem())
}

#[test]
fn examples_are_refused_only_for_the_placeholder_ca() {
    let providers = ProviderSet::load(
        Some(&repo().join("deploy/examples/providers/providers.yaml")),
        &[],
    )
    .unwrap();
    let opts = InventoryOptions {
        trust_domain: Some("example.org".into()),
        ..InventoryOptions::default()
    };
    let profiles = example_profiles();
    assert!(profiles.len() >= 5, "{}", profiles.len());
    let ca = ca_b64();
    for (file, doc) in profiles {
        // `by-hand.yaml` is metadata and spec only: its status, with the access providers,
        // is patched through the subresource (docs/install.md), so it holds no CA at all.
        let parsed: ClusterProfile = kleym_api::yaml::from_str(&doc).unwrap();
        if parsed.status.is_none() {
            assert!(
                file.ends_with("by-hand.yaml"),
                "{file}: a profile without status"
            );
            continue;
        }
        assert!(doc.contains(PLACEHOLDER), "{file}: no placeholder CA");
        assert!(
            doc.contains("# PLACEHOLDER: replace with the spoke API server's CA bundle"),
            "{file}: the placeholder says what to put there"
        );
        let as_is: ClusterProfile = kleym_api::yaml::from_str(&doc).unwrap();
        match evaluate(&as_is, &providers, &opts) {
            Decision::Refused { reason } => assert!(
                reason.contains("certificate-authority-data"),
                "{file}: {reason}"
            ),
            other => panic!("{file}: the placeholder must not be usable: {other:?}"),
        }
        let fixed: ClusterProfile =
            kleym_api::yaml::from_str(&doc.replace(PLACEHOLDER, &ca)).unwrap();
        let d = evaluate(&fixed, &providers, &opts);
        assert!(matches!(d, Decision::Engage(_)), "{file}: {d:?}");
    }
}
