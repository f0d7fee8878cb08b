//! Provider selection and extension-policy table tests. The first group mirrors the Go
//! reference library's `pkg/access/config_test.go`; the second covers kleym's fixes.

use base64::Engine as _;
use kleym_hub::access::{
    AccessProfile, AudiencePolicy, CliArgsPolicy, EnvVar, EnvVarsPolicy, ExecApiVersion,
    ExecConfig, ProfileProvider, ProviderConfig, ProviderSet, SelectError, SelectOptions,
    provider_config::parse_provider_document, select,
};
use serde_json::{Value, json};

const ARGS_EXT: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
const ENVS_EXT: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";
const EXEC_EXT: &str = "client.authentication.k8s.io/exec";

fn provider(name: &str, args: CliArgsPolicy, envs: EnvVarsPolicy) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        exec: ExecConfig {
            api_version: ExecApiVersion::V1,
            command: format!("/bin/{name}-plugin"),
            args: vec!["file".into()],
            env: vec![EnvVar {
                name: "CLIENT_ID".into(),
                value: "None".into(),
            }],
            provide_cluster_info: true,
            install_hint: None,
        },
        cli_args_policy: args,
        env_vars_policy: envs,
        env_vars_allow_list: None,
        audience_policy: AudiencePolicy::Ignore,
    }
}

fn set(ps: Vec<ProviderConfig>) -> ProviderSet {
    ProviderSet::new(ps).unwrap()
}

fn offer(name: &str, cluster: Value) -> ProfileProvider {
    ProfileProvider {
        name: name.into(),
        cluster,
    }
}

fn profile(access: Vec<ProfileProvider>, credential: Vec<ProfileProvider>) -> AccessProfile {
    AccessProfile {
        namespace: "fleet".into(),
        name: "spoke-1".into(),
        access_providers: access,
        credential_providers: credential,
    }
}

fn cluster_with_ext(exts: Value) -> Value {
    json!({"server": "https://spoke.example:6443", "extensions": exts})
}

fn policy_profile() -> AccessProfile {
    profile(
        vec![offer(
            "p",
            cluster_with_ext(json!([
                {"name": EXEC_EXT, "extension": {"clusterName": "spoke-1"}},
                {"name": ARGS_EXT, "extension": ["--audience", "audience"]},
                {"name": ENVS_EXT, "extension": {"CLIENT_ID": "client-id"}}
            ])),
        )],
        vec![],
    )
}

const OPTS: SelectOptions = SelectOptions {
    allow_insecure_skip_tls_verify: false,
    allow_plain_http: false,
};

// ---- reference library cases -------------------------------------------------------------

#[test]
fn first_matching_provider_in_controller_order_wins() {
    let providers = set(vec![
        provider("b", CliArgsPolicy::Ignore, EnvVarsPolicy::Ignore),
        provider("a", CliArgsPolicy::Ignore, EnvVarsPolicy::Ignore),
    ]);
    // The profile lists "a" first, but the hub's order (b, a) decides.
    let p = profile(
        vec![
            offer("a", json!({"server": "https://a:6443"})),
            offer("b", json!({"server": "https://b:6443"})),
        ],
        vec![],
    );
    let eff = select(&providers, &p, &OPTS).unwrap();
    assert_eq!(eff.provider, "b");
    assert_eq!(eff.cluster.server, "https://b:6443");
    assert_eq!(eff.spoke, "fleet/spoke-1");
}

#[test]
fn access_providers_override_credential_providers_by_name() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let p = profile(
        vec![offer("p", json!({"server": "https://new:6443"}))],
        vec![offer("p", json!({"server": "https://old:6443"}))],
    );
    assert_eq!(
        select(&providers, &p, &OPTS).unwrap().cluster.server,
        "https://new:6443"
    );
    // Deprecated list alone still works.
    let p = profile(
        vec![],
        vec![offer("p", json!({"server": "https://old:6443"}))],
    );
    assert_eq!(
        select(&providers, &p, &OPTS).unwrap().cluster.server,
        "https://old:6443"
    );
}

