//! The CEL environment: cel-rust's standard library and its strings/lists/math extensions,
//! plus the Kubernetes library functions kubesim implements (`isURL`, `url(...).getX()`
//! including `getQuery`,
//! list `isSorted/sum/min/max/indexOf/lastIndexOf`, regex `find/findAll`, the
//! `quantity` library with quantities represented as doubles, and the IP/CIDR library with
//! addresses and prefixes represented as their strings), and the `format` library
//! (`cel_format`), and the semver library (`cel_semver`). URLs are parsed as Go's `url.ParseRequestURI` parses them (`go_url`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cel::common::types::{DOUBLE_TYPE, DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{Context, Env, ExecutionError, Value};

use cel::IdedExpr;
use cel::common::ast::{EntryExpr, Expr};

use crate::go_url::GoUrl;

/// The shared environment (built once; compiling and evaluating only read it).
pub(crate) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(build_env()));

/// Operators and macros the interpreter evaluates itself (not declared in the `Env`).
/// cel-rust 0.15 does not evaluate `cel.bind`, `transformList` or `transformMap` (its
/// interpreter reports their variables as undeclared), so they are not listed: rules
/// using them are refused.
const BUILTIN: &[&str] = &[
    "_==_",
    "_!=_",
    "_&&_",
    "_||_",
    "_?_:_",
    "!_",
    "-_",
    "@in",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "_[_]",
    "_[?_]",
    "_?._",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "@not_strictly_false",
    "sortBy",
];

fn build_env() -> Env {
    let mut env = Env::stdlib();
    // Registration of fixed, distinct overloads cannot fail; an error here would be a
    // programming error caught by the unit tests (which assert the functions work).
    let _ = env.add_extension(cel::extensions::strings);
    let _ = env.add_extension(cel::extensions::lists);
    let _ = env.add_extension(cel::extensions::math);
    let _ = env.add_extension(cel::extensions::encoders);
    let _ = add_kubernetes_library(&mut env);
    env
}

