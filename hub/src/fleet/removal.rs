//! What happens to a spoke's objects when kleym stops managing it: the removal policy applied
//! to every binding that still carries kleym's finalizer.
//!
//! One pass ([`apply_removal`]) lists the bindings once and handles each on its own: every
//! request is bounded, a 409 on the finalizer update re-reads that binding and tries again,
//! and a failing binding is reported in [`RemovalReport::left`] without stopping the others.
//! The caller repeats passes (with backoff) until nothing is left — see `removal_job`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::labels;
use kleym_spoke::compiler::Reason;
use kleym_spoke::ownership::{self, Owner};
use kleym_spoke::reconciler::context::{DEFAULT_FIELD_MANAGER, FINALIZER};
use kleym_spoke::reconciler::events::EventPublisher;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::Reporter;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::errors::categorize_kube;
use super::state::ErrorCategory;

/// `--removal-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RemovalPolicy {
    /// Stop managing the spoke and remove kleym's finalizer from its bindings; the
    /// ClusterSPIFFEIDs stay (workloads keep their identities).
    #[default]
    Orphan,
    /// Also delete the ClusterSPIFFEIDs kleym created (only those proven to be the
    /// binding's output, see `kleym_spoke::ownership`), then remove the finalizers.
    Cleanup,
}

/// A binding a removal pass could not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftBinding {
    /// `namespace/name`.
    pub binding: String,
    /// What failed (never a credential).
    pub error: String,
    /// Category of the failure.
    pub category: ErrorCategory,
}

/// What one removal pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemovalReport {
    /// Bindings whose finalizer was removed.
    pub finalizers_removed: usize,
    /// ClusterSPIFFEIDs deleted (Cleanup only).
    pub cluster_spiffe_ids_deleted: usize,
    /// Bindings whose ClusterSPIFFEID name holds an object that is not proven to be their
    /// output (Cleanup only): not kleym's, kept untouched.
    pub foreign_kept: usize,
    /// Bindings that still carry kleym's finalizer after this pass.
    pub left: Vec<LeftBinding>,
}

impl RemovalReport {
    /// Nothing left to do.
    pub fn is_complete(&self) -> bool {
        self.left.is_empty()
    }

    /// The bindings left, for logs and the published reason: at most `cap` named, then a
    /// count of the rest.
    pub fn left_summary(&self, cap: usize) -> String {
        let mut names: Vec<String> = self
            .left
            .iter()
            .take(cap)
            .map(|l| format!("{} ({})", l.binding, l.error))
            .collect();
        if self.left.len() > cap {
            names.push(format!("and {} more", self.left.len() - cap));
        }
        names.join(", ")
    }
}

/// A removal pass that could not look at any binding.
#[derive(Debug, thiserror::Error)]
pub enum RemovalError {
    /// Listing the bindings failed.
    #[error("listing InferenceIdentityBindings: {0}")]
    List(#[source] kube::Error),
    /// Listing the bindings did not answer in time.
    #[error("listing InferenceIdentityBindings timed out after {0}s")]
    ListTimeout(u64),
    /// Listing kleym's ClusterSPIFFEIDs failed (Cleanup).
    #[error("listing ClusterSPIFFEIDs: {0}")]
    ListOutputs(#[source] kube::Error),
    /// Listing kleym's ClusterSPIFFEIDs did not answer in time (Cleanup).
    #[error("listing ClusterSPIFFEIDs timed out after {0}s")]
    ListOutputsTimeout(u64),
}

impl RemovalError {
    /// The category of this failure.
    pub fn category(&self) -> ErrorCategory {
        match self {
            RemovalError::List(e) | RemovalError::ListOutputs(e) => categorize_kube(e),
            RemovalError::ListTimeout(_) | RemovalError::ListOutputsTimeout(_) => {
                ErrorCategory::Unreachable
            }
        }
    }
}

/// Reason of the Warning event on a binding whose ClusterSPIFFEID name holds an object
/// Cleanup does not delete because it is not proven to be the binding's output.
const REASON_FOREIGN_KEPT: &str = Reason::ForeignObjectHoldsName.as_str();

/// 409s in a row on one binding's finalizer update before the pass leaves it for the next.
const CONFLICT_ATTEMPTS: usize = 5;

/// A failed request on one binding.
struct Failed {
    error: String,
    category: ErrorCategory,
}

impl Failed {
    fn kube(what: String, e: &kube::Error) -> Self {
        Self {
            error: format!("{what}: {e}"),
            category: categorize_kube(e),
        }
    }

    fn timeout(what: String, limit: Duration) -> Self {
        Self {
            error: format!("{what} timed out after {}s", limit.as_secs()),
            category: ErrorCategory::Unreachable,
        }
    }
}

/// Bounds of one pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassBounds {
    /// Bound of each request.
    pub request_timeout: Duration,
    /// No binding is started after this instant (the rest are reported as left).
    pub deadline: Option<Instant>,
}

impl PassBounds {
    /// The bound of the next request: the request timeout, shortened to the deadline.
    fn limit(&self) -> Option<Duration> {
        match self.deadline {
            None => Some(self.request_timeout),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| left.min(self.request_timeout))
            }
        }
    }
}

