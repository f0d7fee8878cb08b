//! The pure half of compiling a namespace: the verdict per binding ([`BindingDecision`]),
//! the namespace evaluation shared by its reconciles ([`NamespaceEvaluation`]) and the
//! memo of per-binding compile results ([`CompileMemo`]). No caches and no I/O: the
//! dereference that feeds it is [`super::compile`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kleym_api::external::spiffeid::ClusterSPIFFEIDSpec;
use kleym_api::label_map::LabelMap;
use kleym_api::{ComputedSpiffeId, ConflictPeer, IdentityWarning};

use super::queue::ObjectKey;
use crate::compiler::{
    self, BindingInput, BindingRef, ClusterConfig, ForeignSpiffeId, NamespaceLabels, Refusal,
};

/// What the binding's ClusterSPIFFEID should be.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredOutput {
    /// Deterministic object name.
    pub name: String,
    /// The spec.
    pub spec: ClusterSPIFFEIDSpec,
    /// Labels kleym sets (`kleym.io/managed-by`, binding namespace and name).
    pub labels: LabelMap,
}

/// What the reconciler decided for one binding: the output to apply (or the refusal)
/// and what its status shows.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDecision {
    /// The ClusterSPIFFEID to have, or `None` when refused. Boxed: an evaluation keeps a
    /// decision per binding with no output (its findings), and inline the output's spec
    /// made each of them about 350 bytes larger.
    pub output: Option<Box<DesiredOutput>>,
    /// The refusal, or `None` when the output is good.
    pub refusal: Option<Refusal>,
    /// Computed SPIFFE IDs (also shown when refused by a conflict, to explain it).
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// Rendered selectors.
    pub rendered_selectors: Vec<String>,
    /// Conflict peers.
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings.
    pub warnings: Vec<IdentityWarning>,
}

impl BindingDecision {
    /// The SPIFFE IDs, for messages.
    pub fn spiffe_id_summary(&self) -> String {
        spiffe_id_summary(&self.computed_spiffe_ids)
    }
}