fn add_kubernetes_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_overload("isURL", "isURL_string", vec![STRING_TYPE], is_url)?;
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], url)?;
    let getters: [(&str, cel::common::functions::Function); 5] = [
        ("getScheme", get_scheme),
        ("getHost", get_host),
        ("getHostname", get_hostname),
        ("getPort", get_port),
        ("getEscapedPath", get_escaped_path),
    ];
    for (name, f) in getters {
        env.add_member_overload(name, &format!("url_{name}"), STRING_TYPE, vec![], f)?;
    }
    env.add_member_overload("getQuery", "url_getQuery", STRING_TYPE, vec![], get_query)?;
    env.add_member_overload("isSorted", "list_isSorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], list_min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], list_max)?;
    env.add_member_overload(
        "indexOf",
        "list_indexOf",
        LIST_TYPE,
        vec![DYN_TYPE],
        list_index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_lastIndexOf",
        LIST_TYPE,
        vec![DYN_TYPE],
        list_last_index_of,
    )?;
    add_quantity_library(env)?;
    add_ip_library(env)?;
    crate::cel_format::add_format_library(env)?;
    crate::cel_semver::add_semver_library(env)?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload(
        "findAll",
        "string_findAll",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    Ok(())
}

/// Names already probed: declared in the environment or not.
static DECLARED: LazyLock<Mutex<HashMap<String, bool>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether a function name (`size`, or a qualified `format.labelValue`) is declared here.
pub(crate) fn is_supported(name: &str) -> bool {
    if BUILTIN.contains(&name) {
        return true;
    }
    if let Ok(cache) = DECLARED.lock()
        && let Some(hit) = cache.get(name)
    {
        return *hit;
    }
    // `Context::add_function` refuses a name the Env declares: the only public probe.
    let mut ctx = Context::with_env(ENV.clone());
    let declared = ctx.add_function(name, |a: i64| a).is_err();
    if let Ok(mut cache) = DECLARED.lock() {
        cache.insert(name.to_string(), declared);
    }
    declared
}

/// The functions a parsed rule calls that this environment does not declare, sorted.
/// A call on a plain identifier that is neither `self`/`oldSelf` nor a comprehension
/// variable is a namespaced function (`format.dns1123Label()`, `sets.contains(a, b)`) and
/// is checked under its qualified name, so a namespace kubesim lacks is not mistaken for a
/// member call of the same name (`sets.contains` vs `string.contains`).
pub(crate) fn unsupported_functions(expr: &IdedExpr) -> Vec<String> {
    let mut missing = Vec::new();
    let mut bound = vec!["self".to_string(), "oldSelf".to_string()];
    walk(expr, &mut bound, &mut missing);
    missing.sort();
    missing.dedup();
    missing
}

fn walk(e: &IdedExpr, bound: &mut Vec<String>, missing: &mut Vec<String>) {
    match &e.expr {
        Expr::Call(call) => {
            match call.target.as_deref() {
                Some(IdedExpr {
                    expr: Expr::Ident(ns),
                    ..
                }) if !bound.contains(ns) => {
                    let qualified = format!("{ns}.{}", call.func_name);
                    if !is_supported(&qualified) {
                        missing.push(qualified);
                    }
                }
                Some(target) => {
                    if !is_supported(&call.func_name) {
                        missing.push(call.func_name.clone());
                    }
                    walk(target, bound, missing);
                }
                None => {
                    if !is_supported(&call.func_name) {
                        missing.push(call.func_name.clone());
                    }
                }
            }
            // Macros cel-rust keeps as calls (`cel.bind(n, v, e)`, and possibly `all`,
            // `map`, …) name their variables in leading identifier arguments.
            let before = bound.len();
            let binds = BINDING_CALLS.contains(&call.func_name.as_str());
            for (i, a) in call.args.iter().enumerate() {
                match &a.expr {
                    Expr::Ident(v) if binds && i + 1 < call.args.len() => bound.push(v.clone()),
                    _ => walk(a, bound, missing),
                }
            }
            bound.truncate(before);
        }
        Expr::Comprehension(c) => {
            walk(&c.iter_range, bound, missing);
            walk(&c.accu_init, bound, missing);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            if let Some(v) = &c.iter_var2 {
                bound.push(v.clone());
            }
            bound.push(c.accu_var.clone());
            walk(&c.loop_cond, bound, missing);
            walk(&c.loop_step, bound, missing);
            walk(&c.result, bound, missing);
            bound.truncate(before);
        }
        Expr::List(l) => {
            for x in &l.elements {
                walk(x, bound, missing);
            }
        }
        Expr::Map(m) => {
            for entry in &m.entries {
                walk_entry(&entry.expr, bound, missing);
            }
        }
        Expr::Struct(st) => {
            for entry in &st.entries {
                walk_entry(&entry.expr, bound, missing);
            }
        }
        Expr::Select(sel) => walk(&sel.operand, bound, missing),
        _ => {}
    }
}

/// Whether a call to `name` binds its leading identifier arguments (see [`BINDING_CALLS`]).
pub(crate) fn binds_variables(name: &str) -> bool {
    BINDING_CALLS.contains(&name)
}

/// Calls whose leading identifier arguments are variables bound in the later ones.
const BINDING_CALLS: &[&str] = &[
    "bind",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "sortBy",
    "transformList",
    "transformMap",
];

fn walk_entry(e: &EntryExpr, bound: &mut Vec<String>, missing: &mut Vec<String>) {
    match e {
        EntryExpr::StructField(f) => walk(&f.value, bound, missing),
        EntryExpr::MapEntry(m) => {
            walk(&m.key, bound, missing);
            walk(&m.value, bound, missing);
        }
    }
}

fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

fn ret<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn string_arg(v: &Value, function: &str) -> Result<String, ExecutionError> {
    match v {
        Value::String(s) => Ok(s.to_string()),
        other => Err(ExecutionError::function_error(
            function,
            format!("expected string, got {}", other.type_of()),
        )),
    }
}

fn list_arg(v: &Value, function: &str) -> Result<Arc<Vec<Value>>, ExecutionError> {
    match v {
        Value::List(l) => Ok(l.clone()),
        other => Err(ExecutionError::function_error(
            function,
            format!("expected list, got {}", other.type_of()),
        )),
    }
}

fn parse_url(s: &str) -> Option<GoUrl> {
    crate::go_url::parse_request_uri(s).ok()
}

fn is_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), "isURL")?;
    ret(Value::Bool(parse_url(&s).is_some()))
}

