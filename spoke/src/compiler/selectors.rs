//! Workload selectors and the safety proofs that keep a binding inside its namespace.
//!
//! SPIRE ANDs an entry's selectors, so extra selectors only narrow. Confinement therefore
//! rests on (a) exactly one `k8s:ns:<namespace>` and no other `k8s:ns:`, (b) exactly one
//! non-empty `k8s:sa:<name>`, (c) a non-empty pool selector, and (d) no template selector
//! contradicting the pool labels or the container discriminator (which would make the
//! registered selection something other than "the referenced pool's pods").

use std::collections::BTreeSet;

use kleym_api::label_map::LabelMap;
use kleym_api::{ContainerDiscriminator, DiscriminatorType, IdentityMode};

use super::refusal::{Reason, Refusal};

/// `k8s:ns:` prefix.
pub const NS_PREFIX: &str = "k8s:ns:";
/// `k8s:sa:` prefix.
pub const SA_PREFIX: &str = "k8s:sa:";
/// `k8s:pod-label:` prefix.
pub const POD_LABEL_PREFIX: &str = "k8s:pod-label:";
/// `k8s:container-name:` prefix.
pub const CONTAINER_NAME_PREFIX: &str = "k8s:container-name:";
/// `k8s:container-image:` prefix.
pub const CONTAINER_IMAGE_PREFIX: &str = "k8s:container-image:";

/// Split a selector `type:value` at the first `:` as SPIRE Controller Manager does; both
/// parts must be non-empty.
pub fn parse_selector(selector: &str) -> Option<(&str, &str)> {
    let (ty, value) = selector.split_once(':')?;
    (!ty.is_empty() && !value.is_empty()).then_some((ty, value))
}

/// RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Kubernetes' DNS-1123 subdomain (object names, ServiceAccount names): dot-separated
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` parts, at most 253 characters in total (Kubernetes does
/// not limit each part to 63).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_subdomain_part)
}

/// A DNS name for an SVID SAN: a DNS-1123 subdomain whose labels are at most 63
/// characters.
pub fn is_dns_name(s: &str) -> bool {
    is_dns1123_subdomain(s) && s.split('.').all(is_dns1123_label)
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Kubernetes label key: `[prefix/]name`.
pub fn is_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_label_name(name),
        None => is_label_name(key),
    }
}

/// Kubernetes label value: empty or a label name.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

/// `k8s:pod-label:<k>:<v>` for each pool label, refusing an empty or invalid selector.
pub fn pool_label_selectors(pool_desc: &str, labels: &LabelMap) -> Result<Vec<String>, Refusal> {
    if labels.is_empty() {
        return Err(Refusal::new(
            Reason::EmptyPoolSelector,
            format!(
                "{pool_desc} spec.selector is empty: it would select every pod in the namespace, so the identity cannot be tied to the pool"
            ),
        ));
    }
    labels
        .iter()
        .map(|(k, v)| {
            if !is_label_key(k) || !is_label_value(v) {
                return Err(Refusal::new(
                    Reason::InvalidPoolSelector,
                    format!("{pool_desc} spec.selector has an invalid label {k:?}: {v:?}"),
                ));
            }
            Ok(format!("{POD_LABEL_PREFIX}{k}:{v}"))
        })
        .collect()
}

/// The pool label `(key, value)` a `k8s:pod-label:<k>:<v>` selector stands for (the inverse
/// of [`pool_label_selectors`]; label keys and values never contain `:`), or `None` for any
/// other selector.
pub fn parse_pool_label_selector(selector: &str) -> Option<(&str, &str)> {
    selector.strip_prefix(POD_LABEL_PREFIX)?.split_once(':')
}

/// `k8s:container-name:<v>` / `k8s:container-image:<v>`: the selector a container
/// discriminator renders to (unchecked; [`discriminator_selector`] checks the value).
pub fn container_selector(discriminator: &ContainerDiscriminator) -> String {
    let prefix = match discriminator.type_ {
        DiscriminatorType::ContainerName => CONTAINER_NAME_PREFIX,
        DiscriminatorType::ContainerImage => CONTAINER_IMAGE_PREFIX,
    };
    format!("{prefix}{}", discriminator.value)
}

/// Whether `s` is a plausible container image reference: `[A-Za-z0-9._:/@+-]`, at most 512
/// characters, starting with an alphanumeric.
pub fn is_image_reference(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 512
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'+' | b'-')
        })
}

/// The container selector for `mode`, checking the discriminator is present exactly when
/// required and well-formed.
pub fn discriminator_selector(
    binding_desc: &str,
    mode: IdentityMode,
    discriminator: Option<&ContainerDiscriminator>,
) -> Result<Option<String>, Refusal> {
    match (mode, discriminator) {
        (IdentityMode::PoolOnly, None) => Ok(None),
        (IdentityMode::PoolOnly, Some(_)) => Err(Refusal::new(
            Reason::InvalidContainerDiscriminator,
            format!(
                "{binding_desc}: spec.containerDiscriminator must not be set when spec.mode is PoolOnly"
            ),
        )),
        (IdentityMode::PerObjective, None) => Err(Refusal::new(
            Reason::MissingContainerDiscriminator,
            format!(
                "{binding_desc}: spec.containerDiscriminator is required when spec.mode is PerObjective"
            ),
        )),
        (IdentityMode::PerObjective, Some(d)) => match d.type_ {
            DiscriminatorType::ContainerName if is_dns1123_label(&d.value) => {
                Ok(Some(container_selector(d)))
            }
            DiscriminatorType::ContainerImage if is_image_reference(&d.value) => {
                Ok(Some(container_selector(d)))
            }
            DiscriminatorType::ContainerName => Err(Refusal::new(
                Reason::InvalidContainerDiscriminator,
                format!(
                    "{binding_desc}: spec.containerDiscriminator.value {:?} is not a valid container name (RFC 1123 label)",
                    d.value
                ),
            )),
            DiscriminatorType::ContainerImage => Err(Refusal::new(
                Reason::InvalidContainerDiscriminator,
                format!(
                    "{binding_desc}: spec.containerDiscriminator.value {:?} is not a valid image reference",
                    d.value
                ),
            )),
        },
    }
}

/// What the proof established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The one service account the identity is confined to.
    pub service_account: String,
}

/// Prove that the rendered template selectors confine the identity to `namespace`, the
/// pool's pods and (PerObjective) the discriminated container. `rendered` pairs each
/// rendered selector with the index of its template, for messages.
pub fn prove_confinement(
    binding_desc: &str,
    namespace: &str,
    rendered: &[(usize, String)],
    pool_labels: &LabelMap,
    container_selector: Option<&str>,
) -> Result<Confinement, Refusal> {
    let field = |i: usize| format!("spec.workloadSelectorTemplates[{i}]");
    let mut service_accounts = BTreeSet::new();
    let mut has_ns = false;
    for (i, sel) in rendered {
        // Braces never reach SPIRE Controller Manager, which would render them as a template.
        if parse_selector(sel).is_none() || sel.contains(['{', '}']) {
            return Err(Refusal::new(
                Reason::InvalidSelector,
                format!(
                    "{binding_desc}: {} renders to {sel:?}, which is not a \"type:value\" selector",
                    field(*i)
                ),
            ));
        }
        if let Some(ns) = sel.strip_prefix(NS_PREFIX) {
            if ns != namespace {
                return Err(Refusal::new(
                    Reason::ForeignNamespaceSelector,
                    format!(
                        "{binding_desc}: {} renders to {sel:?}; the only namespace selector allowed is \"{NS_PREFIX}{namespace}\"",
                        field(*i)
                    ),
                ));
            }
            has_ns = true;
        } else if let Some(sa) = sel.strip_prefix(SA_PREFIX) {
            if sa.is_empty() {
                return Err(Refusal::new(
                    Reason::MissingServiceAccountSelector,
                    format!(
                        "{binding_desc}: {} renders to an empty \"{SA_PREFIX}\"; a non-empty ServiceAccount name is required",
                        field(*i)
                    ),
                ));
            }
            if !is_dns1123_subdomain(sa) {
                return Err(Refusal::new(
                    Reason::InvalidServiceAccountSelector,
                    format!(
                        "{binding_desc}: {} renders to {sel:?}, which does not name a valid ServiceAccount",
                        field(*i)
                    ),
                ));
            }
            service_accounts.insert(sa.to_string());
        } else if let Some(label) = sel.strip_prefix(POD_LABEL_PREFIX) {
            if let Some((k, v)) = label.split_once(':')
                && let Some(pool_value) = pool_labels.get(k)
                && pool_value != v
            {
                return Err(Refusal::new(
                    Reason::UnprovableSelector,
                    format!(
                        "{binding_desc}: {} renders to {sel:?}, contradicting the pool's label {k}={pool_value}",
                        field(*i)
                    ),
                ));
            }
        } else if (sel.starts_with(CONTAINER_NAME_PREFIX)
            || sel.starts_with(CONTAINER_IMAGE_PREFIX))
            && Some(sel.as_str()) != container_selector
        {
            return Err(Refusal::new(
                Reason::UnprovableSelector,
                format!(
                    "{binding_desc}: {} renders to {sel:?}; container selectors come only from spec.containerDiscriminator",
                    field(*i)
                ),
            ));
        }
    }
    if service_accounts.is_empty() {
        return Err(Refusal::new(
            Reason::MissingServiceAccountSelector,
            format!(
                "{binding_desc}: spec.workloadSelectorTemplates must render exactly one non-empty \"{SA_PREFIX}<name>\""
            ),
        ));
    }
    if !has_ns {
        return Err(Refusal::new(
            Reason::MissingNamespaceSelector,
            format!(
                "{binding_desc}: spec.workloadSelectorTemplates must render \"{NS_PREFIX}{namespace}\""
            ),
        ));
    }
    if service_accounts.len() > 1 {
        return Err(Refusal::new(
            Reason::AmbiguousServiceAccountSelector,
            format!(
                "{binding_desc}: spec.workloadSelectorTemplates render several service accounts ({}); exactly one is allowed",
                service_accounts.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let service_account = service_accounts.into_iter().next().unwrap_or_default();
    Ok(Confinement { service_account })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_syntax() {
        assert!(is_label_key("app"));
        assert!(is_label_key("app.kubernetes.io/name"));
        assert!(!is_label_key("a:b"));
        assert!(!is_label_key("/x"));
        assert!(!is_label_key("-x"));
        assert!(is_label_value(""));
        assert!(!is_label_value("a:b"));
        assert!(is_dns1123_label("vllm-0"));
        assert!(!is_dns1123_label("Vllm"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_image_reference("ghcr.io/org/vllm:1.0@sha256:abc"));
        assert!(!is_image_reference("vllm {{ .X }}"));
        assert!(!is_image_reference(":tag"));
    }

    /// The snapshot reads the pool labels back from the rendered selectors, and the report
    /// renders the discriminator as the compiler does: both must be exact inverses.
    #[test]
    fn pool_labels_and_container_selectors_round_trip() {
        let labels = LabelMap::from([
            ("app".to_string(), "vllm".to_string()),
            ("example.com/tier".to_string(), "gpu".to_string()),
        ]);
        let rendered = pool_label_selectors("pool", &labels).unwrap();
        let back: LabelMap = rendered
            .iter()
            .filter_map(|s| parse_pool_label_selector(s))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(back, labels);
        assert_eq!(parse_pool_label_selector("k8s:sa:vllm"), None);
        for (type_, value, want) in [
            (
                DiscriminatorType::ContainerName,
                "vllm",
                "k8s:container-name:vllm",
            ),
            (
                DiscriminatorType::ContainerImage,
                "ghcr.io/o/vllm:1.0",
                "k8s:container-image:ghcr.io/o/vllm:1.0",
            ),
        ] {
            let d = ContainerDiscriminator {
                type_,
                value: value.to_string(),
            };
            assert_eq!(container_selector(&d), want);
            let checked = discriminator_selector("b", IdentityMode::PerObjective, Some(&d));
            assert_eq!(checked.unwrap().as_deref(), Some(want));
        }
    }

    #[test]
    fn parse_selector_splits_at_first_colon() {
        assert_eq!(
            parse_selector("k8s:container-name:x"),
            Some(("k8s", "container-name:x"))
        );
        assert_eq!(parse_selector("k8s:"), None);
        assert_eq!(parse_selector(":x"), None);
        assert_eq!(parse_selector("nocolon"), None);
    }
}
