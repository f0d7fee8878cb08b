//! Many simulated clusters in one process: [`Kubesim`] and per-cluster [`ClusterHandle`]s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubesim::KubesimError> {
//! use kubesim::{Kubesim, KubesimOptions};
//! let sim = Kubesim::start(&["hub", "spoke-1"], KubesimOptions::default()).await?;
//! let hub = sim.cluster("hub").expect("started");
//! let spoke = sim.cluster("spoke-1").expect("started");
//! // The spoke accepts the hub's ServiceAccount tokens whose audience is the spoke's URL.
//! spoke.trust_issuer(&hub, &[spoke.url()]).await?;
//! let client: kube::Client = hub.kube_client().await?;
//! # let _ = client; Ok(()) }
//! ```

use crate::authn::ExternalAuthenticator;
use crate::error::KubesimError;
use crate::faults::FaultHandle;
use crate::kubeconfig::{self, Credentials, Entry};
use crate::server::request_log::RequestLog;
use crate::server::shared_port::SharedPort;
use crate::server::{ClusterServer, listener};
use kubesim_auth::UserInfo;
use kubesim_auth::jwt::{ObjectRef, SaTokenRequest};
use kubesim_auth::pki::ClusterPki;
use kubesim_store::{Cluster, WriteOptions};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A `UserInfo` for `name` in `groups` (for [`ClusterHandle::add_static_token`]).
pub fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        username: name.to_string(),
        groups: groups.iter().map(|g| (*g).to_string()).collect(),
        ..Default::default()
    }
}

/// Options for [`Kubesim::start`] (and clusters added later).
#[derive(Debug, Clone)]
pub struct KubesimOptions {
    /// CRD manifests to install in every cluster (parsed objects; see [`load_crds`]).
    pub crds: Vec<Value>,
    /// Accept client certificates signed by the cluster CA (default `true`).
    pub client_certs: bool,
    /// Preload kube-apiserver's default ClusterRoles/ClusterRoleBindings (default `true`).
    pub default_rbac: bool,
    /// Watch history kept per resource type (`None`: the store's default).
    pub history_limit: Option<usize>,
    /// Per cluster name, the text (YAML or JSON) of an `apiserver.config.k8s.io`
    /// `AuthenticationConfiguration` whose `jwt` authenticators the cluster uses, as
    /// kube-apiserver's `--authentication-config` (see
    /// [`ClusterHandle::set_authentication_config`]).
    pub authentication_configs: BTreeMap<String, String>,
    /// Per cluster name, PEM CA bundles whose client certificates the cluster also accepts
    /// (kube-apiserver's `--client-ca-file`, added to the cluster's own CA).
    pub client_cas: BTreeMap<String, String>,
    /// Cluster names whose API server runs on a runtime (threads) of its own rather than on
    /// the caller's runtime. A real API server is a process of its own: one that many clients
    /// depend on (a hub cluster, its Leases) must not queue behind the traffic of thousands
    /// of simulated spokes sharing the caller's runtime.
    pub own_threads: BTreeSet<String>,
    /// Serve every cluster not in `own_threads` through one listening socket, each at a
    /// loopback address of its own (`127.1.0.1`, ...) on one port, instead of a socket per
    /// cluster: for fleets whose listeners and connections would pass the process's
    /// open-file limit. See [`crate::server::shared_port`] for what differs.
    pub shared_port: bool,
}

impl Default for KubesimOptions {
    fn default() -> Self {
        Self {
            crds: Vec::new(),
            client_certs: true,
            default_rbac: true,
            history_limit: None,
            authentication_configs: BTreeMap::new(),
            client_cas: BTreeMap::new(),
            own_threads: BTreeSet::new(),
            shared_port: false,
        }
    }
}

/// A set of simulated clusters, each an HTTPS API server on its own 127.0.0.1 port with its
/// own CA, admin token and ServiceAccount issuer. Dropping it (or [`Kubesim::shutdown`])
/// stops every server.
#[derive(Debug)]
pub struct Kubesim {
    clusters: RwLock<BTreeMap<String, ClusterHandle>>,
    options: KubesimOptions,
    shutdown: CancellationToken,
    shared: Option<SharedPort>,
}

