//! Label selector matching (`matchLabels` and `matchExpressions`), as apimachinery's
//! `LabelSelectorAsSelector`: an empty selector matches everything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` satisfy `selector`. Unknown operators match nothing (kube rejects them
/// at validation, so a stored selector never has one).
pub fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selector_table() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        let cases = [
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("a", "1")])),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("a", "2")])),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("a", "In", &["1", "3"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("a", "NotIn", &["1"])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("c", "NotIn", &["1"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("b", "Exists", &[])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("b", "DoesNotExist", &[])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("b", "Bogus", &[])]),
                    ..Default::default()
                },
                false,
            ),
        ];
        for (i, (selector, want)) in cases.iter().enumerate() {
            assert_eq!(label_selector_matches(selector, &l), *want, "case {i}");
        }
    }
}
