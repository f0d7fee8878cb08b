//! Kubernetes' CEL `format` library (k8s.io/apiserver/pkg/cel/library/format.go):
//! `format.named(name)` → `optional<Format>`, `format.<name>()` → `Format`, and
//! `<Format>.validate(string)` → `optional<list<string>>` (`optional.none()` when valid,
//! the validator's messages otherwise). The validators and their messages are
//! k8s.io/apimachinery's (`validation.IsDNS1123Label` and friends, `content.IsLabelValue`,
//! `IsQualifiedName`) and strfmt's for the CRD formats, as Kubernetes 1.33 words them.

use std::sync::Arc;

use cel::common::types::{STRING_TYPE, Type};
use cel::common::value::CowVal;
use cel::objects::{Opaque, OptionalValue};
use cel::{Env, ExecutionError, Value};

/// The CEL type name of a format value (`apiservercel.FormatType`).
const FORMAT_TYPE_NAME: &str = "kubernetes.NamedFormat";

/// One named format: a CEL opaque value whose `validate` runs [`validate_named`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamedFormat {
    name: &'static str,
}

impl Opaque for NamedFormat {
    fn runtime_type_name(&self) -> &str {
        FORMAT_TYPE_NAME
    }
}

/// The names `format.named` knows, each also a `format.<name>()` constant.
pub(crate) const FORMAT_NAMES: [&str; 13] = [
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `validation.RegexError`.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

/// `validation.MaxLenError`.
fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (with `first` deciding the first character's class).
fn is_label_shaped(s: &str, first: fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            first(*f)
                && (l.is_ascii_lowercase() || l.is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        }
        _ => false,
    }
}

fn lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_subdomain_shaped(s: &str) -> bool {
    s.split('.').all(|l| is_label_shaped(l, lower_alnum))
}

/// `validation.IsDNS1123Label`.
pub(crate) fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is_label_shaped(s, lower_alnum) {
        if is_subdomain_shaped(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `validation.IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !is_subdomain_shaped(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `validation.IsDNS1035Label`.
pub(crate) fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is_label_shaped(s, |c| c.is_ascii_lowercase()) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `maskTrailingDash` of apimachinery's `NameIs*` with `prefix` set: a trailing dash is
/// allowed in a generateName prefix. Upstream replaces the last *two* bytes by `a` (so
/// `ab-` is checked as `aa`); kept as is. A lone `-` is checked unchanged (upstream's
/// older guard; the newest code would index out of range there).
fn mask_trailing_dash(s: &str) -> String {
    if s.len() > 1 && s.ends_with('-') {
        // Both bytes are ASCII-boundary safe only if the byte before the dash is ASCII;
        // otherwise the label check fails anyway, so keep the original string.
        match s.get(..s.len() - 2) {
            Some(head) => format!("{head}a"),
            None => s.to_string(),
        }
    } else {
        s.to_string()
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`: a label key's name part, a non-empty label value.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        }
        _ => false,
    }
}

/// `validation.IsQualifiedName`.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `validation.IsValidLabelValue`.
pub(crate) fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !(s.is_empty() || is_qualified_name_part(s)) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// The messages of the named format's validator for `s` (empty when valid); `None` for an
/// unknown name.
pub(crate) fn validate_named(name: &str, s: &str) -> Option<Vec<String>> {
    let one = |ok: bool, msg: &str| {
        if ok {
            Vec::new()
        } else {
            vec![msg.to_string()]
        }
    };
    Some(match name {
        "dns1123Label" => dns1123_label(s),
        "dns1123Subdomain" => dns1123_subdomain(s),
        "dns1035Label" => dns1035_label(s),
        "qualifiedName" => qualified_name(s),
        "dns1123LabelPrefix" => dns1123_label(&mask_trailing_dash(s)),
        "dns1123SubdomainPrefix" => dns1123_subdomain(&mask_trailing_dash(s)),
        "dns1035LabelPrefix" => dns1035_label(&mask_trailing_dash(s)),
        "labelValue" => label_value(s),
        // `url.ParseRequestURI`'s error, as upstream returns it.
        "uri" => match crate::go_url::parse_request_uri(s) {
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        },
        "uuid" => one(
            crate::formats::check("uuid", s) == Some(true),
            "does not match the UUID format",
        ),
        "byte" => one(
            crate::formats::check("byte", s) == Some(true),
            "invalid base64",
        ),
        "date" => one(
            crate::formats::check("date", s) == Some(true),
            "invalid date",
        ),
        "datetime" => one(
            crate::formats::check("datetime", s) == Some(true),
            "invalid datetime",
        ),
        _ => return None,
    })
}

fn format_value(name: &'static str) -> Value {
    Value::Opaque(Arc::new(NamedFormat { name }))
}

fn ret<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let b: Box<dyn cel::common::value::Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn arg_values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

fn named<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = arg_values(&args)?;
    let Some(Value::String(name)) = a.first() else {
        return Err(ExecutionError::function_error(
            "format.named",
            "expected a string",
        ));
    };
    let found = FORMAT_NAMES.iter().find(|n| **n == name.as_str());
    let opt = match found {
        Some(n) => OptionalValue::of(format_value(n)),
        None => OptionalValue::none(),
    };
    ret(Value::Opaque(Arc::new(opt)))
}

fn validate<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = arg_values(&args)?;
    let format = match a.first() {
        Some(Value::Opaque(o)) => o.downcast_ref::<NamedFormat>().cloned(),
        _ => None,
    };
    let (Some(format), Some(Value::String(s))) = (format, a.get(1)) else {
        return Err(ExecutionError::function_error(
            "validate",
            "no such overload: expected (Format, string)",
        ));
    };
    let errs = validate_named(format.name, s).unwrap_or_default();
    let opt = if errs.is_empty() {
        OptionalValue::none()
    } else {
        OptionalValue::of(Value::List(Arc::new(
            errs.into_iter()
                .map(|e| Value::String(Arc::new(e)))
                .collect(),
        )))
    };
    ret(Value::Opaque(Arc::new(opt)))
}

/// Registers `format.named`, the `format.<name>()` constants and `validate`.
pub(crate) fn add_format_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_overload("format.named", "format-named", vec![STRING_TYPE], named)?;
    // One zero-argument function per name: cel-rust's `Function` is a plain fn pointer, so
    // each constant needs its own item.
    macro_rules! constants {
        ($($name:literal),*) => {$(
            env.add_overload(concat!("format.", $name), concat!("format.", $name), vec![], {
                fn f<'b, 'v>(
                    _args: Vec<CowVal<'b, 'v>>,
                ) -> Result<CowVal<'b, 'v>, ExecutionError> {
                    ret(format_value($name))
                }
                f
            })?;
        )*};
    }
    constants!(
        "dns1123Label",
        "dns1123Subdomain",
        "dns1035Label",
        "qualifiedName",
        "dns1123LabelPrefix",
        "dns1123SubdomainPrefix",
        "dns1035LabelPrefix",
        "labelValue",
        "uri",
        "uuid",
        "byte",
        "date",
        "datetime"
    );
    env.add_member_overload(
        "validate",
        "format-validate",
        Type::new_opaque_type(FORMAT_TYPE_NAME),
        vec![STRING_TYPE],
        validate,
    )?;
    Ok(())
}