impl Drop for Kubesim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Kubesim {
    /// Start one server per name (in parallel); returns when all are serving.
    pub async fn start(names: &[&str], options: KubesimOptions) -> Result<Self, KubesimError> {
        install_crypto_provider();
        let shutdown = CancellationToken::new();
        let shared = if options.shared_port {
            Some(SharedPort::start(shutdown.clone()).await?)
        } else {
            None
        };
        let sim = Self {
            clusters: RwLock::new(BTreeMap::new()),
            options,
            shutdown,
            shared,
        };
        let mut seen = std::collections::BTreeSet::new();
        for n in names {
            if !seen.insert(*n) {
                return Err(KubesimError::Cluster((*n).to_string(), "listed twice"));
            }
        }
        let starts = names.iter().map(|n| {
            start_cluster(
                n.to_string(),
                sim.options.clone(),
                sim.shared.as_ref(),
                sim.shutdown.child_token(),
            )
        });
        for handle in futures::future::try_join_all(starts).await? {
            sim.insert(handle)?;
        }
        Ok(sim)
    }

    fn insert(&self, handle: ClusterHandle) -> Result<(), KubesimError> {
        let mut map = self
            .clusters
            .write()
            .map_err(|_| KubesimError::Cluster(handle.name().to_string(), "registry poisoned"))?;
        if map.contains_key(handle.name()) {
            handle.stop();
            return Err(KubesimError::Cluster(
                handle.name().to_string(),
                "already exists",
            ));
        }
        map.insert(handle.name().to_string(), handle);
        Ok(())
    }

    /// Start another cluster at run time.
    pub async fn add_cluster(&self, name: &str) -> Result<ClusterHandle, KubesimError> {
        if self.cluster(name).is_some() {
            return Err(KubesimError::Cluster(name.to_string(), "already exists"));
        }
        let h = start_cluster(
            name.to_string(),
            self.options.clone(),
            self.shared.as_ref(),
            self.shutdown.child_token(),
        )
        .await?;
        self.insert(h.clone())?;
        Ok(h)
    }

    /// Stop and forget one cluster (its port stops answering).
    pub fn remove_cluster(&self, name: &str) -> Option<ClusterHandle> {
        let h = self.clusters.write().ok()?.remove(name)?;
        h.stop();
        Some(h)
    }

    /// The cluster called `name`.
    pub fn cluster(&self, name: &str) -> Option<ClusterHandle> {
        self.clusters.read().ok()?.get(name).cloned()
    }

