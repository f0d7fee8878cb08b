//! Field errors rendered exactly like `k8s.io/apimachinery/pkg/util/validation/field`
//! (`ErrorBody`), and the `Invalid` status message and causes built from them
//! (`apierrors.NewInvalid`).

use serde_json::{Number, Value, json};

use crate::{FieldError, FieldErrorKind};

impl FieldErrorKind {
    /// The `CauseType` string kube-apiserver puts in `Status.details.causes[].reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::InternalError => "InternalError",
        }
    }
}

/// A bad value as `field.Error.BadValue` holds it: most are JSON values, a few are the
/// Go strings kube-apiserver passes instead (a type name, the empty string).
pub(crate) fn body(label: &str, value: &Value, detail: &str) -> String {
    let mut s = format!("{label}: {}", go_value(value));
    if !detail.is_empty() {
        s.push_str(": ");
        s.push_str(detail);
    }
    s
}

fn with_detail(label: &str, detail: &str) -> String {
    if detail.is_empty() {
        label.to_string()
    } else {
        format!("{label}: {detail}")
    }
}

impl FieldError {
    fn new(path: &str, kind: FieldErrorKind, detail: String) -> Self {
        FieldError {
            path: path.to_string(),
            kind,
            detail,
        }
    }

    /// `field.Required(path, detail)`.
    pub fn required(path: &str, detail: &str) -> Self {
        Self::new(
            path,
            FieldErrorKind::Required,
            with_detail("Required value", detail),
        )
    }

    /// `field.Invalid(path, value, detail)`.
    pub fn invalid(path: &str, value: &Value, detail: &str) -> Self {
        Self::new(
            path,
            FieldErrorKind::Invalid,
            body("Invalid value", value, detail),
        )
    }

    /// `field.TypeInvalid(path, value, detail)`.
    pub fn type_invalid(path: &str, value: &Value, detail: &str) -> Self {
        Self::new(
            path,
            FieldErrorKind::TypeInvalid,
            body("Invalid value", value, detail),
        )
    }

    /// `field.NotSupported(path, value, validValues)`.
    pub fn not_supported(path: &str, value: &Value, valid: &[String]) -> Self {
        let detail = if valid.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = valid.iter().map(|v| go_quote(v)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(
            path,
            FieldErrorKind::NotSupported,
            body("Unsupported value", value, &detail),
        )
    }

    /// `field.TooLong(path, value, maxLength)`.
    pub fn too_long(path: &str, max: Option<u64>) -> Self {
        let detail = match max {
            Some(1) => "may not be more than 1 byte".to_string(),
            Some(m) => format!("may not be more than {m} bytes"),
            None => "value is too long".to_string(),
        };
        Self::new(
            path,
            FieldErrorKind::TooLong,
            with_detail("Too long", &detail),
        )
    }

    /// `field.TooMany(path, actual, max)`.
    pub fn too_many(path: &str, actual: u64, max: u64) -> Self {
        Self::new(
            path,
            FieldErrorKind::TooMany,
            format!("Too many: {actual}: must have at most {max} items"),
        )
    }

    /// `field.Duplicate(path, value)`.
    pub fn duplicate(path: &str, value: &Value) -> Self {
        Self::new(
            path,
            FieldErrorKind::Duplicate,
            body("Duplicate value", value, ""),
        )
    }

    /// `field.Forbidden(path, detail)`.
    pub fn forbidden(path: &str, detail: &str) -> Self {
        Self::new(
            path,
            FieldErrorKind::Forbidden,
            with_detail("Forbidden", detail),
        )
    }

    /// `field.InternalError(path, err)`.
    pub fn internal(path: &str, detail: &str) -> Self {
        Self::new(
            path,
            FieldErrorKind::InternalError,
            with_detail("Internal error", detail),
        )
    }
}

/// The `message` of kube-apiserver's `Invalid` status: `<Kind>.<group> "<name>" is invalid: ...`,
/// one error as is, several joined with `, ` inside `[...]` (identical messages once).
pub fn invalid_message(kind_group: &str, name: &str, errors: &[FieldError]) -> String {
    let mut msgs: Vec<String> = Vec::with_capacity(errors.len());
    for e in errors {
        let m = e.to_string();
        if !msgs.contains(&m) {
            msgs.push(m);
        }
    }
    let head = format!("{kind_group} {} is invalid", go_quote(name));
    match msgs.len() {
        0 => head,
        1 => format!("{head}: {}", msgs[0]),
        _ => format!("{head}: [{}]", msgs.join(", ")),
    }
}

/// `Status.details.causes` for these errors: `[{reason, message, field}]`.
pub fn causes(errors: &[FieldError]) -> Value {
    Value::Array(
        errors
            .iter()
            .map(|e| {
                json!({
                    "reason": e.kind.reason(),
                    "message": e.detail,
                    "field": e.path,
                })
            })
            .collect(),
    )
}

/// Go's `strconv.Quote` for the characters that matter in Kubernetes messages.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%v` for a float64 (shortest representation, exponent past 1e21).
pub(crate) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e21).contains(&a) {
        // Rust `{:e}` gives `1e21`/`1.5e-5`; Go writes `1e+21`/`1.5e-05`.
        let s = format!("{f:e}");
        if let Some((mant, exp)) = s.split_once('e') {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let digits = if digits.len() < 2 {
                format!("0{digits}")
            } else {
                digits.to_string()
            };
            return format!("{mant}e{sign}{digits}");
        }
        return s;
    }
    format!("{f}")
}

