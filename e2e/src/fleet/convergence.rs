//! When each binding of a spoke converged, read from in-process watches on the spoke's
//! store (exact arrival times, no polling load on the API servers).
//!
//! A binding is **converged** when both hold: its status has `Ready=True` for its current
//! generation (the condition's `observedGeneration` equals `metadata.generation`), and its
//! ClusterSPIFFEID exists. It converged at the later of the two moments. A binding whose
//! `Ready` is `False` is *refused* (the condition's reason is kept for the report); the
//! bench's bindings are all valid and distinct, so no refusal is expected.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kubesim_store::{Cluster, WatchOptions};
use serde_json::Value;

use super::env;

/// Binding names and ClusterSPIFFEID names to binding indices (shared by every spoke).
#[derive(Debug)]
pub struct Names {
    bindings: HashMap<String, usize>,
    csids: HashMap<String, usize>,
}

impl Names {
    /// The names of bindings `0..m` (see [`env::binding_name`], [`env::csid_name`]).
    pub fn new(m: usize) -> Self {
        Self {
            bindings: (0..m).map(|i| (env::binding_name(i), i)).collect(),
            csids: (0..m).map(|i| (env::csid_name(i), i)).collect(),
        }
    }

    fn len(&self) -> usize {
        self.bindings.len()
    }
}

/// What a binding's status says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingState {
    /// No `Ready` condition for the current generation yet.
    Pending,
    /// `Ready=True` for the current generation.
    Ready,
    /// `Ready=False` for the current generation, with the condition's reason.
    Refused(String),
}