    /// Every cluster, by name.
    pub fn clusters(&self) -> Vec<ClusterHandle> {
        self.clusters
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One kubeconfig with a context per cluster (admin token users); `current-context` is
    /// the first cluster by name.
    pub fn kubeconfig_yaml(&self) -> String {
        let entries: Vec<Entry> = self
            .clusters()
            .iter()
            .map(ClusterHandle::admin_entry)
            .collect();
        kubeconfig::render(&entries)
    }

    /// Write the files the `kubesim` command writes: for each cluster
    /// `dir/<name>/{kubeconfig,ca.crt,admin.token,server}`, plus `dir/kubeconfig` with a
    /// context per cluster. Credential files are created with mode 0600.
    pub fn write_state_dir(&self, dir: &Path) -> Result<(), KubesimError> {
        std::fs::create_dir_all(dir)?;
        for c in self.clusters() {
            let d = dir.join(c.name());
            std::fs::create_dir_all(&d)?;
            write_private(&d.join("kubeconfig"), &c.kubeconfig_yaml())?;
            std::fs::write(d.join("ca.crt"), c.ca_pem())?;
            write_private(&d.join("admin.token"), &c.admin_token())?;
            std::fs::write(d.join("server"), c.url())?;
        }
        write_private(&dir.join("kubeconfig"), &self.kubeconfig_yaml())?;
        Ok(())
    }

    /// Stop every server.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// Write a file readable only by its owner (it holds credentials).
fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(content.as_bytes())
}

/// rustls needs a process-wide provider for clients built without an explicit one
/// (kube-rs); installing ring twice is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

async fn start_cluster(
    name: String,
    options: KubesimOptions,
    shared: Option<&SharedPort>,
    shutdown: CancellationToken,
) -> Result<ClusterHandle, KubesimError> {
    let own_thread = options.own_threads.contains(&name);
    let shared = shared.filter(|_| !own_thread);
    // A socket of its own, or an address of its own on the shared port.
    let (listener, addr) = match shared {
        Some(s) => (None, s.allocate()?),
        None => {
            let l = listener::bind_random().await?;
            let addr = l.local_addr()?;
            (Some(l), addr)
        }
    };
    let pki_name = name.clone();
    // The serving certificate names 127.0.0.1 already; a shared-port address is added.
    let ips: Vec<std::net::IpAddr> = Some(addr.ip())
        .filter(|ip| *ip != std::net::Ipv4Addr::LOCALHOST)
        .into_iter()
        .collect();
    let pki = tokio::task::spawn_blocking(move || {
        ClusterPki::generate_with_addresses(&pki_name, &[], &ips)
    })
    .await
    .map_err(|e| KubesimError::Kube(format!("pki task: {e}")))??;
    let tls = pki.server_config_with_client_cas(
        options.client_certs,
        options.client_cas.get(&name).map(String::as_str),
    )?;
    let store = Cluster::new(&name);
    if let Some(n) = options.history_limit {
        store.set_history_limit(n);
    }
    if options.default_rbac {
        preload_default_rbac(&store)?;
    }
    for crd in &options.crds {
        install_crd(&store, crd.clone())?;
    }
    let admin_token = random_token();
    let server = Arc::new(ClusterServer::new(
        &name,
        store,
        pki,
        addr,
        admin_token,
        shutdown.clone(),
    ));
    let handle = ClusterHandle { server };
    if let Some(text) = options.authentication_configs.get(&name) {
        handle.set_authentication_config(text)?;
    }
    let server = handle.server.clone();
    let Some(listener) = listener else {
        if let Some(s) = shared {
            s.add(server, tls);
        }
        return Ok(handle);
    };
    if own_thread {
        // Registered with the thread's reactor, not the caller's.
        let std_listener = listener.into_std()?;
        runtime_of_its_own(&name, shutdown)?.spawn(async move {
            match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => listener::run(server, l, tls).await,
                Err(e) => tracing::error!(error = %e, "kubesim: listener on its own thread"),
            }
        });
    } else {
        tokio::spawn(listener::run(server, listener, tls));
    }
    Ok(handle)
}

/// Worker threads of a cluster's own runtime: kube-apiserver serves requests in parallel,
/// and one thread made a hub cluster's server the bottleneck of three busy hub replicas.
const OWN_RUNTIME_THREADS: usize = 2;

/// A runtime of its own (`kubesim-<name>` threads), running until `shutdown`; the tasks
/// spawned on it (the listener, and from it every connection) stop with it.
fn runtime_of_its_own(
    name: &str,
    shutdown: CancellationToken,
) -> Result<tokio::runtime::Handle, KubesimError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(OWN_RUNTIME_THREADS)
        .thread_name(format!("kubesim-{name}"))
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    std::thread::Builder::new()
        .name(format!("kubesim-{name}"))
        .spawn(move || rt.block_on(shutdown.cancelled()))?;
    Ok(handle)
}

fn random_token() -> String {
    use rand::Rng;
    let bytes: [u8; 24] = rand::thread_rng().r#gen();
    hex::encode(bytes)
}

/// Preload kube-apiserver's bootstrap RBAC. An object the store rejects is logged and
/// skipped rather than failing the cluster (the rest of the defaults still apply).
fn preload_default_rbac(store: &Cluster) -> Result<(), KubesimError> {
    for obj in crate::authz::default_rbac_objects() {
        if let Err(e) = create_ignoring_exists(store, &obj) {
            tracing::warn!(
                cluster = %store.name(),
                object = %obj.pointer("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or(""),
                error = %e,
                "default RBAC object rejected by the store"
            );
        }
    }
    Ok(())
}

fn create_ignoring_exists(store: &Cluster, obj: &Value) -> Result<(), KubesimError> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let res = store
        .resources()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind)
        .ok_or_else(|| {
            KubesimError::Api(kubesim_store::ApiError::new(
                404,
                "NotFound",
                format!("no resource for {api_version} {kind}"),
            ))
        })?;
    let ns = if res.namespaced {
        Some(
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default"),
        )
    } else {
        None
    };
    let opts = WriteOptions {
        field_manager: "kubesim".into(),
        ..Default::default()
    };
    match store.create(&res, ns, obj.clone(), &opts) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Install one CRD (an `apiextensions.k8s.io/v1` `CustomResourceDefinition` object).
