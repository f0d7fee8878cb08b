//! `kleym trust-config`: per spoke, what its operator applies so that the spoke's API server
//! accepts the hub: for `spiffe-jwt` and `token-request` the `AuthenticationConfiguration`
//! for `--authentication-config`, for `spiffe-x509` the client CA, and for every credential
//! the spoke ClusterRole with the one ClusterRoleBinding (`kleym-hub`) of the hub's identity.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use kleym_api::external::clusterprofile::ClusterProfileVersion;
use kleym_hub::access::AccessProfile;
use kleym_hub::credentials::plugins::spiffe_id::resolve_hub_spiffe_id;
use kleym_hub::issuer::trust::{
    AudienceRule, EXPLAIN_CLUSTER_ROLE_YAML, SPOKE_CLUSTER_ROLE_YAML, SpokeTarget, TrustInputs,
    authentication_configuration, check_distinct_audiences, cluster_role_binding,
    explain_role_binding, spoke_target,
};
use kleym_hub::issuer::validate_issuer_url;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};

/// The credential the spokes will be configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Credential {
    /// JWT-SVIDs from `kleym credential spiffe-jwt` (sub = the hub's SPIFFE ID).
    SpiffeJwt,
    /// X.509-SVIDs from `kleym credential spiffe-x509`: the spoke adds the hub CA (from its
    /// own Secret, --issuer-x509-ca-secret) to its client CAs; CN = the mapped user.
    SpiffeX509,
    /// ServiceAccount tokens from `kleym credential token-request` (sub =
    /// `system:serviceaccount:<ns>:<name>` of --service-account; the issuer is the hub
    /// cluster's ServiceAccount issuer).
    TokenRequest,
    /// Any credential whose identity the spoke's own authenticators establish:
    /// `secret-reader`'s stored token, `aws eks get-token`, `gke-gcloud-auth-plugin`,
    /// `kubelogin`. Prints only the RBAC, binding --user or --group (which may be a
    /// `system:serviceaccount:` name of a ServiceAccount in the spoke).
    External,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents, commented per spoke.
    Yaml,
    /// One JSON array, an object per spoke.
    Json,
}

