//! `kleym-demo`: a whole kleym fleet on one machine. See `--help`.

use kleym_e2e::demo;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Run a kleym fleet on this machine: kubesim serves a hub cluster and N spoke clusters (each
/// with its own CA and credentials), every spoke gets a realistic inference environment
/// (model-server pods, InferencePools, InferenceObjectives, PoolOnly and PerObjective
/// InferenceIdentityBindings) with two planted mistakes (a collision in spoke-1, a
/// cross-cluster drift in spoke-2), the spokes are registered as ClusterProfiles with the
/// bundled credential plugins, and the kleym hub engages them. Once every binding settled the
/// fleet report is printed; then the demo keeps running (Ctrl-C stops it) so you can look around
/// with kubectl and the kubeconfigs in the state directory.
#[derive(Debug, Parser)]
#[command(name = "kleym-demo", version, args_conflicts_with_subcommands = true)]
struct Cli {
    /// Where to write kubeconfigs (one per cluster, plus one with every context), the
    /// provider file and the report (report.txt, report.json). Existing files are overwritten.
    #[arg(long, value_name = "DIR", default_value_os_t = std::env::temp_dir().join("kleym-demo"))]
    state_dir: PathBuf,

    /// Number of spoke clusters (1 to 20).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=20))]
    spokes: u8,

    /// Keep running after convergence until Ctrl-C (the default).
    #[arg(long, conflicts_with = "exit_when_converged")]
    keep_running: bool,

    /// Exit after printing the report (for tests and CI). Exit code 0 only if the report
    /// shows exactly the planted findings.
    #[arg(long)]
    exit_when_converged: bool,

    /// Give up if the fleet has not converged after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    timeout: u64,

    /// SPIFFE trust domain of the fleet (the hub's --trust-domain).
    #[arg(long, default_value = "demo.example")]
    trust_domain: String,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// The bundled credential plugins (used by the demo's hub when the `kleym` binary is not
    /// built next to this one; same code as `kleym credential`).
    #[command(hide = true)]
    Credential {
        #[command(subcommand)]
        plugin: demo::plugin::Plugin,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Credential { plugin }) = &cli.command {
        return match demo::plugin::run(plugin) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kleym-demo credential: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // Quiet by default: the demo prints its own progress; RUST_LOG=kleym_hub=info for more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("kleym-demo: cannot locate its own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = demo::Options {
        state_dir: cli.state_dir,
        spokes: usize::from(cli.spokes),
        exit_when_converged: cli.exit_when_converged && !cli.keep_running,
        timeout: Duration::from_secs(cli.timeout),
        trust_domain: cli.trust_domain,
    };
    let plugin = demo::setup::PluginCommand::locate(&exe);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kleym-demo: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(demo::run(&opts, &plugin)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kleym-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