#[test]
fn no_matching_provider_and_empty_profile() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let err = select(
        &providers,
        &profile(vec![offer("q", json!({"server": "https://q"}))], vec![]),
        &OPTS,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("no matching cluster accessor found for cluster profile \"fleet/spoke-1\""),
        "{err}"
    );
    assert!(matches!(
        select(&providers, &profile(vec![], vec![]), &OPTS),
        Err(SelectError::NoMatchingProvider { .. })
    ));
}

#[test]
fn without_policies_args_and_env_unchanged_and_exec_extension_passes_through() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let eff = select(&providers, &policy_profile(), &OPTS).unwrap();
    assert_eq!(eff.exec.args, vec!["file"]);
    assert_eq!(
        eff.exec.env,
        vec![EnvVar {
            name: "CLIENT_ID".into(),
            value: "None".into()
        }]
    );
    assert_eq!(
        eff.cluster.exec_extension.as_deref(),
        Some(r#"{"clusterName":"spoke-1"}"#)
    );
}

#[test]
fn the_audience_is_the_hubs_unless_the_provider_allows_the_profiles() {
    // The profile names another spoke's URL as its server and audience.
    let cluster = json!({"server": "https://spoke-b.example:6443", "extensions": [
        {"name": EXEC_EXT, "extension": {"audience": "https://spoke-b.example:6443"}}]});
    let p = profile(vec![offer("p", cluster.clone())], vec![]);
    let mut prov = provider("p", CliArgsPolicy::Ignore, EnvVarsPolicy::Ignore);
    let eff = select(&set(vec![prov.clone()]), &p, &OPTS).unwrap();
    assert_eq!(eff.audience, "kleym.io/clusterprofile/fleet/spoke-1");
    // The same profile elsewhere gets another audience: it is the profile's identity.
    let other = AccessProfile {
        namespace: "other".into(),
        ..p.clone()
    };
    assert_eq!(
        select(&set(vec![prov.clone()]), &other, &OPTS)
            .unwrap()
            .audience,
        "kleym.io/clusterprofile/other/spoke-1"
    );
    // Only a provider entry that allows it takes the profile's audience.
    prov.audience_policy = AudiencePolicy::Allow;
    let providers = set(vec![prov]);
    let eff = select(&providers, &p, &OPTS).unwrap();
    assert_eq!(eff.audience, "https://spoke-b.example:6443");
    // Without one, the derived audience still applies.
    let bare = profile(
        vec![offer(
            "p",
            json!({"server": "https://spoke-b.example:6443"}),
        )],
        vec![],
    );
    assert_eq!(
        select(&providers, &bare, &OPTS).unwrap().audience,
        "kleym.io/clusterprofile/fleet/spoke-1"
    );
    // A malformed audience is refused, naming the extension.
    for bad in [json!(5), json!(""), json!("a b")] {
        let p = profile(
            vec![offer(
                "p",
                json!({"server": "https://s:6443", "extensions": [
                    {"name": EXEC_EXT, "extension": {"audience": bad}}]}),
            )],
            vec![],
        );
        let err = select(&providers, &p, &OPTS).unwrap_err().to_string();
        assert!(err.contains(EXEC_EXT) && err.contains("audience"), "{err}");
    }
    // The provider file spells the policy; anything but Ignore/Allow is refused.
    let doc = |policy: &str| {
        format!(
            r#"{{"providers":[{{"name":"p","execConfig":{{"apiVersion":"client.authentication.k8s.io/v1","command":"/bin/p"}},"profileSourcedAudiencePolicy":"{policy}"}}]}}"#
        )
    };
    assert_eq!(
        parse_provider_document(&doc("Allow")).unwrap()[0].audience_policy,
        AudiencePolicy::Allow
    );
    assert_eq!(
        parse_provider_document(&doc("")).unwrap()[0].audience_policy,
        AudiencePolicy::Ignore
    );
    let err = parse_provider_document(&doc("Maybe"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("field profileSourcedAudiencePolicy"), "{err}");
}

#[test]
fn append_and_replace() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Append,
        EnvVarsPolicy::Replace,
    )]);
    let eff = select(&providers, &policy_profile(), &OPTS).unwrap();
    assert_eq!(eff.exec.args, vec!["file", "--audience", "audience"]);
    assert_eq!(
        eff.exec.env,
        vec![EnvVar {
            name: "CLIENT_ID".into(),
            value: "client-id".into()
        }]
    );
}

