//! `kleym report`: print the fleet's identity findings, and fail CI when there are any.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use kleym_hub::report::render::{FailOn, findings_exit_code, render_spokes, render_table};
use kleym_hub::report::source::{self, ReportDocument};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A readable table grouped by finding.
    Table,
    /// The report document as JSON.
    Json,
    /// The report document as YAML.
    Yaml,
}

/// Arguments of `kleym report`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
SOURCES:
  default        the FleetIdentityReport in the hub cluster (kubeconfig, else in-cluster);
                 capped lists, exact counts
  --server URL   the hub API's GET /v1/report: the full, uncapped report
  --file F       a saved report (JSON or YAML; '-' reads stdin), e.g.
                 `kubectl get fleetidentityreport fleet -o yaml`

EXIT STATUS:
  0  no findings at or above --fail-on
  1  findings at or above --fail-on exist
  2  the report could not be read (bad flags, unreachable, unauthorized, not found)

EXAMPLES:
  kleym report
  kleym report -o json --fail-on none
  kleym report --server https://kleym.kleym-system.svc:8443 \\
      --token-file /var/run/secrets/tokens/kleym-report --ca-file ca.crt --fail-on warning
  (the Helm chart's Service is <fullname>.<namespace>.svc: `kleym` for a release named
  kleym; any hub replica answers)

TOKEN:
  --token-file holds a ServiceAccount token whose audience is the hub's --api-audience
  (default kleym-hub; the chart keeps the default): a token for the API server's default
  audience is refused. Mint one with
    kubectl create token <sa> -n <ns> --audience kleym-hub
  or a projected volume with `audience: kleym-hub`; its user needs `get` on
  fleetidentityreports.kleym.io.")]
pub struct Args {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Exit 1 when findings of this severity or worse exist: `collision` (IdentityCollision,
    /// DuplicateSPIFFEID, CrossClusterDrift), `warning` (any finding) or `none`.
    #[arg(long, value_enum, default_value_t = FailOn::Collision)]
    pub fail_on: FailOn,
    /// Name of the FleetIdentityReport in the hub cluster.
    #[arg(long, default_value = kleym_api::hub_status::FLEET_REPORT_NAME)]
    pub name: String,
    /// Kubeconfig of the hub cluster (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long, conflicts_with_all = ["server", "file"])]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, conflicts_with_all = ["server", "file"])]
    pub context: Option<String>,
    /// Read the full report from the hub API at this URL (`GET <URL>/v1/report`).
    #[arg(long, value_name = "URL", conflicts_with = "file")]
    pub server: Option<String>,
    /// File holding the bearer token for --server: a ServiceAccount token minted for the
    /// hub's --api-audience (default `kleym-hub`, e.g. `kubectl create token SA --audience
    /// kleym-hub`) whose user may `get` fleetidentityreports. The token is never printed.
    #[arg(long, value_name = "FILE", requires = "server")]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle to verify --server's certificate (default: the system roots).
    #[arg(long, value_name = "FILE", requires = "server")]
    pub ca_file: Option<PathBuf>,
    /// Read a saved report from this file ('-' for stdin) instead of a cluster.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// Run `kleym report`; exits with 1 on findings (per --fail-on) and 2 on errors.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let code = match execute(args, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kleym report: {err:#}");
            2
        }
    };
    if code != 0 {
        // Nothing left to drop but the locked stdout, which `execute` flushed.
        std::process::exit(i32::from(code));
    }
    Ok(())
}

/// Read, print, and decide the exit code.
fn execute(args: &Args, out: &mut impl Write) -> anyhow::Result<u8> {
    let doc = read(args)?;
    match args.output {
        Output::Table => {
            render_table(&doc.report, out).context("writing the table")?;
            render_spokes(&doc.spokes, out).context("writing the table")?;
        }
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, &doc.raw).context("writing JSON")?;
            writeln!(out)?;
        }
        Output::Yaml => {
            let yaml = kleym_api::yaml::to_string(&doc.raw).context("rendering YAML")?;
            out.write_all(yaml.as_bytes())?;
        }
    }
    out.flush()?;
    Ok(findings_exit_code(&doc.report, args.fail_on))
}

fn read(args: &Args) -> anyhow::Result<ReportDocument> {
    if let Some(path) = &args.file {
        let mut bytes = Vec::new();
        if path.as_os_str() == "-" {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("reading the report from stdin")?;
        } else {
            bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        }
        return Ok(ReportDocument::parse(&bytes)?);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(server) = &args.server {
        let token = args
            .token_file
            .as_ref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map(|t| t.trim().to_string())
                    .with_context(|| format!("reading --token-file {}", p.display()))
            })
            .transpose()?;
        let ca = args
            .ca_file
            .as_ref()
            .map(|p| std::fs::read(p).with_context(|| format!("reading --ca-file {}", p.display())))
            .transpose()?;
        return Ok(rt.block_on(source::from_api(server, token.as_deref(), ca.as_deref()))?);
    }
    rt.block_on(async {
        let client = hub_client(args).await?;
        Ok(source::from_cluster(client, &args.name).await?)
    })
}

async fn hub_client(args: &Args) -> anyhow::Result<kube::Client> {
    kleym_hub::kubeconfig::client_from_flags(args.kubeconfig.as_deref(), args.context.as_deref())
        .await
}
