//! `kleym credential <plugin>`: the bundled credential plugins of KEP-4322 (formerly KEP-5339), run by the hub (or any
//! client-go based tool) as exec plugins. They print one ExecCredential on stdout; errors go to
//! stderr with exit code 1 and never include the token.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use kleym_hub::credentials::plugins::exec_info::exec_info_from_env;
use kleym_hub::credentials::plugins::hub_client::hub_client;
use kleym_hub::credentials::plugins::secret_reader::{SecretReaderOptions, secret_reader};
use kleym_hub::credentials::plugins::spiffe_jwt::{
    DEFAULT_LIFETIME_SECONDS, SpiffeJwtOptions, spiffe_jwt, spiffe_jwt_from_workload_api,
};
use kleym_hub::credentials::plugins::spiffe_x509::{
    DEFAULT_TTL_SECONDS, SpiffeX509Options, spiffe_x509, spiffe_x509_from_workload_api,
};
use kleym_hub::credentials::plugins::token_request::{TokenRequestOptions, token_request};
use kleym_hub::credentials::plugins::workload_api::{
    DEFAULT_TIMEOUT_SECONDS, WorkloadApiOptions, WorkloadApiSocket, parse_socket,
};
use kleym_hub::issuer::ca::parse_ca_secret;
use kleym_hub::issuer::keys::Algorithm;
use kleym_hub::issuer::secret::{SecretRef, parse_issuer_key_secret};

const SECRET_READER_LONG_ABOUT: &str = "\
Return the token stored in a hub Secret for the spoke (the example plugin of KEP-4322, formerly KEP-5339).

Runs as a client-go exec plugin: reads KUBERNETES_EXEC_INFO, takes the cluster name from \
spec.cluster.config.clusterName, reads the Secret --namespace/--secret-name-pattern ({clusterName} \
replaced by that name) in the hub, and prints an ExecCredential with data[--key] as the token, \
without expiry (the hub keeps it until the spoke answers 401).

clusterName comes from the profile's status, so it cannot choose the Secret alone: the Secret \
must carry the annotation kleym.io/cluster-profiles listing (comma-separated namespace/name) the \
ClusterProfile the hub runs the plugin for, which the hub names in KLEYM_CLUSTER_PROFILE. \
Whoever creates the Secret sets the annotation; any other Secret is refused.