/// Arguments of `kleym trust-config`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of the hub cluster [default: KUBECONFIG, ~/.kube/config, in-cluster].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The ClusterProfile(s) to print for, `namespace/name` (repeatable).
    #[arg(
        long,
        value_name = "NS/NAME",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub profile: Vec<String>,
    /// Every ClusterProfile of the hub cluster.
    #[arg(long)]
    pub all: bool,
    /// The access provider whose `cluster.server` the spokes are reached at [default: the
    /// first provider of the profile that has a server].
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// The credential the hub uses.
    #[arg(long, value_enum, default_value = "spiffe-jwt")]
    pub credential: Credential,
    /// The provider entry says `profileSourcedAudiencePolicy: Allow`: a profile's exec
    /// extension `audience` is its spoke's audience. By default the audience is
    /// `kleym.io/clusterprofile/<namespace>/<name>`, which the profile's status cannot change.
    #[arg(long)]
    pub profile_sourced_audience: bool,
    /// Also accept the spoke's server URL as an audience (`audienceMatchPolicy: MatchAny`),
    /// the audience of kleym versions before the audience was the hub's: for the migration
    /// only. While a spoke accepts it, a token an older hub minted for a forged profile still
    /// logs in there; remove it once every hub replica is upgraded.
    #[arg(long)]
    pub legacy_server_audience: bool,
    /// With `--credential token-request`: the hub ServiceAccount, `namespace/name`, as
    /// `kleym credential token-request --service-account`.
    #[arg(
        long,
        value_name = "NS/NAME",
        required_if_eq("credential", "token-request")
    )]
    pub service_account: Option<String>,
    /// The issuer URL: `kleym hub --issuer-url` (spiffe-jwt), or the hub cluster's
    /// `--service-account-issuer` (token-request).
    /// Required for both.
    #[arg(long, value_name = "URL", env = "KLEYM_ISSUER_URL")]
    pub issuer_url: Option<String>,
    /// PEM CA bundle that verifies the issuer listener's certificate (what the spoke's API
    /// server trusts to fetch discovery and keys). Required unless `--credential spiffe-x509`.
    #[arg(long, value_name = "PATH")]
    pub issuer_ca_file: Option<PathBuf>,
    /// With `--credential spiffe-x509`: the issuer key Secret, as `kleym hub
    /// --issuer-key-secret`, naming the hub CA Secret beside it (`<name>-x509-ca`) unless
    /// `--issuer-x509-ca-secret` is given.
    #[arg(long, value_name = "NS/NAME", value_parser = kleym_hub::issuer::secret::parse_issuer_key_secret)]
    pub issuer_key_secret: Option<kleym_hub::issuer::secret::SecretRef>,
    /// With `--credential spiffe-x509`: the Secret holding the hub CA, as `kleym hub
    /// --issuer-x509-ca-secret`.
    #[arg(long, value_name = "NS/NAME", value_parser = kleym_hub::issuer::ca::parse_ca_secret, conflicts_with = "client_ca_file")]
    pub issuer_x509_ca_secret: Option<kleym_hub::issuer::secret::SecretRef>,
    /// With `--credential spiffe-x509` and SVIDs from a SPIRE agent (`kleym credential
    /// spiffe-x509 --workload-api-socket`): the PEM bundle the spokes add to their client CAs,
    /// SPIRE's X.509 bundle of the trust domain (`spire-server bundle show`), instead of the
    /// hub CA of `--issuer-x509-ca-secret`.
    #[arg(long, value_name = "PATH", conflicts_with = "issuer_key_secret")]
    pub client_ca_file: Option<PathBuf>,
    /// With `--credential spiffe-x509` and SVIDs from a SPIRE agent: the user the spokes map,
    /// which is the SVID's subject CN (SPIRE sets it to the registration entry's first DNS
    /// name) [default: --username-prefix followed by the hub's SPIFFE ID, the CN of the SVIDs
    /// kleym issues itself].
    #[arg(long, value_name = "NAME", requires = "client_ca_file")]
    pub x509_username: Option<String>,
    /// The hub's SPIFFE ID [default: spiffe://<trust domain>/kleym/hub].
    #[arg(long)]
    pub hub_spiffe_id: Option<String>,
    /// The SPIFFE trust domain.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN")]
    pub trust_domain: Option<String>,
    /// Prefix of the username spokes map the hub to (must not start with `system:`).
    #[arg(long, default_value = "kleym:")]
    pub username_prefix: String,
    /// With `--credential external`: the user the spoke authenticates the hub's credential
    /// as (for `secret-reader` with a spoke ServiceAccount's token:
    /// `system:serviceaccount:<ns>:<name>`; for cloud plugins: the user the cloud's IAM
    /// mapping yields).
    #[arg(long, value_name = "NAME", conflicts_with = "group")]
    pub user: Option<String>,
    /// With `--credential external`: bind this group instead of a user.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// Kubernetes version of the spokes' API servers (`1.30`, `v1.34.1`): decides the
    /// apiVersion of the AuthenticationConfiguration. 1.29: `v1alpha1` (needs the
    /// StructuredAuthenticationConfiguration feature gate); 1.30-1.33: `v1beta1`; 1.34 and
    /// later: `v1`. The default, 1.30, prints `v1beta1`, which every release from 1.30 on
    /// reads; name the oldest version in your fleet, or 1.34 once all run 1.34 or later.
    #[arg(
        long,
        value_name = "VERSION",
        default_value = "1.30",
        value_parser = kleym_hub::issuer::trust::parse_kubernetes_minor
    )]
    pub apiserver_version: u32,
    /// The SVID bounds of the spokes, as the hub's flags of the same names: the parameters
    /// of the admission policy (its ConfigMap `kube-system/kleym-hub-bounds`).
    #[command(flatten)]
    pub svid: kleym_hub::flags::SvidBoundsFlags,
    /// Also grant the hub's identity what `kleym explain --hub-url` reads on each spoke: the
    /// ClusterRole `kleym-explain-reader` (get/list pods, get nodes and ClusterSPIFFEIDs) and its binding
    /// `kleym-hub-explain`. Off by default: it lets the hub's credential read every pod spec.
    #[arg(long)]
    pub allow_explain: bool,
    /// Output format on stdout.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// Also write, per spoke, `<DIR>/<namespace>_<name>/authentication-config.yaml` (for the
    /// API server's `--authentication-config`) and `rbac.yaml` (for `kubectl apply -f`).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

/// Runs `kleym trust-config`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = runtime.block_on(render(args))?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .context("writing to stdout")?;
    Ok(())
}