#[test]
fn append_and_append_if_not_exists_keeps_local_value() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Append,
        EnvVarsPolicy::AppendIfNotExists,
    )]);
    let eff = select(&providers, &policy_profile(), &OPTS).unwrap();
    assert_eq!(eff.exec.args, vec!["file", "--audience", "audience"]);
    assert_eq!(
        eff.exec.env,
        vec![EnvVar {
            name: "CLIENT_ID".into(),
            value: "None".into()
        }]
    );
}

#[test]
fn ignore_policies_ignore_even_malformed_extensions() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let p = profile(
        vec![offer(
            "p",
            cluster_with_ext(
                json!([{"name": ARGS_EXT, "extension": 42}, {"name": ENVS_EXT, "extension": [1]}]),
            ),
        )],
        vec![],
    );
    let eff = select(&providers, &p, &OPTS).unwrap();
    assert_eq!(eff.exec.args, vec!["file"]);
}

#[test]
fn provider_file_loads_like_reference() {
    let text = r#"{"providers":[{"name":"secretreader","execConfig":{"apiVersion":"client.authentication.k8s.io/v1",
      "command":"./bin/secretreader-plugin","args":null,"env":[{"name":"K","value":"V"}],"provideClusterInfo":true,
      "installHint":"","interactiveMode":"Never"},"profileSourcedCLIArgsPolicy":"Append",
      "profileSourcedEnvVarsPolicy":"AppendIfNotExists"}]}"#;
    let ps = parse_provider_document(text).unwrap();
    assert_eq!(ps.len(), 1);
    assert_eq!(ps[0].exec.command, "./bin/secretreader-plugin");
    assert_eq!(ps[0].cli_args_policy, CliArgsPolicy::Append);
    assert_eq!(ps[0].env_vars_policy, EnvVarsPolicy::AppendIfNotExists);
    assert!(ps[0].exec.provide_cluster_info);
    assert!(parse_provider_document("{}").unwrap().is_empty());
    assert!(
        parse_provider_document("{not json")
            .unwrap_err()
            .to_string()
            .contains("failed to unmarshal access providers")
    );
}

/// Go's `encoding/json` matches keys case-insensitively, so a file the Go library reads the
/// same way loads the same way here.
#[test]
fn provider_file_keys_match_case_insensitively_like_go() {
    let text = r#"{"Providers":[{"NAME":"p","ExecConfig":{"APIVersion":"client.authentication.k8s.io/v1beta1",
      "Command":"/bin/p","ARGS":["a"],"Env":[{"Name":"K","VALUE":"V"}],"provideclusterinfo":true,
      "InstallHint":"hint","InteractiveMode":"Never"},
      "profileSourcedCliArgsPolicy":"Append","ProfileSourcedEnvVarsPolicy":"Replace",
      "profilesourcedenvvarsallowlist":["K2"]}]}"#;
    let ps = parse_provider_document(text).unwrap();
    assert_eq!(ps.len(), 1);
    let p = &ps[0];
    assert_eq!(p.name, "p");
    assert_eq!(p.exec.api_version, ExecApiVersion::V1Beta1);
    assert_eq!(p.exec.command, "/bin/p");
    assert_eq!(p.exec.args, vec!["a"]);
    assert_eq!(
        p.exec.env,
        vec![EnvVar {
            name: "K".into(),
            value: "V".into()
        }]
    );
    assert!(p.exec.provide_cluster_info);
    assert_eq!(p.exec.install_hint.as_deref(), Some("hint"));
    assert_eq!(p.cli_args_policy, CliArgsPolicy::Append);
    assert_eq!(p.env_vars_policy, EnvVarsPolicy::Replace);
    assert_eq!(p.env_vars_allow_list, Some(vec!["K2".to_string()]));
    // The same key twice in different cases is ambiguous: an error naming provider and field.
    let err = parse_provider_document(
        r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1",
          "command":"/bin/a","Command":"/bin/b"}}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"p\"") && err.contains("execConfig.command") && err.contains("twice"),
        "{err}"
    );
    // A value of the wrong type names the provider and the field.
    let err = parse_provider_document(
        r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1",
          "command":"/bin/a","args":["x", 3]}}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"p\"") && err.contains("execConfig.args[1]"),
        "{err}"
    );
}