fn url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), "url")?;
    if let Err(e) = crate::go_url::parse_request_uri(&s) {
        return Err(ExecutionError::function_error(
            "url",
            format!("URL parse error during conversion from string: {e}"),
        ));
    }
    ret(Value::String(Arc::new(s)))
}

fn url_part<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    name: &str,
    part: fn(&GoUrl) -> String,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), name)?;
    let parts = parse_url(&s)
        .ok_or_else(|| ExecutionError::function_error(name, format!("not a URL: {s}")))?;
    ret(Value::String(Arc::new(part(&parts))))
}

fn get_scheme<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    url_part(args, "getScheme", |p| p.scheme.clone())
}

fn get_host<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    url_part(args, "getHost", |p| p.host.clone())
}

fn get_hostname<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    url_part(args, "getHostname", GoUrl::hostname)
}

fn get_port<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    url_part(args, "getPort", GoUrl::port)
}

fn get_escaped_path<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    url_part(args, "getEscapedPath", GoUrl::escaped_path)
}

/// `map<string, list<string>>` of the query parameters (`url.Query()`).
fn get_query<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), "getQuery")?;
    let parts = parse_url(&s)
        .ok_or_else(|| ExecutionError::function_error("getQuery", format!("not a URL: {s}")))?;
    let map: HashMap<String, Value> = parts
        .query()
        .into_iter()
        .map(|(k, vs)| {
            let list = vs.into_iter().map(|v| Value::String(Arc::new(v))).collect();
            (k, Value::List(Arc::new(list)))
        })
        .collect();
    ret(Value::from(map))
}

fn compare(a: &Value, b: &Value, function: &str) -> Result<std::cmp::Ordering, ExecutionError> {
    let ord = match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.partial_cmp(y),
        (Value::UInt(x), Value::UInt(y)) => x.partial_cmp(y),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
        (Value::String(x), Value::String(y)) => x.partial_cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.partial_cmp(y),
        (Value::Timestamp(x), Value::Timestamp(y)) => x.partial_cmp(y),
        (Value::Duration(x), Value::Duration(y)) => x.partial_cmp(y),
        _ => None,
    };
    ord.ok_or_else(|| {
        ExecutionError::function_error(
            function,
            format!("cannot compare {} and {}", a.type_of(), b.type_of()),
        )
    })
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let list = list_arg(a.first().unwrap_or(&Value::Null), "isSorted")?;
    for w in list.windows(2) {
        if compare(&w[0], &w[1], "isSorted")? == std::cmp::Ordering::Greater {
            return ret(Value::Bool(false));
        }
    }
    ret(Value::Bool(true))
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let list = list_arg(a.first().unwrap_or(&Value::Null), "sum")?;
    let mut acc = Value::Int(0);
    for (i, x) in list.iter().enumerate() {
        acc = match (&acc, x) {
            (_, x) if i == 0 => x.clone(),
            (Value::Int(s), Value::Int(y)) => Value::Int(
                s.checked_add(*y)
                    .ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?,
            ),
            (Value::UInt(s), Value::UInt(y)) => Value::UInt(
                s.checked_add(*y)
                    .ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?,
            ),
            (Value::Float(s), Value::Float(y)) => Value::Float(s + y),
            (Value::Duration(s), Value::Duration(y)) => Value::Duration(*s + *y),
            _ => {
                return Err(ExecutionError::function_error(
                    "sum",
                    format!("cannot add {}", x.type_of()),
                ));
            }
        };
    }
    ret(acc)
}

fn extreme<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    want: std::cmp::Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let list = list_arg(a.first().unwrap_or(&Value::Null), function)?;
    let mut best: Option<&Value> = None;
    for x in list.iter() {
        best = match best {
            Some(b) if compare(x, b, function)? != want => Some(b),
            _ => Some(x),
        };
    }
    match best {
        Some(b) => ret(b.clone()),
        None => Err(ExecutionError::function_error(
            function,
            format!("{function} called on empty list"),
        )),
    }
}

fn list_min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "min", std::cmp::Ordering::Less)
}

fn list_max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "max", std::cmp::Ordering::Greater)
}

