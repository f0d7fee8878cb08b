//! compile(): the happy paths, every refusal reason and every escape attempt.

mod compiler_common;

use compiler_common::*;
use kleym_api::{DiscriminatorType, IdentityMode, SvidOptions, TargetKind};
use std::sync::Arc;
use std::time::Duration;

use kleym_spoke::compiler::{
    ClusterConfig, Lookup, Reason, Refusal, RefusalKind, SvidPolicy, SvidPolicySettings,
    TargetView, compile,
};

#[test]
fn per_objective_default_output() {
    let c = ok(&binding("chat-id", "chat", "vllm"));
    assert_eq!(
        c.spiffe_id(),
        "spiffe://example.org/ns/team-a/objective/chat"
    );
    assert_eq!(
        c.selectors(),
        [
            "k8s:container-name:vllm",
            "k8s:ns:team-a",
            "k8s:pod-label:app:model",
            "k8s:sa:model-server"
        ]
    );
    assert_eq!(c.service_account, "model-server");
    let spec = &c.output.spec;
    assert_eq!(spec.spiffe_id_template, c.spiffe_id());
    assert_eq!(
        spec.workload_selector_templates.as_ref(),
        Some(&c.selectors().to_vec())
    );
    assert_eq!(spec.fallback, Some(false));
    assert_eq!(spec.hint.as_deref(), Some("chat"));
    assert_eq!(spec.class_name, None);
    assert_eq!(
        spec.namespace_selector.as_ref().unwrap().match_labels,
        Some(labels(&[("kubernetes.io/metadata.name", "team-a")]).into())
    );
    assert_eq!(
        spec.pod_selector.as_ref().unwrap().match_labels,
        Some(labels(&[("app", "model")]).into())
    );
    assert!(c.output_name().starts_with("kleym-team-a-chat-id-"));
    assert_eq!(
        c.output_labels()
            .get("kleym.io/managed-by")
            .unwrap_or_default(),
        "kleym"
    );
    assert_eq!(
        c.output_labels()
            .get("kleym.io/binding-namespace")
            .unwrap_or_default(),
        "team-a"
    );
    assert_eq!(
        c.output_labels()
            .get("kleym.io/binding-name")
            .unwrap_or_default(),
        "chat-id"
    );
}

#[test]
fn pool_only_default_output_and_class_name() {
    let cfg = ClusterConfig {
        trust_domain: TD.into(),
        class_name: Some("spire-a".into()),
        ..ClusterConfig::default()
    };
    let c = compile(&pool_only("p", "chat"), &cfg).unwrap();
    assert_eq!(c.spiffe_id(), "spiffe://example.org/ns/team-a/pool/pool");
    assert!(!c.selectors().iter().any(|s| s.contains("container")));
    assert_eq!(c.output.spec.hint.as_deref(), Some("pool"));
    assert_eq!(c.output.spec.class_name.as_deref(), Some("spire-a"));
}

#[test]
fn container_image_discriminator() {
    let mut b = binding("b", "chat", "x");
    b.spec.container_discriminator.as_mut().unwrap().type_ = DiscriminatorType::ContainerImage;
    b.spec.container_discriminator.as_mut().unwrap().value = "ghcr.io/vllm/vllm:0.9".into();
    let c = ok(&b);
    assert!(
        c.selectors()
            .contains(&"k8s:container-image:ghcr.io/vllm/vllm:0.9".to_string())
    );
}

#[test]
fn templates_render_all_variables_and_override_id() {
    let mut b = binding("b", "chat", "vllm");
    b.spec.spiffe_id_template = Some(
        "spiffe://{{ .TrustDomain }}/ns/{{.Namespace}}/{{ .Mode }}/{{ .PoolName }}/{{ .ObjectiveName }}/{{ .ContainerName }}/{{ .BindingName }}".into(),
    );
    b.spec
        .workload_selector_templates
        .push("k8s:pod-label:tier:{{ .PoolName }}".into());
    let c = ok(&b);
    assert_eq!(
        c.spiffe_id(),
        "spiffe://example.org/ns/team-a/PerObjective/pool/chat/vllm/b"
    );
    assert!(
        c.selectors()
            .contains(&"k8s:pod-label:tier:pool".to_string())
    );
}