#[test]
fn provider_file_unknown_keys_are_reported_and_logged() {
    use kleym_hub::access::provider_config::{
        UnknownKey, parse_provider_document_with_unknown_keys,
    };
    let text = r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1",
      "comand":"/bin/typo","command":"/bin/p","Config":{"x":1},"env":[{"name":"K","value":"V","vaule":"W"}]},
      "profileSourcedArgsPolicy":"Append"},
      {"execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"/bin/q"},"name":"q","extra":1}],
      "version":2}"#;
    let doc = parse_provider_document_with_unknown_keys(text).unwrap();
    assert_eq!(doc.providers.len(), 2);
    // An unknown policy key leaves the policy at its default, as in Go.
    assert_eq!(doc.providers[0].cli_args_policy, CliArgsPolicy::Ignore);
    let mut got: Vec<(Option<String>, String)> = doc
        .unknown_keys
        .into_iter()
        .map(|UnknownKey { provider, key }| (provider, key))
        .collect();
    got.sort();
    let p = Some("p".to_string());
    assert_eq!(
        got,
        vec![
            (None, "version".to_string()),
            (p.clone(), "execConfig.Config".to_string()),
            (p.clone(), "execConfig.comand".to_string()),
            (p.clone(), "execConfig.env[0].vaule".to_string()),
            (p, "profileSourcedArgsPolicy".to_string()),
            (Some("q".to_string()), "extra".to_string()),
        ]
    );

    // Loading the file logs one warning per key, naming file, provider and key.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.json");
    std::fs::write(&path, text).unwrap();
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        ProviderSet::load(Some(&path), &[]).unwrap();
    });
    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 6, "{logs}");
    assert!(
        warnings
            .iter()
            .any(|l| l.contains(&path.display().to_string())
                && l.contains("provider=p")
                && l.contains("key=execConfig.comand")),
        "{logs}"
    );
}

// ---- kleym fixes -------------------------------------------------------------------------

#[test]
fn selection_never_mutates_shared_config_and_is_repeatable() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Append,
        EnvVarsPolicy::Replace,
    )]);
    let before = providers.clone();
    let first = select(&providers, &policy_profile(), &OPTS).unwrap();
    for _ in 0..3 {
        assert_eq!(select(&providers, &policy_profile(), &OPTS).unwrap(), first);
    }
    assert_eq!(providers, before);
    // A second profile using the same provider sees none of the first profile's values.
    let other = profile(
        vec![offer("p", json!({"server": "https://other:6443"}))],
        vec![],
    );
    let eff = select(&providers, &other, &OPTS).unwrap();
    assert_eq!(eff.exec.args, vec!["file"]);
    assert_eq!(eff.exec.env[0].value, "None");
}

#[test]
fn env_order_is_deterministic() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Replace,
    )]);
    let p = profile(
        vec![offer(
            "p",
            cluster_with_ext(
                json!([{"name": ENVS_EXT, "extension": {"Z": "1", "A": "2", "M": "3", "CLIENT_ID": "x"}}]),
            ),
        )],
        vec![],
    );
    let names: Vec<String> = select(&providers, &p, &OPTS)
        .unwrap()
        .exec
        .env
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["CLIENT_ID", "A", "M", "Z"]);
}