fn position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let list = list_arg(a.first().unwrap_or(&Value::Null), function)?;
    let needle = a.get(1).unwrap_or(&Value::Null);
    let found = if last {
        list.iter().rposition(|x| x == needle)
    } else {
        list.iter().position(|x| x == needle)
    };
    ret(Value::Int(found.map_or(-1, |i| i as i64)))
}

fn list_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "indexOf", false)
}

fn list_last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "lastIndexOf", true)
}

fn regex_args(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<(String, regex::Regex), ExecutionError> {
    let a = values(args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), function)?;
    let re = string_arg(a.get(1).unwrap_or(&Value::Null), function)?;
    let re = regex::Regex::new(&crate::go_regex::translate(&re))
        .map_err(|e| ExecutionError::function_error(function, e))?;
    Ok((s, re))
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, re) = regex_args(&args, "find")?;
    let m = re
        .find(&s)
        .map_or(String::new(), |m| m.as_str().to_string());
    ret(Value::String(Arc::new(m)))
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, re) = regex_args(&args, "findAll")?;
    let all: Vec<Value> = re
        .find_iter(&s)
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    ret(Value::List(Arc::new(all)))
}

/// Kubernetes' quantity library. A quantity is represented by its value as a CEL double:
/// comparisons, equality (`quantity('1Gi') == quantity('1024Mi')`) and arithmetic behave as
/// in Kubernetes within double precision.
fn add_quantity_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        quantity,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    let binary: [(&str, cel::common::functions::Function); 5] = [
        ("isLessThan", q_less),
        ("isGreaterThan", q_greater),
        ("compareTo", q_compare),
        ("add", q_add),
        ("sub", q_sub),
    ];
    for (name, f) in binary {
        env.add_member_overload(
            name,
            &format!("quantity_{name}"),
            DOUBLE_TYPE,
            vec![DOUBLE_TYPE],
            f,
        )?;
    }
    env.add_member_overload(
        "add",
        "quantity_add_int",
        DOUBLE_TYPE,
        vec![INT_TYPE],
        q_add,
    )?;
    env.add_member_overload(
        "sub",
        "quantity_sub_int",
        DOUBLE_TYPE,
        vec![INT_TYPE],
        q_sub,
    )?;
    let unary: [(&str, cel::common::functions::Function); 4] = [
        ("isInteger", q_is_integer),
        ("asInteger", q_as_integer),
        ("asApproximateFloat", q_as_float),
        ("sign", q_sign),
    ];
    for (name, f) in unary {
        env.add_member_overload(name, &format!("quantity_{name}"), DOUBLE_TYPE, vec![], f)?;
    }
    Ok(())
}

/// Parses a Kubernetes quantity (`1.5Gi`, `100m`, `2e3`, `-4k`) to its value.
pub(crate) fn parse_quantity(s: &str) -> Option<f64> {
    let num_end = s
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || ((*c == '+' || *c == '-') && *i == 0)))
        .map_or(s.len(), |(i, _)| i);
    let (num, suffix) = s.split_at(num_end);
    let digits = num.trim_start_matches(['+', '-']);
    if digits.is_empty() || digits == "." || digits.matches('.').count() > 1 {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp => {
            let e = exp.strip_prefix(['e', 'E'])?;
            let e: i32 = e.parse().ok()?;
            10f64.powi(e)
        }
    };
    Some(value * scale)
}

fn float_arg(v: &Value, function: &str) -> Result<f64, ExecutionError> {
    match v {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        other => Err(ExecutionError::function_error(
            function,
            format!("expected quantity, got {}", other.type_of()),
        )),
    }
}

fn quantity_pair(args: &[CowVal<'_, '_>], function: &str) -> Result<(f64, f64), ExecutionError> {
    let a = values(args)?;
    Ok((
        float_arg(a.first().unwrap_or(&Value::Null), function)?,
        float_arg(a.get(1).unwrap_or(&Value::Null), function)?,
    ))
}

fn quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), "quantity")?;
    let q = parse_quantity(&s).ok_or_else(|| {
        ExecutionError::function_error("quantity", format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {s}"))
    })?;
    ret(Value::Float(q))
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = values(&args)?;
    let s = string_arg(a.first().unwrap_or(&Value::Null), "isQuantity")?;
    ret(Value::Bool(parse_quantity(&s).is_some()))
}