/// The SPIFFE IDs of `ids`, comma-separated, for messages.
pub fn spiffe_id_summary(ids: &[ComputedSpiffeId]) -> String {
    ids.iter()
        .map(|c| c.spiffe_id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a cache lookup saw, for the compile memo: the group and resourceVersion of the
/// object found, or why nothing was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenFp {
    /// Found: group and resourceVersion.
    Found(&'static str, String),
    /// Served, absent.
    NotFound,
    /// Not served.
    CrdNotServed,
}

/// Everything a binding's compile result depends on besides the (fixed) cluster config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFingerprint {
    pub(crate) binding_uid: Option<String>,
    pub(crate) binding_generation: Option<i64>,
    pub(crate) target: SeenFp,
    pub(crate) pool: SeenFp,
}

/// A namespace's evaluation: each live binding's namespace-wide verdict and compile
/// result. Peers are read for their findings only; [`Self::verdict`] builds the output of
/// the one binding being reconciled (cloning every peer's ClusterSPIFFEID spec per
/// reconcile dominated large namespaces).
#[derive(Debug, Default)]
pub struct NamespaceEvaluation {
    bindings: BTreeMap<String, Evaluated>,
    /// Which bindings' statuses must still be compared with these findings (see
    /// [`Self::take_peers_to_check`]).
    peer_checks: Mutex<PeerChecks>,
}

/// The bindings whose recorded findings may differ from an evaluation's without anyone
/// having looked since. Whether a peer's status matches its findings only changes when
/// the findings change (a new evaluation: every binding is unchecked) or its status does
/// (a write, ours or not, marks it): comparing every peer on every reconcile made a burst
/// of reconciles quadratic in the namespace.
#[derive(Debug, Default)]
enum PeerChecks {
    /// Nothing compared yet.
    #[default]
    All,
    /// Only these (statuses changed since the last comparison, or peers left to their
    /// retry).
    Only(HashSet<String>),
}

#[derive(Debug)]
struct Evaluated {
    /// The namespace-wide part of the verdict: refusal, conflict peers and warnings. What
    /// the compiled identity holds (output, SPIFFE IDs, selectors) is left empty and added
    /// by [`Self::verdict`], so an evaluation keeps one copy of it, not two. `None` when
    /// there is nothing to say ([`NO_FINDINGS`]): most bindings, and a decision is about
    /// 190 bytes of empty lists and options per binding of every spoke.
    findings: Option<Box<BindingDecision>>,
    compiled: Arc<CompileResult>,
}

/// The findings of a binding with no refusal, no conflict peer and no warning.
pub(crate) static NO_FINDINGS: BindingDecision = BindingDecision {
    output: None,
    refusal: None,
    computed_spiffe_ids: Vec::new(),
    rendered_selectors: Vec::new(),
    conflict_peers: Vec::new(),
    warnings: Vec::new(),
};

impl Evaluated {
    fn new(findings: BindingDecision, compiled: Arc<CompileResult>) -> Self {
        let findings = (findings != NO_FINDINGS).then(|| Box::new(findings));
        Self { findings, compiled }
    }

    fn findings(&self) -> &BindingDecision {
        self.findings.as_deref().unwrap_or(&NO_FINDINGS)
    }

    fn verdict(&self) -> BindingDecision {
        let mut verdict = self.findings().clone();
        if let Ok(id) = self.compiled.as_ref() {
            // Shown even when refused by a conflict, to explain it.
            verdict.computed_spiffe_ids = vec![ComputedSpiffeId {
                mode: id.mode,
                spiffe_id: id.spiffe_id().to_string(),
            }];
            verdict.rendered_selectors = id.selectors().to_vec();
            if verdict.refusal.is_none() {
                verdict.output = Some(Box::new(DesiredOutput {
                    name: id.output_name(),
                    spec: id.output.spec.clone(),
                    labels: id.output_labels(),
                }));
            }
        }
        verdict
    }
}

impl NamespaceEvaluation {
    /// The full verdict (output included) of the binding `name`, if it is live.
    pub fn verdict(&self, name: &str) -> Option<BindingDecision> {
        self.bindings.get(name).map(Evaluated::verdict)
    }

    /// Every binding's namespace-wide findings, by name: the verdict with only its
    /// refusal, conflict peers and warnings (output, SPIFFE IDs and selectors empty; see
    /// [`Self::verdict`]).
    pub fn findings(&self) -> impl Iterator<Item = (&String, &BindingDecision)> {
        self.bindings.iter().map(|(name, e)| (name, e.findings()))
    }

    /// Every binding's full verdict, by name.
    pub fn verdicts(&self) -> BTreeMap<String, BindingDecision> {
        self.bindings
            .iter()
            .map(|(name, e)| (name.clone(), e.verdict()))
            .collect()
    }

    /// Number of live bindings evaluated.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// True when the namespace has no live binding.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// The findings of the bindings whose status has not been compared with them since
    /// it last changed (all of them on first use), and forgets them: the caller compares
    /// and enqueues. Peers it could not act on go back with [`Self::check_again`].
    pub fn take_peers_to_check(&self) -> Vec<(&String, &BindingDecision)> {
        let taken = std::mem::replace(&mut *self.lock_checks(), PeerChecks::Only(HashSet::new()));
        match taken {
            PeerChecks::All => self.findings().collect(),
            PeerChecks::Only(names) => names
                .iter()
                .filter_map(|n| self.bindings.get_key_value(n.as_str()))
                .map(|(name, e)| (name, e.findings()))
                .collect(),
        }
    }

    /// Has the binding `name` compared again on the next [`Self::take_peers_to_check`]:
    /// its status changed, or it was left to its retry. Names this evaluation does not
    /// hold are ignored.
    pub fn check_again(&self, name: &str) {
        if !self.bindings.contains_key(name) {
            return;
        }
        if let PeerChecks::Only(names) = &mut *self.lock_checks()
            && !names.contains(name)
        {
            names.insert(name.to_string());
        }
    }

    /// An evaluation holding `findings` as they are, for tests of what reads them.
    #[cfg(test)]
    pub(crate) fn from_findings(
        findings: impl IntoIterator<Item = (String, BindingDecision)>,
    ) -> Self {
        let refused: Arc<CompileResult> = Arc::new(Err(Refusal::new(
            compiler::Reason::IdentityCollision,
            "test",
        )));
        let bindings = findings
            .into_iter()
            .map(|(name, findings)| {
                let compiled = Arc::clone(&refused);
                (name, Evaluated::new(findings, compiled))
            })
            .collect();
        Self {
            bindings,
            peer_checks: Mutex::default(),
        }
    }

    fn lock_checks(&self) -> std::sync::MutexGuard<'_, PeerChecks> {
        // Poisoning only means a panic elsewhere; the set stays consistent.
        self.peer_checks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Memo of compile results per binding, valid while the binding's inputs (binding
/// generation, target and pool resourceVersions, served APIs) are unchanged: a reconcile
/// compiles its namespace peers only when they changed.
#[derive(Debug, Default)]
pub struct CompileMemo(Mutex<HashMap<ObjectKey, MemoEntry>>);

pub(crate) type CompileResult = Result<compiler::CompiledIdentity, Refusal>;

/// Shared so a hit costs a reference count, not a deep clone of the identity.
type MemoEntry = (InputFingerprint, Arc<CompileResult>);

impl CompileMemo {
    /// The memoised result for `key` if `fp` matches, else `compile()` (remembered).
    pub fn get_or_compile(
        &self,
        key: &ObjectKey,
        fp: InputFingerprint,
        compile: impl FnOnce() -> Result<compiler::CompiledIdentity, Refusal>,
    ) -> Result<compiler::CompiledIdentity, Refusal> {
        (*self.get_or_compile_shared(key, fp, compile)).clone()
    }

    /// [`Self::get_or_compile`] without cloning the result.
    pub fn get_or_compile_shared(
        &self,
        key: &ObjectKey,
        fp: InputFingerprint,
        compile: impl FnOnce() -> CompileResult,
    ) -> Arc<CompileResult> {
        if let Some((seen, result)) = self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key)
            && *seen == fp
        {
            return Arc::clone(result);
        }
        let result = Arc::new(compile());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), (fp, Arc::clone(&result)));
        result
    }

    /// Forgets a deleted binding.
    pub fn forget(&self, key: &ObjectKey) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// The pure part: compile each binding, analyse the namespace, merge into verdicts. Every