pub fn install_crd(store: &Cluster, crd: Value) -> Result<(), KubesimError> {
    create_ignoring_exists(store, &crd)
}

/// Read CRDs from a file or a directory (`*.yaml`, `*.yml`, `*.json`, sorted by name; YAML
/// may hold several documents). Documents that are not CustomResourceDefinitions are
/// rejected.
pub fn load_crds(path: &Path) -> Result<Vec<Value>, KubesimError> {
    let err = |message: String| KubesimError::Crds {
        path: path.display().to_string(),
        message,
    };
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| err(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| err(format!("{}: {e}", f.display())))?;
        out.extend(parse_crds(&f.display().to_string(), &text)?);
    }
    Ok(out)
}

/// Parse the CRDs in `text` (one or more YAML documents; empty documents are skipped);
/// `origin` names the text in errors (a file name). Documents that are not
/// CustomResourceDefinitions are rejected.
pub fn parse_crds(origin: &str, text: &str) -> Result<Vec<Value>, KubesimError> {
    let err = |message: String| KubesimError::Crds {
        path: origin.to_string(),
        message,
    };
    let mut out = Vec::new();
    let docs: Vec<Value> = crate::yaml::documents(text).map_err(|e| err(e.to_string()))?;
    for v in docs {
        if v.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
            return Err(err(format!(
                "not a CustomResourceDefinition: kind {:?}",
                v.get("kind")
            )));
        }
        out.push(v);
    }
    Ok(out)
}

/// One simulated cluster. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClusterHandle {
    server: Arc<ClusterServer>,
}

