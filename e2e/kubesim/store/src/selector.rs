//! Label and field selectors with kube-apiserver's syntax and error messages.

use serde_json::Value;
use std::collections::BTreeSet;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
    GreaterThan(i64),
    LessThan(i64),
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),!h,i,j notin (k)`); every requirement must
/// hold (`labels.Parse` in apimachinery).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Eq,
    DoubleEq,
    NotEq,
    Not,
    Gt,
    Lt,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    End,
}

impl Tok {
    fn literal(&self) -> String {
        match self {
            Tok::Ident(s) => s.clone(),
            Tok::Eq => "=".into(),
            Tok::DoubleEq => "==".into(),
            Tok::NotEq => "!=".into(),
            Tok::Not => "!".into(),
            Tok::Gt => ">".into(),
            Tok::Lt => "<".into(),
            Tok::In => "in".into(),
            Tok::NotIn => "notin".into(),
            Tok::Open => "(".into(),
            Tok::Close => ")".into(),
            Tok::Comma => ",".into(),
            Tok::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(input: &str) -> Vec<Tok> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if is_special(c) {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (tok, len) = match two.as_str() {
                "==" => (Tok::DoubleEq, 2),
                "!=" => (Tok::NotEq, 2),
                _ => (
                    match c {
                        '=' => Tok::Eq,
                        '!' => Tok::Not,
                        '(' => Tok::Open,
                        ')' => Tok::Close,
                        ',' => Tok::Comma,
                        '>' => Tok::Gt,
                        _ => Tok::Lt,
                    },
                    1,
                ),
            };
            out.push(tok);
            i += len;
            continue;
        }
        let start = i;
        while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        out.push(match word.as_str() {
            "in" => Tok::In,
            "notin" => Tok::NotIn,
            _ => Tok::Ident(word),
        });
    }
    out.push(Tok::End);
    out
}

const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !crate::meta::is_dns_subdomain(p)
    {
        return Err(format!(
            "key: Invalid value: \"{key}\": prefix part {}",
            crate::meta::DNS_SUBDOMAIN_MSG
        ));
    }
    if !is_name_part(name) {
        return Err(format!(
            "key: Invalid value: \"{key}\": {QUALIFIED_NAME_MSG}"
        ));
    }
    Ok(())
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "values[0][key]: Invalid value: \"{v}\": {LABEL_VALUE_MSG}"
        ))
    }
}

/// `metadata.labels` errors as kube-apiserver's `ValidateLabels` reports them
/// (`metadata.labels: Invalid value: "k": name part must consist of ...`).
pub fn label_errors(obj: &Value) -> Vec<String> {
    let Some(labels) = obj
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in labels {
        if let Err(e) = validate_key(k) {
            out.push(e.replacen("key: ", "", 1));
        }
        match v.as_str() {
            Some(v) if v.len() > 63 => out.push(format!(
                "Invalid value: \"{v}\": must be no more than 63 characters"
            )),
            Some(v) => {
                if let Err(e) = validate_value(v) {
                    out.push(e.replacen("values[0][key]: ", "", 1));
                }
            }
            None => out.push(format!("Invalid value: {v}: label values must be strings")),
        }
    }
    out
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn requirement(&mut self) -> Result<(String, LabelOp), String> {
        let negated = if *self.peek() == Tok::Not {
            self.next();
            true
        } else {
            false
        };
        let key = match self.next() {
            Tok::Ident(k) => k,
            t => {
                return Err(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    t.literal()
                ));
            }
        };
        validate_key(&key)?;
        if negated {
            return Ok((key, LabelOp::DoesNotExist));
        }
        if matches!(self.peek(), Tok::Comma | Tok::End) {
            return Ok((key, LabelOp::Exists));
        }
        let op = self.next();
        let op = match op {
            Tok::Eq | Tok::DoubleEq | Tok::NotEq | Tok::In | Tok::NotIn | Tok::Gt | Tok::Lt => op,
            t => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                ));
            }
        };
        match op {
            Tok::In | Tok::NotIn => {
                let set = self.value_set()?;
                Ok((
                    key,
                    if op == Tok::In {
                        LabelOp::In(set)
                    } else {
                        LabelOp::NotIn(set)
                    },
                ))
            }
            _ => {
                let value = match self.peek().clone() {
                    Tok::Ident(v) => {
                        self.next();
                        v
                    }
                    Tok::Comma | Tok::End => String::new(),
                    t => {
                        return Err(format!(
                            "found '{}', expected: ',', ')' or identifier",
                            t.literal()
                        ));
                    }
                };
                match op {
                    Tok::Gt | Tok::Lt => {
                        let n: i64 = value.parse().map_err(|_| {
                            format!(
                                "for 'Gt', 'Lt' operators, the value must be an integer: {value}"
                            )
                        })?;
                        Ok((
                            key,
                            if op == Tok::Gt {
                                LabelOp::GreaterThan(n)
                            } else {
                                LabelOp::LessThan(n)
                            },
                        ))
                    }
                    Tok::NotEq => {
                        validate_value(&value)?;
                        Ok((key, LabelOp::NotEquals(value)))
                    }
                    _ => {
                        validate_value(&value)?;
                        Ok((key, LabelOp::Equals(value)))
                    }
                }
            }
        }
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Tok::Open => {}
            t => return Err(format!("found '{}', expected: '('", t.literal())),
        }
        let mut set = BTreeSet::new();
        loop {
            match self.next() {
                Tok::Ident(v) => {
                    validate_value(&v)?;
                    set.insert(v);
                    match self.next() {
                        Tok::Comma => continue,
                        Tok::Close => break,
                        t => {
                            return Err(format!("found '{}', expected: ',' or ')'", t.literal()));
                        }
                    }
                }
                // `in ()` and `in (a,)` mean the empty value
                Tok::Close => {
                    set.insert(String::new());
                    break;
                }
                Tok::Comma => {
                    set.insert(String::new());
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        t.literal()
                    ));
                }
            }
        }
        Ok(set)
    }
}

impl LabelSelector {
    /// Parse a label selector; the error is kube-apiserver's message for a 400.
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut p = Parser {
            toks: lex(input),
            pos: 0,
        };
        let mut reqs = Vec::new();
        if *p.peek() == Tok::End {
            return Ok(Self { reqs });
        }
        loop {
            let r = p
                .requirement()
                .map_err(|e| format!("unable to parse requirement: {e}"))?;
            reqs.push(r);
            match p.next() {
                Tok::End => break,
                Tok::Comma => {
                    if *p.peek() == Tok::End {
                        return Err(
                            "found '', expected: !, identifier, or 'end of string'".to_string()
                        );
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        t.literal()
                    ));
                }
            }
        }
        Ok(Self { reqs })
    }

    /// Whether the labels (`metadata.labels`, possibly absent) satisfy every requirement.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|(k, op)| match op {
            LabelOp::Equals(v) => get(k) == Some(v.as_str()),
            LabelOp::NotEquals(v) => get(k) != Some(v.as_str()),
            LabelOp::In(set) => get(k).is_some_and(|x| set.contains(x)),
            LabelOp::NotIn(set) => get(k).is_none_or(|x| !set.contains(x)),
            LabelOp::Exists => get(k).is_some(),
            LabelOp::DoesNotExist => get(k).is_none(),
            LabelOp::GreaterThan(n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelOp::LessThan(n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    /// Whether the selector has no requirement.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

/// A parsed field selector (`metadata.name=x,spec.nodeName!=y`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parse a field selector, checking every field against `supported` (the fields this
    /// kind can be selected on). Errors are kube-apiserver's 400 messages.
    pub fn parse(input: &str, supported: &[String]) -> Result<Self, String> {
        let mut terms = Vec::new();
        for raw in split_unescaped_commas(input) {
            if raw.is_empty() {
                continue;
            }
            let (field, eq, value) = if let Some((f, v)) = raw.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = raw.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = raw.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{raw}'"
                ));
            };
            let field = field.trim();
            if !supported.iter().any(|s| s == field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), eq, unescape(value)));
        }
        Ok(Self { terms })
    }

    /// Rename the selected fields (served field path → stored field path).
    pub fn map_fields(mut self, f: impl Fn(&str) -> String) -> Self {
        for t in &mut self.terms {
            t.0 = f(&t.0);
        }
        self
    }

    /// Whether `obj` satisfies every term; a missing field reads as `""`.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, eq, value)| {
            let actual = field_value(obj, field);
            (actual == *value) == *eq
        })
    }
}

fn split_unescaped_commas(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

/// The string value of a dotted field path (`spec.nodeName`, `involvedObject.kind`) as field
/// selectors compare it: strings as is, numbers and booleans printed, absent as `""`.
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn full_label_syntax_matches() {
        let l = json!({"app": "web", "tier": "front", "n": "5"});
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web,db)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier=front",
            "n>3",
            "n<7",
            "missing!=x",
            "missing notin (x)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(Some(&l)), "{s}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "tier notin (front)",
            "missing",
            "!app",
            "app=web,tier=back",
            "n>5",
            "missing in (x)",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(Some(&l)), "{s}");
        }
        assert!(LabelSelector::parse("").unwrap().matches(None));
        assert!(!LabelSelector::parse("a").unwrap().matches(None));
    }

    #[test]
    fn malformed_label_selectors_use_apiserver_messages() {
        assert_eq!(
            LabelSelector::parse("a b").unwrap_err(),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            LabelSelector::parse("a in b").unwrap_err(),
            "unable to parse requirement: found 'b', expected: '('"
        );
        assert_eq!(
            LabelSelector::parse("a=b c").unwrap_err(),
            "found 'c', expected: ',' or 'end of string'"
        );
        assert!(
            LabelSelector::parse("-bad=x")
                .unwrap_err()
                .starts_with("unable to parse requirement: key: Invalid value: \"-bad\"")
        );
        assert!(LabelSelector::parse("a=b,").is_err());
        assert!(LabelSelector::parse("a in (b").is_err());
    }

    #[test]
    fn label_validation() {
        let ok = json!({"metadata": {"labels": {"app.kubernetes.io/name": "x", "e": ""}}});
        assert!(label_errors(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"bad key": "x", "k": "-v"}}});
        let errs = label_errors(&bad);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("Invalid value: \"bad key\": name part must consist"));
        assert!(errs[1].starts_with("Invalid value: \"-v\": a valid label must be"));
    }

    #[test]
    fn field_selectors() {
        let sup: Vec<String> = vec!["metadata.name".into(), "spec.nodeName".into()];
        let o = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert!(
            FieldSelector::parse("metadata.name=p", &sup)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.name==p,spec.nodeName!=n2", &sup)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n2", &sup)
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("spec.x=1", &sup).unwrap_err(),
            "field label not supported: spec.x"
        );
        assert!(
            FieldSelector::parse("metadata.name", &sup)
                .unwrap_err()
                .starts_with("invalid selector")
        );
    }
}
