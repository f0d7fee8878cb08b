//! The template language of `spiffeIDTemplate`, `workloadSelectorTemplates` and
//! `svid.dnsNameTemplates`: a deliberately tiny, fully specified subset of Go templates.
//!
//! Grammar (anything else is a [`TemplateError`], reported as `RenderFailure`):
//!
//! ```text
//! template := ( literal | action )*
//! literal  := any characters except '{' and '}'
//! action   := "{{" " "* "." NAME " "* "}}"
//! NAME     := Namespace | ObjectiveName | PoolName | BindingName | Mode
//!           | ContainerName | TrustDomain
//! ```
//!
//! So `{{ .Namespace }}` and `{{.Namespace}}` are the same; pipes, functions, field chains
//! (`.Namespace.X`), trim markers (`{{-`), other whitespace, unknown or undefined
//! variables, nested or stray braces are all rejected. Braces are banned from literals
//! because SPIRE Controller Manager renders our output as Go templates again: no output
//! may ever contain template syntax.

use std::fmt;

/// Values available to templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variables<'a> {
    /// `.Namespace`: the binding's namespace.
    pub namespace: &'a str,
    /// `.ObjectiveName`: the target objective (or legacy InferenceModel) name.
    pub objective_name: &'a str,
    /// `.PoolName`: the resolved pool's name.
    pub pool_name: &'a str,
    /// `.BindingName`: the binding's name.
    pub binding_name: &'a str,
    /// `.Mode`: `PoolOnly` or `PerObjective`.
    pub mode: &'a str,
    /// `.ContainerName`: the discriminator value; defined only for a `ContainerName`
    /// discriminator.
    pub container_name: Option<&'a str>,
    /// `.TrustDomain`: the cluster's trust domain.
    pub trust_domain: &'a str,
}

/// Every variable name the language knows.
pub const VARIABLE_NAMES: [&str; 7] = [
    "Namespace",
    "ObjectiveName",
    "PoolName",
    "BindingName",
    "Mode",
    "ContainerName",
    "TrustDomain",
];

impl Variables<'_> {
    fn lookup(&self, name: &str) -> Result<&str, TemplateErrorKind> {
        match name {
            "Namespace" => Ok(self.namespace),
            "ObjectiveName" => Ok(self.objective_name),
            "PoolName" => Ok(self.pool_name),
            "BindingName" => Ok(self.binding_name),
            "Mode" => Ok(self.mode),
            "TrustDomain" => Ok(self.trust_domain),
            "ContainerName" => self
                .container_name
                .ok_or_else(|| TemplateErrorKind::UndefinedVariable(name.to_string())),
            _ => Err(TemplateErrorKind::UnknownVariable(name.to_string())),
        }
    }
}

/// What is wrong with a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateErrorKind {
    /// `{{` without a matching `}}`.
    UnterminatedAction,
    /// A `{` or `}` outside an action (including `}}` without `{{`, and nested braces).
    StrayBrace,
    /// An action that is not exactly one `.Variable` (pipes, functions, chains, trim
    /// markers, …).
    UnsupportedAction(String),
    /// A variable the language does not define.
    UnknownVariable(String),
    /// A known variable without a value for this binding (`.ContainerName` without a
    /// `ContainerName` discriminator).
    UndefinedVariable(String),
}

/// A template that cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {position} of {template:?}")]
pub struct TemplateError {
    /// The template text.
    pub template: String,
    /// Byte offset of the problem.
    pub position: usize,
    /// The problem.
    pub kind: TemplateErrorKind,
}

impl fmt::Display for TemplateErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateErrorKind::UnterminatedAction => f.write_str("\"{{\" without \"}}\""),
            TemplateErrorKind::StrayBrace => {
                f.write_str("brace outside a \"{{ .Variable }}\" action")
            }
            TemplateErrorKind::UnsupportedAction(a) => write!(
                f,
                "unsupported action {{{{{a}}}}} (only \"{{{{ .Variable }}}}\" is allowed)"
            ),
            TemplateErrorKind::UnknownVariable(v) => write!(
                f,
                "unknown variable .{v} (known: {})",
                VARIABLE_NAMES.map(|n| format!(".{n}")).join(" ")
            ),
            TemplateErrorKind::UndefinedVariable(v) => write!(
                f,
                "variable .{v} is not defined for this binding (it needs a ContainerName discriminator)"
            ),
        }
    }
}