fn env_profile(vars: Value) -> AccessProfile {
    profile(
        vec![offer(
            "p",
            cluster_with_ext(json!([{"name": ENVS_EXT, "extension": vars}])),
        )],
        vec![],
    )
}

/// Every rule of the deny list, through selection: an example name per rule is refused with
/// an error naming the profile, the extension, the variable and the rule.
#[test]
fn deny_listed_variables_are_refused_naming_profile_extension_and_variable() {
    use kleym_hub::access::extensions::{EnvPattern, FORBIDDEN_ENV};
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Replace,
    )]);
    let mut checked = 0;
    for (_, patterns) in FORBIDDEN_ENV {
        for pattern in *patterns {
            let examples: Vec<String> = match pattern {
                EnvPattern::Exact(n) => vec![n.to_string()],
                EnvPattern::Prefix(p) => vec![p.to_string(), format!("{p}X1")],
                EnvPattern::SuffixAnyCase(s) => vec![
                    format!("HTTP{s}"),
                    format!("http{}", s.to_lowercase()),
                    format!("No{}", s.to_lowercase()),
                ],
            };
            for var in examples {
                let err = select(&providers, &env_profile(json!({&var: "x"})), &OPTS)
                    .expect_err(&var)
                    .to_string();
                for needle in [
                    "\"fleet/spoke-1\"",
                    ENVS_EXT,
                    &format!("{var:?}"),
                    &pattern.to_string(),
                ] {
                    assert!(err.contains(needle), "{var}: {needle} not in {err}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked}");
    // The bypasses the audit found are all covered.
    for var in [
        "PYTHONWARNINGS",
        "BROWSER",
        "PERL5DB",
        "PERL5OPT",
        "RUBYOPT",
        "NODE_OPTIONS",
        "BASH_ENV",
        "ENV",
        "OPENSSL_CONF",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "KUBECONFIG",
        "HOME",
        "PATH",
        "GIT_SSH_COMMAND",
        "AZURE_AUTHORITY_HOST",
        "JAVA_TOOL_OPTIONS",
        "LD_PRELOAD",
        "KUBERNETES_SERVICE_HOST",
    ] {
        assert!(
            select(&providers, &env_profile(json!({var: "x"})), &OPTS).is_err(),
            "{var}"
        );
    }
    // Names on no rule pass; the check is case-sensitive as Linux is (proxies aside).
    for var in [
        "CLIENT_ID",
        "TENANT_ID",
        "AZURE_CLIENT_ID",
        "ld_preload",
        "path",
    ] {
        let eff = select(&providers, &env_profile(json!({var: "v"})), &OPTS)
            .unwrap_or_else(|e| panic!("{var}: {e}"));
        assert!(eff.exec.env.iter().any(|e| e.name == var), "{var}");
    }
}

/// docs/access-providers.md lists every rule of the deny list.
#[test]
fn docs_list_the_whole_deny_list() {
    use kleym_hub::access::extensions::{EnvPattern, FORBIDDEN_ENV};
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/access-providers.md"),
    )
    .unwrap();
    for (why, patterns) in FORBIDDEN_ENV {
        assert!(doc.contains(why), "group {why:?} not documented");
        for p in *patterns {
            let text = match p {
                EnvPattern::Exact(n) => format!("`{n}`"),
                EnvPattern::Prefix(p) => format!("`{p}*`"),
                EnvPattern::SuffixAnyCase(s) => format!("`*{s}`"),
            };
            assert!(doc.contains(&text), "{text} not documented");
        }
    }
}

#[test]
fn allow_list_narrows_profile_sourced_variables() {
    let doc = r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"/bin/p"},
        "profileSourcedEnvVarsPolicy":"Replace","profileSourcedEnvVarsAllowList":["CLIENT_ID","TENANT_ID"]}]}"#;
    let providers = set(parse_provider_document(doc).unwrap());
    let eff = select(
        &providers,
        &env_profile(json!({"CLIENT_ID": "c", "TENANT_ID": "t"})),
        &OPTS,
    )
    .unwrap();
    assert_eq!(eff.exec.env.len(), 2);
    let err = select(
        &providers,
        &env_profile(json!({"CLIENT_ID": "c", "OTHER": "o"})),
        &OPTS,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"OTHER\"") && err.contains("profileSourcedEnvVarsAllowList"),
        "{err}"
    );
    // The deny list wins: an allow list cannot name a denied variable.
    let bad = r#"{"providers":[{"name":"p","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"/bin/p"},
        "profileSourcedEnvVarsAllowList":["CLIENT_ID","LD_PRELOAD"]}]}"#;
    let err = parse_provider_document(bad).unwrap_err().to_string();
    assert!(
        err.contains("\"p\"")
            && err.contains("profileSourcedEnvVarsAllowList")
            && err.contains("LD_PRELOAD"),
        "{err}"
    );
}

