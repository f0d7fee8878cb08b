//! Which of a pod's entries each container can obtain: the SPIRE agent's Kubernetes
//! workload attestor issues an entry to a workload whose selectors include every selector
//! of the entry. Selectors kleym can evaluate from the pod are checked; any other selector
//! leaves the answer "depends" rather than a guess.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::KeptEntry;

/// Whether one entry applies to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "applies"
)]
pub enum Applies {
    /// Every selector holds for the container.
    Yes,
    /// This selector does not hold.
    No {
        /// The selector.
        selector: String,
    },
    /// These selectors are not evaluated by kleym (the agent decides).
    Depends {
        /// The selectors.
        selectors: Vec<String>,
    },
}

/// One container and the SPIFFE IDs it can obtain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSvids {
    /// Container name.
    pub container: String,
    /// Whether it is an init container.
    pub init: bool,
    /// Per entry (by SPIFFE ID), whether it applies.
    pub entries: Vec<ContainerEntry>,
    /// The SPIFFE IDs the container gets for certain.
    pub svids: Vec<String>,
}

/// One entry seen from one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEntry {
    /// The entry's SPIFFE ID.
    pub spiffe_id: String,
    /// The object that declares it.
    pub declared_by: String,
    /// Whether it applies.
    #[serde(flatten)]
    pub applies: Applies,
}

/// Evaluate `entries` for every container of `pod`.
pub fn per_container(pod: &Pod, entries: &[KeptEntry]) -> Vec<ContainerSvids> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    let main = spec.containers.iter().map(|c| (c, false));
    main.chain(init)
        .map(|(c, init)| {
            let image = c.image.clone().unwrap_or_default();
            let mut out = Vec::new();
            let mut svids = Vec::new();
            for e in entries {
                let applies = applies(pod, &c.name, &image, &e.entry.selectors);
                if applies == Applies::Yes && !svids.contains(&e.entry.spiffe_id) {
                    svids.push(e.entry.spiffe_id.clone());
                }
                out.push(ContainerEntry {
                    spiffe_id: e.entry.spiffe_id.clone(),
                    declared_by: e.declared_by.clone(),
                    applies,
                });
            }
            ContainerSvids {
                container: c.name.clone(),
                init,
                entries: out,
                svids,
            }
        })
        .collect()
}

fn applies(pod: &Pod, container: &str, image: &str, selectors: &[String]) -> Applies {
    let spec = pod.spec.as_ref();
    let mut unknown = Vec::new();
    for s in selectors {
        let Some(rest) = s.strip_prefix("k8s:") else {
            unknown.push(s.clone());
            continue;
        };
        let Some((kind, value)) = rest.split_once(':') else {
            unknown.push(s.clone());
            continue;
        };
        let holds = match kind {
            "ns" => Some(pod.namespace().unwrap_or_default() == value),
            "sa" => Some(
                spec.and_then(|s| s.service_account_name.as_deref())
                    .unwrap_or("default")
                    == value,
            ),
            "pod-uid" => Some(pod.uid().unwrap_or_default() == value),
            "pod-name" => Some(pod.name_any() == value),
            "node-name" => Some(spec.and_then(|s| s.node_name.as_deref()) == Some(value)),
            "container-name" => Some(container == value),
            // The agent also matches the image ID from the pod's status; equality with the
            // spec's image is the common case, anything else is left to the agent.
            "container-image" if image == value => Some(true),
            "pod-label" => value
                .split_once(':')
                .map(|(k, v)| pod.labels().get(k).map(String::as_str) == Some(v)),
            _ => None,
        };
        match holds {
            Some(true) => {}
            Some(false) => {
                return Applies::No {
                    selector: s.clone(),
                };
            }
            None => unknown.push(s.clone()),
        }
    }
    if unknown.is_empty() {
        Applies::Yes
    } else {
        Applies::Depends { selectors: unknown }
    }
}