/// output counts as not created yet ([`compiler::OutputPrecedence`]).
pub fn compile_namespace(
    inputs: &[BindingInput],
    config: &ClusterConfig,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
) -> BTreeMap<String, BindingDecision> {
    compile_namespace_observed(
        inputs,
        config,
        foreign,
        namespaces,
        &compiler::OutputPrecedence::new(),
    )
}

/// [`compile_namespace`] knowing when the bindings' outputs were created.
pub fn compile_namespace_observed(
    inputs: &[BindingInput],
    config: &ClusterConfig,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
    outputs: &compiler::OutputPrecedence,
) -> BTreeMap<String, BindingDecision> {
    let results = inputs
        .iter()
        .map(|i| (i.clone(), Arc::new(compiler::compile(i, config))))
        .collect();
    merge(results, foreign, namespaces, outputs).verdicts()
}

/// Merges compile results with the namespace analysis.
pub(crate) fn merge(
    results: Vec<(BindingInput, Arc<CompileResult>)>,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
    outputs: &compiler::OutputPrecedence,
) -> NamespaceEvaluation {
    let compiled: Vec<&compiler::CompiledIdentity> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().as_ref().ok())
        .collect();
    let analysis = compiler::analyze_observed(&compiled, foreign, namespaces, outputs);
    let bindings = results
        .into_iter()
        .map(|(input, compiled)| {
            let findings = match compiled.as_ref() {
                Err(refusal) => BindingDecision {
                    output: None,
                    refusal: Some(refusal.clone()),
                    computed_spiffe_ids: Vec::new(),
                    rendered_selectors: Vec::new(),
                    conflict_peers: Vec::new(),
                    warnings: Vec::new(),
                },
                Ok(_) => {
                    let bref = BindingRef {
                        namespace: input.namespace,
                        name: input.name.clone(),
                    };
                    let findings = analysis.verdict(&bref);
                    BindingDecision {
                        output: None,
                        refusal: findings.refusal(&bref),
                        // From the compiled identity, in `Evaluated::verdict`.
                        computed_spiffe_ids: Vec::new(),
                        rendered_selectors: Vec::new(),
                        conflict_peers: findings.conflict_peers(),
                        warnings: findings.status_warnings(),
                    }
                }
            };
            (input.name, Evaluated::new(findings, compiled))
        })
        .collect();
    NamespaceEvaluation {
        bindings,
        peer_checks: Mutex::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_with_nothing_to_report_keeps_no_findings_of_its_own() {
        let refused: Arc<CompileResult> = Arc::new(Err(Refusal::new(
            compiler::Reason::IdentityCollision,
            "test",
        )));
        let clean = Evaluated::new(NO_FINDINGS.clone(), Arc::clone(&refused));
        assert!(clean.findings.is_none());
        assert_eq!(clean.findings(), &NO_FINDINGS);

        let mut warned = NO_FINDINGS.clone();
        warned.warnings.push(IdentityWarning {
            reason: "OverlappingDefaultIdentity".into(),
            message: "m".into(),
        });
        let kept = Evaluated::new(warned.clone(), refused);
        assert_eq!(kept.findings(), &warned);
        assert_eq!(kept.verdict(), warned, "a refused compile adds nothing");
    }
}
