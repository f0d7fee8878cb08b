//! The replica's Lease work (its membership Lease in sharded mode, the leader election and
//! the watch of the leader Lease) on an OS thread of its own, with a hub-cluster client of
//! its own.
//!
//! A replica's spoke work runs on a runtime of one worker thread by default. Engaging
//! thousands of spokes queues thousands of ready tasks there, and a Lease renewal waiting
//! behind them can miss its renew deadline: the replica then owns nothing (or steps down),
//! halts every spoke and engages them again, under the very load that delayed it. On a
//! thread of its own the renewal is scheduled by the operating system beside the spoke
//! work, as client-go's leader election is beside a Go controller's goroutines; its
//! requests go through a client whose connections live on that thread too.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A runtime on an OS thread of its own, and a hub-cluster client whose connections run on
/// it. The runtime stops (and every task on it with it) when the last clone is dropped: hold
/// one until the tasks spawned on it have ended.
#[derive(Clone)]
pub struct Coordination {
    inner: Arc<Inner>,
}

struct Inner {
    handle: Handle,
    client: kube::Client,
    /// Dropping it ends the thread's `block_on`, which drops the runtime.
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for Coordination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordination").finish_non_exhaustive()
    }
}

impl Coordination {
    /// Starts the thread (`kleym-coordination`) and builds the client on it with `connect`
    /// (a client's connection tasks run on the runtime that made it).
    pub async fn start<F, Fut>(connect: F) -> anyhow::Result<Self>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<kube::Client>> + Send + 'static,
    {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("kleym-coordination".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .context("starting the coordination thread")?;
        let handle = ready_rx
            .await
            .context("the coordination thread ended while starting")?
            .context("building the coordination runtime")?;
        let client = handle
            .spawn(connect())
            .await
            .context("building the coordination client")??;
        Ok(Self {
            inner: Arc::new(Inner {
                handle,
                client,
                _stop: stop_tx,
            }),
        })
    }

    /// The runtime to spawn Lease work on.
    pub fn handle(&self) -> &Handle {
        &self.inner.handle
    }

    /// The hub-cluster client whose connections run on [`Coordination::handle`].
    pub fn client(&self) -> &kube::Client {
        &self.inner.client
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kleym_spoke::reconciler::CancellationToken;
    use kubesim::{Kubesim, KubesimOptions};

    use super::Coordination;
    use crate::shard::{MembershipOptions, ShardMetrics, membership::lease_name};

    /// The replica Lease keeps being renewed while the caller's runtime cannot run a task
    /// (its one thread busy past the renew deadline, as under thousands of spokes).
    #[tokio::test(flavor = "current_thread")]
    async fn leases_are_renewed_while_the_callers_runtime_is_busy() {
        // The API server must not live on the runtime this test is about to block.
        let sim = Kubesim::start(
            &["hub"],
            KubesimOptions {
                own_threads: ["hub".to_string()].into(),
                ..KubesimOptions::default()
            },
        )
        .await
        .unwrap();
        let hub = sim.cluster("hub").unwrap();
        let admin = hub.kube_client().await.unwrap();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "kleym"}})).unwrap();
        kube::Api::all(admin)
            .create(&kube::api::PostParams::default(), &ns)
            .await
            .unwrap();
        let on_thread = hub.clone();
        let coordination = Coordination::start(move || async move {
            on_thread
                .kube_client()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .await
        .unwrap();
        let opts = MembershipOptions {
            namespace: "kleym".into(),
            identity: "replica-a".into(),
            weight: 10,
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(1),
            retry_period: Duration::from_millis(100),
        };
        let lease_path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/kleym/leases/{}",
            lease_name(&opts.identity)
        );
        let stop = CancellationToken::new();
        let mut membership = crate::shard::spawn(
            coordination.handle(),
            coordination.client().clone(),
            opts,
            ShardMetrics::default(),
            stop.clone(),
        );
        tokio::time::timeout(
            Duration::from_secs(30),
            membership.ownership.wait_for(|o| o.view_hash().is_some()),
        )
        .await
        .unwrap()
        .unwrap();
        let renewals = || {
            hub.requests()
                .with_method("PUT")
                .iter()
                .filter(|r| r.path == lease_path)
                .count()
        };
        let before = renewals();
        // Blocks this runtime's only thread: nothing spawned on it runs meanwhile.
        std::thread::sleep(Duration::from_millis(1500));
        let during = renewals() - before;
        assert!(
            during >= 3,
            "{during} renewals while the caller's runtime was blocked for 1.5 s (retry period 100 ms)"
        );
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), &mut membership.task)
            .await
            .unwrap()
            .unwrap();
    }
}