/// Go's `%v` for a JSON number as decoded by kube-apiserver (int64 or float64).
pub(crate) fn go_number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        go_float(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// How `field.Error.ErrorBody` prints a bad value: strings quoted, scalars plain,
/// `nil` as `"null"`, maps and slices with Go's `%#v`.
pub(crate) fn go_value(v: &Value) -> String {
    match v {
        Value::Null => "\"null\"".to_string(),
        Value::String(s) => go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::Array(_) | Value::Object(_) => go_sharp(v),
    }
}

/// Go's `%#v` of an `interface{}` holding decoded JSON.
fn go_sharp(v: &Value) -> String {
    match v {
        Value::Null => "interface {}(nil)".to_string(),
        Value::String(s) => go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(go_sharp).collect();
            format!("[]interface {{}}{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            // Go prints map keys sorted.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", go_quote(k), go_sharp(&map[k])))
                .collect();
            format!("map[string]interface {{}}{{{}}}", inner.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_field_error_body() {
        let e = FieldError::required("spec.spiffeIDTemplate", "");
        assert_eq!(e.to_string(), "spec.spiffeIDTemplate: Required value");
        let e = FieldError::not_supported(
            "spec.mode",
            &json!("Foo"),
            &["PoolOnly".to_string(), "PerObjective".to_string()],
        );
        assert_eq!(
            e.to_string(),
            r#"spec.mode: Unsupported value: "Foo": supported values: "PoolOnly", "PerObjective""#
        );
        assert_eq!(
            FieldError::too_long("spec.name", Some(5)).to_string(),
            "spec.name: Too long: may not be more than 5 bytes"
        );
        assert_eq!(
            FieldError::too_many("spec.p", 9, 8).to_string(),
            "spec.p: Too many: 9: must have at most 8 items"
        );
        assert_eq!(
            FieldError::duplicate("status.conditions[1]", &json!({"type": "Ready"})).to_string(),
            r#"status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Ready"}"#
        );
        assert_eq!(
            FieldError::invalid("<nil>", &Value::Null, "x").to_string(),
            r#"<nil>: Invalid value: "null": x"#
        );
    }

    #[test]
    fn go_formatting_of_values() {
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(100.0), "100");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_quote("a\"b\n"), "\"a\\\"b\\n\"");
        assert_eq!(
            go_value(&json!(["a", 1, null])),
            r#"[]interface {}{"a", 1, interface {}(nil)}"#
        );
    }

    #[test]
    fn invalid_message_shapes() {
        let one = [FieldError::required("spec.a", "")];
        assert_eq!(
            invalid_message("ClusterSPIFFEID.spire.spiffe.io", "x", &one),
            r#"ClusterSPIFFEID.spire.spiffe.io "x" is invalid: spec.a: Required value"#
        );
        let two = [
            FieldError::required("spec.a", ""),
            FieldError::required("spec.b", ""),
            FieldError::required("spec.a", ""),
        ];
        assert_eq!(
            invalid_message("K.g", "n", &two),
            r#"K.g "n" is invalid: [spec.a: Required value, spec.b: Required value]"#
        );
        assert_eq!(invalid_message("K.g", "n", &[]), r#"K.g "n" is invalid"#);
        let c = causes(&one);
        assert_eq!(
            c,
            json!([{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.a"}])
        );
    }
}