#[test]
fn svid_options_pass_through() {
    let mut b = binding("b", "chat", "vllm");
    b.spec.svid = Some(SvidOptions {
        ttl: Some("1h".into()),
        jwt_ttl: Some("0s".into()),
        dns_name_templates: vec![
            "{{ .ObjectiveName }}.{{ .Namespace }}.svc".into(),
            "a.example".into(),
        ],
        federates_with: vec!["z.example".into(), "a.example".into(), "z.example".into()],
    });
    let spec = compile(&b, &permissive()).unwrap().output.spec;
    assert_eq!(spec.ttl.as_deref(), Some("1h"));
    assert_eq!(spec.jwt_ttl, None, "zero TTL is SPIRE's default: unset");
    assert_eq!(
        spec.dns_name_templates,
        Some(vec!["a.example".into(), "chat.team-a.svc".into()])
    );
    assert_eq!(
        spec.federates_with,
        Some(vec!["a.example".into(), "z.example".into()])
    );

    for bad in [
        SvidOptions {
            dns_name_templates: vec!["Bad_Name".into()],
            ..Default::default()
        },
        SvidOptions {
            federates_with: vec!["spiffe://x".into()],
            ..Default::default()
        },
        SvidOptions {
            ttl: Some("-1h".into()),
            ..Default::default()
        },
        SvidOptions {
            jwt_ttl: Some("soon".into()),
            ..Default::default()
        },
    ] {
        let mut b = binding("b", "chat", "vllm");
        b.spec.svid = Some(bad.clone());
        assert_eq!(refused(&b).0, Reason::InvalidSvidOption, "{bad:?}");
    }
}

#[test]
fn legacy_inference_model_resolves_through_its_pool_ref() {
    let mut b = binding("b", "llama", "vllm");
    b.spec.target_ref.kind = TargetKind::InferenceModel;
    let mut t = objective(NS, "llama", "old-pool");
    t.kind = TargetKind::InferenceModel;
    t.group = "inference.networking.x-k8s.io".into();
    t.pool_ref.group = "inference.networking.x-k8s.io".into();
    b.target = Lookup::Found(t);
    let mut p = pool(NS, "old-pool", &[("app", "llama")]);
    p.group = "inference.networking.x-k8s.io".into();
    b.pool = Lookup::Found(p);
    let c = ok(&b);
    assert_eq!(c.spiffe_id(), "spiffe://example.org/ns/team-a/model/llama");
    assert_eq!(c.pool.group, "inference.networking.x-k8s.io");
    assert!(
        c.selectors()
            .contains(&"k8s:pod-label:app:llama".to_string())
    );
}

#[test]
fn both_objective_groups_and_both_pool_groups_resolve() {
    for objective_group in ["llm-d.ai", "inference.networking.x-k8s.io"] {
        for pool_group in [
            "inference.networking.k8s.io",
            "inference.networking.x-k8s.io",
        ] {
            let mut b = binding("b", "chat", "vllm");
            let mut t = objective(NS, "chat", "pool");
            t.group = objective_group.into();
            t.pool_ref.group = pool_group.into();
            b.target = Lookup::Found(t);
            let mut p = pool(NS, "pool", &[("app", "model")]);
            p.group = pool_group.into();
            b.pool = Lookup::Found(p);
            assert_eq!(ok(&b).pool.group, pool_group);
        }
    }
}

// ---- InvalidRef ----

#[test]
fn invalid_refs() {
    let mut b = binding("b", "chat", "vllm");
    b.target = Lookup::NotFound;
    assert_eq!(refused(&b).0, Reason::TargetNotFound);
    b.target = Lookup::CrdNotServed;
    assert_eq!(refused(&b).0, Reason::TargetCRDNotServed);

    let mut b = binding("b", "chat", "vllm");
    b.pool = Lookup::NotFound;
    let (reason, msg) = refused(&b);
    assert_eq!(reason, Reason::PoolNotFound);
    assert!(
        msg.contains("spec.poolRef") && msg.contains("team-a/pool"),
        "{msg}"
    );
    b.pool = Lookup::CrdNotServed;
    assert_eq!(refused(&b).0, Reason::PoolCRDNotServed);
    assert_eq!(Reason::PoolCRDNotServed.kind(), RefusalKind::InvalidRef);
}