async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Option<Result<T, kube::Error>> {
    tokio::time::timeout(limit, fut).await.ok()
}

fn has_our_finalizer(b: &InferenceIdentityBinding) -> bool {
    b.finalizers().iter().any(|f| f == FINALIZER)
}

/// Applies `policy` to the spoke behind `client` once; each request is bounded by
/// `request_timeout`. `Ok` with a non-empty [`RemovalReport::left`] means some bindings
/// failed (each with its error); call again to retry them.
pub async fn apply_removal(
    client: &kube::Client,
    policy: RemovalPolicy,
    request_timeout: Duration,
) -> Result<RemovalReport, RemovalError> {
    let events = removal_events(client, None, true);
    removal_pass(
        client,
        policy,
        PassBounds {
            request_timeout,
            deadline: None,
        },
        &events,
    )
    .await
}

/// The publisher of the events a removal pass publishes on a spoke's bindings.
pub(crate) fn removal_events(
    client: &kube::Client,
    instance: Option<String>,
    enabled: bool,
) -> EventPublisher {
    let reporter = Reporter {
        controller: "kleym-hub".into(),
        instance,
    };
    EventPublisher::new(client.clone(), reporter, enabled)
}

/// [`apply_removal`] with an overall deadline.
pub(crate) async fn removal_pass(
    client: &kube::Client,
    policy: RemovalPolicy,
    bounds: PassBounds,
    events: &EventPublisher,
) -> Result<RemovalReport, RemovalError> {
    let all: Api<InferenceIdentityBinding> = Api::all(client.clone());
    let limit = bounds.limit().unwrap_or(Duration::ZERO);
    let listed = match bounded(limit, all.list(&ListParams::default())).await {
        Some(Ok(l)) => l,
        Some(Err(e)) => return Err(RemovalError::List(e)),
        None => return Err(RemovalError::ListTimeout(limit.as_secs())),
    };
    let outputs = match policy {
        RemovalPolicy::Orphan => Outputs::new(),
        RemovalPolicy::Cleanup => list_outputs(client, bounds).await?,
    };
    let mut report = RemovalReport::default();
    for b in listed {
        if !has_our_finalizer(&b) {
            continue;
        }
        let binding = format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
        let cx = BindingPass {
            client,
            policy,
            bounds,
            outputs: &outputs,
            events,
        };
        if let Err(f) = remove_binding(&cx, b, &mut report).await {
            report.left.push(LeftBinding {
                binding,
                error: f.error,
                category: f.category,
            });
        }
    }
    Ok(report)
}

/// kleym's ClusterSPIFFEIDs by name.
type Outputs = BTreeMap<String, ClusterSPIFFEID>;