#[test]
fn additional_args_object_payload_is_accepted() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Append,
        EnvVarsPolicy::Ignore,
    )]);
    let p = profile(
        vec![offer(
            "p",
            cluster_with_ext(
                json!([{"name": ARGS_EXT, "extension": {"args": ["-audience", "https://x"]}}]),
            ),
        )],
        vec![],
    );
    assert_eq!(
        select(&providers, &p, &OPTS).unwrap().exec.args,
        vec!["file", "-audience", "https://x"]
    );
    let p = profile(
        vec![offer(
            "p",
            cluster_with_ext(json!([{"name": ARGS_EXT, "extension": {"nope": 1}}])),
        )],
        vec![],
    );
    assert!(matches!(
        select(&providers, &p, &OPTS),
        Err(SelectError::Extension { .. })
    ));
}

#[test]
fn duplicate_extension_names_are_refused() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let p = profile(
        vec![offer(
            "p",
            cluster_with_ext(
                json!([{"name": EXEC_EXT, "extension": {}}, {"name": EXEC_EXT, "extension": {}}]),
            ),
        )],
        vec![],
    );
    let err = select(&providers, &p, &OPTS).unwrap_err();
    assert!(
        err.to_string().contains("duplicate extension name"),
        "{err}"
    );
}

fn test_ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["ca.test".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

#[test]
fn tls_fields_are_honoured_and_validated() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = test_ca_pem();
    let cluster = json!({
        "server": "https://10.0.0.1:6443/prefix",
        "certificate-authority-data": b64(&ca),
        "tls-server-name": "api.spoke.test",
        "proxy-url": "http://proxy.local:3128",
        "disable-compression": true
    });
    let eff = select(
        &providers,
        &profile(vec![offer("p", cluster)], vec![]),
        &OPTS,
    )
    .unwrap();
    assert_eq!(
        eff.cluster.certificate_authority_pem.as_deref(),
        Some(ca.as_bytes())
    );
    assert_eq!(
        eff.cluster.tls_server_name.as_deref(),
        Some("api.spoke.test")
    );
    assert_eq!(
        eff.cluster.proxy_url.as_deref(),
        Some("http://proxy.local:3128")
    );
    assert!(eff.cluster.disable_compression);

    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"server": "https://x", "certificate-authority-data": "%%%"}),
            "certificate-authority-data",
        ),
        (
            json!({"server": "https://x", "certificate-authority-data": b64("hello")}),
            "certificate-authority-data",
        ),
        (
            json!({"server": "https://x", "certificate-authority-data": b64("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")}),
            "certificate-authority-data",
        ),
        (
            json!({"server": "https://x", "insecure-skip-tls-verify": true}),
            "insecure-skip-tls-verify",
        ),
        (json!({"server": "not a url"}), "server"),
        (json!({"server": "ftp://x"}), "server"),
        (json!({"server": "http://x"}), "server"),
        (json!({"server": "https://"}), "server"),
        (json!({}), "server"),
        (
            json!({"server": "https://x", "proxy-url": "socks5://p:1080"}),
            "proxy-url",
        ),
        (
            json!({"server": "https://x", "disable-compression": "yes"}),
            "disable-compression",
        ),
    ];
    for (cluster, field) in cases {
        let err = select(
            &providers,
            &profile(vec![offer("p", cluster.clone())], vec![]),
            &OPTS,
        )
        .unwrap_err();
        match &err {
            SelectError::InvalidCluster { field: f, .. } => {
                assert_eq!(*f, field, "{cluster}: {err}")
            }
            other => panic!("{cluster}: unexpected {other}"),
        }
    }
    // insecure allowed by the hub.
    let opts = SelectOptions {
        allow_insecure_skip_tls_verify: true,
        allow_plain_http: false,
    };
    let eff = select(
        &providers,
        &profile(
            vec![offer(
                "p",
                json!({"server": "https://x", "insecure-skip-tls-verify": true}),
            )],
            vec![],
        ),
        &opts,
    )
    .unwrap();
    assert!(eff.cluster.insecure_skip_tls_verify);
}