Needs: provideClusterInfo: true in the provider entry, and on each ClusterProfile a \
client.authentication.k8s.io/exec extension {clusterName: <name>}.
RBAC in the hub for the identity it runs as: get on secrets in --namespace, e.g. a Role with \
rules: [{apiGroups: [\"\"], resources: [secrets], verbs: [get]}] (restrict with resourceNames).

Provider file entry:
  providers:
    - name: kleym-secret-reader
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, secret-reader, --namespace, kleym-system]
        provideClusterInfo: true
        interactiveMode: Never";

const TOKEN_REQUEST_LONG_ABOUT: &str = "\
Return a short-lived token for a hub ServiceAccount, minted by the TokenRequest API.

Runs as a client-go exec plugin: reads KUBERNETES_EXEC_INFO, requests a token for \
--service-account with the audience the hub decided for the spoke (KLEYM_CLUSTER_AUDIENCE: \
kleym.io/clusterprofile/<namespace>/<name> of its ClusterProfile, see `kleym trust-config`) and \
lifetime --expiration-seconds, and prints an ExecCredential with the token and its \
expirationTimestamp (the hub refreshes it before it expires). The spoke must trust the hub's \
ServiceAccount issuer (structured authentication / OIDC discovery) for that audience and \
authorize that ServiceAccount. --audience is for runs outside the hub; under the hub a \
different --audience is refused.
RBAC in the hub for the identity it runs as: create on serviceaccounts/token for that \
ServiceAccount, e.g. a Role in its namespace with rules: [{apiGroups: [\"\"], \
resources: [serviceaccounts/token], resourceNames: [<name>], verbs: [create]}].

Provider file entry:
  providers:
    - name: kleym-token-request
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, token-request, --service-account, kleym-system/kleym-hub]
        provideClusterInfo: true
        interactiveMode: Never";

const SPIFFE_JWT_LONG_ABOUT: &str = "\
Return a JWT-SVID signed with the hub's issuer key (kleym hub --issuer-url ... \
--issuer-key-secret ...): no static secret exists anywhere, and a token minted for one spoke \
is refused by every other spoke.

Runs as a client-go exec plugin: reads KUBERNETES_EXEC_INFO, reads the signing key from the \
issuer Secret in the hub (in memory only: never written to a file, a log, argv or the \
environment) and prints an ExecCredential whose token has sub = the hub's SPIFFE ID \
(--hub-spiffe-id, default spiffe://<trust domain>/kleym/hub), aud = [the audience the hub \
decided for the spoke] (KLEYM_CLUSTER_AUDIENCE: kleym.io/clusterprofile/<namespace>/<name> of \
its ClusterProfile, or the profile's exec extension `audience` where the provider entry says \
profileSourcedAudiencePolicy: Allow), iss = --issuer-url, a lifetime of --lifetime-seconds (at most 900), iat, nbf, jti and the key's kid. \
Its expirationTimestamp is a little before exp, so the hub refreshes it early.

The spoke's API server must trust the issuer: `kleym trust-config` prints its \
AuthenticationConfiguration and ClusterRoleBinding. --audience is for runs outside the hub; \
under the hub a different --audience is refused.
RBAC in the hub for the identity it runs as: get on the issuer Secret, e.g. a Role with \
rules: [{apiGroups: [\"\"], resources: [secrets], resourceNames: [<name>], verbs: [get]}].

Provider file entry:
  providers:
    - name: kleym-spiffe-jwt
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, spiffe-jwt, --issuer-url, https://kleym-issuer.example.org,
               --issuer-key-secret, kleym-system/kleym-issuer, --trust-domain, example.org]
        provideClusterInfo: true
        interactiveMode: Never

From a SPIRE agent instead (--workload-api-socket unix:///PATH): the plugin asks the agent's \
SPIFFE Workload API for a JWT-SVID (FetchJWTSVID, audience = the one the hub decided, the \
SPIFFE ID of --hub-spiffe-id if given, else the agent's default \
SVID), checks that its SPIFFE ID is inside --trust-domain and that its sub, aud and exp are \
what was asked for, and prints it. No hub key, kubeconfig or hub RBAC is used: the hub pod \
needs the agent's socket mounted and a registration entry. The spokes trust SPIRE's issuer \
(its OIDC discovery provider): kleym trust-config --issuer-url <that URL> --issuer-ca-file \
<its CA> --hub-spiffe-id <the entry's SPIFFE ID>. The agent must answer within \
--workload-api-timeout-seconds.

  providers:
    - name: kleym-spiffe-jwt
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, spiffe-jwt, --workload-api-socket,
               unix:///run/spire/agent-sockets/spire-agent.sock, --trust-domain, example.org]
        provideClusterInfo: true
        interactiveMode: Never";

const SPIFFE_X509_LONG_ABOUT: &str = "\
Return an X.509-SVID client certificate signed by the hub's CA (kept in the X.509 CA Secret of \
kleym hub --issuer-x509 --issuer-x509-ca-secret, created by the hub; the JWT signing keys are \
in another Secret this plugin never reads).

Runs as a client-go exec plugin: reads KUBERNETES_EXEC_INFO, reads the CA from the CA \
Secret in the hub (in memory only), and prints an ExecCredential with clientCertificateData \
and clientKeyData: a new P-256 key and a certificate with URI SAN = the hub's SPIFFE ID \
(--hub-spiffe-id, default spiffe://<trust domain>/kleym/hub), CN = --username-prefix + that ID \
(the user the spoke's API server maps a client certificate to), client-auth only, valid \
--ttl-seconds (default 3600). Its expirationTimestamp is a little before the end.

The spoke's API server must trust the CA for client certificates (--client-ca-file; the CA \
bundle is data[x509-ca-bundle.crt] of the CA Secret) and bind that user (kleym trust-config \
prints both). RBAC in the hub for the identity it runs as: get on the CA Secret. \
--issuer-key-secret NS/NAME alone (the flag of older releases) means the CA Secret \
NS/NAME-x509-ca, where kleym hub --issuer-x509 puts it by default.

Provider file entry:
  providers:
    - name: kleym-spiffe-x509
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, spiffe-x509, --issuer-x509-ca-secret,
               kleym-system/kleym-issuer-x509-ca, --trust-domain, example.org]
        interactiveMode: Never

From a SPIRE agent instead (--workload-api-socket unix:///PATH): the plugin takes the first \
answer of the agent's FetchX509SVID (the SVID of --hub-spiffe-id if given, else the default \
one), checks that the leaf's URI SAN is that SPIFFE ID, inside --trust-domain, valid now, and \
that it has a subject CN, and prints the chain and key. kube-apiserver takes the user from the \
CN, which SPIRE sets to the registration entry's first DNS name (spire-server entry create \
-dns ...). The spokes add SPIRE's bundle to their client CAs: kleym trust-config --credential \
spiffe-x509 --client-ca-file <bundle> --x509-username <that DNS name>.

  providers:
    - name: kleym-spiffe-x509
      execConfig:
        apiVersion: client.authentication.k8s.io/v1
        command: /usr/local/bin/kleym
        args: [credential, spiffe-x509, --workload-api-socket,
               unix:///run/spire/agent-sockets/spire-agent.sock, --trust-domain, example.org]
        interactiveMode: Never";

/// Arguments of `kleym credential`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plugin to run.
    #[command(subcommand)]
    pub plugin: Plugin,
}

/// The bundled plugins.
#[derive(Debug, clap::Subcommand)]
pub enum Plugin {
    /// Token from a hub Secret named after `spec.cluster.config.clusterName`.
    #[command(long_about = SECRET_READER_LONG_ABOUT)]
    SecretReader(SecretReaderArgs),
    /// Short-lived token for a hub ServiceAccount via the TokenRequest API.
    #[command(long_about = TOKEN_REQUEST_LONG_ABOUT)]
    TokenRequest(TokenRequestArgs),
    /// Short-lived JWT-SVID signed with the hub's issuer key (keyless fleet access).
    #[command(long_about = SPIFFE_JWT_LONG_ABOUT)]
    SpiffeJwt(SpiffeJwtArgs),
    /// Short-lived X.509-SVID client certificate signed by the hub's CA.
    #[command(long_about = SPIFFE_X509_LONG_ABOUT)]
    SpiffeX509(SpiffeX509Args),
}

/// `--workload-api-socket` and its timeout, shared by both SPIFFE plugins.
#[derive(Debug, clap::Args)]
pub struct WorkloadApiArgs {
    /// Take the SVID from a SPIRE agent instead of the hub's keys: the SPIFFE Workload API
    /// socket, `unix:///path` (FetchJWTSVID with the spoke's audience, or the first answer of
    /// FetchX509SVID). No issuer Secret, hub kubeconfig or hub RBAC is used; the spokes trust
    /// SPIRE (its OIDC discovery provider, or its X.509 bundle).
    #[arg(long, value_name = "unix:///PATH", value_parser = parse_socket)]
    pub workload_api_socket: Option<WorkloadApiSocket>,
    /// With `--workload-api-socket`: how long the agent may take before the plugin fails.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECONDS, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub workload_api_timeout_seconds: u64,
}

impl WorkloadApiArgs {
    /// The plugin options when a socket was given.
    fn options(
        &self,
        hub_spiffe_id: &Option<String>,
        trust_domain: &Option<String>,
    ) -> Option<WorkloadApiOptions> {
        self.workload_api_socket
            .as_ref()
            .map(|socket| WorkloadApiOptions {
                socket: socket.clone(),
                hub_spiffe_id: hub_spiffe_id.clone(),
                trust_domain: trust_domain.clone(),
                timeout: Duration::from_secs(self.workload_api_timeout_seconds),
            })
    }
}

/// Arguments of `kleym credential spiffe-x509`.
#[derive(Debug, clap::Args)]
pub struct SpiffeX509Args {
    /// The X.509 CA Secret in the hub, `namespace/name`, as `kleym hub
    /// --issuer-x509-ca-secret`. Required unless `--workload-api-socket` or
    /// `--issuer-key-secret`.
    #[arg(
        long,
        value_parser = parse_ca_secret,
        env = "KLEYM_ISSUER_X509_CA_SECRET",
        conflicts_with = "workload_api_socket"
    )]
    pub issuer_x509_ca_secret: Option<SecretRef>,
    /// Older releases' flag: the issuer key Secret `NS/NAME`, meaning the CA Secret
    /// `NS/NAME-x509-ca` (where `kleym hub --issuer-x509` puts the CA by default). Its data is
    /// not read.
    #[arg(
        long,
        value_parser = parse_issuer_key_secret,
        env = "KLEYM_ISSUER_KEY_SECRET",
        required_unless_present_any = ["workload_api_socket", "issuer_x509_ca_secret"],
        conflicts_with = "workload_api_socket"
    )]
    pub issuer_key_secret: Option<SecretRef>,
    /// The SPIRE agent source (`--workload-api-socket`).
    #[command(flatten)]
    pub workload_api: WorkloadApiArgs,
    /// Accepted for compatibility and ignored: the CA Secret holds no signing key.
    #[arg(
        long,
        value_enum,
        default_value = "ES256",
        value_name = "ES256|RS256",
        hide = true
    )]
    pub issuer_key_algorithm: Algorithm,
    /// The SPIFFE ID in the URI SAN [default: spiffe://<trust domain>/kleym/hub].
    #[arg(long)]
    pub hub_spiffe_id: Option<String>,
    /// The SPIFFE trust domain.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN")]
    pub trust_domain: Option<String>,
    /// Prefix of the CN, as `kleym trust-config --username-prefix`.
    #[arg(long, default_value = "kleym:")]
    pub username_prefix: String,
    /// Certificate lifetime in seconds (300 ..= 86400).
    #[arg(long, default_value_t = DEFAULT_TTL_SECONDS)]
    pub ttl_seconds: i64,
    /// Kubeconfig for the hub [default: in-cluster config, else the usual kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Arguments of `kleym credential spiffe-jwt`.
#[derive(Debug, clap::Args)]
pub struct SpiffeJwtArgs {
    /// The hub's issuer URL (`iss`), as `kleym hub --issuer-url`. Required unless
    /// `--workload-api-socket`.
    #[arg(
        long,
        env = "KLEYM_ISSUER_URL",
        required_unless_present = "workload_api_socket",
        conflicts_with = "workload_api_socket"
    )]
    pub issuer_url: Option<String>,
    /// Accept an `http://` issuer URL (as `kleym hub --issuer-insecure-http`).
    #[arg(long)]
    pub issuer_insecure_http: bool,
    /// The issuer Secret in the hub, `namespace/name`, as `kleym hub --issuer-key-secret`.
    /// Required unless `--workload-api-socket`.
    #[arg(
        long,
        value_parser = parse_issuer_key_secret,
        env = "KLEYM_ISSUER_KEY_SECRET",
        required_unless_present = "workload_api_socket",
        conflicts_with = "workload_api_socket"
    )]
    pub issuer_key_secret: Option<SecretRef>,
    /// The SPIRE agent source (`--workload-api-socket`).
    #[command(flatten)]
    pub workload_api: WorkloadApiArgs,
    /// The signing key's algorithm, as `kleym hub --issuer-key-algorithm`.
    #[arg(long, value_enum, default_value = "ES256", value_name = "ES256|RS256")]
    pub issuer_key_algorithm: Algorithm,
    /// The SPIFFE ID in `sub` [default: spiffe://<trust domain>/kleym/hub]; must be in the
    /// trust domain when one is given.
    #[arg(long)]
    pub hub_spiffe_id: Option<String>,
    /// The SPIFFE trust domain.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN")]
    pub trust_domain: Option<String>,
    /// Token lifetime in seconds (60 ..= 900).
    #[arg(long, default_value_t = DEFAULT_LIFETIME_SECONDS)]
    pub lifetime_seconds: i64,
    /// The token's audience when run outside the hub. The hub names the audience of each
    /// spoke itself (KLEYM_CLUSTER_AUDIENCE); a different --audience is then refused.
    #[arg(long)]
    pub audience: Option<String>,
    /// Kubeconfig for the hub [default: in-cluster config, else the usual kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Arguments of `kleym credential secret-reader`.
