//! Kubernetes' CEL semver library (k8s.io/apiserver/pkg/cel/library/semverlib.go):
//! `semver(s[, normalize])`, `isSemver(s[, normalize])`, `<Semver>.major()/minor()/patch()`,
//! `isLessThan`, `isGreaterThan`, `compareTo`. Parsing and precedence follow
//! github.com/blang/semver/v4's `Parse` and `Compare`, which upstream uses; build metadata is
//! checked and then ignored (it takes no part in comparisons or equality).

use std::cmp::Ordering;
use std::sync::Arc;

use cel::common::types::{BOOL_TYPE, STRING_TYPE, Type};
use cel::common::value::CowVal;
use cel::objects::Opaque;
use cel::{Env, ExecutionError, Value};

/// The CEL type name of a semver value (`apiservercel.SemverType`).
const SEMVER_TYPE_NAME: &str = "kubernetes.Semver";

/// One pre-release identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pre {
    Num(u64),
    Alpha(String),
}

/// A parsed semantic version (build metadata dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<Pre>,
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        SEMVER_TYPE_NAME
    }
}

fn numeric(part: &str, what: &str) -> Result<u64, String> {
    if !part.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "Invalid character(s) found in {what} number {part:?}"
        ));
    }
    if part.len() > 1 && part.starts_with('0') {
        return Err(format!(
            "{} number must not contain leading zeroes {part:?}",
            capitalized(what)
        ));
    }
    part.parse::<u64>()
        .map_err(|e| format!("strconv.ParseUint: parsing {part:?}: {e}"))
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn is_alphanum(s: &str) -> bool {
    s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

/// blang/semver `Parse`.
pub(crate) fn parse(s: &str) -> Result<Semver, String> {
    if s.is_empty() {
        return Err("Version string empty".to_string());
    }
    let parts: Vec<&str> = s.splitn(3, '.').collect();
    let [major, minor, rest] = parts.as_slice() else {
        return Err("No Major.Minor.Patch elements found".to_string());
    };
    let major = numeric(major, "major")?;
    let minor = numeric(minor, "minor")?;
    let mut patch = *rest;
    let mut build: Vec<&str> = Vec::new();
    if let Some(i) = patch.find('+') {
        build = patch[i + 1..].split('.').collect();
        patch = &patch[..i];
    }
    let mut pre_parts: Vec<&str> = Vec::new();
    if let Some(i) = patch.find('-') {
        pre_parts = patch[i + 1..].split('.').collect();
        patch = &patch[..i];
    }
    let patch = numeric(patch, "patch")?;
    let mut pre = Vec::new();
    for p in pre_parts {
        if p.is_empty() {
            return Err("Prerelease is empty".to_string());
        }
        if p.bytes().all(|c| c.is_ascii_digit()) {
            if p.len() > 1 && p.starts_with('0') {
                return Err(format!(
                    "Prerelease number must not contain leading zeroes {p:?}"
                ));
            }
            let n = p
                .parse::<u64>()
                .map_err(|e| format!("strconv.ParseUint: parsing {p:?}: {e}"))?;
            pre.push(Pre::Num(n));
        } else if is_alphanum(p) {
            pre.push(Pre::Alpha(p.to_string()));
        } else {
            return Err(format!("Invalid character(s) found in prerelease {p:?}"));
        }
    }
    for b in build {
        if b.is_empty() {
            return Err("Build meta data is empty".to_string());
        }
        if !is_alphanum(b) {
            return Err(format!(
                "Invalid character(s) found in build meta data {b:?}"
            ));
        }
    }
    Ok(Semver {
        major,
        minor,
        patch,
        pre,
    })
}

/// Upstream's `normalizeAndParse`: no `v` prefix, missing minor/patch filled with 0,
/// leading zeros removed.
pub(crate) fn normalize_and_parse(s: &str) -> Result<Semver, String> {
    let s = s.strip_prefix('v').unwrap_or(s);
    let mut parts: Vec<String> = s
        .splitn(3, '.')
        .map(|p| {
            if p.len() > 1 {
                let t = p.trim_start_matches('0');
                if t.is_empty() || !t.starts_with(|c: char| c.is_ascii_digit()) {
                    format!("0{t}")
                } else {
                    t.to_string()
                }
            } else {
                p.to_string()
            }
        })
        .collect();
    if parts.len() < 3 {
        if parts
            .last()
            .is_some_and(|p| p.contains('+') || p.contains('-'))
        {
            return Err("short version cannot contain PreRelease/Build meta data".to_string());
        }
        while parts.len() < 3 {
            parts.push("0".to_string());
        }
    }
    parse(&parts.join("."))
}

fn compare_pre(a: &Pre, b: &Pre) -> Ordering {
    match (a, b) {
        (Pre::Num(x), Pre::Num(y)) => x.cmp(y),
        (Pre::Num(_), Pre::Alpha(_)) => Ordering::Less,
        (Pre::Alpha(_), Pre::Num(_)) => Ordering::Greater,
        (Pre::Alpha(x), Pre::Alpha(y)) => x.cmp(y),
    }
}

impl Semver {
    /// blang/semver `Compare` (semver.org precedence).
    pub(crate) fn compare(&self, o: &Semver) -> Ordering {
        let core = (self.major, self.minor, self.patch).cmp(&(o.major, o.minor, o.patch));
        if core != Ordering::Equal {
            return core;
        }
        match (self.pre.is_empty(), o.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            _ => {}
        }
        for (a, b) in self.pre.iter().zip(&o.pre) {
            let c = compare_pre(a, b);
            if c != Ordering::Equal {
                return c;
            }
        }
        self.pre.len().cmp(&o.pre.len())
    }
}

fn ret<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let b: Box<dyn cel::common::value::Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn arg_values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

/// `(string, normalize)` of `semver`/`isSemver`, parsed.
fn parse_args(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<Result<Semver, String>, ExecutionError> {
    let a = arg_values(args)?;
    let Some(Value::String(s)) = a.first() else {
        return Err(ExecutionError::function_error(
            function,
            "expected a string",
        ));
    };
    let normalize = matches!(a.get(1), Some(Value::Bool(true)));
    Ok(if normalize {
        normalize_and_parse(s)
    } else {
        parse(s)
    })
}

fn semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    match parse_args(&args, "semver")? {
        Ok(v) => ret(Value::Opaque(Arc::new(v))),
        Err(e) => Err(ExecutionError::function_error("semver", e)),
    }
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Bool(parse_args(&args, "isSemver")?.is_ok()))
}

