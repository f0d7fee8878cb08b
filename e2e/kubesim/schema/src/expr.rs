//! Free-standing CEL expressions over JSON variables, with the same environment as
//! `x-kubernetes-validations` rules: what kube-apiserver's structured authentication
//! evaluates (`claims` in claim validation rules and claim mappings, `user` in user
//! validation rules).

use std::sync::Arc;

use cel::{Context, Program};
use serde_json::Value;

use crate::cel_lib::{ENV, unsupported_functions};
use crate::cel_rules::to_cel;
use crate::cel_types::{CelType, CheckIssue};

/// A compiled CEL expression (compile once, evaluate many times).
#[derive(Debug, Clone)]
pub struct CelExpression {
    text: String,
    program: Arc<Program>,
}

impl CelExpression {
    /// Compiles `text`. Errors name why: a syntax error, or a function kubesim does not
    /// evaluate.
    pub fn compile(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Err("expression must not be empty".into());
        }
        let program = ENV
            .compile(text)
            .map_err(|e| format!("compilation failed: {e}"))?;
        let missing = unsupported_functions(program.expression());
        if !missing.is_empty() {
            return Err(format!(
                "kubesim cannot evaluate this expression: unsupported function(s): {}",
                missing.join(", ")
            ));
        }
        Ok(CelExpression {
            text: text.to_string(),
            program: Arc::new(program),
        })
    }

    /// The expression's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the expression names the variable `name`.
    pub fn uses_variable(&self, name: &str) -> bool {
        self.program.references().has_variable(name)
    }

    /// The free variables the expression names (comprehension variables excluded), sorted.
    pub fn variables(&self) -> Vec<String> {
        crate::cel_lib::free_variables(self.program.expression())
    }

    /// Checks the field selections against the types of `roots`, as cel-go's checker
    /// does (see [`crate::cel_types`]); names in `undeclared` are reported as undeclared
    /// references. Returns the expression's type (`Dyn` unless it is a plain selection
    /// path) and the issues, in cel-go's order; [`crate::cel_types::display_issues`]
    /// renders them.
    pub fn check_types(
        &self,
        roots: &[(&str, &CelType)],
        undeclared: &[String],
    ) -> (CelType, Vec<CheckIssue>) {
        let info = self.program.source_info();
        let offsets = |id: u64| info.offset_for(id).map(|(start, _)| start as usize);
        crate::cel_types::check(self.program.expression(), &offsets, roots, undeclared)
    }

    /// Evaluates with `variables` bound (each a JSON value, numbers as int when integral)
    /// and returns the result as JSON.
    pub fn evaluate(&self, variables: &[(&str, &Value)]) -> Result<Value, String> {
        let mut ctx = Context::with_env(ENV.clone());
        for (name, value) in variables {
            ctx.add_variable_as_val(*name, to_cel(None, value, false));
        }
        let out = self
            .program
            .execute(&ctx)
            .map_err(|e| format!("evaluation failed: {e}"))?;
        out.json()
            .map_err(|e| format!("result is not representable as JSON: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluates_claims_and_user_expressions() {
        let claims =
            json!({"sub": "spiffe://example.org/kleym/hub", "n": 3, "email_verified": false});
        let e = CelExpression::compile("claims.sub == 'spiffe://example.org/kleym/hub'").unwrap();
        assert!(e.uses_variable("claims"));
        assert_eq!(e.variables(), vec!["claims".to_string()]);
        let free = |t: &str| CelExpression::compile(t).unwrap().variables();
        assert_eq!(
            free("request.userInfo.groups.exists(g, g == object.x)"),
            vec!["object".to_string(), "request".to_string()]
        );
        assert_eq!(
            free("[1].all(x, x > 0) && math.abs(y) > 0"),
            vec!["y".to_string()]
        );
        assert_eq!(e.evaluate(&[("claims", &claims)]).unwrap(), json!(true));
        let e = CelExpression::compile("'kleym:' + claims.sub").unwrap();
        assert_eq!(
            e.evaluate(&[("claims", &claims)]).unwrap(),
            json!("kleym:spiffe://example.org/kleym/hub")
        );
        let e = CelExpression::compile("claims.?email_verified.orValue(true) == true").unwrap();
        assert_eq!(e.evaluate(&[("claims", &claims)]).unwrap(), json!(false));
        let user = json!({"username": "system:admin", "groups": []});
        let e = CelExpression::compile("!user.username.startsWith('system:')").unwrap();
        assert_eq!(e.evaluate(&[("user", &user)]).unwrap(), json!(false));
    }

    #[test]
    fn refuses_bad_expressions() {
        assert!(CelExpression::compile("claims.sub ==").is_err());
        assert!(CelExpression::compile("  ").is_err());
        let e = CelExpression::compile("claims.missing == 'x'").unwrap();
        assert!(e.evaluate(&[("claims", &json!({}))]).is_err());
    }
}