/// Lists the ClusterSPIFFEIDs carrying kleym's label (every object kleym owns does: the
/// spoke reconciler applies it, and restores it when someone else removed it) once per
/// pass, so that Cleanup reads each object it may delete (the spoke role has `list`, not
/// `get`). The label only finds candidates; each is deleted only when `ownership::verify`
/// proves it the binding's. An object whose label was removed after its spoke's reconciler
/// stopped is not found, and stays. No CRD served: nothing to delete.
async fn list_outputs(client: &kube::Client, bounds: PassBounds) -> Result<Outputs, RemovalError> {
    let api: Api<ClusterSPIFFEID> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    let limit = bounds.limit().unwrap_or(Duration::ZERO);
    match bounded(limit, api.list(&lp)).await {
        Some(Ok(l)) => Ok(l.items.into_iter().map(|o| (o.name_any(), o)).collect()),
        Some(Err(kube::Error::Api(s))) if s.code == 404 => Ok(Outputs::new()),
        Some(Err(e)) => Err(RemovalError::ListOutputs(e)),
        None => Err(RemovalError::ListOutputsTimeout(limit.as_secs())),
    }
}

/// What every binding of one pass shares.
struct BindingPass<'a> {
    client: &'a kube::Client,
    policy: RemovalPolicy,
    bounds: PassBounds,
    outputs: &'a Outputs,
    events: &'a EventPublisher,
}

/// What Cleanup did about one binding's ClusterSPIFFEID.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CleanedUp {
    /// Not yet looked at.
    Pending,
    /// Deleted, gone, or kept because it is not the binding's: nothing more to do.
    Done,
}

