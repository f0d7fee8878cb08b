//! The model's templates rendered for "every pod of a pool" rather than for one pod.
//!
//! The spoke reconciler watches no pods: a pod watch in every spoke would hold every pod of
//! the fleet in the hub's memory (5000 spokes), for a report that needs only what every pod
//! of a pool has in common. So the report's masking and several-SVID analysis
//! (`crate::compiler::collisions`) reasons about the pool's pods as kleym knows them: their
//! namespace, the pool's labels (every pod the pool selects carries them; any other label is
//! unknown), the one service account the binding confines its identity to, and the trust
//! domain kleym compiles into (which must be the controller manager's, or no kleym entry
//! would render).
//!
//! A template is rendered for those pods only when it reads nothing else: the result is then
//! the same for every pod of the pool, and a finding built on it holds for all of them. A
//! template that reads anything else (the pod's name or UID, its node, a label the pool does
//! not fix, the cluster name) has no such value, and no finding is claimed from it.

use kleym_api::label_map::LabelMap;

use super::gotemplate::{GoTemplateError, render_with};

/// What every pod of one pool is known to have.
#[derive(Debug, Clone, Copy)]
pub struct PoolPods<'a> {
    /// `.TrustDomain`: kleym's trust domain.
    pub trust_domain: &'a str,
    /// The pool's (and the binding's) namespace.
    pub namespace: &'a str,
    /// The service account of the pods the binding's identity selects.
    pub service_account: &'a str,
    /// The pool's `matchLabels`: labels every pod of the pool carries.
    pub labels: &'a LabelMap,
}

impl PoolPods<'_> {
    /// `template` rendered for every pod of the pool, or `None` when its value depends on
    /// something kleym does not know of them (or the template does not render at all).
    pub fn render(&self, template: &str) -> Option<String> {
        render_with(template, |action| {
            self.value(action)
                .map(str::to_string)
                .ok_or_else(|| GoTemplateError::Unsupported(action.to_string()))
        })
        .ok()
    }

    /// The value of one action, such as `.PodMeta.Namespace`, when it is known.
    fn value(&self, action: &str) -> Option<&str> {
        match action {
            ".TrustDomain" => Some(self.trust_domain),
            ".PodMeta.Namespace" => Some(self.namespace),
            ".PodSpec.ServiceAccountName" => Some(self.service_account),
            _ => {
                // A label key with a dot would be read by Go as a nested field access, not
                // as the key: only plain keys are looked up.
                let key = action.strip_prefix(".PodMeta.Labels.")?;
                if key.contains('.') {
                    return None;
                }
                self.labels.get(key)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_only_what_every_pod_of_the_pool_has() {
        let labels = LabelMap::from([("app".to_string(), "vllm".to_string())]);
        let pods = PoolPods {
            trust_domain: "td.example",
            namespace: "team",
            service_account: "model",
            labels: &labels,
        };
        let known = [
            (
                "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{.PodSpec.ServiceAccountName}}",
                "spiffe://td.example/ns/team/sa/model",
            ),
            (
                "k8s:pod-label:app:{{ .PodMeta.Labels.app }}",
                "k8s:pod-label:app:vllm",
            ),
            ("k8s:ns:team", "k8s:ns:team"),
            ("a {{- .PodMeta.Namespace -}} b", "ateamb"),
        ];
        for (template, want) in known {
            assert_eq!(pods.render(template).as_deref(), Some(want), "{template}");
        }
        // Per-pod values, labels the pool does not fix, the cluster's name, bad syntax.
        for template in [
            "k8s:pod-name:{{ .PodMeta.Name }}",
            "k8s:pod-uid:{{ .PodMeta.UID }}",
            "{{ .PodSpec.NodeName }}",
            "{{ .PodMeta.Labels.version }}",
            "{{ .PodMeta.Labels.app.kubernetes }}",
            "spiffe://x/{{ .ClusterName }}",
            "{{ .PodMeta.Namespace | lower }}",
            "{{ .PodMeta.Namespace",
        ] {
            assert_eq!(pods.render(template), None, "{template}");
        }
    }
}