fn q_less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (x, y) = quantity_pair(&args, "isLessThan")?;
    ret(Value::Bool(x < y))
}

fn q_greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (x, y) = quantity_pair(&args, "isGreaterThan")?;
    ret(Value::Bool(x > y))
}

fn q_compare<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (x, y) = quantity_pair(&args, "compareTo")?;
    let c = if x < y {
        -1
    } else if x > y {
        1
    } else {
        0
    };
    ret(Value::Int(c))
}

fn q_add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (x, y) = quantity_pair(&args, "add")?;
    ret(Value::Float(x + y))
}

fn q_sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (x, y) = quantity_pair(&args, "sub")?;
    ret(Value::Float(x - y))
}

fn q_unary(args: &[CowVal<'_, '_>], function: &str) -> Result<f64, ExecutionError> {
    let a = values(args)?;
    float_arg(a.first().unwrap_or(&Value::Null), function)
}

fn q_is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = q_unary(&args, "isInteger")?;
    ret(Value::Bool(q.fract() == 0.0 && q.abs() < 9.2e18))
}

fn q_as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = q_unary(&args, "asInteger")?;
    if q.fract() != 0.0 || q.abs() >= 9.2e18 {
        return Err(ExecutionError::function_error(
            "asInteger",
            "cannot convert value to integer",
        ));
    }
    ret(Value::Int(q as i64))
}

fn q_as_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Float(q_unary(&args, "asApproximateFloat")?))
}

fn q_sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = q_unary(&args, "sign")?;
    ret(Value::Int(if q > 0.0 {
        1
    } else if q < 0.0 {
        -1
    } else {
        0
    }))
}

/// Kubernetes' IP and CIDR libraries. `ip(s)` and `cidr(s)` check their argument and
/// return it as a string; the methods work on such strings.
fn add_ip_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_overload("isIP", "is_ip_string", vec![STRING_TYPE], is_ip)?;
    env.add_overload("ip", "string_to_ip", vec![STRING_TYPE], ip)?;
    env.add_overload("isCIDR", "is_cidr_string", vec![STRING_TYPE], is_cidr)?;
    env.add_overload("cidr", "string_to_cidr", vec![STRING_TYPE], cidr)?;
    let unary: [(&str, cel::common::functions::Function); 9] = [
        ("family", ip_family),
        ("isUnspecified", ip_is_unspecified),
        ("isLoopback", ip_is_loopback),
        ("isLinkLocalMulticast", ip_is_link_local_multicast),
        ("isLinkLocalUnicast", ip_is_link_local_unicast),
        ("isGlobalUnicast", ip_is_global_unicast),
        ("prefixLength", cidr_prefix_length),
        ("masked", cidr_masked),
        ("ip", cidr_ip),
    ];
    for (name, f) in unary {
        env.add_member_overload(name, &format!("ipcidr_{name}"), STRING_TYPE, vec![], f)?;
    }
    env.add_member_overload(
        "containsIP",
        "cidr_containsIP",
        STRING_TYPE,
        vec![STRING_TYPE],
        cidr_contains_ip,
    )?;
    env.add_member_overload(
        "containsCIDR",
        "cidr_containsCIDR",
        STRING_TYPE,
        vec![STRING_TYPE],
        cidr_contains_cidr,
    )?;
    Ok(())
}

/// An IP address as Kubernetes' `isIP` accepts it (no zone, no IPv4-mapped IPv6).
fn parse_ip(s: &str) -> Option<std::net::IpAddr> {
    let addr: std::net::IpAddr = s.parse().ok()?;
    match addr {
        std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => None,
        a => Some(a),
    }
}

/// A CIDR as `(address, prefix length)`.
fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, bits) = s.split_once('/')?;
    let addr = parse_ip(addr)?;
    let bits: u8 = bits.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((addr, bits))
}