fn inputs(args: &Args) -> anyhow::Result<TrustInputs> {
    let authentication_api_version =
        kleym_hub::issuer::trust::authentication_api_version(args.apiserver_version)
            .map_err(|e| anyhow!("--apiserver-version: {e}"))?;
    if args.credential == Credential::External {
        let (name, bind_group) = match (&args.user, &args.group) {
            (Some(u), None) => (u, false),
            (None, Some(g)) => (g, true),
            _ => bail!(
                "--credential external needs --user or --group: the identity the spoke authenticates the hub's credential as"
            ),
        };
        if name.is_empty() {
            bail!("--user/--group must not be empty");
        }
        // The spoke's own authenticator made this name, so `system:` names (a spoke
        // ServiceAccount) are legitimate here; kleym maps nothing.
        return Ok(TrustInputs {
            issuer_url: String::new(),
            issuer_ca_pem: String::new(),
            subject: name.clone(),
            username_prefix: String::new(),
            authentication_api_version,
            bind_group,
        });
    }
    if args.user.is_some() || args.group.is_some() {
        bail!("--user and --group are only for --credential external");
    }
    let (issuer_url, ca) = if args.credential == Credential::SpiffeX509 {
        (String::new(), String::new())
    } else {
        let (Some(url), Some(file)) = (&args.issuer_url, &args.issuer_ca_file) else {
            bail!(
                "--issuer-url and --issuer-ca-file are required with --credential spiffe-jwt or token-request"
            );
        };
        validate_issuer_url(url, false)?;
        let ca = std::fs::read_to_string(file)
            .with_context(|| format!("--issuer-ca-file {}", file.display()))?;
        if !ca.contains("-----BEGIN CERTIFICATE-----") {
            bail!(
                "--issuer-ca-file {}: holds no PEM certificate",
                file.display()
            );
        }
        (url.clone(), ca)
    };
    if args.username_prefix.starts_with("system:") {
        bail!(
            "--username-prefix {:?}: system: usernames are reserved",
            args.username_prefix
        );
    }
    let mut inputs = TrustInputs {
        issuer_url,
        issuer_ca_pem: ca,
        subject: subject(args)?,
        username_prefix: args.username_prefix.clone(),
        authentication_api_version,
        bind_group: false,
    };
    if let Some(name) = &args.x509_username {
        if args.credential != Credential::SpiffeX509 {
            bail!("--x509-username is only for --credential spiffe-x509");
        }
        if name.is_empty() || name.starts_with("system:") {
            bail!("--x509-username {name:?}: must be a non-empty name outside system:");
        }
        // A client certificate's user is its CN verbatim: kube-apiserver adds no prefix.
        inputs.username_prefix = String::new();
        inputs.subject = name.clone();
    }
    Ok(inputs)
}

/// The `sub` the spokes pin.
fn subject(args: &Args) -> anyhow::Result<String> {
    match args.credential {
        Credential::SpiffeJwt | Credential::SpiffeX509 => Ok(resolve_hub_spiffe_id(
            args.hub_spiffe_id.as_deref(),
            args.trust_domain.as_deref(),
        )?),
        Credential::External => Ok(args.user.clone().or(args.group.clone()).unwrap_or_default()),
        Credential::TokenRequest => {
            let sa = args.service_account.as_deref().unwrap_or_default();
            let (ns, name) =
                kleym_hub::credentials::plugins::token_request::parse_service_account(sa)?;
            Ok(format!("system:serviceaccount:{ns}:{name}"))
        }
    }
}

async fn profiles(args: &Args) -> anyhow::Result<Vec<AccessProfile>> {
    let client = kleym_hub::kubeconfig::client_from_flags(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
    )
    .await?;
    let ar = ClusterProfileVersion::V1alpha1.api_resource();
    let mut out = Vec::new();
    if args.all {
        let list = Api::<DynamicObject>::all_with(client, &ar)
            .list(&ListParams::default())
            .await
            .context("listing ClusterProfiles in the hub cluster")?;
        for obj in list.items {
            out.push(AccessProfile::from_profile_json(&serde_json::to_value(
                obj,
            )?)?);
        }
    } else {
        for p in &args.profile {
            let (ns, name) = p
                .split_once('/')
                .filter(|(n, m)| !n.is_empty() && !m.is_empty())
                .ok_or_else(|| anyhow!("--profile must be <namespace>/<name>, got {p:?}"))?;
            let obj = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
                .get(name)
                .await
                .with_context(|| format!("reading ClusterProfile {p}"))?;
            out.push(AccessProfile::from_profile_json(&serde_json::to_value(
                obj,
            )?)?);
        }
    }
    Ok(out)
}

