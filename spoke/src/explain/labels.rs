//! `metav1.LabelSelector` evaluated as `metav1.LabelSelectorAsSelector` does: every
//! `matchLabels` pair and every `matchExpressions` requirement must hold; an empty selector
//! selects everything; an unknown operator or a malformed requirement makes the whole
//! selector invalid (SPIRE Controller Manager then skips the ClusterSPIFFEID).

use std::collections::BTreeMap;

use kleym_api::external::spiffeid::LabelSelector;

/// Why a selector is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector: {0}")]
pub struct SelectorError(pub String);

/// Whether `selector` selects an object with `labels`.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == Some(v));
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        let holds = match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError(format!(
                    "operator {} on key {:?} needs at least one value",
                    req.operator, req.key
                )));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError(format!(
                    "operator {} on key {:?} takes no values",
                    req.operator, req.key
                )));
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(SelectorError(format!(
                    "{other:?} is not a valid label selector operator"
                )));
            }
        };
        ok &= holds;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn requirements_hold_as_in_kubernetes() {
        let labels: BTreeMap<String, String> =
            [("app".to_string(), "a".to_string())].into_iter().collect();
        let cases = [
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: Some([("app", "a")].into_iter().collect()),
                    match_expressions: None,
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some([("app", "b")].into_iter().collect()),
                    match_expressions: None,
                },
                false,
            ),
            (
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![req("tier", "NotIn", &["x"])]),
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![req("app", "In", &["b", "c"])]),
                },
                false,
            ),
            (
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![req("tier", "DoesNotExist", &[])]),
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![req("app", "Exists", &[])]),
                },
                true,
            ),
        ];
        for (sel, want) in cases {
            assert_eq!(matches(&sel, &labels), Ok(want), "{sel:?}");
        }
    }

    #[test]
    fn malformed_requirements_are_errors() {
        for r in [
            req("a", "Gt", &["1"]),
            req("a", "In", &[]),
            req("a", "Exists", &["x"]),
        ] {
            let sel = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![r]),
            };
            assert!(matches(&sel, &BTreeMap::new()).is_err(), "{sel:?}");
        }
    }
}