fn as_bits(a: std::net::IpAddr) -> (u128, u32) {
    match a {
        std::net::IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        std::net::IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

fn mask(a: std::net::IpAddr, bits: u8) -> u128 {
    let (v, width) = as_bits(a);
    let host_bits = width - u32::from(bits);
    if host_bits >= 128 {
        0
    } else {
        (v >> host_bits) << host_bits
    }
}

fn from_bits(v: u128, v4: bool) -> std::net::IpAddr {
    if v4 {
        std::net::IpAddr::V4(std::net::Ipv4Addr::from(v as u32))
    } else {
        std::net::IpAddr::V6(std::net::Ipv6Addr::from(v))
    }
}

fn one_string(args: &[CowVal<'_, '_>], function: &str) -> Result<String, ExecutionError> {
    let a = values(args)?;
    string_arg(a.first().unwrap_or(&Value::Null), function)
}

fn two_strings(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<(String, String), ExecutionError> {
    let a = values(args)?;
    Ok((
        string_arg(a.first().unwrap_or(&Value::Null), function)?,
        string_arg(a.get(1).unwrap_or(&Value::Null), function)?,
    ))
}

fn ip_of(s: &str, function: &str) -> Result<std::net::IpAddr, ExecutionError> {
    parse_ip(s).ok_or_else(|| {
        ExecutionError::function_error(
            function,
            format!("IP Address '{s}' parse error during conversion from string"),
        )
    })
}

fn cidr_of(s: &str, function: &str) -> Result<(std::net::IpAddr, u8), ExecutionError> {
    parse_cidr(s).ok_or_else(|| {
        ExecutionError::function_error(
            function,
            format!("network address parse error during conversion from string: {s}"),
        )
    })
}

fn is_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Bool(parse_ip(&one_string(&args, "isIP")?).is_some()))
}

fn ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = one_string(&args, "ip")?;
    ip_of(&s, "ip")?;
    ret(Value::String(Arc::new(s)))
}

fn is_cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ret(Value::Bool(
        parse_cidr(&one_string(&args, "isCIDR")?).is_some(),
    ))
}

fn cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = one_string(&args, "cidr")?;
    cidr_of(&s, "cidr")?;
    ret(Value::String(Arc::new(s)))
}

fn ip_family<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = ip_of(&one_string(&args, "family")?, "family")?;
    ret(Value::Int(if a.is_ipv4() { 4 } else { 6 }))
}

fn ip_predicate<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    test: fn(std::net::IpAddr) -> bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let a = ip_of(&one_string(&args, function)?, function)?;
    ret(Value::Bool(test(a)))
}

fn ip_is_unspecified<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_predicate(args, "isUnspecified", |a| a.is_unspecified())
}

fn ip_is_loopback<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_predicate(args, "isLoopback", |a| a.is_loopback())
}

fn ip_is_link_local_multicast<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_predicate(args, "isLinkLocalMulticast", |a| match a {
        std::net::IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        std::net::IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
    })
}

fn ip_is_link_local_unicast<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_predicate(args, "isLinkLocalUnicast", |a| match a {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    })
}

fn ip_is_global_unicast<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    // Go's net.IP.IsGlobalUnicast: not unspecified, loopback, multicast, link-local or
    // (IPv4) broadcast.
    ip_predicate(args, "isGlobalUnicast", |a| match a {
        std::net::IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        std::net::IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.segments()[0] & 0xffc0 == 0xfe80)
        }
    })
}

fn cidr_prefix_length<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (_, bits) = cidr_of(&one_string(&args, "prefixLength")?, "prefixLength")?;
    ret(Value::Int(i64::from(bits)))
}

fn cidr_masked<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, bits) = cidr_of(&one_string(&args, "masked")?, "masked")?;
    let masked = from_bits(mask(a, bits), a.is_ipv4());
    ret(Value::String(Arc::new(format!("{masked}/{bits}"))))
}

fn cidr_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, _) = cidr_of(&one_string(&args, "ip")?, "ip")?;
    ret(Value::String(Arc::new(a.to_string())))
}

fn cidr_contains_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (c, i) = two_strings(&args, "containsIP")?;
    let (net, bits) = cidr_of(&c, "containsIP")?;
    let addr = ip_of(&i, "containsIP")?;
    let same_family = net.is_ipv4() == addr.is_ipv4();
    ret(Value::Bool(
        same_family && mask(addr, bits) == mask(net, bits),
    ))
}

fn cidr_contains_cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (c, other) = two_strings(&args, "containsCIDR")?;
    let (net, bits) = cidr_of(&c, "containsCIDR")?;
    let (sub, sub_bits) = cidr_of(&other, "containsCIDR")?;
    let same_family = net.is_ipv4() == sub.is_ipv4();
    ret(Value::Bool(
        same_family && sub_bits >= bits && mask(sub, bits) == mask(net, bits),
    ))
}