/// Applies the policy to one binding: Cleanup deletes its ClusterSPIFFEID — the object at
/// the name the compiler gives the binding, proven to be its output by
/// `ownership::verify` (never the object its status names: status is writable by the
/// binding's tenant) — with a UID precondition; then kleym's finalizer is removed
/// (resourceVersion-guarded; a 409 re-reads the binding and starts over, so another
/// controller's finalizer is never lost). The finalizer stays until the deletion
/// succeeded, so a failed pass can be retried.
async fn remove_binding(
    cx: &BindingPass<'_>,
    mut b: InferenceIdentityBinding,
    report: &mut RemovalReport,
) -> Result<(), Failed> {
    let ns = b.namespace().unwrap_or_default();
    let name = b.name_any();
    let api: Api<InferenceIdentityBinding> = Api::namespaced(cx.client.clone(), &ns);
    let deadline = || Failed {
        error: "not finished before the removal deadline".into(),
        category: ErrorCategory::Other,
    };
    let mut cleaned = CleanedUp::Pending;
    for _ in 0..CONFLICT_ATTEMPTS {
        if !has_our_finalizer(&b) {
            return Ok(());
        }
        if cx.policy == RemovalPolicy::Cleanup && cleaned == CleanedUp::Pending {
            delete_output(cx, &b, report).await?;
            cleaned = CleanedUp::Done;
        }
        let rest: Vec<String> = b
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": b.resource_version()}});
        let limit = cx.bounds.limit().ok_or_else(deadline)?;
        let what = || format!("removing finalizer {FINALIZER}");
        // kleym names its field manager on every write rather than let the API server
        // derive one from the user agent (which names the replica).
        let pp = PatchParams {
            field_manager: Some(DEFAULT_FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        match bounded(limit, api.patch(&name, &pp, &Patch::Merge(&patch))).await {
            Some(Ok(_)) => {
                report.finalizers_removed += 1;
                return Ok(());
            }
            Some(Err(kube::Error::Api(s))) if s.code == 404 => return Ok(()),
            // Changed since it was read: read it again and start over.
            Some(Err(kube::Error::Api(s))) if s.code == 409 => {
                let limit = cx.bounds.limit().ok_or_else(deadline)?;
                let what = || "re-reading the binding after a conflict".to_string();
                match bounded(limit, api.get_opt(&name)).await {
                    // Re-created under the same name: another binding, whose output is
                    // another object; look at it afresh.
                    Some(Ok(Some(fresh))) => {
                        if fresh.uid() != b.uid() {
                            cleaned = CleanedUp::Pending;
                        }
                        b = fresh;
                    }
                    Some(Ok(None)) => return Ok(()),
                    Some(Err(e)) => return Err(Failed::kube(what(), &e)),
                    None => return Err(Failed::timeout(what(), limit)),
                }
            }
            Some(Err(e)) => return Err(Failed::kube(what(), &e)),
            None => return Err(Failed::timeout(what(), limit)),
        }
    }
    Err(Failed {
        error: format!(
            "removing finalizer {FINALIZER}: {CONFLICT_ATTEMPTS} conflicts in a row (the binding keeps changing)"
        ),
        category: ErrorCategory::Other,
    })
}

/// Cleanup of one binding's ClusterSPIFFEID: deleted (UID precondition) only when proven
/// to be the binding's output; a foreign object at its name is kept, logged and reported
/// as an event on the binding.
async fn delete_output(
    cx: &BindingPass<'_>,
    b: &InferenceIdentityBinding,
    report: &mut RemovalReport,
) -> Result<(), Failed> {
    let Some(owner) = Owner::of(b) else {
        return Ok(()); // without a UID nothing can be proven to be its output
    };
    let name = owner.object_name();
    let Some(obj) = cx.outputs.get(&name) else {
        return Ok(()); // already gone (or never created)
    };
    if let Err(foreign) = ownership::verify(obj, DEFAULT_FIELD_MANAGER, &owner) {
        report.foreign_kept += 1;
        let note = format!("{foreign}; the Cleanup removal policy left it untouched");
        tracing::warn!(binding = %format!("{}/{}", owner.namespace, owner.name), "{note}");
        if let Some(limit) = cx.bounds.limit() {
            // Best effort: the event is information, the removal does not wait for it.
            let _ = tokio::time::timeout(
                limit,
                cx.events
                    .warn(&b.object_ref(&()), REASON_FOREIGN_KEPT, &note),
            )
            .await;
        }
        return Ok(());
    }
    let uid = obj.uid().unwrap_or_default();
    let csids: Api<ClusterSPIFFEID> = Api::all(cx.client.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let limit = cx.bounds.limit().ok_or_else(|| Failed {
        error: "not finished before the removal deadline".into(),
        category: ErrorCategory::Other,
    })?;
    let what = || format!("deleting ClusterSPIFFEID {name}");
    match bounded(limit, csids.delete(&name, &dp)).await {
        Some(Ok(_)) => report.cluster_spiffe_ids_deleted += 1,
        // Already gone.
        Some(Err(kube::Error::Api(s))) if s.code == 404 => {}
        // The UID precondition failed: the name holds another object since the list, one
        // that was not proven to be the binding's: keep it.
        Some(Err(kube::Error::Api(s))) if s.code == 409 => report.foreign_kept += 1,
        Some(Err(e)) => return Err(Failed::kube(what(), &e)),
        None => return Err(Failed::timeout(what(), limit)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left(n: usize) -> RemovalReport {
        RemovalReport {
            left: (0..n)
                .map(|i| LeftBinding {
                    binding: format!("llm/b-{i}"),
                    error: "boom".into(),
                    category: ErrorCategory::ServerError,
                })
                .collect(),
            ..RemovalReport::default()
        }
    }

    #[test]
    fn left_summary_names_a_capped_number_of_bindings() {
        assert!(left(0).is_complete());
        assert_eq!(left(0).left_summary(3), "");
        assert!(!left(1).is_complete());
        assert_eq!(left(2).left_summary(3), "llm/b-0 (boom), llm/b-1 (boom)");
        assert_eq!(
            left(5).left_summary(2),
            "llm/b-0 (boom), llm/b-1 (boom), and 3 more"
        );
    }

    #[test]
    fn pass_bounds_shorten_requests_to_the_deadline_and_stop_at_it() {
        let rt = Duration::from_secs(30);
        let free = PassBounds {
            request_timeout: rt,
            deadline: None,
        };
        assert_eq!(free.limit(), Some(rt));
        let soon = PassBounds {
            request_timeout: rt,
            deadline: Some(Instant::now() + Duration::from_secs(5)),
        };
        let l = soon.limit().unwrap();
        assert!(l <= Duration::from_secs(5) && !l.is_zero(), "{l:?}");
        let past = PassBounds {
            request_timeout: rt,
            deadline: Some(Instant::now() - Duration::from_secs(1)),
        };
        assert_eq!(past.limit(), None);
    }
}