/// Render `template` with `vars`.
pub fn render(template: &str, vars: &Variables<'_>) -> Result<String, TemplateError> {
    let err = |position: usize, kind: TemplateErrorKind| TemplateError {
        template: template.to_string(),
        position,
        kind,
    };
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    let mut offset = 0;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let at = offset + i;
        if !rest[i..].starts_with("{{") {
            return Err(err(at, TemplateErrorKind::StrayBrace));
        }
        let body_start = i + 2;
        let Some(close) = rest[body_start..].find("}}") else {
            return Err(err(at, TemplateErrorKind::UnterminatedAction));
        };
        let body = &rest[body_start..body_start + close];
        if let Some(j) = body.find(['{', '}']) {
            return Err(err(offset + body_start + j, TemplateErrorKind::StrayBrace));
        }
        let name = parse_action(body).map_err(|kind| err(at, kind))?;
        out.push_str(vars.lookup(name).map_err(|kind| err(at, kind))?);
        let consumed = body_start + close + 2;
        rest = &rest[consumed..];
        offset += consumed;
    }
    out.push_str(rest);
    Ok(out)
}

/// Parse the inside of `{{ … }}`; returns the variable name.
fn parse_action(body: &str) -> Result<&str, TemplateErrorKind> {
    let unsupported = || TemplateErrorKind::UnsupportedAction(body.to_string());
    let inner = body.trim_matches(' ');
    let name = inner.strip_prefix('.').ok_or_else(unsupported)?;
    let is_ident = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_ident {
        return Err(unsupported());
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Variables<'static> {
        Variables {
            namespace: "team-a",
            objective_name: "chat",
            pool_name: "pool",
            binding_name: "b",
            mode: "PerObjective",
            container_name: Some("vllm"),
            trust_domain: "td",
        }
    }

    #[test]
    fn renders_every_variable_with_and_without_spaces() {
        let t = "{{ .Namespace }}|{{.ObjectiveName}}|{{  .PoolName}}|{{.BindingName  }}|{{ .Mode }}|{{ .ContainerName }}|{{ .TrustDomain }}";
        assert_eq!(
            render(t, &vars()).unwrap(),
            "team-a|chat|pool|b|PerObjective|vllm|td"
        );
        assert_eq!(render("k8s:ns:x", &vars()).unwrap(), "k8s:ns:x");
        assert_eq!(render("", &vars()).unwrap(), "");
    }

    #[test]
    fn rejects_everything_else() {
        use TemplateErrorKind::*;
        let cases: &[(&str, TemplateErrorKind)] = &[
            ("{{ .Nope }}", UnknownVariable("Nope".into())),
            ("{{ .namespace }}", UnknownVariable("namespace".into())),
            (
                "{{ .Namespace | printf \"%s\" }}",
                UnsupportedAction(" .Namespace | printf \"%s\" ".into()),
            ),
            (
                "{{ printf \"x\" }}",
                UnsupportedAction(" printf \"x\" ".into()),
            ),
            (
                "{{ .Namespace.Name }}",
                UnsupportedAction(" .Namespace.Name ".into()),
            ),
            (
                "{{- .Namespace -}}",
                UnsupportedAction("- .Namespace -".into()),
            ),
            (
                "{{\t.Namespace }}",
                UnsupportedAction("\t.Namespace ".into()),
            ),
            ("{{ . }}", UnsupportedAction(" . ".into())),
            ("{{ }}", UnsupportedAction(" ".into())),
            ("{{ $x := 1 }}", UnsupportedAction(" $x := 1 ".into())),
            ("{{ .Namespace ", UnterminatedAction),
            ("a {{ .Namespace }", UnterminatedAction),
            ("}}", StrayBrace),
            ("{ .Namespace }", StrayBrace),
            ("k8s:ns:}", StrayBrace),
            ("{{ {{ .Namespace }} }}", StrayBrace),
            ("{{{ .Namespace }}}", StrayBrace),
        ];
        for (t, want) in cases {
            let e = render(t, &vars()).unwrap_err();
            assert_eq!(&e.kind, want, "{t}");
            assert_eq!(e.template, *t);
        }
    }

    #[test]
    fn container_name_is_undefined_without_a_container_name_discriminator() {
        let mut v = vars();
        v.container_name = None;
        let e = render("k8s:container-name:{{ .ContainerName }}", &v).unwrap_err();
        assert_eq!(
            e.kind,
            TemplateErrorKind::UndefinedVariable("ContainerName".into())
        );
        assert_eq!(e.position, 19);
        assert!(e.to_string().contains("ContainerName discriminator"));
    }
}