#[test]
fn cross_namespace_refs_are_refused() {
    // poolRef naming another namespace.
    let mut b = binding("b", "chat", "vllm");
    let mut t = objective(NS, "chat", "pool");
    t.pool_ref.namespace = Some("team-b".into());
    b.target = Lookup::Found(t);
    let (reason, msg) = refused(&b);
    assert_eq!(reason, Reason::CrossNamespaceRef);
    assert!(msg.contains("spec.poolRef.namespace"), "{msg}");
    // A target or pool supplied from another namespace.
    let mut b = binding("b", "chat", "vllm");
    b.target = Lookup::Found(objective("team-b", "chat", "pool"));
    assert_eq!(refused(&b).0, Reason::CrossNamespaceRef);
    let mut b = binding("b", "chat", "vllm");
    b.pool = Lookup::Found(pool("team-b", "pool", &[("app", "model")]));
    assert_eq!(refused(&b).0, Reason::CrossNamespaceRef);
    // Same-namespace poolRef.namespace is fine.
    let mut b = binding("b", "chat", "vllm");
    let mut t = objective(NS, "chat", "pool");
    t.pool_ref.namespace = Some(NS.into());
    b.target = Lookup::Found(t);
    ok(&b);
}

#[test]
fn unsupported_groups_and_kinds_are_refused() {
    let cases: [fn(&mut TargetView); 6] = [
        |t| t.pool_ref.kind = "Service".into(),
        |t| t.pool_ref.group = "".into(),
        |t| t.pool_ref.group = "example.com".into(),
        |t| t.group = "inference.networking.k8s.io".into(),
        |t| t.kind = TargetKind::InferenceModel,
        |t| t.name = "other".into(),
    ];
    for (i, mutate) in cases.iter().enumerate() {
        let mut b = binding("b", "chat", "vllm");
        let mut t = objective(NS, "chat", "pool");
        mutate(&mut t);
        b.target = Lookup::Found(t);
        assert_eq!(refused(&b).0, Reason::UnsupportedRef, "case {i}");
    }
    // A legacy InferenceModel from a non-legacy group.
    let mut b = binding("b", "m", "vllm");
    b.spec.target_ref.kind = TargetKind::InferenceModel;
    let mut t = objective(NS, "m", "pool");
    t.kind = TargetKind::InferenceModel;
    b.target = Lookup::Found(t);
    assert_eq!(refused(&b).0, Reason::UnsupportedRef);
}

// ---- UnsafeSelector ----

fn with_templates(templates: &[&str]) -> kleym_spoke::compiler::BindingInput {
    let mut b = binding("b", "chat", "vllm");
    b.spec.workload_selector_templates = templates.iter().map(|s| s.to_string()).collect();
    b
}

#[test]
fn namespace_selector_escapes() {
    let cases: &[(&[&str], Reason)] = &[
        (&["k8s:sa:s"], Reason::MissingNamespaceSelector),
        (
            &["k8s:ns:team-b", "k8s:sa:s"],
            Reason::ForeignNamespaceSelector,
        ),
        (
            &["k8s:ns:team-a", "k8s:ns:team-b", "k8s:sa:s"],
            Reason::ForeignNamespaceSelector,
        ),
        (
            &["k8s:ns:team-b", "k8s:ns:team-a", "k8s:sa:s"],
            Reason::ForeignNamespaceSelector,
        ),
        (
            &["k8s:ns:team-a-extra", "k8s:sa:s"],
            Reason::ForeignNamespaceSelector,
        ),
        (
            &["k8s:ns:{{ .PoolName }}", "k8s:sa:s"],
            Reason::ForeignNamespaceSelector,
        ),
    ];
    for (templates, want) in cases {
        let (reason, msg) = refused(&with_templates(templates));
        assert_eq!(reason, *want, "{templates:?}");
        assert_eq!(reason.kind(), RefusalKind::UnsafeSelector);
        assert!(msg.contains("spec.workloadSelectorTemplates"), "{msg}");
    }
    // Duplicated identical namespace selectors collapse to one: accepted.
    ok(&with_templates(&[
        "k8s:ns:team-a",
        "k8s:ns:{{ .Namespace }}",
        "k8s:sa:s",
    ]));
}