impl ClusterHandle {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.server.name
    }

    /// `https://127.0.0.1:<port>` (also the ServiceAccount issuer and API audience).
    pub fn url(&self) -> String {
        self.server.url.clone()
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.server.pki.ca_cert_pem().to_string()
    }

    /// The static admin token (user `kubesim-admin`, group `system:masters`).
    pub fn admin_token(&self) -> String {
        self.server.admin_token.clone()
    }

    /// The cluster's API machinery (direct, in-process access; bypasses HTTP and auth).
    pub fn store(&self) -> Arc<Cluster> {
        self.server.store.clone()
    }

    /// The HTTP server state (advanced use).
    pub fn server(&self) -> Arc<ClusterServer> {
        self.server.clone()
    }

    /// Fault injection for this cluster.
    pub fn faults(&self) -> FaultHandle {
        self.server.faults.clone()
    }

    /// The requests this cluster answered (shared: it keeps filling).
    pub fn requests(&self) -> RequestLog {
        self.server.requests.clone()
    }

    /// A `kube::Client` authenticated as the admin that calls this cluster's request
    /// handler in process: no socket, no TLS. Every wait on its path is then a tokio
    /// timer, so a test can drive it on a paused clock (`tokio::time::pause`), which real
    /// connections do not allow (the clock jumps while a socket is not ready yet).
    pub fn in_process_client(&self) -> kube::Client {
        let server = self.server.clone();
        let bearer = http::HeaderValue::from_str(&format!("Bearer {}", self.admin_token())).ok();
        let svc = tower::service_fn(move |mut req: http::Request<kube::client::Body>| {
            let server = server.clone();
            if let Some(v) = &bearer {
                req.headers_mut()
                    .insert(http::header::AUTHORIZATION, v.clone());
            }
            async move { Ok::<_, std::convert::Infallible>(server.handle(None, req).await) }
        });
        kube::Client::new(svc, "default")
    }

    fn admin_entry(&self) -> Entry {
        Entry {
            name: self.name().to_string(),
            server: self.url(),
            ca_pem: self.ca_pem(),
            credentials: Credentials::Token(self.admin_token()),
        }
    }

    /// An admin kubeconfig (token auth, CA embedded).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::render(&[self.admin_entry()])
    }

    /// A kubeconfig for arbitrary credentials.
    pub fn kubeconfig_yaml_with(&self, credentials: Credentials) -> String {
        kubeconfig::render(&[Entry {
            credentials,
            ..self.admin_entry()
        }])
    }

    async fn client_from_kubeconfig(&self, yaml: &str) -> Result<kube::Client, KubesimError> {
        install_crypto_provider();
        let kc = kube::config::Kubeconfig::from_yaml(yaml)
            .map_err(|e| KubesimError::Kube(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| KubesimError::Kube(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| KubesimError::Kube(e.to_string()))
    }

    /// A `kube::Client` trusting this cluster's CA, authenticated with the admin token.
    pub async fn kube_client(&self) -> Result<kube::Client, KubesimError> {
        self.client_for_token(&self.admin_token()).await
    }

    /// A `kube::Client` authenticated with `token`.
    pub async fn client_for_token(&self, token: &str) -> Result<kube::Client, KubesimError> {
        self.client_from_kubeconfig(
            &self.kubeconfig_yaml_with(Credentials::Token(token.to_string())),
        )
        .await
    }

    /// A client certificate for `user` in `groups` signed by this cluster's CA, valid one
    /// day: `(cert_pem, key_pem)`.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[String],
    ) -> Result<(String, String), KubesimError> {
        Ok(self
            .server
            .pki
            .issue_client_cert(user, groups, Duration::from_secs(24 * 3600))?)
    }

    /// A `kube::Client` authenticating with a fresh client certificate for `user`/`groups`.
    pub async fn client_for_cert(
        &self,
        user: &str,
        groups: &[String],
    ) -> Result<kube::Client, KubesimError> {
        let (cert_pem, key_pem) = self.issue_client_cert(user, groups)?;
        self.client_from_kubeconfig(
            &self.kubeconfig_yaml_with(Credentials::ClientCert { cert_pem, key_pem }),
        )
        .await
    }

    /// Add a static bearer token for `user` (kube-apiserver's `--token-auth-file`).
    pub fn add_static_token(&self, token: &str, user: UserInfo) {
        if let Ok(mut m) = self.server.static_tokens.write() {
            m.insert(token.to_string(), user.with_authenticated_group());
        }
    }

    /// Issue a ServiceAccount token (as TokenRequest does): the ServiceAccount must exist;
    /// `audiences` empty means the cluster's API audience; `pod` binds the token to a pod
    /// (name) that must exist.
    pub async fn issue_sa_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration: Duration,
        pod: Option<&str>,
    ) -> Result<String, KubesimError> {
        let store = self.store();
        let uid_of = |plural: &str, name: &str| -> Result<String, KubesimError> {
            let res = store.resolve("", "v1", plural).ok_or_else(|| {
                KubesimError::Api(kubesim_store::ApiError::new(
                    404,
                    "NotFound",
                    plural.to_string(),
                ))
            })?;
            let obj = store.get(&res, Some(namespace), name)?;
            Ok(obj
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string())
        };
        let sa_uid = uid_of("serviceaccounts", service_account)?;
        let pod = match pod {
            Some(p) => Some(ObjectRef {
                name: p.to_string(),
                uid: uid_of("pods", p)?,
            }),
            None => None,
        };
        let audiences = if audiences.is_empty() {
            self.server.api_audiences()
        } else {
            audiences.to_vec()
        };
        let req = SaTokenRequest {
            namespace: namespace.to_string(),
            sa_name: service_account.to_string(),
            sa_uid,
            audiences,
            expiration_seconds: i64::try_from(expiration.as_secs()).unwrap_or(i64::MAX),
            pod,
            node: None,
        };
        let (token, _) = crate::virtual_resources::issue(&self.server, &req).await?;
        Ok(token)
    }

    /// Rotate the ServiceAccount signing key (previous keys stay in the JWKS for a while;
    /// see `kubesim_auth::jwt::PREVIOUS_KEYS_KEPT`).
    pub async fn rotate_sa_signing_key(&self) -> Result<(), KubesimError> {
        let issuer = self.server.sa_issuer().await?;
        tokio::task::spawn_blocking(move || issuer.rotate())
            .await
            .map_err(|e| KubesimError::Kube(format!("rotation task: {e}")))??;
        Ok(())
    }

    /// Accept `issuer`'s ServiceAccount tokens whose audience intersects `audiences`
    /// (usually `[self.url()]`), verified against the JWKS fetched over HTTPS from the issuer
    /// cluster's `/openid/v1/jwks` (trusting its CA).
    pub async fn trust_issuer(
        &self,
        issuer: &ClusterHandle,
        audiences: &[String],
    ) -> Result<(), KubesimError> {
        // Make sure the issuer's key exists before anyone fetches its JWKS.
        issuer.server.sa_issuer().await?;
        let ext = crate::authn::external_issuer(&issuer.url(), &issuer.ca_pem(), audiences)?;
        self.add_external_authenticator(ext);
        Ok(())
    }

    /// Add any external JWT authenticator.
    pub fn add_external_authenticator(&self, ext: Arc<dyn ExternalAuthenticator>) {
        if let Ok(mut v) = self.server.external_issuers.write() {
            v.retain(|e| e.issuer() != ext.issuer());
            v.push(ext);
        }
    }

    /// Use the `jwt` authenticators of an `apiserver.config.k8s.io` `AuthenticationConfiguration`
    /// (YAML or JSON `text`), replacing those of the previous configuration, as
    /// kube-apiserver's `--authentication-config` (and its reload) does. An invalid
    /// configuration is refused with the field named and the previous one stays. Authenticators
    /// added with [`Self::trust_issuer`] are kept. Unknown key IDs refetch the JWKS at most
    /// every 200 ms (kube-apiserver: a few seconds), so tests can rotate keys quickly.
    pub fn set_authentication_config(&self, text: &str) -> Result<(), KubesimError> {
        let authenticators = crate::authn::authentication_config(text, Duration::from_millis(200))?;
        let taken: Vec<String> = self
            .server
            .external_issuers
            .read()
            .map(|v| {
                v.iter()
                    .filter(|e| !e.is_from_authentication_config())
                    .map(|e| e.issuer().to_string())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(a) = authenticators
            .iter()
            .find(|a| taken.iter().any(|t| t == a.issuer()))
        {
            return Err(KubesimError::Auth(kubesim_auth::AuthError::InvalidRequest(
                format!(
                    "jwt issuer.url {:?}: already trusted through trust_issuer",
                    a.issuer()
                ),
            )));
        }
        if let Ok(mut v) = self.server.external_issuers.write() {
            v.retain(|e| !e.is_from_authentication_config());
            v.extend(authenticators);
        }
        Ok(())
    }

    /// Stop this cluster's server.
    pub fn stop(&self) {
        self.server.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_crds_reads_multi_document_files() {
        // Two vendored CRD files concatenated with `---`, comments and an empty document,
        // as `kubectl apply -f dir/` or a pipe would see them. (kleym's own chart CRDs are
        // read the same way in kleym-e2e's `fleet` tests.)
        let a = upstream_crds::CLUSTERPROFILE_V1ALPHA2.yaml;
        let b = upstream_crds::UPSTREAM[0].yaml;
        let text = format!("# leading comment\n---\n{a}\n---\n# an empty document\n---\n{b}\n");
        let expected = parse_crds("a", a).unwrap().len() + parse_crds("b", b).unwrap().len();
        let crds = parse_crds("two files", &text).unwrap();
        assert_eq!(crds.len(), expected);
        assert!(crds.iter().all(|c| c["metadata"]["name"].is_string()));
        // Every vendored upstream file loads, whatever its document layout.
        for file in upstream_crds::UPSTREAM
            .iter()
            .chain([&upstream_crds::CLUSTERPROFILE_V1ALPHA2])
        {
            assert!(
                !parse_crds(file.name, file.yaml).unwrap().is_empty(),
                "{}",
                file.name
            );
        }

        let err = parse_crds("x.yaml", "kind: ConfigMap\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("x.yaml") && err.contains("not a CustomResourceDefinition"),
            "{err}"
        );
        let err = parse_crds("y.yaml", "kind: CustomResourceDefinition\n---\nkind: [\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("y.yaml") && err.contains("line"), "{err}");
    }
}
