//! Compiler benchmark (no harness): µs per `compile`, ms for `analyze` over 100k bindings.
//!
//! Run in release: `cargo bench -p kleym-spoke --bench compiler_bench`.
//! Set `KLEYM_BENCH_BINDINGS` to change the binding count.

use std::hint::black_box;
use std::time::Instant;

use kleym_api::{
    ContainerDiscriminator, DiscriminatorType, IdentityMode, InferenceIdentityBindingSpec,
    SelectorSource, TargetKind, TargetRef,
};
use kleym_spoke::compiler::{
    BindingInput, ClusterConfig, ForeignSpiffeId, Lookup, NamespaceLabels, PoolRefView, PoolView,
    TargetView, analyze, compile,
};

/// 100 bindings per namespace over 10 pools; every 50th binding collides with its
/// neighbour, and pool 9 mixes PoolOnly and PerObjective bindings, so the analysis has
/// findings to report.
fn input(i: usize) -> BindingInput {
    let ns = format!("team-{}", i / 100);
    // Binding 50k+1 shares binding 50k's pool and container: an IdentityCollision.
    let twin = if i % 50 == 1 { i - 1 } else { i };
    let pool = format!("pool-{}", twin % 10);
    let objective = format!("objective-{i}");
    let container = twin;
    let mode = if i % 20 == 19 {
        IdentityMode::PoolOnly
    } else {
        IdentityMode::PerObjective
    };
    BindingInput {
        namespace: ns.clone(),
        name: format!("binding-{i}"),
        spec: InferenceIdentityBindingSpec {
            target_ref: TargetRef {
                kind: TargetKind::InferenceObjective,
                name: objective.clone(),
            },
            spiffe_id_template: None,
            selector_source: SelectorSource::DerivedFromPool,
            workload_selector_templates: vec![
                "k8s:ns:{{ .Namespace }}".into(),
                "k8s:sa:model-server".into(),
                "k8s:pod-label:app.kubernetes.io/part-of:{{ .PoolName }}".into(),
            ],
            mode,
            container_discriminator: (mode == IdentityMode::PerObjective).then(|| {
                ContainerDiscriminator {
                    type_: DiscriminatorType::ContainerName,
                    value: format!("model-{container}"),
                }
            }),
            svid: None,
        },
        target: Lookup::Found(TargetView {
            kind: TargetKind::InferenceObjective,
            group: "llm-d.ai".into(),
            namespace: ns.clone(),
            name: objective,
            pool_ref: PoolRefView {
                group: "inference.networking.k8s.io".into(),
                kind: "InferencePool".into(),
                name: pool.clone(),
                namespace: None,
            },
        }),
        pool: Lookup::Found(PoolView {
            group: "inference.networking.k8s.io".into(),
            namespace: ns,
            name: pool.clone(),
            match_labels: kleym_api::label_map::LabelMap::from([
                ("app.kubernetes.io/name".to_string(), pool.clone()),
                ("app.kubernetes.io/part-of".to_string(), pool),
            ]),
        }),
    }
}

fn main() {
    let n: usize = std::env::var("KLEYM_BENCH_BINDINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let config = ClusterConfig {
        trust_domain: "example.org".into(),
        class_name: Some("spire".into()),
        ..ClusterConfig::default()
    };
    let inputs: Vec<BindingInput> = (0..n).map(input).collect();

    // Warm up, then time compile over all inputs.
    for b in inputs.iter().take(1000) {
        black_box(compile(b, &config).ok());
    }
    let start = Instant::now();
    let compiled: Vec<_> = inputs
        .iter()
        .filter_map(|b| compile(b, &config).ok())
        .collect();
    let compile_total = start.elapsed();
    assert_eq!(compiled.len(), n, "every benchmark binding compiles");

    let foreign = vec![ForeignSpiffeId {
        name: "spire-default".into(),
        class_name: Some("spire".into()),
        fallback: false,
        namespace_selector: None,
        pod_selector: None,
        workload_selector_templates: vec![],
        // SPIRE's usual default ID, rendered for each pool's pods by the masking analysis.
        spiffe_id_template:
            "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}"
                .into(),
        ..ForeignSpiffeId::default()
    }];
    let namespaces = NamespaceLabels::new();
    black_box(analyze(&compiled, &[], &namespaces));
    let mut best = f64::MAX;
    let mut findings = 0;
    for _ in 0..3 {
        let start = Instant::now();
        let analysis = analyze(&compiled, &[], &namespaces);
        best = best.min(start.elapsed().as_secs_f64() * 1e3);
        findings = analysis.verdicts.len();
    }
    let start = Instant::now();
    let with_foreign = analyze(&compiled, &foreign, &namespaces);
    let foreign_ms = start.elapsed().as_secs_f64() * 1e3;

    println!("bindings: {n}");
    println!(
        "compile: {:.2} µs per binding ({:.0} ms total)",
        compile_total.as_secs_f64() * 1e6 / n as f64,
        compile_total.as_secs_f64() * 1e3
    );
    println!("analyze: {best:.1} ms (best of 3), {findings} bindings with findings");
    println!(
        "analyze with 1 overlapping foreign ClusterSPIFFEID: {foreign_ms:.1} ms, {} bindings with findings",
        with_foreign.verdicts.len()
    );
}