fn semvers(args: &[CowVal<'_, '_>], function: &str) -> Result<Vec<Semver>, ExecutionError> {
    arg_values(args)?
        .iter()
        .map(|v| match v {
            Value::Opaque(o) => o.downcast_ref::<Semver>().cloned(),
            _ => None,
        })
        .map(|v| v.ok_or_else(|| ExecutionError::function_error(function, "expected a Semver")))
        .collect()
}

fn pair(args: &[CowVal<'_, '_>], function: &str) -> Result<Ordering, ExecutionError> {
    match semvers(args, function)?.as_slice() {
        [a, b] => Ok(a.compare(b)),
        _ => Err(ExecutionError::function_error(
            function,
            "expected two Semvers",
        )),
    }
}

fn single(args: &[CowVal<'_, '_>], function: &str) -> Result<Semver, ExecutionError> {
    semvers(args, function)?
        .into_iter()
        .next()
        .ok_or_else(|| ExecutionError::function_error(function, "expected a Semver"))
}

fn is_less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Bool(pair(&args, "isLessThan")? == Ordering::Less))
}

fn is_greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Bool(
        pair(&args, "isGreaterThan")? == Ordering::Greater,
    ))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Int(pair(&args, "compareTo")? as i64))
}

// Go converts the uint64 parts with types.Int(...): values above i64::MAX wrap there.
fn major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Int(single(&args, "major")?.major as i64))
}

fn minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Int(single(&args, "minor")?.minor as i64))
}

fn patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Int(single(&args, "patch")?.patch as i64))
}

/// Registers the semver library.
pub(crate) fn add_semver_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    let t = || Type::new_opaque_type(SEMVER_TYPE_NAME);
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        semver,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    env.add_member_overload("isLessThan", "semver_is_less_than", t(), vec![t()], is_less)?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_is_greater_than",
        t(),
        vec![t()],
        is_greater,
    )?;
    env.add_member_overload("compareTo", "semver_compare_to", t(), vec![t()], compare_to)?;
    env.add_member_overload("major", "semver_major", t(), vec![], major)?;
    env.add_member_overload("minor", "semver_minor", t(), vec![], minor)?;
    env.add_member_overload("patch", "semver_patch", t(), vec![], patch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_like_blang_semver() {
        for ok in [
            "1.0.0",
            "0.1.0-alpha.1",
            "1.2.3+build.5",
            "1.2.3-rc.1+b",
            "10.20.30",
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
        for (bad, msg) in [
            ("", "Version string empty"),
            ("1.0", "No Major.Minor.Patch elements found"),
            (
                "v1.0.0",
                "Invalid character(s) found in major number \"v1\"",
            ),
            (
                "01.0.0",
                "Major number must not contain leading zeroes \"01\"",
            ),
            ("1.0.0-", "Prerelease is empty"),
            (
                "1.0.0-01",
                "Prerelease number must not contain leading zeroes \"01\"",
            ),
            ("1.0.0+", "Build meta data is empty"),
            (
                "1.0.0-a_b",
                "Invalid character(s) found in prerelease \"a_b\"",
            ),
        ] {
            assert_eq!(parse(bad), Err(msg.to_string()), "{bad}");
        }
        assert_eq!(normalize_and_parse("v1.0"), parse("1.0.0"));
        assert_eq!(normalize_and_parse("01.01.01"), parse("1.1.1"));
        assert_eq!(normalize_and_parse("1"), parse("1.0.0"));
        assert!(normalize_and_parse("1.0-rc").is_err());
    }

    #[test]
    fn precedence_like_semver_org() {
        let order = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
        ];
        for w in order.windows(2) {
            let (a, b) = (parse(w[0]).unwrap(), parse(w[1]).unwrap());
            assert_eq!(a.compare(&b), Ordering::Less, "{} < {}", w[0], w[1]);
            assert_eq!(b.compare(&a), Ordering::Greater);
        }
        assert_eq!(
            parse("1.0.0+a")
                .unwrap()
                .compare(&parse("1.0.0+b").unwrap()),
            Ordering::Equal
        );
    }
}
