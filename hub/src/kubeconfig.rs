//! The Kubernetes client every `kleym` command builds from its `--kubeconfig`/`--context`
//! flags (`kleym hub`, `kleym spoke`, `kleym report`), so they find their cluster the same
//! way.

use anyhow::Context as _;

/// A client from the `--kubeconfig`/`--context` flags every kleym command takes: the given
/// file (and context), else the default kubeconfig with that context, else the usual
/// inference (`KUBECONFIG`, `~/.kube/config`, in-cluster). The client speaks HTTP/2 when the
/// server offers it (see [`crate::credentials::transport`]), and goes through a proxy by the
/// rules of [`crate::credentials::proxy`] (never for loopback or the hub's own in-cluster API
/// server; `NO_PROXY` honoured).
pub async fn client_from_flags(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    client_with_limit(
        kubeconfig,
        context,
        kleym_spoke::reconciler::limits::DEFAULT_MAX_RESPONSE_BYTES,
    )
    .await
}

/// [`client_from_flags`], reading no response body larger than `max_response_bytes`
/// (`--max-response-mib`; see [`kleym_spoke::reconciler::limits`]).
pub async fn client_with_limit(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    max_response_bytes: u64,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let (mut config, explicit_proxy) = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let proxy = crate::credentials::proxy::kubeconfig_proxy_url(&kc, context);
            let config = kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?;
            (config, proxy)
        }
        (None, Some(_)) => (
            kube::Config::from_kubeconfig(&options)
                .await
                .context("loading kubeconfig")?,
            crate::credentials::proxy::default_kubeconfig_proxy(context),
        ),
        (None, None) => (
            kube::Config::infer().await.context(
                "no kubeconfig (KUBECONFIG, ~/.kube/config) and not running in a cluster",
            )?,
            crate::credentials::proxy::default_kubeconfig_proxy(None),
        ),
    };
    crate::credentials::proxy::apply_to_config(&mut config, explicit_proxy.as_deref())
        .context("the kubeconfig's proxy-url")?;
    crate::credentials::transport::client(
        &config,
        crate::credentials::Keepalive::default(),
        max_response_bytes,
    )
    .context("building the Kubernetes client")
}