/// Each profile's spoke and audience; profiles sharing an audience are refused.
async fn targets(args: &Args) -> anyhow::Result<Vec<SpokeTarget>> {
    let rule = AudienceRule {
        profile_sourced: args.profile_sourced_audience,
        legacy_server_audience: args.legacy_server_audience,
    };
    let targets = profiles(args)
        .await?
        .iter()
        .map(|p| spoke_target(p, args.provider.as_deref(), rule).map_err(|e| anyhow!(e)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    check_distinct_audiences(&targets).map_err(|e| anyhow!(e))?;
    Ok(targets)
}

/// Per spoke: (target, AuthenticationConfiguration, RBAC documents).
/// With `allow_explain`, the RBAC documents also hold the explain reader role and binding.
pub fn documents(
    inputs: &TrustInputs,
    targets: &[SpokeTarget],
    allow_explain: bool,
) -> anyhow::Result<Vec<(SpokeTarget, Value, Vec<Value>)>> {
    let role: Value = kleym_api::yaml::from_str(SPOKE_CLUSTER_ROLE_YAML)
        .map_err(|e| anyhow!("embedded spoke ClusterRole: {e}"))?;
    let mut rbac = vec![role, cluster_role_binding(inputs)];
    if allow_explain {
        let explain: Value = kleym_api::yaml::from_str(EXPLAIN_CLUSTER_ROLE_YAML)
            .map_err(|e| anyhow!("embedded explain ClusterRole: {e}"))?;
        rbac.push(explain);
        rbac.push(explain_role_binding(inputs));
    }
    Ok(targets
        .iter()
        .map(|t| {
            (
                t.clone(),
                authentication_configuration(inputs, t),
                rbac.clone(),
            )
        })
        .collect())
}

fn yaml(v: &Value) -> anyhow::Result<String> {
    kleym_api::yaml::to_string(v).map_err(|e| anyhow!("rendering YAML: {e}"))
}

/// The spoke admission policy bounding the hub's user (`kleym_spoke::admission_policy`) with
/// its parameters' ConfigMap, or `None` when the spokes' trust domain is unknown
/// (`--trust-domain` not given and not in the hub's SPIFFE ID). Settings the hub would
/// refuse (`--svid-dns-suffix` covering other namespaces' names) are refused here too.
pub fn admission_policy_documents(
    args: &Args,
    inputs: &TrustInputs,
) -> anyhow::Result<Option<Vec<Value>>> {
    let from_subject = inputs
        .subject
        .strip_prefix("spiffe://")
        .and_then(|rest| rest.split('/').next())
        .filter(|td| !td.is_empty())
        .map(str::to_string);
    let Some(trust_domain) = args.trust_domain.clone().or(from_subject) else {
        return Ok(None);
    };
    // With X.509-SVIDs the mapped user is the certificate's CN: no DNS name may be it.
    let reserved = match args.credential {
        Credential::SpiffeX509 => vec![inputs.username()],
        _ => Vec::new(),
    };
    let svid = kleym_spoke::compiler::SvidPolicy::new(args.svid.settings(Vec::new(), reserved))
        .map_err(|e| anyhow!("--cluster-domain/--svid-*: {e}"))?;
    let name = kleym_spoke::admission_policy::HUB_POLICY_NAME;
    Ok(Some(kleym_spoke::admission_policy::admission_policy_with(
        &kleym_spoke::admission_policy::PolicyOptions {
            name: name.into(),
            usernames: vec![inputs.username()],
            trust_domain,
            cluster_domain: args.svid.cluster_domain.clone(),
        },
        &kleym_spoke::admission_policy::ParamsRef::default_for(name),
        &svid,
    )))
}

/// The admission policy section of the YAML output.
fn policy_yaml(policy: Option<&Vec<Value>>) -> anyhow::Result<String> {
    let Some(docs) = policy else {
        return Ok(
            "# 3. No admission policy: pass --trust-domain (the spokes' SPIFFE trust domain) to\n\
                   #    print the ValidatingAdmissionPolicy that bounds the hub's user.\n"
                .into(),
        );
    };
    let mut out = String::from(
        "# 3. kubectl apply -f - on that spoke (Kubernetes 1.30+): the admission policy that\n\
         #    lets the hub's user write only what kleym writes (docs/keyless-access.md), and\n\
         #    the ConfigMap of its parameters: keep it equal to the hub's --cluster-domain\n\
         #    and --svid-* flags (edit it to change what the policy allows).\n",
    );
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&yaml(doc)?);
    }
    Ok(out)
}

/// Writes `<dir>/admission-policy.yaml` when there is a policy.
fn write_policy(dir: &std::path::Path, policy: Option<&Vec<Value>>) -> anyhow::Result<()> {
    if let Some(docs) = policy {
        let text = docs
            .iter()
            .map(yaml)
            .collect::<anyhow::Result<Vec<_>>>()?
            .join("---\n");
        std::fs::write(dir.join("admission-policy.yaml"), text)
            .with_context(|| format!("writing {}", dir.display()))?;
    }
    Ok(())
}

