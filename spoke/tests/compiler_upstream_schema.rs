//! Generated ClusterSPIFFEIDs are accepted by the real upstream ClusterSPIFFEID schema.

mod compiler_common;

use compiler_common::*;
use std::sync::Arc;

use kleym_api::SvidOptions;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::compiler::{ClusterConfig, SvidPolicy, SvidPolicySettings, compile};
use kubesim_schema::CompiledSchema;

fn upstream() -> CompiledSchema {
    let text = upstream_crds::upstream_yaml("spire.spiffe.io_clusterspiffeids.yaml");
    let crd: serde_json::Value = kleym_api::yaml::from_str(text).unwrap();
    CompiledSchema::new(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).unwrap()
}

#[test]
fn generated_objects_pass_the_upstream_schema_unchanged() {
    let schema = upstream();
    // Federation is off unless the operator allows a trust domain.
    let config = ClusterConfig {
        svid: Arc::new(
            SvidPolicy::new(SvidPolicySettings {
                federates_with: vec!["other.example".into()],
                ..SvidPolicySettings::default()
            })
            .unwrap(),
        ),
        ..config()
    };
    let mut with_svid = binding("svid", "chat", "vllm");
    with_svid.spec.svid = Some(SvidOptions {
        ttl: Some("1h".into()),
        jwt_ttl: Some("5m".into()),
        dns_name_templates: vec!["chat.team-a.svc".into()],
        federates_with: vec!["other.example".into()],
    });
    for input in [
        binding("a", "chat", "vllm"),
        pool_only("p", "chat"),
        with_svid,
    ] {
        let c = compile(&input, &config).unwrap();
        let mut obj = ClusterSPIFFEID::new(&c.output_name(), c.output.spec.clone());
        obj.metadata.labels = Some(c.output_labels().to_btree_map());
        let value = serde_json::to_value(&obj).unwrap();
        assert_eq!(
            schema.unknown_fields(&value),
            Vec::<String>::new(),
            "pruning would drop fields"
        );
        let mut defaulted = value.clone();
        schema.apply_defaults(&mut defaulted);
        assert_eq!(
            defaulted, value,
            "no server-side defaults: resync compares equal"
        );
        let errs = schema.validate(&value, None);
        assert!(errs.is_empty(), "{errs:?}");
    }
}