#[test]
fn service_account_selector_escapes() {
    let cases: &[(&[&str], Reason)] = &[
        (&["k8s:ns:team-a"], Reason::MissingServiceAccountSelector),
        (
            &["k8s:ns:team-a", "k8s:sa:"],
            Reason::MissingServiceAccountSelector,
        ),
        (
            &["k8s:ns:team-a", "k8s:sa:a", "k8s:sa:b"],
            Reason::AmbiguousServiceAccountSelector,
        ),
        (
            &["k8s:ns:team-a", "k8s:sa:Not_Valid"],
            Reason::InvalidServiceAccountSelector,
        ),
    ];
    for (templates, want) in cases {
        assert_eq!(
            refused(&with_templates(templates)).0,
            *want,
            "{templates:?}"
        );
    }
}

#[test]
fn selectors_contradicting_the_pool_or_discriminator_are_unprovable() {
    for templates in [
        &["k8s:ns:team-a", "k8s:sa:s", "k8s:pod-label:app:other"][..],
        &["k8s:ns:team-a", "k8s:sa:s", "k8s:container-name:other"][..],
        &["k8s:ns:team-a", "k8s:sa:s", "k8s:container-image:x"][..],
    ] {
        assert_eq!(
            refused(&with_templates(templates)).0,
            Reason::UnprovableSelector
        );
    }
    // Narrowing selectors are fine: SPIRE ANDs them.
    let c = ok(&with_templates(&[
        "k8s:ns:team-a",
        "k8s:sa:s",
        "k8s:pod-label:app:model",
        "k8s:pod-label:extra:x",
        "k8s:container-name:vllm",
    ]));
    assert!(c.selectors().contains(&"k8s:pod-label:extra:x".to_string()));
}

#[test]
fn empty_and_invalid_pool_selectors() {
    let mut b = binding("b", "chat", "vllm");
    b.pool = Lookup::Found(pool(NS, "pool", &[]));
    let (reason, msg) = refused(&b);
    assert_eq!(reason, Reason::EmptyPoolSelector);
    assert!(
        msg.contains("InferencePool team-a/pool") && msg.contains("spec.selector"),
        "{msg}"
    );
    b.pool = Lookup::Found(pool(NS, "pool", &[("bad key:x", "v")]));
    assert_eq!(refused(&b).0, Reason::InvalidPoolSelector);
    b.pool = Lookup::Found(pool(NS, "pool", &[("app", "a:b")]));
    assert_eq!(refused(&b).0, Reason::InvalidPoolSelector);
}