/// The client CA bundle the spokes add (spiffe-x509): `--client-ca-file`, else the hub CA of
/// the issuer Secret.
async fn client_ca(args: &Args) -> anyhow::Result<String> {
    if let Some(file) = &args.client_ca_file {
        let pem =
            std::fs::read(file).with_context(|| format!("--client-ca-file {}", file.display()))?;
        // Certificates only (a key pasted by mistake is refused), at least one.
        kleym_hub::access::select::pem_certificates(&pem)
            .map_err(|e| anyhow!("--client-ca-file {}: {e}", file.display()))?;
        return Ok(String::from_utf8_lossy(&pem).into_owned());
    }
    let at = match (&args.issuer_x509_ca_secret, &args.issuer_key_secret) {
        (Some(ca), _) => ca.clone(),
        (None, Some(key)) => kleym_hub::issuer::ca::default_ca_secret(key),
        (None, None) => {
            anyhow::bail!(
                "--issuer-x509-ca-secret (or --issuer-key-secret) is required with --credential spiffe-x509"
            )
        }
    };
    let client = kleym_hub::kubeconfig::client_from_flags(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
    )
    .await?;
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, &at.namespace)
        .get(&at.name)
        .await
        .with_context(|| {
            format!(
                "reading X.509 CA Secret {at} (the hub creates it when started with --issuer-x509)"
            )
        })?;
    // The bundle (current, next and replaced CAs during a CA rotation) when the hub wrote
    // one; else the CA certificate alone.
    let data = secret.data.as_ref();
    let cert = data
        .and_then(|d| d.get(kleym_hub::issuer::x509::CA_BUNDLE_KEY))
        .or_else(|| data.and_then(|d| d.get(kleym_hub::issuer::x509::CA_CERT_KEY)))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .filter(|c| c.contains("-----BEGIN CERTIFICATE-----"))
        .ok_or_else(|| {
            anyhow!(
                "X.509 CA Secret {at}: no data[{}]",
                kleym_hub::issuer::x509::CA_CERT_KEY
            )
        })?;
    Ok(cert)
}

async fn render(args: &Args) -> anyhow::Result<String> {
    let inputs = inputs(args)?;
    if args.credential == Credential::SpiffeX509 {
        return render_x509(args, &inputs).await;
    }
    if args.credential == Credential::External {
        return render_rbac_only(args, &inputs).await;
    }
    let targets = targets(args).await?;
    let docs = documents(&inputs, &targets, args.allow_explain)?;
    let policy = admission_policy_documents(args, &inputs)?;
    if let Some(dir) = &args.output_dir {
        for (t, authn, rbac) in &docs {
            let d = dir.join(t.spoke.replace('/', "_"));
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            std::fs::write(d.join("authentication-config.yaml"), yaml(authn)?)
                .with_context(|| format!("writing {}", d.display()))?;
            let rbac_text = rbac
                .iter()
                .map(yaml)
                .collect::<anyhow::Result<Vec<_>>>()?
                .join("---\n");
            std::fs::write(d.join("rbac.yaml"), rbac_text)
                .with_context(|| format!("writing {}", d.display()))?;
            write_policy(&d, policy.as_ref())?;
        }
    }
    match args.output {
        Format::Json => {
            let arr: Vec<Value> = docs
                .iter()
                .map(|(t, authn, rbac)| {
                    json!({
                        "spoke": t.spoke, "server": t.server, "audience": t.audience,
                        "username": inputs.username(),
                        "authenticationConfiguration": authn, "rbac": rbac,
                        "admissionPolicy": policy,
                    })
                })
                .collect();
            Ok(format!("{}\n", serde_json::to_string_pretty(&arr)?))
        }
        Format::Yaml => {
            let mut out = String::new();
            for (t, authn, rbac) in &docs {
                out.push_str(&format!(
                    "# ClusterProfile {} (server {}, audience {}): the hub connects as user {:?}.\n\
                     # 1. The API server's --authentication-config file (merge this jwt entry\n\
                     #    into an existing file):\n---\n",
                    t.spoke,
                    t.server,
                    t.audience,
                    inputs.username()
                ));
                out.push_str(&yaml(authn)?);
                out.push_str("# 2. kubectl apply -f - on that spoke:\n");
                for doc in rbac {
                    out.push_str("---\n");
                    out.push_str(&yaml(doc)?);
                }
                out.push_str(&policy_yaml(policy.as_ref())?);
            }
            Ok(out)
        }
    }
}