#[derive(Debug, clap::Args)]
pub struct SecretReaderArgs {
    /// Namespace of the Secrets in the hub [default: the in-cluster ServiceAccount's namespace,
    /// else the kubeconfig context's, else `default`].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Secret name; `{clusterName}` is replaced by the cluster name.
    #[arg(long, default_value = "{clusterName}")]
    pub secret_name_pattern: String,
    /// Data key holding the token.
    #[arg(long, default_value = "token")]
    pub key: String,
    /// Kubeconfig for the hub [default: in-cluster config, else the usual kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Arguments of `kleym credential token-request`.
#[derive(Debug, clap::Args)]
pub struct TokenRequestArgs {
    /// The hub ServiceAccount, as `namespace/name`.
    #[arg(long)]
    pub service_account: String,
    /// The token's audience when run outside the hub. The hub names the audience of each
    /// spoke itself (KLEYM_CLUSTER_AUDIENCE); a different --audience is then refused.
    #[arg(long)]
    pub audience: Option<String>,
    /// Requested token lifetime in seconds (minimum 600).
    #[arg(long, default_value_t = 3600)]
    pub expiration_seconds: i64,
    /// Kubeconfig for the hub [default: in-cluster config, else the usual kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the selected plugin and prints its ExecCredential.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let (name, result) = match &args.plugin {
        Plugin::SecretReader(a) => ("secret-reader", runtime.block_on(run_secret_reader(a))),
        Plugin::TokenRequest(a) => ("token-request", runtime.block_on(run_token_request(a))),
        Plugin::SpiffeJwt(a) => ("spiffe-jwt", runtime.block_on(run_spiffe_jwt(a))),
        Plugin::SpiffeX509(a) => ("spiffe-x509", runtime.block_on(run_spiffe_x509(a))),
    };
    let credential = result.map_err(|e| anyhow!("[{name}] {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{credential}").context("writing the credential to stdout")?;
    Ok(())
}

async fn run_secret_reader(a: &SecretReaderArgs) -> anyhow::Result<String> {
    let info = exec_info_from_env()?;
    let hub = hub_client(a.kubeconfig.as_deref()).await?;
    let namespace = a
        .namespace
        .clone()
        .unwrap_or_else(|| hub.default_namespace().to_string());
    let opts = SecretReaderOptions {
        namespace,
        name_pattern: a.secret_name_pattern.clone(),
        key: a.key.clone(),
    };
    Ok(secret_reader(hub, &info, &opts).await?)
}

async fn run_token_request(a: &TokenRequestArgs) -> anyhow::Result<String> {
    let info = exec_info_from_env()?;
    let hub = hub_client(a.kubeconfig.as_deref()).await?;
    let opts = TokenRequestOptions {
        service_account: a.service_account.clone(),
        audience: a.audience.clone(),
        expiration_seconds: a.expiration_seconds,
    };
    Ok(token_request(hub, &info, &opts).await?)
}

async fn run_spiffe_jwt(a: &SpiffeJwtArgs) -> anyhow::Result<String> {
    let info = exec_info_from_env()?;
    if let Some(opts) = a.workload_api.options(&a.hub_spiffe_id, &a.trust_domain) {
        return Ok(spiffe_jwt_from_workload_api(&info, a.audience.as_deref(), &opts).await?);
    }
    // clap requires both when there is no socket; this is the message if that ever changes.
    let (Some(issuer_url), Some(secret)) = (&a.issuer_url, &a.issuer_key_secret) else {
        anyhow::bail!(
            "--issuer-url and --issuer-key-secret are required without --workload-api-socket"
        );
    };
    let hub = hub_client(a.kubeconfig.as_deref()).await?;
    let opts = SpiffeJwtOptions {
        issuer_url: issuer_url.clone(),
        allow_http_issuer: a.issuer_insecure_http,
        secret: secret.clone(),
        algorithm: a.issuer_key_algorithm,
        hub_spiffe_id: a.hub_spiffe_id.clone(),
        trust_domain: a.trust_domain.clone(),
        lifetime_seconds: a.lifetime_seconds,
        audience: a.audience.clone(),
    };
    Ok(spiffe_jwt(hub, &info, &opts).await?)
}

async fn run_spiffe_x509(a: &SpiffeX509Args) -> anyhow::Result<String> {
    let info = exec_info_from_env()?;
    if let Some(opts) = a.workload_api.options(&a.hub_spiffe_id, &a.trust_domain) {
        return Ok(spiffe_x509_from_workload_api(&info, &opts).await?);
    }
    let secret = match (&a.issuer_x509_ca_secret, &a.issuer_key_secret) {
        (Some(ca), _) => ca.clone(),
        (None, Some(key)) => kleym_hub::issuer::ca::default_ca_secret(key),
        (None, None) => anyhow::bail!(
            "--issuer-x509-ca-secret (or --issuer-key-secret) is required without --workload-api-socket"
        ),
    };
    let hub = hub_client(a.kubeconfig.as_deref()).await?;
    let opts = SpiffeX509Options {
        secret,
        hub_spiffe_id: a.hub_spiffe_id.clone(),
        trust_domain: a.trust_domain.clone(),
        username_prefix: a.username_prefix.clone(),
        ttl_seconds: a.ttl_seconds,
    };
    Ok(spiffe_x509(hub, &info, &opts).await?)
}