/// The state of `binding` (an `InferenceIdentityBinding` object) from its `Ready` condition.
pub fn binding_state(binding: &Value) -> BindingState {
    let generation = binding["metadata"]["generation"].as_i64();
    let Some(ready) = binding["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
    else {
        return BindingState::Pending;
    };
    // A condition written for an older generation says nothing about the current spec.
    if generation.is_some() && ready["observedGeneration"].as_i64() != generation {
        return BindingState::Pending;
    }
    match ready["status"].as_str() {
        Some("True") => BindingState::Ready,
        Some("False") => BindingState::Refused(
            ready["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
                .unwrap_or("no reason")
                .to_string(),
        ),
        _ => BindingState::Pending,
    }
}

/// The convergence of one spoke's bindings `0..m`, fed with watch events.
#[derive(Debug)]
pub struct SpokeProgress {
    names: Arc<Names>,
    /// When the binding's ClusterSPIFFEID (last) appeared; `None` while it does not exist.
    csid_at: Vec<Option<Instant>>,
    /// When the binding (last) became Ready; `None` while it is not.
    ready_at: Vec<Option<Instant>>,
    /// The reason of a `Ready=False` binding.
    refused: Vec<Option<String>>,
    converged: usize,
}

impl SpokeProgress {
    /// Nothing converged yet.
    pub fn new(names: Arc<Names>) -> Self {
        let m = names.len();
        Self {
            names,
            csid_at: vec![None; m],
            ready_at: vec![None; m],
            refused: vec![None; m],
            converged: 0,
        }
    }

    fn is_converged(&self, i: usize) -> bool {
        self.csid_at[i].is_some() && self.ready_at[i].is_some()
    }

    /// Applies `update` to binding `i`, keeping the converged count right.
    fn update(&mut self, i: usize, update: impl FnOnce(&mut Self)) {
        let before = self.is_converged(i);
        update(self);
        match (before, self.is_converged(i)) {
            (false, true) => self.converged += 1,
            (true, false) => self.converged -= 1,
            _ => {}
        }
    }

    /// A ClusterSPIFFEID watch event (`ADDED`, `MODIFIED`, `DELETED`) seen at `at`.
    pub fn on_csid(&mut self, event_type: &str, obj: &Value, at: Instant) {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let Some(&i) = self.names.csids.get(name) else {
            return;
        };
        self.update(i, |s| match event_type {
            "DELETED" => s.csid_at[i] = None,
            "ADDED" | "MODIFIED" => {
                s.csid_at[i].get_or_insert(at);
            }
            _ => {}
        });
    }

    /// A binding watch event seen at `at`.
    pub fn on_binding(&mut self, event_type: &str, obj: &Value, at: Instant) {
        if obj["metadata"]["namespace"] != env::NS {
            return;
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let Some(&i) = self.names.bindings.get(name) else {
            return;
        };
        let state = if event_type == "DELETED" {
            BindingState::Pending
        } else {
            binding_state(obj)
        };
        self.update(i, |s| match state {
            BindingState::Ready => {
                s.ready_at[i].get_or_insert(at);
                s.refused[i] = None;
            }
            BindingState::Refused(reason) => {
                s.ready_at[i] = None;
                s.refused[i] = Some(reason);
            }
            BindingState::Pending => s.ready_at[i] = None,
        });
    }

    /// Whether every binding converged.
    pub fn done(&self) -> bool {
        self.converged == self.names.len()
    }

    /// When each binding converged (the later of Ready and its ClusterSPIFFEID); `None`
    /// for a binding that has not.
    pub fn converged_at(&self) -> Vec<Option<Instant>> {
        (0..self.names.len())
            .map(|i| match (self.csid_at[i], self.ready_at[i]) {
                (Some(c), Some(r)) => Some(c.max(r)),
                _ => None,
            })
            .collect()
    }

    /// When each binding's ClusterSPIFFEID appeared (`None` while it does not exist).
    pub fn csid_at(&self) -> &[Option<Instant>] {
        &self.csid_at
    }

    /// Per binding that has not converged: what is missing.
    pub fn missing(&self) -> Vec<(usize, String)> {
        (0..self.names.len())
            .filter(|&i| !self.is_converged(i))
            .map(|i| {
                let ready = match (&self.refused[i], self.ready_at[i]) {
                    (Some(reason), _) => format!("Ready=False ({reason})"),
                    (None, Some(_)) => "Ready".to_string(),
                    (None, None) => "not Ready".to_string(),
                };
                let csid = if self.csid_at[i].is_some() {
                    "ClusterSPIFFEID exists"
                } else {
                    "no ClusterSPIFFEID"
                };
                (i, format!("{ready}, {csid}"))
            })
            .collect()
    }
}

/// Which watch an event came from.
enum Source {
    Binding,
    Csid,
}

/// Watches `store`'s bindings and ClusterSPIFFEIDs from its current resourceVersion (so
/// only what happens from now on is seen) and returns a task that ends once every binding
/// converged or after `limit`, with the spoke's progress.
pub fn watch_spoke(
    store: &Cluster,
    names: Arc<Names>,
    limit: Duration,
) -> Result<tokio::task::JoinHandle<SpokeProgress>, String> {
    let spoke = store.name().to_string();
    let resolve = |group: &str, version: &str, plural: &str| {
        store
            .resolve(group, version, plural)
            .ok_or_else(|| format!("{spoke}: {group}/{version} {plural} is not served"))
    };
    let opts = WatchOptions {
        resource_version: Some(store.current_resource_version().to_string()),
        ..WatchOptions::default()
    };
    let watch = |res| {
        store
            .watch(&res, None, &opts)
            .map_err(|e| format!("{spoke}: watch: {}", e.message))
    };
    let bindings = watch(resolve(
        "kleym.io",
        "v1alpha1",
        "inferenceidentitybindings",
    )?)?
    .map(|ev| (Source::Binding, ev));
    let csids = watch(resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")?)?
        .map(|ev| (Source::Csid, ev));
    let mut events = futures::stream::select(bindings, csids);
    Ok(tokio::spawn(async move {
        let mut progress = SpokeProgress::new(names);
        let deadline = tokio::time::Instant::now() + limit;
        while !progress.done() {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some((source, ev))) => {
                    let at = Instant::now();
                    match source {
                        Source::Binding => progress.on_binding(ev.event_type, &ev.object, at),
                        Source::Csid => progress.on_csid(ev.event_type, &ev.object, at),
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        progress
    }))
}

/// Checks by listing `store` that bindings `0..m` are all Ready with their ClusterSPIFFEID
/// (the watches decide *when*; this confirms the end state). Returns what is wrong.
pub fn verify_listed(store: &Cluster, m: usize) -> Vec<String> {
    let csids = env::csid_names(store);
    let states: HashMap<String, BindingState> = env::bindings(store)
        .iter()
        .filter(|b| b["metadata"]["namespace"] == env::NS)
        .filter_map(|b| {
            Some((
                b["metadata"]["name"].as_str()?.to_string(),
                binding_state(b),
            ))
        })
        .collect();
    let mut wrong = Vec::new();
    for i in 0..m {
        let name = env::binding_name(i);
        match states.get(&name) {
            Some(BindingState::Ready) => {}
            Some(other) => wrong.push(format!("{}: {}/{name} is {other:?}", store.name(), env::NS)),
            None => wrong.push(format!(
                "{}: {}/{name} does not exist",
                store.name(),
                env::NS
            )),
        }
        if !csids.contains(&env::csid_name(i)) {
            wrong.push(format!(
                "{}: ClusterSPIFFEID {} of {}/{name} does not exist",
                store.name(),
                env::csid_name(i),
                env::NS
            ));
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(i: usize, generation: i64, ready: Option<(&str, &str, i64)>) -> Value {
        let mut b = json!({"metadata": {"name": env::binding_name(i), "namespace": env::NS,
                                        "generation": generation}});
        if let Some((status, reason, observed)) = ready {
            b["status"] = json!({"conditions": [
                {"type": "Conflict", "status": "False", "reason": "NoConflict", "observedGeneration": observed},
                {"type": "Ready", "status": status, "reason": reason, "observedGeneration": observed}
            ]});
        }
        b
    }

    fn csid(i: usize) -> Value {
        json!({"metadata": {"name": env::csid_name(i)}})
    }

    #[test]
    fn ready_needs_the_current_generation() {
        assert_eq!(binding_state(&binding(0, 1, None)), BindingState::Pending);
        assert_eq!(
            binding_state(&binding(0, 2, Some(("True", "Compiled", 1)))),
            BindingState::Pending
        );
        assert_eq!(
            binding_state(&binding(0, 2, Some(("True", "Compiled", 2)))),
            BindingState::Ready
        );
        assert_eq!(
            binding_state(&binding(0, 2, Some(("False", "InvalidRef", 2)))),
            BindingState::Refused("InvalidRef".into())
        );
    }

    #[test]
    fn a_binding_converges_when_it_is_ready_and_its_csid_exists_at_the_later_moment() {
        let names = Arc::new(Names::new(2));
        let mut p = SpokeProgress::new(names);
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        // The ClusterSPIFFEID alone is not convergence.
        p.on_csid("ADDED", &csid(0), t(10));
        assert_eq!(p.converged_at(), vec![None, None]);
        // Neither is Ready alone.
        p.on_binding(
            "MODIFIED",
            &binding(1, 1, Some(("True", "Compiled", 1))),
            t(15),
        );
        assert_eq!(p.converged_at(), vec![None, None]);
        p.on_binding(
            "MODIFIED",
            &binding(0, 1, Some(("True", "Compiled", 1))),
            t(20),
        );
        assert_eq!(p.converged_at(), vec![Some(t(20)), None]);
        assert!(!p.done());
        // A later event for an already Ready binding does not move its moment.
        p.on_binding(
            "MODIFIED",
            &binding(0, 1, Some(("True", "Compiled", 1))),
            t(25),
        );
        p.on_csid("ADDED", &csid(1), t(30));
        assert!(p.done());
        assert_eq!(p.converged_at(), vec![Some(t(20)), Some(t(30))]);
        // Losing either half un-converges it, and says what is missing.
        p.on_csid("DELETED", &csid(1), t(40));
        assert!(!p.done());
        assert_eq!(p.missing(), vec![(1, "Ready, no ClusterSPIFFEID".into())]);
        p.on_binding(
            "MODIFIED",
            &binding(0, 2, Some(("False", "Conflict", 2))),
            t(50),
        );
        assert_eq!(
            p.missing(),
            vec![
                (0, "Ready=False (Conflict), ClusterSPIFFEID exists".into()),
                (1, "Ready, no ClusterSPIFFEID".into())
            ]
        );
    }

    #[test]
    fn other_objects_are_ignored() {
        let mut p = SpokeProgress::new(Arc::new(Names::new(1)));
        let now = Instant::now();
        p.on_csid("ADDED", &json!({"metadata": {"name": "someone-else"}}), now);
        let mut other_ns = binding(0, 1, Some(("True", "Compiled", 1)));
        other_ns["metadata"]["namespace"] = json!("elsewhere");
        p.on_binding("MODIFIED", &other_ns, now);
        p.on_csid("ADDED", &csid(0), now);
        assert!(!p.done());
        assert_eq!(
            p.missing(),
            vec![(0, "not Ready, ClusterSPIFFEID exists".into())]
        );
    }
}