async fn render_x509(args: &Args, inputs: &TrustInputs) -> anyhow::Result<String> {
    let ca = client_ca(args).await?;
    let targets = targets(args).await?;
    let docs = documents(inputs, &targets, args.allow_explain)?;
    let policy = admission_policy_documents(args, inputs)?;
    if let Some(dir) = &args.output_dir {
        for (t, _, rbac) in &docs {
            let d = dir.join(t.spoke.replace('/', "_"));
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            std::fs::write(d.join("client-ca.crt"), &ca)
                .with_context(|| format!("writing {}", d.display()))?;
            let rbac_text = rbac
                .iter()
                .map(yaml)
                .collect::<anyhow::Result<Vec<_>>>()?
                .join("---\n");
            std::fs::write(d.join("rbac.yaml"), rbac_text)
                .with_context(|| format!("writing {}", d.display()))?;
            write_policy(&d, policy.as_ref())?;
        }
    }
    match args.output {
        Format::Json => {
            let arr: Vec<Value> = docs
                .iter()
                .map(|(t, _, rbac)| {
                    json!({
                        "spoke": t.spoke, "server": t.server, "username": inputs.username(),
                        "clientCA": ca, "rbac": rbac, "admissionPolicy": policy,
                    })
                })
                .collect();
            Ok(format!("{}\n", serde_json::to_string_pretty(&arr)?))
        }
        Format::Yaml => {
            let mut out = String::new();
            for (t, _, rbac) in &docs {
                out.push_str(&format!(
                    "# ClusterProfile {} (server {}): the hub connects with a client certificate as user {:?}.\n\
                     # 1. Append this CA to the file of the API server's --client-ca-file:\n",
                    t.spoke,
                    t.server,
                    inputs.username()
                ));
                for line in ca.lines() {
                    out.push_str(&format!("#    {line}\n"));
                }
                out.push_str("# 2. kubectl apply -f - on that spoke:\n");
                for doc in rbac {
                    out.push_str("---\n");
                    out.push_str(&yaml(doc)?);
                }
                out.push_str(&policy_yaml(policy.as_ref())?);
            }
            Ok(out)
        }
    }
}