#[test]
fn spiffe_id_path_escapes() {
    let cases: &[(&str, Reason)] = &[
        (
            "spiffe://example.org/ns/team-b/objective/chat",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        (
            "spiffe://example.org/ns/team-aextra/x",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        (
            "spiffe://example.org/ns/{{ .Namespace }}extra/x",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        (
            "spiffe://example.org/ns/team-a",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        (
            "spiffe://example.org/team-a/x",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        ("spiffe://example.org", Reason::SPIFFEIDOutsideNamespace),
        (
            "spiffe://example.org/x/ns/team-a/y",
            Reason::SPIFFEIDOutsideNamespace,
        ),
        (
            "spiffe://example.org/ns/team-a/../team-b/x",
            Reason::InvalidSPIFFEID,
        ),
        (
            "spiffe://example.org/ns/team-a/./x",
            Reason::InvalidSPIFFEID,
        ),
        (
            "spiffe://example.org/ns/team-a/%2e%2e/team-b",
            Reason::InvalidSPIFFEID,
        ),
        (
            "spiffe://example.org/ns/team-a%2Fx/y",
            Reason::InvalidSPIFFEID,
        ),
        ("spiffe://example.org/ns/team-a//x", Reason::InvalidSPIFFEID),
        ("spiffe://example.org/ns/team-a/x/", Reason::InvalidSPIFFEID),
        (
            "spiffe://example.org/ns/team-a/x?y=1",
            Reason::InvalidSPIFFEID,
        ),
        (
            "spiffe://example.org/ns/team-a/x#f",
            Reason::InvalidSPIFFEID,
        ),
        ("spiffe://Example.org/ns/team-a/x", Reason::InvalidSPIFFEID),
        ("http://example.org/ns/team-a/x", Reason::InvalidSPIFFEID),
        ("spiffe://other.org/ns/team-a/x", Reason::ForeignTrustDomain),
        (
            "spiffe://example.org.evil/ns/team-a/x",
            Reason::ForeignTrustDomain,
        ),
    ];
    for (template, want) in cases {
        let mut b = binding("b", "chat", "vllm");
        b.spec.spiffe_id_template = Some(template.to_string());
        let (reason, msg) = refused(&b);
        assert_eq!(reason, *want, "{template}");
        assert!(msg.contains("spec.spiffeIDTemplate"), "{msg}");
    }
    let mut b = binding("b", "chat", "vllm");
    b.spec.spiffe_id_template = Some("spiffe://example.org/ns/team-a/custom/id".into());
    assert_eq!(
        ok(&b).spiffe_id(),
        "spiffe://example.org/ns/team-a/custom/id"
    );
}

// ---- RenderFailure ----

#[test]
fn template_tricks_are_render_failures() {
    for bad in [
        "k8s:ns:{{ .Nope }}",
        "k8s:ns:{{ .Namespace | printf \"%s\" }}",
        "k8s:ns:{{ printf \"team-a\" }}",
        "k8s:ns:{{ {{ .Namespace }} }}",
        "k8s:ns:{{ .Namespace }",
        "k8s:ns:{ .Namespace }",
        "k8s:ns:{{- .Namespace }}",
        "k8s:ns:{{ .Namespace.X }}",
        "k8s:ns:}}{{",
    ] {
        let b = with_templates(&[bad, "k8s:sa:s"]);
        let (reason, msg) = refused(&b);
        assert_eq!(reason, Reason::TemplateError, "{bad}");
        assert!(msg.contains("spec.workloadSelectorTemplates[0]"), "{msg}");
    }
    // Both spellings of an action are the same.
    let a = ok(&with_templates(&["k8s:ns:{{.Namespace}}", "k8s:sa:s"]));
    let b = ok(&with_templates(&["k8s:ns:{{ .Namespace }}", "k8s:sa:s"]));
    assert_eq!(a.selectors(), b.selectors());
    // .ContainerName is undefined in PoolOnly mode.
    let mut p = pool_only("p", "chat");
    p.spec
        .workload_selector_templates
        .push("k8s:pod-label:c:{{ .ContainerName }}".into());
    assert_eq!(refused(&p).0, Reason::TemplateError);
    let mut b = binding("b", "chat", "vllm");
    b.spec.spiffe_id_template = Some("spiffe://example.org/ns/team-a/{{ .X }}".into());
    assert_eq!(refused(&b).0, Reason::TemplateError);
}

#[test]
fn selectors_must_be_type_value() {
    for bad in ["nocolon", ":x", "k8s:"] {
        assert_eq!(
            refused(&with_templates(&["k8s:ns:team-a", "k8s:sa:s", bad])).0,
            Reason::InvalidSelector,
            "{bad}"
        );
    }
}

#[test]
fn discriminator_rules() {
    let mut b = binding("b", "chat", "vllm");
    b.spec.container_discriminator = None;
    assert_eq!(refused(&b).0, Reason::MissingContainerDiscriminator);
    let mut p = pool_only("p", "chat");
    p.spec.container_discriminator = container("vllm");
    assert_eq!(refused(&p).0, Reason::InvalidContainerDiscriminator);
    for bad in ["Vllm", "a_b", "{{ .PodSpec.ServiceAccountName }}", "-x", ""] {
        let mut b = binding("b", "chat", bad);
        b.spec.mode = IdentityMode::PerObjective;
        assert_eq!(
            refused(&b).0,
            Reason::InvalidContainerDiscriminator,
            "{bad}"
        );
    }
    let mut b = binding("b", "chat", "x");
    b.spec.container_discriminator.as_mut().unwrap().type_ = DiscriminatorType::ContainerImage;
    b.spec.container_discriminator.as_mut().unwrap().value = "img {{ .X }}".into();
    assert_eq!(refused(&b).0, Reason::InvalidContainerDiscriminator);
}

#[test]
fn invalid_trust_domain_config() {
    for td in ["", "Example.org", "spiffe://example.org", "a/b"] {
        let cfg = ClusterConfig {
            trust_domain: td.into(),
            class_name: None,
            ..ClusterConfig::default()
        };
        let r = compile(&binding("b", "chat", "vllm"), &cfg).unwrap_err();
        assert_eq!(r.reason, Reason::InvalidTrustDomain, "{td:?}");
    }
}

#[test]
fn no_output_ever_contains_template_syntax() {
    // Whatever passes compile, nothing that SPIRE Controller Manager would render remains.
    let c = ok(&with_templates(&[
        "k8s:ns:{{ .Namespace }}",
        "k8s:sa:{{ .PoolName }}",
    ]));
    let json = serde_json::to_string(&c.output.spec).unwrap();
    assert!(!json.contains("{{"), "{json}");
    assert!(!c.selectors().iter().any(|s| s.contains(['{', '}'])));
}

/// The default config with an SVID policy made of `settings`.
fn with_policy(f: impl FnOnce(&mut SvidPolicySettings)) -> ClusterConfig {
    let mut settings = SvidPolicySettings::default();
    f(&mut settings);
    ClusterConfig {
        svid: Arc::new(SvidPolicy::new(settings).unwrap()),
        ..config()
    }
}

/// A policy that allows the names and trust domains of `svid_options_pass_through`.
fn permissive() -> ClusterConfig {
    with_policy(|s| {
        s.dns_suffixes = vec!["example".into()];
        s.federates_with = vec!["a.example".into(), "z.example".into()];
    })
}

/// The binding `b` with `svid.dnsNameTemplates` = `names`.
fn with_dns_names(names: &[&str]) -> kleym_spoke::compiler::BindingInput {
    let mut b = binding("b", "chat", "vllm");
    b.spec.svid = Some(SvidOptions {
        dns_name_templates: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    });
    b
}

fn refusal_under(cfg: &ClusterConfig, b: &kleym_spoke::compiler::BindingInput) -> Refusal {
    compile(b, cfg).expect_err("expected a refusal")
}

#[test]
fn dns_names_are_confined_to_the_namespace_by_default() {
    let c = ok(&with_dns_names(&[
        "{{ .ObjectiveName }}.{{ .Namespace }}.svc",
        "{{ .ObjectiveName }}.{{ .Namespace }}.svc.cluster.local",
        "other-svc.team-a.svc.cluster.local",
    ]));
    assert_eq!(
        c.output.spec.dns_name_templates,
        Some(vec![
            "chat.team-a.svc".into(),
            "chat.team-a.svc.cluster.local".into(),
            "other-svc.team-a.svc.cluster.local".into(),
        ])
    );
    for outside in [
        "payments.t2.svc.cluster.local",
        "payments.t2.svc",
        "kleym-hub.example.org",
        // The namespace's domain itself, a host under a Service, another cluster domain.
        "team-a.svc",
        "team-a.svc.cluster.local",
        "web-0.chat.team-a.svc.cluster.local",
        "chat.team-a.svc.other.local",
        // No dot boundary: longer namespace, longer `svc`, a suffix glued on.
        "chat.team-ab.svc",
        "chat.xteam-a.svc",
        "chat.team-a.svcx",
        "chat.team-a.svc.cluster.localx",
        "chat.team-a.svc.evilcluster.local",
        "chat.team-a.svc.cluster.local.evil.org",
        // IDNA: an A-label as the Service name; not an RFC 1035 label.
        "xn--80ak6aa92e.team-a.svc",
        "1chat.team-a.svc",
    ] {
        let b = with_dns_names(&["chat.team-a.svc", outside]);
        let (reason, message) = refused(&b);
        assert_eq!(
            reason,
            Reason::DNSNameOutsideNamespace,
            "{outside}: {message}"
        );
        assert_eq!(reason.kind(), RefusalKind::UnsafeSelector);
        assert!(
            message.contains("spec.svid.dnsNameTemplates[1]") && message.contains(outside),
            "{message}"
        );
        if !outside.starts_with("xn--") && !outside.starts_with('1') {
            assert!(
                message.contains("<service>.team-a.svc or <service>.team-a.svc.cluster.local"),
                "the rule is named: {message}"
            );
        }
    }
    // Tricks the syntax check already refuses: wildcard, trailing dot, uppercase, empty
    // label, Unicode, underscore.
    for bad in [
        "*.team-a.svc",
        "chat.team-a.svc.",
        "Chat.team-a.svc",
        "CHAT.TEAM-A.SVC",
        "chat..team-a.svc",
        ".chat.team-a.svc",
        "chät.team-a.svc",
        "_grpc.chat.team-a.svc",
    ] {
        let (reason, message) = refused(&with_dns_names(&[bad]));
        assert_eq!(reason, Reason::InvalidSvidOption, "{bad}: {message}");
        assert!(
            message.contains("spec.svid.dnsNameTemplates[0]"),
            "{message}"
        );
    }
}

#[test]
fn the_cluster_domain_is_a_setting() {
    let cfg = with_policy(|s| s.cluster_domain = "corp.internal".into());
    assert!(compile(&with_dns_names(&["chat.team-a.svc.corp.internal"]), &cfg).is_ok());
    let r = refusal_under(&cfg, &with_dns_names(&["chat.team-a.svc.cluster.local"]));
    assert_eq!(r.reason, Reason::DNSNameOutsideNamespace);
    assert!(
        r.message.contains("<service>.team-a.svc.corp.internal"),
        "{}",
        r.message
    );
}

#[test]
fn operator_suffixes_allow_more_globally_or_per_namespace() {
    let cfg = with_policy(|s| {
        s.dns_suffixes = vec!["apps.example.org".into()];
        s.namespace_dns_suffixes = vec![
            ("team-a".into(), "team-a.example.net".into()),
            ("team-a".into(), "chat.team-a.svc.cluster.local".into()),
            ("t2".into(), "t2.example.net".into()),
        ];
    });
    for allowed in [
        "chat.apps.example.org",
        "a.b.apps.example.org",
        "x.team-a.example.net",
        "web-0.chat.team-a.svc.cluster.local",
    ] {
        assert!(
            compile(&with_dns_names(&[allowed]), &cfg).is_ok(),
            "{allowed}"
        );
    }
    for refused_name in [
        // Equal to a suffix, no dot boundary, another namespace's suffix, IDNA label.
        "apps.example.org",
        "evilapps.example.org",
        "x.evilapps.example.org",
        "x.t2.example.net",
        "team-a.example.net",
        "xn--80ak6aa92e.apps.example.org",
        "a.xn--80ak6aa92e.apps.example.org",
        "apps.example.org.evil.org",
    ] {
        let r = refusal_under(&cfg, &with_dns_names(&[refused_name]));
        assert_eq!(r.reason, Reason::DNSNameOutsideNamespace, "{refused_name}");
        assert!(
            r.message.contains("spec.svid.dnsNameTemplates[0]"),
            "{}",
            r.message
        );
    }
    let r = refusal_under(&cfg, &with_dns_names(&["x.t2.example.net"]));
    assert!(
        r.message.contains(".apps.example.org") && r.message.contains(".team-a.example.net"),
        "names what this namespace may use: {}",
        r.message
    );
    assert!(!r.message.contains(".t2.example.net,"), "{}", r.message);
}

#[test]
fn suffixes_that_would_reach_other_namespaces_are_refused_as_settings() {
    for (ns, suffix) in [
        (None, "cluster.local"),
        (None, "local"),
        (None, "svc"),
        (None, "svc.cluster.local"),
        (None, "t2.svc.cluster.local"),
        (Some("team-a"), "t2.svc.cluster.local"),
        (Some("team-a"), "svc.cluster.local"),
    ] {
        let mut s = SvidPolicySettings::default();
        match ns {
            None => s.dns_suffixes = vec![suffix.into()],
            Some(n) => s.namespace_dns_suffixes = vec![(n.into(), suffix.into())],
        }
        let e = SvidPolicy::new(s).unwrap_err().to_string();
        assert!(e.contains(suffix), "{ns:?} {suffix}: {e}");
    }
}

#[test]
fn hub_identities_are_reserved() {
    let cfg = with_policy(|s| {
        s.dns_suffixes = vec!["example.org".into()];
        s.hub_x509_usernames = vec!["Kleym-Hub.example.org".into(), "hub.team-a.svc".into()];
        s.hub_spiffe_ids = vec!["spiffe://example.org/ns/team-a/objective/hub".into()];
    });
    // The hub's user name, whatever its case, and even where the name is the tenant's own.
    for name in ["kleym-hub.example.org", "hub.team-a.svc"] {
        let r = refusal_under(&cfg, &with_dns_names(&["chat.team-a.svc", name]));
        assert_eq!(r.reason, Reason::ReservedHubIdentity, "{name}");
        assert_eq!(r.kind(), RefusalKind::UnsafeSelector);
        assert!(
            r.message.contains("spec.svid.dnsNameTemplates[1]")
                && r.message.contains("X.509 user name"),
            "{}",
            r.message
        );
    }
    // Without the setting the name is just outside the namespace (still refused).
    let r = refusal_under(&config(), &with_dns_names(&["kleym-hub.example.org"]));
    assert_eq!(r.reason, Reason::DNSNameOutsideNamespace);
    // Another name under the allowed suffix is fine.
    assert!(compile(&with_dns_names(&["chat.example.org"]), &cfg).is_ok());

    // The hub's SPIFFE ID, rendered or default.
    let mut b = binding("b", "hub", "vllm");
    b.target = Lookup::Found(objective(NS, "hub", "pool"));
    let r = refusal_under(&cfg, &b);
    assert_eq!(r.reason, Reason::ReservedHubIdentity);
    assert!(
        r.message.contains("spec.spiffeIDTemplate") && r.message.contains("hub's SPIFFE ID"),
        "{}",
        r.message
    );
    let mut b = binding("b", "chat", "vllm");
    b.spec.spiffe_id_template =
        Some("spiffe://{{ .TrustDomain }}/ns/{{ .Namespace }}/objective/hub".into());
    assert_eq!(refusal_under(&cfg, &b).reason, Reason::ReservedHubIdentity);
    assert!(compile(&binding("b", "chat", "vllm"), &cfg).is_ok());
}

#[test]
fn ttls_are_bounded_by_the_operator_maxima() {
    let svid = |ttl: Option<&str>, jwt: Option<&str>| {
        let mut b = binding("b", "chat", "vllm");
        b.spec.svid = Some(SvidOptions {
            ttl: ttl.map(str::to_string),
            jwt_ttl: jwt.map(str::to_string),
            ..Default::default()
        });
        b
    };
    // Defaults: 24h and 1h.
    let c = ok(&svid(Some("24h"), Some("1h")));
    assert_eq!(c.output.spec.ttl.as_deref(), Some("24h"));
    assert_eq!(c.output.spec.jwt_ttl.as_deref(), Some("1h"));
    for (b, field, max) in [
        (svid(Some("24h0m1s"), None), "spec.svid.ttl", "24h"),
        (svid(Some("720h"), None), "spec.svid.ttl", "24h"),
        (svid(None, Some("61m")), "spec.svid.jwtTtl", "1h"),
    ] {
        let (reason, message) = refused(&b);
        assert_eq!(reason, Reason::SvidOptionOutOfBounds, "{message}");
        assert_eq!(reason.kind(), RefusalKind::RenderFailure);
        assert!(
            message.contains(field) && message.contains(&format!("maximum {max}")),
            "{message}"
        );
    }
    let cfg = with_policy(|s| {
        s.max_ttl = Duration::from_secs(600);
        s.max_jwt_ttl = Duration::from_secs(90);
    });
    assert!(compile(&svid(Some("10m"), Some("90s")), &cfg).is_ok());
    let r = refusal_under(&cfg, &svid(Some("11m"), None));
    assert!(r.message.contains("maximum 10m"), "{}", r.message);
    let r = refusal_under(&cfg, &svid(None, Some("91s")));
    assert!(r.message.contains("maximum 90s"), "{}", r.message);
}

#[test]
fn federation_needs_the_operators_allow_list() {
    let mut b = binding("b", "chat", "vllm");
    b.spec.svid = Some(SvidOptions {
        federates_with: vec!["partner.example".into(), "other.example".into()],
        ..Default::default()
    });
    let (reason, message) = refused(&b);
    assert_eq!(reason, Reason::SvidOptionOutOfBounds);
    assert!(
        message.contains("spec.svid.federatesWith[0]") && message.contains("allows no federation"),
        "{message}"
    );
    let cfg = with_policy(|s| s.federates_with = vec!["partner.example".into()]);
    let r = refusal_under(&cfg, &b);
    assert!(
        r.message.contains("spec.svid.federatesWith[1]")
            && r.message.contains("\"other.example\"")
            && r.message.contains("allowed are partner.example"),
        "{}",
        r.message
    );
    b.spec.svid.as_mut().unwrap().federates_with.pop();
    assert_eq!(
        compile(&b, &cfg).unwrap().output.spec.federates_with,
        Some(vec!["partner.example".into()])
    );
}