#[test]
fn fingerprint_tracks_effective_changes_only() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let a = select(&providers, &policy_profile(), &OPTS).unwrap();
    // A change to an ignored extension is not an effective change.
    let mut changed = policy_profile();
    changed.access_providers[0].cluster["extensions"][1]["extension"] = json!(["--other"]);
    let b = select(&providers, &changed, &OPTS).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.fingerprint(), b.fingerprint());
    changed.access_providers[0].cluster["server"] = json!("https://moved:6443");
    let c = select(&providers, &changed, &OPTS).unwrap();
    assert_ne!(a.fingerprint(), c.fingerprint());
    let mut hs = std::collections::HashSet::new();
    hs.insert(a);
    assert!(hs.contains(&b));
}

/// The CA bundle is shared between clones but still serialized as the bytes it holds, so
/// fingerprints did not change when it stopped being a `Vec<u8>`.
#[test]
fn fingerprint_reads_the_ca_as_its_bytes() {
    let providers = set(vec![provider(
        "p",
        CliArgsPolicy::Ignore,
        EnvVarsPolicy::Ignore,
    )]);
    let mut a = select(&providers, &policy_profile(), &OPTS).unwrap();
    a.cluster.certificate_authority_pem = Some(b"PEM".to_vec().into());
    let json = serde_json::to_value(&a.cluster).unwrap();
    assert_eq!(json["certificate_authority_pem"], json!([80, 69, 77]));
    let shared = a.clone();
    assert_eq!(a.fingerprint(), shared.fingerprint());
    a.cluster.certificate_authority_pem = Some(b"PEN".to_vec().into());
    assert_ne!(a.fingerprint(), shared.fingerprint());
}

#[test]
fn provider_config_validation_names_provider_and_field() {
    let cases = [
        (
            r#"{"providers":[{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"x"}},{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"y"}}]}"#,
            "duplicate access provider \"a\"",
        ),
        (
            r#"{"providers":[{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":""}}]}"#,
            "\"a\": field execConfig.command: empty command",
        ),
        (
            r#"{"providers":[{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v2","command":"x"}}]}"#,
            "field execConfig.apiVersion: unknown apiVersion",
        ),
        (
            r#"{"providers":[{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"x"},"profileSourcedCLIArgsPolicy":"Maybe"}]}"#,
            "field profileSourcedCLIArgsPolicy",
        ),
        (
            r#"{"providers":[{"name":"a","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"x"},"profileSourcedEnvVarsPolicy":"Append"}]}"#,
            "field profileSourcedEnvVarsPolicy",
        ),
        (
            r#"{"providers":[{"name":"a"}]}"#,
            "field execConfig: missing",
        ),
        (
            r#"{"providers":[{"execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"x"}}]}"#,
            "\"providers[0]\": field name",
        ),
    ];
    for (doc, want) in cases {
        let err = parse_provider_document(doc).unwrap_err().to_string();
        assert!(err.contains(want), "{doc}\n got: {err}\nwant: {want}");
    }
}