/// `--credential external`: per spoke only the ClusterRole and the binding.
async fn render_rbac_only(args: &Args, inputs: &TrustInputs) -> anyhow::Result<String> {
    let targets = targets(args).await?;
    let docs = documents(inputs, &targets, args.allow_explain)?;
    let who = if inputs.bind_group { "group" } else { "user" };
    if let Some(dir) = &args.output_dir {
        for (t, _, rbac) in &docs {
            let d = dir.join(t.spoke.replace('/', "_"));
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            let rbac_text = rbac
                .iter()
                .map(yaml)
                .collect::<anyhow::Result<Vec<_>>>()?
                .join("---\n");
            std::fs::write(d.join("rbac.yaml"), rbac_text)
                .with_context(|| format!("writing {}", d.display()))?;
        }
    }
    match args.output {
        Format::Json => {
            let arr: Vec<Value> = docs
                .iter()
                .map(|(t, _, rbac)| {
                    json!({"spoke": t.spoke, "server": t.server, who: inputs.username(), "rbac": rbac})
                })
                .collect();
            Ok(format!("{}\n", serde_json::to_string_pretty(&arr)?))
        }
        Format::Yaml => {
            let mut out = String::new();
            for (t, _, rbac) in &docs {
                out.push_str(&format!(
                    "# ClusterProfile {} (server {}): the spoke authenticates the hub as {who} {:?}.\n\
                     # kubectl apply -f - on that spoke:\n",
                    t.spoke,
                    t.server,
                    inputs.username()
                ));
                for doc in rbac {
                    out.push_str("---\n");
                    out.push_str(&yaml(doc)?);
                }
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut v = vec![
            "x",
            "--all",
            "--issuer-url",
            "https://i.example",
            "--issuer-ca-file",
            "ca.pem",
        ];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).map(|c| c.args)
    }

    #[test]
    fn the_pinned_subject_follows_the_credential() {
        let a = parse(&["--trust-domain", "example.org"]).unwrap();
        assert_eq!(subject(&a).unwrap(), "spiffe://example.org/kleym/hub");
        let a = parse(&[
            "--credential",
            "token-request",
            "--service-account",
            "kleym/hub",
        ])
        .unwrap();
        assert_eq!(subject(&a).unwrap(), "system:serviceaccount:kleym:hub");
        assert!(
            parse(&["--credential", "token-request"]).is_err(),
            "--service-account required"
        );
        let a = parse(&["--credential", "token-request", "--service-account", "hub"]).unwrap();
        assert!(subject(&a).is_err());
        let a = parse(&[]).unwrap();
        assert!(subject(&a).is_err(), "no trust domain, no SPIFFE ID");
        let a = Cli::try_parse_from([
            "x",
            "--all",
            "--credential",
            "spiffe-x509",
            "--trust-domain",
            "example.org",
        ])
        .unwrap()
        .args;
        let i = inputs(&a).unwrap();
        assert_eq!(i.username(), "kleym:spiffe://example.org/kleym/hub");
        let a = Cli::try_parse_from(["x", "--all", "--trust-domain", "example.org"])
            .unwrap()
            .args;
        assert!(inputs(&a).unwrap_err().to_string().contains("--issuer-url"));
    }

    #[test]
    fn external_credentials_bind_the_named_identity_and_need_no_issuer() {
        let ext = |extra: &[&str]| {
            let mut v = vec!["x", "--all", "--credential", "external"];
            v.extend_from_slice(extra);
            Cli::try_parse_from(v).map(|c| c.args)
        };
        let a = ext(&["--user", "system:serviceaccount:kleym-system:kleym-hub"]).unwrap();
        let i = inputs(&a).unwrap();
        assert_eq!(i.username(), "system:serviceaccount:kleym-system:kleym-hub");
        assert!(!i.bind_group);
        let i = inputs(&ext(&["--group", "kleym-hubs"]).unwrap()).unwrap();
        assert!(i.bind_group);
        assert!(ext(&["--user", "a", "--group", "b"]).is_err());
        let err = inputs(&ext(&[]).unwrap()).unwrap_err().to_string();
        assert!(err.contains("--user or --group"), "{err}");
        // --user belongs to external only.
        let a = parse(&["--trust-domain", "example.org", "--user", "u"]).unwrap();
        assert!(inputs(&a).is_err());
    }

    #[test]
    fn apiserver_version_picks_the_authentication_config_version() {
        let ca = std::env::temp_dir().join(format!("kleym-tc-ca-{}.pem", std::process::id()));
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let ca = ca.to_str().unwrap().to_string();
        let with = |extra: &[&str]| {
            let mut v = vec![
                "x",
                "--all",
                "--issuer-url",
                "https://i.example",
                "--issuer-ca-file",
                ca.as_str(),
                "--trust-domain",
                "example.org",
            ];
            v.extend_from_slice(extra);
            inputs(&Cli::try_parse_from(v).unwrap().args)
        };
        assert_eq!(
            with(&[]).unwrap().authentication_api_version,
            "apiserver.config.k8s.io/v1beta1"
        );
        assert_eq!(
            with(&["--apiserver-version", "1.34"])
                .unwrap()
                .authentication_api_version,
            "apiserver.config.k8s.io/v1"
        );
        let err = with(&["--apiserver-version", "1.28"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--apiserver-version"), "{err}");
        assert!(Cli::try_parse_from(["x", "--all", "--apiserver-version", "one.thirty"]).is_err());
    }

    #[test]
    fn the_admission_policy_bounds_the_mapped_user_in_the_trust_domain() {
        let a = Cli::try_parse_from([
            "x",
            "--all",
            "--credential",
            "spiffe-x509",
            "--hub-spiffe-id",
            "spiffe://fleet.example/kleym/hub",
            "--cluster-domain",
            "c.example",
        ])
        .unwrap()
        .args;
        let i = inputs(&a).unwrap();
        let docs = admission_policy_documents(&a, &i)
            .unwrap()
            .expect("trust domain from the SPIFFE ID");
        let text = serde_json::to_string(&docs).unwrap();
        assert_eq!(docs[0]["kind"], "ValidatingAdmissionPolicy");
        assert_eq!(docs[1]["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(
            docs[0]["spec"]["matchConditions"][0]["expression"],
            "request.userInfo.username in ['kleym:spiffe://fleet.example/kleym/hub']"
        );
        assert!(text.contains("spiffe://fleet.example/ns/"), "{text}");
        // The settings are the parameters, in the ConfigMap the binding names.
        assert_eq!(
            docs[1]["spec"]["paramRef"],
            json!({"name": "kleym-hub-bounds", "namespace": "kube-system", "parameterNotFoundAction": "Deny"})
        );
        assert_eq!(docs[2]["kind"], "ConfigMap");
        assert_eq!(docs[2]["data"]["clusterDomain"], "c.example");
        assert_eq!(docs[2]["data"]["maxTtl"], "24h");
        assert_eq!(docs[2]["data"]["federatesWith"], "");
        let with_bounds = |extra: &[&str]| {
            let mut argv = vec![
                "x",
                "--all",
                "--trust-domain",
                "fleet.example",
                "--credential",
                "spiffe-x509",
            ];
            argv.extend_from_slice(extra);
            let a = Cli::try_parse_from(argv).map(|c| c.args)?;
            let i = inputs(&a).unwrap();
            Ok::<_, clap::Error>(admission_policy_documents(&a, &i))
        };
        let docs = with_bounds(&[
            "--svid-dns-suffix",
            "apps.example.org",
            "--svid-namespace-dns-suffix",
            "t1=web.t1.svc.cluster.local",
            "--svid-max-ttl",
            "90m",
            "--svid-max-jwt-ttl",
            "5m",
            "--svid-federates-with",
            "partner.example",
        ])
        .unwrap()
        .unwrap()
        .unwrap();
        assert_eq!(
            docs[2]["data"],
            json!({
                "clusterDomain": "cluster.local",
                "dnsSuffixes": "apps.example.org",
                "namespaceDNSSuffixes": "t1=web.t1.svc.cluster.local",
                "maxTtl": "90m",
                "maxJwtTtl": "5m",
                "federatesWith": "partner.example",
                // The X.509 user is no DNS name here (`kleym:spiffe://...`): nothing to reserve.
                "reservedDNSNames": "",
            })
        );
        // The hub's own validators, and its rule that a suffix stays out of other namespaces.
        assert!(with_bounds(&["--svid-max-ttl", "0s"]).is_err());
        assert!(with_bounds(&["--svid-federates-with", "spiffe://p"]).is_err());
        let err = with_bounds(&["--svid-dns-suffix", "svc.cluster.local"])
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(err.contains("svc.cluster.local"), "{err}");
        // A ServiceAccount subject names no trust domain: without --trust-domain, no policy.
        let a = parse(&[
            "--credential",
            "token-request",
            "--service-account",
            "k/hub",
        ])
        .unwrap();
        let i = TrustInputs {
            issuer_url: String::new(),
            issuer_ca_pem: String::new(),
            subject: subject(&a).unwrap(),
            username_prefix: a.username_prefix.clone(),
            authentication_api_version: "apiserver.config.k8s.io/v1beta1",
            bind_group: false,
        };
        assert!(admission_policy_documents(&a, &i).unwrap().is_none());
        assert!(policy_yaml(None).unwrap().contains("pass --trust-domain"));
    }

    #[test]
    fn the_explain_reader_role_is_printed_only_when_asked() {
        let i = TrustInputs {
            issuer_url: String::new(),
            issuer_ca_pem: String::new(),
            subject: "spiffe://example.org/kleym/hub".into(),
            username_prefix: "kleym:".into(),
            authentication_api_version: "apiserver.config.k8s.io/v1beta1",
            bind_group: false,
        };
        let target = SpokeTarget {
            spoke: "fleet/a".into(),
            server: "https://a.example:6443".into(),
            audience: "kleym.io/clusterprofile/fleet/a".into(),
            legacy_audience: None,
        };
        let names = |allow: bool| -> Vec<(String, String)> {
            let docs = documents(&i, std::slice::from_ref(&target), allow).unwrap();
            docs[0]
                .2
                .iter()
                .map(|d| {
                    (
                        d["kind"].as_str().unwrap_or_default().to_string(),
                        d["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    )
                })
                .collect()
        };
        let role = |k: &str, n: &str| (k.to_string(), n.to_string());
        assert_eq!(
            names(false),
            vec![
                role("ClusterRole", "kleym-spoke"),
                role("ClusterRoleBinding", "kleym-hub-access")
            ]
        );
        assert_eq!(
            names(true)[2..],
            [
                role("ClusterRole", "kleym-explain-reader"),
                role("ClusterRoleBinding", "kleym-hub-explain")
            ]
        );
        let docs = documents(&i, std::slice::from_ref(&target), true).unwrap();
        let binding = &docs[0].2[3];
        assert_eq!(binding["roleRef"]["name"], "kleym-explain-reader");
        assert_eq!(
            binding["subjects"][0]["name"],
            "kleym:spiffe://example.org/kleym/hub"
        );
        // The shipped spoke role itself grants nothing on pods or nodes.
        let spoke_role = &docs[0].2[0];
        for rule in spoke_role["rules"].as_array().unwrap() {
            let res = rule["resources"].to_string();
            assert!(!res.contains("pods") && !res.contains("nodes"), "{rule}");
        }
    }
}
