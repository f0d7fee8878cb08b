//! `kleym explain pod NS/NAME`: which SVIDs a pod gets, from which ClusterSPIFFEIDs, and why
//! the others do not apply; `kleym explain binding NS/NAME`: which pods a binding reaches,
//! and why not the rest of its pool. Against one cluster, or through the hub API for any
//! spoke (see docs/explain.md).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use kleym_hub::explain::{PodExplanation, Scope, explain_pod};
use kleym_hub::explain_binding::{BindingExplanation, DEFAULT_SAMPLE, explain_binding};
use kleym_hub::http::explain::{ExplainQuery, encode, query_string};
use kleym_spoke::explain::ManagerConfig;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Readable text.
    Text,
    /// The explanation document as JSON.
    Json,
    /// The explanation document as YAML.
    Yaml,
}

/// Arguments of `kleym explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to explain.
    #[command(subcommand)]
    pub what: What,
}

/// What `kleym explain` explains.
#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// A pod: every ClusterSPIFFEID that selects it, the entries SPIRE receives, the SVIDs
    /// of each container, which bindings of its namespace target its pool, and why they do
    /// or do not reach it.
    Pod(PodArgs),
    /// A binding: its ClusterSPIFFEID, the pods it reaches, the pods of its pool it does
    /// not reach and why, where SPIRE masks it, and its collisions and warnings.
    Binding(BindingArgs),
}

/// Where to read from, and the controller manager's settings: shared by both subcommands.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Kubeconfig of the cluster (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long, conflicts_with = "hub_url")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, conflicts_with = "hub_url")]
    pub context: Option<String>,
    /// Ask the hub API at this URL instead, for the spoke --cluster: the hub reads the
    /// spoke with its own credentials, and answers only about the namespace asked.
    #[arg(long, value_name = "URL", requires = "cluster")]
    pub hub_url: Option<String>,
    /// With --hub-url: the spoke, as its ClusterProfile's NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "hub_url")]
    pub cluster: Option<String>,
    /// With --hub-url: file holding the bearer token, a ServiceAccount token minted for
    /// the hub's --api-audience (default `kleym-hub`) whose user may `get`
    /// fleetidentityreports and `get` explanations.kleym.io in the namespace asked. Never
    /// printed.
    #[arg(long, value_name = "FILE", requires = "hub_url")]
    pub token_file: Option<PathBuf>,
    /// With --hub-url: PEM CA bundle to verify the hub API's certificate (default: the
    /// system roots).
    #[arg(long, value_name = "FILE", requires = "hub_url")]
    pub ca_file: Option<PathBuf>,
    /// The SPIRE trust domain (the controller manager's `trustDomain`).
    #[arg(long)]
    pub trust_domain: String,
    /// The controller manager's `clusterName`: part of every entry's parent ID.
    #[arg(long, default_value = "")]
    pub cluster_name: String,
    /// The controller manager's `clusterDomain`, for `.ClusterDomain` in templates.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The controller manager's `className` (empty: none).
    #[arg(long, default_value = "")]
    pub spire_class: String,
    /// The controller manager's `watchClassless`: it also reads ClusterSPIFFEIDs without
    /// `className`.
    #[arg(long)]
    pub watch_classless: bool,
    /// A namespace the controller manager ignores (`ignoreNamespaces`, a Go regular
    /// expression); repeat for several.
    #[arg(long = "ignore-namespace", value_name = "REGEX")]
    pub ignore_namespaces: Vec<String>,
    /// The controller manager's `parentIDTemplate` (default: its built-in
    /// `spiffe://<trust domain>/spire/agent/k8s_psat/<cluster name>/<node UID>`): rendered
    /// with the node's data only, it must give a SPIFFE ID of the trust domain.
    #[arg(long, value_name = "TEMPLATE", default_value = "")]
    pub parent_id_template: String,
    /// kleym's field manager, for the ownership proof of its ClusterSPIFFEIDs.
    #[arg(long, default_value = kleym_spoke::reconciler::config::DEFAULT_FIELD_MANAGER)]
    pub field_manager: String,
}

/// The paragraph both subcommands' `--help` share.
macro_rules! sources_help {
    () => {
        "Against one cluster (--kubeconfig/--context) it reads with your own credentials. \
Through the hub (--hub-url URL --cluster NAMESPACE/NAME, with --token-file and --ca-file as \
for `kleym report --server`), the hub authenticates and authorizes you as on every /v1 \
route, also checks `get explanations.kleym.io` in the namespace asked (object name: the \
cluster), reads the spoke with its own credentials and shows only ClusterSPIFFEIDs that \
select that namespace. Pass the SPIRE Controller Manager's settings (--trust-domain, \
--cluster-name, --spire-class, --watch-classless, --ignore-namespace) as that manager is \
configured: the answer depends on them."
    };
}

/// Arguments of `kleym explain pod`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = concat!("\
Reads: get on the pod, its namespace and its node; list on ClusterSPIFFEIDs and on the \
namespace's InferenceIdentityBindings, InferenceObjectives, InferenceModels and InferencePools \
(to tell which bindings target the pod's pool). ", sources_help!(), "

EXIT STATUS:
  0  explained
  1  the pod (or, through the hub, the cluster) was not found, the caller is not allowed, \
or the cluster could not be read
  2  bad flags

EXAMPLES:
  kleym explain pod serving/vllm-0 --trust-domain example.org --cluster-name spoke-1 -o json
  kleym explain pod serving/vllm-0 --trust-domain example.org --cluster-name spoke-1 \\
      --hub-url https://kleym-hub.kleym-system:8443 --cluster fleet/spoke-1 \\
      --token-file token --ca-file ca.crt"))]