#[test]
fn yaml_file_and_flag_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(
        &path,
        "providers:\n- name: a\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1beta1\n    command: /bin/a\n- name: b\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1\n    command: /bin/b\n",
    )
    .unwrap();
    let set = ProviderSet::load(
        Some(&path),
        &[
            "a=/usr/bin/new-a --x 'y z'".to_string(),
            "c=/bin/c".to_string(),
        ],
    )
    .unwrap();
    let names: Vec<&str> = set.providers().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["a", "b", "c"]);
    assert_eq!(set.get("a").unwrap().exec.command, "/usr/bin/new-a");
    assert_eq!(set.get("a").unwrap().exec.args, vec!["--x", "y z"]);
    assert_eq!(set.get("b").unwrap().exec.api_version, ExecApiVersion::V1);
    let err = ProviderSet::load(None, &["a=/x".into(), "a=/y".into()]).unwrap_err();
    assert!(
        err.to_string().contains("duplicate access provider \"a\""),
        "{err}"
    );
    let err = ProviderSet::load(Some(&dir.path().join("missing.json")), &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("failed to read access config file"),
        "{err}"
    );
}

#[test]
fn yaml_provider_file_reads_yaml_1_2_and_refuses_duplicate_keys() {
    // YAML 1.1 spellings (`no`, `on`) and leading-zero numbers stay the strings they look
    // like; only `true`/`false` are booleans.
    let doc = "providers:\n- name: a\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1\n    command: /bin/a\n    args:\n    - no\n    - 0755\n    env:\n    - name: DEBUG\n      value: on\n    provideClusterInfo: true\n";
    let providers = parse_provider_document(doc).unwrap();
    let exec = &providers[0].exec;
    assert_eq!(exec.args, vec!["no", "0755"]);
    assert_eq!(exec.env[0].value, "on");
    assert!(exec.provide_cluster_info);
    let bad_bool = doc.replace("provideClusterInfo: true", "provideClusterInfo: yes");
    assert!(parse_provider_document(&bad_bool).is_err());
    // A key given twice is an error, and the error quotes none of the file.
    let secret = "swordfishcorrecthorse";
    let dup = format!(
        "providers:\n- name: a\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1\n    command: /bin/a\n    args: [--token, {secret}]\n    args: [--token, {secret}]\n"
    );
    let err = parse_provider_document(&dup).unwrap_err().to_string();
    assert!(err.contains("duplicate"), "{err}");
    assert!(!err.contains("swordfish"), "{err}");
}

#[test]
fn pem_certificates_takes_only_certificate_blocks() {
    use kleym_hub::access::select::pem_certificates;
    let make = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert, key)
    };
    let (a, a_key) = make("a.test");
    let (b, _) = make("b.test");

    // A bundle: every certificate, in order, as DER.
    let bundle = format!("{}{}", a.pem(), b.pem());
    let ders = pem_certificates(bundle.as_bytes()).unwrap();
    assert_eq!(ders, vec![a.der().to_vec(), b.der().to_vec()]);
    // CRLF line endings are PEM too.
    let crlf = a.pem().replace('\n', "\r\n");
    assert_eq!(
        pem_certificates(crlf.as_bytes()).unwrap(),
        vec![a.der().to_vec()]
    );
    // Blocks with labels PEM parsers do not know are skipped, as before.
    let unknown = format!("-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n{}", a.pem());
    assert_eq!(pem_certificates(unknown.as_bytes()).unwrap().len(), 1);

    // A private key next to the certificate is refused, never silently dropped.
    let with_key = format!("{}{}", a.pem(), a_key.serialize_pem());
    let err = pem_certificates(with_key.as_bytes()).unwrap_err();
    assert!(err.contains("not a CERTIFICATE"), "{err}");
    // No certificate at all, or broken PEM.
    let err = pem_certificates(b"just text\n").unwrap_err();
    assert!(err.contains("no PEM CERTIFICATE"), "{err}");
    let truncated = a.pem().replace("-----END CERTIFICATE-----", "");
    let err = pem_certificates(truncated.as_bytes()).unwrap_err();
    assert!(err.contains("not valid PEM"), "{err}");
}
