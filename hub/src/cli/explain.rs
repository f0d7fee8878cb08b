//! `kleym explain pod NS/NAME`: which SVIDs a pod gets, from which ClusterSPIFFEIDs, and why
//! the others do not apply (see docs/explain.md).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use kleym_hub::explain::{explain_pod, render_text};
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
    /// of each container, and why the bindings of its namespace do or do not reach it.
    Pod(PodArgs),
}

/// Arguments of `kleym explain pod`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Reads with your own credentials: get on the pod, its namespace and its node; list on \
ClusterSPIFFEIDs and on the namespace's InferenceIdentityBindings. Pass the SPIRE Controller \
Manager's settings (--trust-domain, --cluster-name, --spire-class, --watch-classless, \
--ignore-namespace) as that manager is configured: the answer depends on them.

EXIT STATUS:
  0  explained
  1  the pod was not found, or the cluster could not be read
  2  bad flags

EXAMPLE:
  kleym explain pod serving/vllm-0 --trust-domain example.org --cluster-name spoke-1 -o json")]
pub struct PodArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub pod: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Kubeconfig of the cluster (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
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
    /// kleym's field manager, for the ownership proof of its ClusterSPIFFEIDs.
    #[arg(long, default_value = kleym_spoke::reconciler::config::DEFAULT_FIELD_MANAGER)]
    pub field_manager: String,
}

/// Run `kleym explain`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.what {
        What::Pod(p) => run_pod(p, &mut std::io::stdout().lock()),
    }
}

fn run_pod(args: &PodArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let Some((namespace, name)) = args
        .pod
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        return Err(super::usage_error(
            "explain",
            format!("pod {:?} is not NAMESPACE/NAME", args.pod),
        )
        .into());
    };
    let manager = ManagerConfig {
        trust_domain: args.trust_domain.clone(),
        cluster_name: args.cluster_name.clone(),
        cluster_domain: args.cluster_domain.clone(),
        class_name: args.spire_class.clone(),
        watch_classless: args.watch_classless,
        ignore_namespaces: args.ignore_namespaces.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let explanation = rt.block_on(async {
        let client = kleym_hub::kubeconfig::client_from_flags(
            args.kubeconfig.as_deref(),
            args.context.as_deref(),
        )
        .await?;
        anyhow::Ok(explain_pod(&client, namespace, name, &manager, &args.field_manager).await?)
    })?;
    match args.output {
        Output::Text => render_text(&explanation, out).context("writing the explanation")?,
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, &explanation).context("writing JSON")?;
            writeln!(out)?;
        }
        Output::Yaml => {
            let yaml = kleym_api::yaml::to_string(&explanation).context("rendering YAML")?;
            out.write_all(yaml.as_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}