pub struct PodArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub pod: String,
    /// Source and settings.
    #[command(flatten)]
    pub common: Common,
}

/// Arguments of `kleym explain binding`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = concat!("\
Reads: get on the binding, its namespace and the nodes of its pods; list on \
ClusterSPIFFEIDs, on the namespace's InferenceObjectives (or InferenceModels) and \
InferencePools, and on its pods (with the pool's label selector). ", sources_help!(), "

EXIT STATUS:
  0  explained
  1  the binding (or, through the hub, the cluster) was not found, the caller is not \
allowed, or the cluster could not be read
  2  bad flags

EXAMPLE:
  kleym explain binding serving/chat-id --trust-domain example.org --cluster-name spoke-1 --sample 5"))]
pub struct BindingArgs {
    /// The binding, as NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub binding: String,
    /// Pods listed per group (reached, not reached); the counts are always complete.
    #[arg(long, default_value_t = DEFAULT_SAMPLE)]
    pub sample: usize,
    /// Source and settings.
    #[command(flatten)]
    pub common: Common,
}

/// Run `kleym explain`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let out = &mut std::io::stdout().lock();
    match &args.what {
        What::Pod(p) => {
            let (ns, name) = object("pod", &p.pod)?;
            let e: PodExplanation = fetch(&p.common, "pod", ns, name, DEFAULT_SAMPLE, |c, m| {
                Box::pin(async move {
                    Ok(
                        explain_pod(&c, ns, name, &m, &p.common.field_manager, Scope::Cluster)
                            .await?,
                    )
                })
            })?;
            print(&p.common, &e, out, |e, out| {
                kleym_hub::explain::render_text(e, out)
            })
        }
        What::Binding(b) => {
            let (ns, name) = object("binding", &b.binding)?;
            let e: BindingExplanation = fetch(&b.common, "binding", ns, name, b.sample, |c, m| {
                Box::pin(async move {
                    Ok(explain_binding(
                        &c,
                        ns,
                        name,
                        &m,
                        &b.common.field_manager,
                        b.sample,
                        Scope::Cluster,
                    )
                    .await?)
                })
            })?;
            print(&b.common, &e, out, |e, out| {
                kleym_hub::explain_binding::render_text(e, out)
            })
        }
    }
}

fn object<'a>(what: &str, arg: &'a str) -> anyhow::Result<(&'a str, &'a str)> {
    arg.split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
        .ok_or_else(|| {
            super::usage_error("explain", format!("{what} {arg:?} is not NAMESPACE/NAME")).into()
        })
}

fn manager(c: &Common) -> ManagerConfig {
    ManagerConfig {
        trust_domain: c.trust_domain.clone(),
        cluster_name: c.cluster_name.clone(),
        cluster_domain: c.cluster_domain.clone(),
        class_name: c.spire_class.clone(),
        watch_classless: c.watch_classless,
        ignore_namespaces: c.ignore_namespaces.clone(),
        parent_id_template: c.parent_id_template.clone(),
    }
}

type Local<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<T>> + 'a>>;

/// The explanation, from the cluster (`local`) or from the hub API.
fn fetch<'a, T: serde::de::DeserializeOwned>(
    c: &'a Common,
    kind: &str,
    ns: &str,
    name: &str,
    sample: usize,
    local: impl FnOnce(kube::Client, ManagerConfig) -> Local<'a, T>,
) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let m = manager(c);
    if let Some(url) = &c.hub_url {
        let cluster = c.cluster.as_deref().unwrap_or_default();
        let (cns, cname) = object("cluster", cluster)?;
        let path = format!(
            "/v1/clusters/{}/{}/explain/{kind}/{}/{}?{}",
            encode(cns),
            encode(cname),
            encode(ns),
            encode(name),
            query_string(&ExplainQuery {
                manager: m,
                field_manager: c.field_manager.clone(),
                sample,
            })
        );
        let token = c
            .token_file
            .as_ref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map(|t| t.trim().to_string())
                    .with_context(|| format!("reading --token-file {}", p.display()))
            })
            .transpose()?;
        let ca = c
            .ca_file
            .as_ref()
            .map(|p| std::fs::read(p).with_context(|| format!("reading --ca-file {}", p.display())))
            .transpose()?;
        let body = rt.block_on(hub_get(url, &path, token.as_deref(), ca.as_deref()))?;
        return serde_json::from_str(&body)
            .with_context(|| format!("reading the hub's answer to GET {url}{path}"));
    }
    rt.block_on(async {
        let client =
            kleym_hub::kubeconfig::client_from_flags(c.kubeconfig.as_deref(), c.context.as_deref())
                .await?;
        local(client, m).await
    })
}

/// `GET url+path` with the bearer token: any answer is final (a `503` from a replica that
/// does not engage the spoke says so at once); only a request that got no answer is
/// retried, a few times ([`kleym_hub::api_client`]).
async fn hub_get(
    url: &str,
    path: &str,
    token: Option<&str>,
    ca_pem: Option<&[u8]>,
) -> anyhow::Result<String> {
    Ok(kleym_hub::api_client::get(url, path, token, ca_pem).await?)
}

fn print<T: serde::Serialize, W: Write>(
    c: &Common,
    e: &T,
    out: &mut W,
    text: impl FnOnce(&T, &mut W) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    match c.output {
        Output::Text => text(e, out).context("writing the explanation")?,
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, e).context("writing JSON")?;
            writeln!(out)?;
        }
        Output::Yaml => {
            let yaml = kleym_api::yaml::to_string(e).context("rendering YAML")?;
            out.write_all(yaml.as_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}