/// The identifiers `expr` uses that no comprehension or binding macro binds (the variables
/// its environment must declare), sorted. A namespace of a namespaced call (`math.abs`) is
/// not one.
pub(crate) fn free_variables(expr: &IdedExpr) -> Vec<String> {
    let mut free = Vec::new();
    free_walk(expr, &mut Vec::new(), &mut free);
    free.sort();
    free.dedup();
    free
}

fn free_walk(e: &IdedExpr, bound: &mut Vec<String>, free: &mut Vec<String>) {
    match &e.expr {
        Expr::Ident(v) if !bound.contains(v) => free.push(v.clone()),
        Expr::Call(call) => {
            match call.target.as_deref() {
                Some(IdedExpr {
                    expr: Expr::Ident(ns),
                    ..
                }) if !bound.contains(ns) && is_supported(&format!("{ns}.{}", call.func_name)) => {}
                Some(target) => free_walk(target, bound, free),
                None => {}
            }
            let before = bound.len();
            let binds = BINDING_CALLS.contains(&call.func_name.as_str());
            for (i, a) in call.args.iter().enumerate() {
                match &a.expr {
                    Expr::Ident(v) if binds && i + 1 < call.args.len() => bound.push(v.clone()),
                    _ => free_walk(a, bound, free),
                }
            }
            bound.truncate(before);
        }
        Expr::Comprehension(c) => {
            free_walk(&c.iter_range, bound, free);
            free_walk(&c.accu_init, bound, free);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            if let Some(v) = &c.iter_var2 {
                bound.push(v.clone());
            }
            bound.push(c.accu_var.clone());
            free_walk(&c.loop_cond, bound, free);
            free_walk(&c.loop_step, bound, free);
            free_walk(&c.result, bound, free);
            bound.truncate(before);
        }
        Expr::List(l) => {
            for x in &l.elements {
                free_walk(x, bound, free);
            }
        }
        Expr::Map(m) => {
            for entry in &m.entries {
                free_entry(&entry.expr, bound, free);
            }
        }
        Expr::Struct(st) => {
            for entry in &st.entries {
                free_entry(&entry.expr, bound, free);
            }
        }
        Expr::Select(sel) => free_walk(&sel.operand, bound, free),
        _ => {}
    }
}

fn free_entry(e: &EntryExpr, bound: &mut Vec<String>, free: &mut Vec<String>) {
    match e {
        EntryExpr::StructField(f) => free_walk(&f.value, bound, free),
        EntryExpr::MapEntry(m) => {
            free_walk(&m.key, bound, free);
            free_walk(&m.value, bound, free);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kubernetes_library_function_is_declared() {
        for f in [
            "isURL",
            "url",
            "getScheme",
            "getHost",
            "getHostname",
            "getPort",
            "getEscapedPath",
            "getQuery",
            "isSorted",
            "sum",
            "min",
            "max",
            "indexOf",
            "lastIndexOf",
            "find",
            "findAll",
            "quantity",
            "isQuantity",
            "isLessThan",
            "isGreaterThan",
            "compareTo",
            "add",
            "sub",
            "isInteger",
            "asInteger",
            "asApproximateFloat",
            "sign",
            "lowerAscii",
            "split",
            "matches",
            "startsWith",
            "endsWith",
            "size",
            "timestamp",
            "duration",
        ] {
            assert!(is_supported(f), "{f}");
        }
        assert!(!is_supported("noSuchFunction"));
        for f in [
            "format.labelValue",
            "format.named",
            "math.abs",
            "optional.none",
        ] {
            assert!(is_supported(f), "{f}");
        }
        assert!(!is_supported("sets.contains"));
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi"), Some(1073741824.0));
        assert_eq!(parse_quantity("100m"), Some(0.1));
        assert_eq!(parse_quantity("-2k"), Some(-2000.0));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity("2e3"), Some(2000.0));
        assert_eq!(parse_quantity("1Xi"), None);
        assert_eq!(parse_quantity("Gi"), None);
        assert_eq!(parse_quantity("1.2.3"), None);
    }
}
