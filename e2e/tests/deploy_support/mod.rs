//! A tiny renderer for the subset of Helm templates the kleym chart uses (no `helm` binary
//! here): `{{ .Values.a.b }}`, `{{ .Release.Name }}`, `{{ .Release.Namespace }}`,
//! `{{ if X }}…{{ else }}…{{ end }}` (nested), `eq A "s"`, `toYaml X`, and the pipeline
//! functions `nindent N`, `default X`, `quote`; `{{-`/`-}}` trim whitespace as in Go
//! templates. Anything else is an error, so the chart cannot drift out of the subset unseen.

#![allow(dead_code)]

use serde_json::Value;

/// The chart's `.Release`.
pub struct Release {
    /// Release name.
    pub name: String,
    /// Release namespace.
    pub namespace: String,
}

enum Tok {
    Text(String),
    Action(String),
}

fn tokenize(src: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(start) = rest.find("{{") {
        let mut text = rest[..start].to_string();
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or("unclosed {{")?;
        let mut inner = &after[..end];
        if let Some(stripped) = inner.strip_prefix('-') {
            inner = stripped;
            text = text.trim_end().to_string();
        }
        let mut trim_after = false;
        if let Some(stripped) = inner.strip_suffix('-') {
            inner = stripped;
            trim_after = true;
        }
        out.push(Tok::Text(text));
        out.push(Tok::Action(inner.trim().to_string()));
        rest = &after[end + 2..];
        if trim_after {
            rest = rest.trim_start();
        }
    }
    out.push(Tok::Text(rest.to_string()));
    Ok(out)
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn words(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        match c {
            '"' => {
                cur.push(c);
                quoted = !quoted;
            }
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn operand(w: &str, values: &Value, release: &Release) -> Result<Value, String> {
    if let Some(s) = w.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Ok(Value::String(s.to_string()));
    }
    if let Some(path) = w.strip_prefix(".Values.") {
        let mut v = values;
        for part in path.split('.') {
            v = v
                .get(part)
                .ok_or_else(|| format!("no value .Values.{path}"))?;
        }
        return Ok(v.clone());
    }
    match w {
        ".Release.Name" => Ok(Value::String(release.name.clone())),
        ".Release.Namespace" => Ok(Value::String(release.namespace.clone())),
        _ => w
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("unsupported operand {w:?}")),
    }
}

fn to_text(v: &Value) -> Result<String, String> {
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(_) | Value::Number(_) => v.to_string(),
        _ => return Err(format!("cannot print {v} without toYaml")),
    })
}

fn eval(expr: &str, values: &Value, release: &Release) -> Result<Value, String> {
    let mut stages = expr.split('|').map(str::trim);
    let first = words(stages.next().ok_or("empty action")?);
    let mut v = match first.first().map(String::as_str) {
        Some("eq") if first.len() == 3 => Value::Bool(
            operand(&first[1], values, release)? == operand(&first[2], values, release)?,
        ),
        Some("toYaml") if first.len() == 2 => {
            let y = serde_yaml_ng::to_string(&operand(&first[1], values, release)?)
                .map_err(|e| e.to_string())?;
            Value::String(y.trim_end().to_string())
        }
        Some(w) if first.len() == 1 => operand(w, values, release)?,
        _ => return Err(format!("unsupported expression {expr:?}")),
    };
    for stage in stages {
        let w = words(stage);
        v = match (w.first().map(String::as_str), w.len()) {
            (Some("nindent"), 2) => {
                let n: usize = w[1].parse().map_err(|_| "nindent N")?;
                let pad = " ".repeat(n);
                let text = to_text(&v)?;
                Value::String(
                    text.lines()
                        .map(|l| format!("\n{pad}{l}"))
                        .collect::<String>(),
                )
            }
            (Some("default"), 2) => {
                if truthy(&v) {
                    v
                } else {
                    operand(&w[1], values, release)?
                }
            }
            (Some("quote"), 1) => Value::String(format!("{:?}", to_text(&v)?)),
            _ => return Err(format!("unsupported function {stage:?}")),
        };
    }
    Ok(v)
}

/// Renders one template.
pub fn render(src: &str, values: &Value, release: &Release) -> Result<String, String> {
    // Stack of (this branch emits, some branch of this `if` was taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut out = String::new();
    let emitting = |stack: &Vec<(bool, bool)>| stack.iter().all(|(e, _)| *e);
    for tok in tokenize(src)? {
        match tok {
            Tok::Text(t) => {
                if emitting(&stack) {
                    out.push_str(&t);
                }
            }
            Tok::Action(a) => {
                if let Some(cond) = a.strip_prefix("if ") {
                    let c = truthy(&eval(cond, values, release)?);
                    stack.push((c, c));
                } else if a == "else" {
                    let top = stack.last_mut().ok_or("else without if")?;
                    *top = (!top.1, true);
                } else if a == "end" {
                    stack.pop().ok_or("end without if")?;
                } else if a.starts_with("/*") {
                    // comment
                } else if emitting(&stack) {
                    out.push_str(&to_text(&eval(&a, values, release)?)?);
                }
            }
        }
    }
    if !stack.is_empty() {
        return Err("unclosed if".into());
    }
    Ok(out)
}

/// Deep-merges `over` into `base` (maps merge, everything else replaces).
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Parses a multi-document YAML string; empty documents are dropped.
pub fn documents(yaml: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| format!("{e}\n{yaml}"))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}
