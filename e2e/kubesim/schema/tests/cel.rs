//! `x-kubernetes-validations`: rules, transition rules (`oldSelf`, `optionalOldSelf`),
//! `message`/`messageExpression`/`fieldPath`/`reason`, the Kubernetes library functions
//! kubesim supports, and rules it cannot evaluate (never passed silently).

mod common;

use common::errors;
use kubesim_schema::{CompiledSchema, FieldErrorKind};
use serde_json::{Value, json};

fn root(spec_schema: Value) -> CompiledSchema {
    CompiledSchema::new(&json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema
        }
    }))
    .unwrap()
}

fn obj(spec: Value) -> Value {
    json!({"apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "a", "labels": {"l": "v"}}, "spec": spec})
}

/// A spec schema with properties `props` and the given rules.
fn spec_with_rules(props: Value, rules: Value) -> CompiledSchema {
    root(json!({"type": "object", "properties": props, "x-kubernetes-validations": rules}))
}

#[test]
fn kleym_mode_rule() {
    let s = spec_with_rules(
        json!({"mode": {"type": "string"}, "containerDiscriminator": {"type": "object", "properties": {"name": {"type": "string"}}}}),
        json!([{
            "rule": "self.mode == 'PoolOnly' ? !has(self.containerDiscriminator) : has(self.containerDiscriminator)",
            "message": "containerDiscriminator is required unless mode is PoolOnly"
        }]),
    );
    assert_eq!(
        errors(&s, obj(json!({"mode": "PoolOnly"})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"mode": "PerObjective", "containerDiscriminator": {"name": "c"}})),
            None
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"mode": "PerObjective"})), None),
        vec![
            r#"spec: Invalid value: "object": containerDiscriminator is required unless mode is PoolOnly"#
        ]
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"mode": "PoolOnly", "containerDiscriminator": {}})),
            None
        ),
        vec![
            r#"spec: Invalid value: "object": containerDiscriminator is required unless mode is PoolOnly"#
        ]
    );
}

#[test]
fn transition_rule_immutable_field() {
    let s = root(json!({"type": "object", "properties": {
        "id": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "id is immutable"}]},
        "other": {"type": "string"}
    }}));
    let old = obj(json!({"id": "a", "other": "x"}));
    // Create: no old value, the transition rule does not run.
    assert_eq!(
        errors(&s, obj(json!({"id": "b"})), None),
        Vec::<String>::new()
    );
    // Update that keeps the id.
    assert_eq!(
        errors(&s, obj(json!({"id": "a", "other": "y"})), Some(&old)),
        Vec::<String>::new()
    );
    // Update that changes it.
    assert_eq!(
        errors(&s, obj(json!({"id": "b", "other": "x"})), Some(&old)),
        vec![r#"spec.id: Invalid value: "string": id is immutable"#]
    );
    // A field set for the first time on update has no old value either.
    let old_without = obj(json!({"other": "x"}));
    assert_eq!(
        errors(&s, obj(json!({"id": "b"})), Some(&old_without)),
        Vec::<String>::new()
    );
}

#[test]
fn optional_old_self_runs_on_create() {
    let s = root(json!({"type": "object", "properties": {
        "gen": {"type": "integer", "x-kubernetes-validations": [{
            "rule": "!oldSelf.hasValue() || self >= oldSelf.value()",
            "optionalOldSelf": true,
            "message": "gen may not decrease"
        }, {
            "rule": "oldSelf.hasValue() || self == 1",
            "optionalOldSelf": true,
            "message": "gen starts at 1"
        }]}
    }}));
    assert_eq!(
        errors(&s, obj(json!({"gen": 5})), None),
        vec![r#"spec.gen: Invalid value: "integer": gen starts at 1"#]
    );
    let old = obj(json!({"gen": 5}));
    assert_eq!(
        errors(&s, obj(json!({"gen": 6})), Some(&old)),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"gen": 4})), Some(&old)),
        vec![r#"spec.gen: Invalid value: "integer": gen may not decrease"#]
    );
}

#[test]
fn message_expression_field_path_reason_and_default_message() {
    let s = spec_with_rules(
        json!({"name": {"type": "string"}, "replicas": {"type": "integer"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}}),
        json!([
            {"rule": "size(self.name) <= 3", "messageExpression": "'name ' + self.name + ' is longer than 3'", "fieldPath": ".name"},
            {"rule": "self.replicas < 10", "reason": "FieldValueForbidden", "message": "too many replicas"},
            {"rule": "!has(self.labels) || !('bad' in self.labels)", "fieldPath": ".labels['bad']", "reason": "FieldValueRequired", "message": "bad label"},
            {"rule": "self.replicas != 7"},
            {"rule": "self.replicas != 8", "messageExpression": "42", "message": "eight"}
        ]),
    );
    assert_eq!(
        errors(&s, obj(json!({"name": "abc", "replicas": 1})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"name": "abcd", "replicas": 12, "labels": {"bad": "x"}})),
            None
        ),
        vec![
            r#"spec.name: Invalid value: "object": name abcd is longer than 3"#,
            "spec: Forbidden: too many replicas",
            "spec.labels[bad]: Required value: bad label",
        ]
    );
    assert_eq!(
        errors(&s, obj(json!({"name": "a", "replicas": 7})), None),
        vec![r#"spec: Invalid value: "object": failed rule: self.replicas != 7"#]
    );
    // A messageExpression that does not give a string falls back to the message.
    assert_eq!(
        errors(&s, obj(json!({"name": "a", "replicas": 8})), None),
        vec![r#"spec: Invalid value: "object": eight"#]
    );
}

#[test]
fn root_rules_map_values_and_list_items() {
    let s = CompiledSchema::new(&json!({
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('ok-')", "message": "name must start with ok-"}],
        "properties": {
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {
                "byName": {"type": "object", "additionalProperties": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]}},
                "items": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self.endsWith('.io')"}]}}
            }}
        }
    }))
    .unwrap();
    let o = json!({"metadata": {"name": "bad"}, "spec": {"byName": {"a": 1, "b": 0}, "items": ["x.io", "y.com"]}});
    assert_eq!(
        errors(&s, o, None),
        vec![
            r#"<nil>: Invalid value: "object": name must start with ok-"#,
            r#"spec.byName[b]: Invalid value: "integer": failed rule: self > 0"#,
            r#"spec.items[1]: Invalid value: "string": failed rule: self.endsWith('.io')"#,
        ]
    );
}

#[test]
fn root_metadata_exposes_only_name_and_generate_name() {
    let s = CompiledSchema::new(&json!({
        "type": "object",
        "x-kubernetes-validations": [{"rule": "has(self.metadata.labels)"}],
        "properties": {"metadata": {"type": "object"}}
    }))
    .unwrap();
    assert_eq!(
        errors(
            &s,
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}}),
            None
        ),
        vec![r#"<nil>: Invalid value: "object": failed rule: has(self.metadata.labels)"#]
    );
}

#[test]
fn transition_rules_in_list_map_items_correlate_by_key() {
    let s = root(json!({"type": "object", "properties": {
        "entries": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
            "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string"}},
                "x-kubernetes-validations": [{"rule": "self.v == oldSelf.v", "message": "v is immutable"}]}}
    }}));
    let old = obj(json!({"entries": [{"k": "a", "v": "1"}, {"k": "b", "v": "2"}]}));
    // Reordered, one changed, one new: only the changed one fails.
    let new =
        obj(json!({"entries": [{"k": "c", "v": "9"}, {"k": "b", "v": "3"}, {"k": "a", "v": "1"}]}));
    assert_eq!(
        errors(&s, new, Some(&old)),
        vec![r#"spec.entries[1]: Invalid value: "object": v is immutable"#]
    );
}

#[test]
fn upstream_style_rules_and_library_functions() {
    let props = json!({
        "ports": {"type": "array", "items": {"type": "object", "properties": {"number": {"type": "integer"}}}},
        "url": {"type": "string"},
        "names": {"type": "array", "items": {"type": "string"}},
        "ratio": {"type": "number"},
        "since": {"type": "string", "format": "date-time"},
        "until": {"type": "string", "format": "date-time"},
        "timeout": {"type": "string", "format": "duration"},
        "x-y": {"type": "string"},
        "if": {"type": "string"}
    });
    let rules = json!([
        {"rule": "self.ports.all(p1, self.ports.exists_one(p2, p1.number == p2.number))", "message": "unique"},
        {"rule": "isURL(self.url) && url(self.url).getHost() == 'example.com:8443' && url(self.url).getHostname() == 'example.com' && url(self.url).getPort() == '8443' && url(self.url).getScheme() == 'https' && url(self.url).getEscapedPath() == '/a/b'", "message": "url"},
        {"rule": "self.names.map(n, n.lowerAscii()).filter(n, n.startsWith('a')).size() == 1 && 'bob' in self.names && self.names.exists(n, n.matches('^C.*e$'))", "message": "lists"},
        {"rule": "self.ratio > 0.5 && self.ratio < 2.0", "message": "ratio"},
        {"rule": "self.since < self.until && self.timeout > duration('1m') && self.timeout == duration('90s')", "message": "time"},
        {"rule": "self.x__dash__y == 'dash' && self.__if__ == 'kw'", "message": "escaping"},
        {"rule": "[3, 1, 2].sum() == 6 && [1, 2, 3].isSorted() && [1, 5, 2].max() == 5 && [4, 2].min() == 2 && ['a', 'b'].indexOf('b') == 1", "message": "list library"},
        {"rule": "'abc123'.find('[0-9]+') == '123' && 'a1b2'.findAll('[0-9]') == ['1', '2'] && 'a,b'.split(',').size() == 2", "message": "regex library"}
    ]);
    let s = spec_with_rules(props, rules);
    assert!(
        s.unevaluable_rules().is_empty(),
        "{:?}",
        s.unevaluable_rules()
    );
    let good = obj(json!({
        "ports": [{"number": 80}, {"number": 443}],
        "url": "https://example.com:8443/a/b?q=1",
        "names": ["Alice", "bob", "Charlie"],
        "ratio": 1,
        "since": "2026-01-01T00:00:00Z",
        "until": "2026-06-01T00:00:00+02:00",
        "timeout": "1m30s",
        "x-y": "dash",
        "if": "kw"
    }));
    assert_eq!(errors(&s, good.clone(), None), Vec::<String>::new());

    let mut bad = good;
    bad["spec"]["ports"] = json!([{"number": 80}, {"number": 80}]);
    bad["spec"]["url"] = json!("not a url");
    bad["spec"]["ratio"] = json!(3);
    assert_eq!(
        errors(&s, bad, None),
        vec![
            r#"spec: Invalid value: "object": unique"#,
            r#"spec: Invalid value: "object": url"#,
            r#"spec: Invalid value: "object": ratio"#,
        ]
    );
}

#[test]
fn runtime_data_errors_are_reported_like_kube_apiserver() {
    let s = spec_with_rules(
        json!({"a": {"type": "object", "properties": {"b": {"type": "string"}}}}),
        json!([{"rule": "self.a.b == 'x'"}]),
    );
    assert_eq!(
        errors(&s, obj(json!({})), None),
        vec![r#"spec: Invalid value: "object": no such key: a evaluating rule: self.a.b == 'x'"#]
    );
}

#[test]
fn unsupported_rules_never_pass_silently() {
    let s = spec_with_rules(
        json!({"ip": {"type": "string"}}),
        json!([
            {"rule": "self.ip.noSuchFunction(1) && lists.noSuchEither()", "message": "bad version"},
            {"rule": "self.ip != ''"}
        ]),
    );
    assert_eq!(
        s.unevaluable_rules(),
        vec!["self.ip.noSuchFunction(1) && lists.noSuchEither()".to_string()]
    );
    let mut o = obj(json!({"ip": "10.1.2.3"}));
    s.apply_defaults(&mut o);
    s.prune(&mut o);
    let errs = s.validate(&o, None);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].kind, FieldErrorKind::InternalError);
    assert_eq!(errs[0].path, "spec");
    assert!(
        errs[0].detail.starts_with(
            "Internal error: kubesim cannot evaluate this rule: unsupported function(s): lists.noSuchEither, noSuchFunction"
        ),
        "{}",
        errs[0].detail
    );

    let unparsable = spec_with_rules(json!({}), json!([{"rule": "self.a ==", "message": "m"}]));
    assert_eq!(
        unparsable.unevaluable_rules(),
        vec!["self.a ==".to_string()]
    );
    let errs = unparsable.validate(&obj(json!({})), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, FieldErrorKind::InternalError);
}

#[test]
fn blocking_schema_errors_skip_cel_with_kube_notice() {
    let s = spec_with_rules(
        json!({"n": {"type": "integer"}, "s": {"type": "string", "pattern": "^a"}}),
        json!([{"rule": "false", "message": "always"}]),
    );
    // A pattern error is not blocking: the rule still runs.
    assert_eq!(
        errors(&s, obj(json!({"s": "b"})), None),
        vec![
            r#"spec.s: Invalid value: "b": spec.s in body should match '^a'"#,
            r#"spec: Invalid value: "object": always"#,
        ]
    );
    // A type error is: the rule is skipped with kube-apiserver's notice.
    assert_eq!(
        errors(&s, obj(json!({"n": "x"})), None),
        vec![
            r#"spec.n: Invalid value: "string": spec.n in body must be of type integer: "string""#,
            r#"<nil>: Invalid value: "null": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"#,
        ]
    );
}

#[test]
fn ratcheting_drops_errors_of_unchanged_values_but_not_of_transition_rules() {
    let s = root(json!({"type": "object", "properties": {
        "x": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self.startsWith('ok')", "message": "x must start with ok"},
            {"rule": "self != oldSelf", "message": "x must change"}
        ]},
        "items": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'bad'"}]}},
        "other": {"type": "string"}
    }}));
    let old = obj(json!({"x": "bad", "items": ["bad"], "other": "1"}));
    // x unchanged: its plain rule is ratcheted, its transition rule still runs;
    // the unchanged atomic list is ratcheted too.
    assert_eq!(
        errors(
            &s,
            obj(json!({"x": "bad", "items": ["bad"], "other": "2"})),
            Some(&old)
        ),
        vec![r#"spec.x: Invalid value: "string": x must change"#]
    );
    // Changed values are checked.
    assert_eq!(
        errors(
            &s,
            obj(json!({"x": "bad2", "items": ["bad", "fine"], "other": "1"})),
            Some(&old)
        ),
        vec![
            r#"spec.items[0]: Invalid value: "string": failed rule: self != 'bad'"#,
            r#"spec.x: Invalid value: "string": x must start with ok"#,
        ]
    );
}

#[test]
fn evaluation_errors_name_the_message_when_there_is_one() {
    let s = spec_with_rules(
        json!({"a": {"type": "object", "properties": {"b": {"type": "string"}}}}),
        json!([{"rule": "self.a.b == 'x'", "message": "b must be x"}]),
    );
    assert_eq!(
        errors(&s, obj(json!({})), None),
        vec![r#"spec: Invalid value: "object": no such key: a evaluating rule: b must be x"#]
    );
}

#[test]
fn immutability_uses_kubernetes_equality() {
    let s = root(json!({"type": "object", "properties": {
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"},
                 "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "tags are immutable"}]},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}},
                  "x-kubernetes-validations": [{"rule": "self == oldSelf", "messageExpression": "'ports changed to ' + string(size(self))"}]},
        "at": {"type": "string", "format": "date-time",
               "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "at is immutable"}]},
        "order": {"type": "array", "items": {"type": "string"},
                  "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "order is immutable"}]}
    }}));
    let old = obj(json!({
        "tags": ["a", "b"], "ports": [{"name": "x", "n": 1}, {"name": "y", "n": 2}],
        "at": "2026-01-01T00:00:00Z", "order": ["a", "b"]
    }));
    // Reordered sets and map lists, the same instant in another offset: all equal.
    let same = obj(json!({
        "tags": ["b", "a"], "ports": [{"name": "y", "n": 2}, {"name": "x", "n": 1}],
        "at": "2026-01-01T01:00:00+01:00", "order": ["a", "b"]
    }));
    assert_eq!(errors(&s, same, Some(&old)), Vec::<String>::new());
    let changed = obj(json!({
        "tags": ["a", "c"], "ports": [{"name": "x", "n": 1}, {"name": "y", "n": 3}, {"name": "z"}],
        "at": "2026-01-02T00:00:00Z", "order": ["b", "a"]
    }));
    assert_eq!(
        errors(&s, changed, Some(&old)),
        vec![
            r#"spec.at: Invalid value: "string": at is immutable"#,
            r#"spec.order: Invalid value: "array": order is immutable"#,
            r#"spec.ports: Invalid value: "array": ports changed to 3"#,
            r#"spec.tags: Invalid value: "array": tags are immutable"#,
        ]
    );
}

#[test]
fn quantity_library() {
    let s = spec_with_rules(
        json!({"mem": {"type": "string"}, "cpu": {"type": "string"}}),
        json!([
            {"rule": "isQuantity(self.mem) && quantity(self.mem).isLessThan(quantity('1Gi'))", "message": "mem must be below 1Gi"},
            {"rule": "quantity(self.cpu).compareTo(quantity('500m')) >= 0 && quantity(self.cpu).add(quantity('1')).isGreaterThan(quantity('1'))", "message": "cpu"},
            {"rule": "quantity('1Gi') == quantity('1024Mi') && quantity('2').isInteger() && quantity('2k').asInteger() == 2000 && quantity('-1').sign() == -1", "message": "identities"}
        ]),
    );
    assert!(
        s.unevaluable_rules().is_empty(),
        "{:?}",
        s.unevaluable_rules()
    );
    assert_eq!(
        errors(&s, obj(json!({"mem": "512Mi", "cpu": "1"})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"mem": "2Gi", "cpu": "100m"})), None),
        vec![
            r#"spec: Invalid value: "object": mem must be below 1Gi"#,
            r#"spec: Invalid value: "object": cpu"#,
        ]
    );
}

#[test]
fn common_rule_idioms_evaluate() {
    let props = json!({
        "name": {"type": "string"},
        "id": {"type": "string"},
        "ttl": {"type": "string"},
        "n": {"type": "integer"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "conditions": {"type": "array", "items": {"type": "object", "properties": {
            "type": {"type": "string"}, "lastTransitionTime": {"type": "string", "format": "date-time"}}}},
        "opt": {"type": "object", "properties": {"v": {"type": "string"}}}
    });
    let idioms = [
        "self.?opt.?v.orValue('none') == 'none'",
        "has(self.opt) ? self.opt.v == 'x' : true",
        "self.labels.all(k, k.startsWith('app'))",
        "self.labels.exists(k, self.labels[k] == 'web')",
        "size(self.labels) <= 3 && self.labels.size() == 1",
        "'app' in self.labels",
        "self.conditions.exists(c, c.type == 'Ready')",
        "self.conditions.all(c, c.lastTransitionTime > timestamp('2020-01-01T00:00:00Z'))",
        "duration(self.ttl) < duration('24h')",
        "self.id.startsWith('spiffe://') && self.id.split('/').size() == 5",
        "self.name.lowerAscii() == self.name && self.name.matches('^[a-z-]+$')",
        "!(self.name in ['a', 'b'])",
        "int(self.n) == 3 && string(self.n) == '3' && self.n % 2 == 1",
        "type(self.name) == string",
        "self.name.indexOf('-') == 3 && self.name.substring(0, 3) == 'web'",
        "self.conditions.map(c, c.type).filter(t, t != 'Ready').size() == 0",
        "self.n <= 3.5 && 3.0 < self.n + 1",
    ];
    let rules: Vec<serde_json::Value> = idioms
        .iter()
        .map(|r| json!({"rule": r, "message": r}))
        .collect();
    let s = spec_with_rules(props, json!(rules));
    assert!(
        s.unevaluable_rules().is_empty(),
        "{:?}",
        s.unevaluable_rules()
    );
    let good = obj(json!({
        "name": "web-a", "id": "spiffe://td/ns/a", "ttl": "1h", "n": 3,
        "labels": {"app": "web"},
        "conditions": [{"type": "Ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }));
    assert_eq!(errors(&s, good, None), Vec::<String>::new());
}

#[test]
fn ip_and_cidr_library() {
    let s = spec_with_rules(
        json!({"ip": {"type": "string"}, "net": {"type": "string"}}),
        json!([
            {"rule": "isIP(self.ip) && ip(self.ip).family() == 4 && !ip(self.ip).isLoopback() && ip(self.ip).isGlobalUnicast()", "message": "ip"},
            {"rule": "isCIDR(self.net) && cidr(self.net).containsIP(self.ip) && cidr(self.net).prefixLength() == 8", "message": "net"},
            {"rule": "cidr('10.1.2.3/8').masked() == '10.0.0.0/8' && cidr('10.0.0.0/8').containsCIDR('10.2.0.0/16') && !cidr('10.0.0.0/16').containsCIDR('10.0.0.0/8') && ip('::1').family() == 6 && ip('::1').isLoopback() && !isIP('10.0.0.256') && !isCIDR('10.0.0.0/33')", "message": "identities"}
        ]),
    );
    assert!(
        s.unevaluable_rules().is_empty(),
        "{:?}",
        s.unevaluable_rules()
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"ip": "10.1.2.3", "net": "10.0.0.0/8"})),
            None
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"ip": "127.0.0.1", "net": "192.168.0.0/16"})),
            None
        ),
        vec![
            r#"spec: Invalid value: "object": ip"#,
            r#"spec: Invalid value: "object": net"#,
        ]
    );
}

/// One rule over a string field `v`, evaluated for `value`: the error strings.
fn eval_on(rule: &str, value: &str) -> Vec<String> {
    let s = spec_with_rules(
        json!({"v": {"type": "string"}}),
        json!([{"rule": rule, "message": "failed"}]),
    );
    assert!(
        s.unevaluable_rules().is_empty(),
        "{rule}: {:?}",
        s.unevaluable_rules()
    );
    errors(&s, obj(json!({"v": value})), None)
}

/// `(format, value, expected messages)`: Kubernetes 1.33's validators and wording.
const FORMAT_TABLE: &[(&str, &str, &[&str])] = &[
    ("labelValue", "", &[]),
    ("labelValue", "a", &[]),
    ("labelValue", "My_value.1-x", &[]),
    ("labelValue", "-a", &[LABEL_VALUE_MSG]),
    ("labelValue", "a-", &[LABEL_VALUE_MSG]),
    ("labelValue", "a b", &[LABEL_VALUE_MSG]),
    ("labelValue", "a/b", &[LABEL_VALUE_MSG]),
    ("dns1123Label", "my-name", &[]),
    ("dns1123Label", "123-abc", &[]),
    ("dns1123Label", "My-Name", &[DNS_LABEL_MSG]),
    ("dns1123Label", "", &[DNS_LABEL_MSG]),
    ("dns1123Label", "a.b", &["must not contain dots"]),
    ("dns1123Label", "a-", &[DNS_LABEL_MSG]),
    ("dns1123LabelPrefix", "my-name-", &[]),
    ("dns1123LabelPrefix", "-a", &[DNS_LABEL_MSG]),
    ("dns1123Subdomain", "example.com", &[]),
    ("dns1123Subdomain", "a..b", &[DNS_SUBDOMAIN_MSG]),
    ("dns1123Subdomain", "Example.com", &[DNS_SUBDOMAIN_MSG]),
    ("dns1123SubdomainPrefix", "example.com-", &[]),
    ("dns1035Label", "my-name", &[]),
    ("dns1035Label", "1abc", &[DNS1035_MSG]),
    ("dns1035LabelPrefix", "abc-", &[]),
    ("qualifiedName", "example.com/MyName", &[]),
    ("qualifiedName", "MyName", &[]),
    ("qualifiedName", "/a", &["prefix part must be non-empty"]),
    (
        "qualifiedName",
        "a/",
        &["name part must be non-empty", QUALIFIED_NAME_PART_MSG],
    ),
    (
        "qualifiedName",
        "Bad_/a",
        &[
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ],
    ),
    (
        "qualifiedName",
        "a/b/c",
        &[
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        ],
    ),
    ("uri", "https://example.com/a", &[]),
    ("uri", "/just/a/path", &[]),
    (
        "uri",
        "example.com",
        &["parse \"example.com\": invalid URI for request"],
    ),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", &[]),
    ("uuid", "123e4567", &["does not match the UUID format"]),
    ("byte", "aGVsbG8=", &[]),
    ("byte", "not base64!", &["invalid base64"]),
    ("date", "2021-01-01", &[]),
    ("date", "2021-13-01", &["invalid date"]),
    ("datetime", "2021-01-01T00:00:00Z", &[]),
    ("datetime", "yesterday", &["invalid datetime"]),
];

const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const DNS_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

#[test]
fn format_library_validates_like_kubernetes() {
    for (format, value, want) in FORMAT_TABLE {
        // The messages come back through messageExpression-style joining in a rule that
        // fails exactly when validate() returns the expected list.
        let expected: Vec<String> = want.iter().map(|m| format!("{m:?}")).collect();
        let list = format!("[{}]", expected.join(", "));
        let rule = if want.is_empty() {
            format!("!format.{format}().validate(self.v).hasValue()")
        } else {
            format!("format.{format}().validate(self.v).value() == {list}")
        };
        assert_eq!(
            eval_on(&rule, value),
            Vec::<String>::new(),
            "{format}({value:?})"
        );
        // format.named(...) gives the same format.
        let named = if want.is_empty() {
            format!("!format.named('{format}').value().validate(self.v).hasValue()")
        } else {
            format!("format.named('{format}').value().validate(self.v).value() == {list}")
        };
        assert_eq!(
            eval_on(&named, value),
            Vec::<String>::new(),
            "named {format}({value:?})"
        );
    }
}

#[test]
fn format_library_optionals_and_lengths() {
    let long = "a".repeat(64);
    assert_eq!(
        eval_on("!format.named('nope').hasValue()", ""),
        Vec::<String>::new()
    );
    assert_eq!(
        eval_on("format.named('labelValue').hasValue()", ""),
        Vec::<String>::new()
    );
    assert_eq!(
        eval_on(
            "format.labelValue().validate(self.v).value() == ['must be no more than 63 characters']",
            &long
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        eval_on(
            "format.dns1123Subdomain().validate(self.v).value().size() == 1",
            &"a".repeat(254)
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        eval_on(
            "format.dns1123Label().validate(self.v).value() == ['must be no more than 63 characters']",
            &long
        ),
        Vec::<String>::new()
    );
    // orValue / join as messageExpressions use them.
    assert_eq!(
        eval_on(
            "format.dns1123Label().validate(self.v).orValue([]).size() == 0",
            "ok"
        ),
        Vec::<String>::new()
    );
    // The upstream ClusterProfile rule, failing.
    assert_eq!(
        eval_on(
            "!format.labelValue().validate(self).hasValue()"
                .replace("(self)", "(self.v)")
                .as_str(),
            "-bad"
        ),
        vec![r#"spec: Invalid value: "object": failed"#]
    );
    // value() of none is an evaluation error, reported as kube-apiserver reports it.
    let errs = eval_on(
        "format.labelValue().validate(self.v).value().size() == 0",
        "ok",
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("optional.none() dereference"), "{errs:?}");
}

/// `isURL` / `url(...).getX()` follow Go's `url.ParseRequestURI` (absolute URI or path).
#[test]
fn url_library_follows_go_parse_request_uri() {
    let ok =
        |rule: &str, v: &str| assert_eq!(eval_on(rule, v), Vec::<String>::new(), "{rule} on {v:?}");
    let fails =
        |rule: &str, v: &str| assert_eq!(eval_on(rule, v).len(), 1, "{rule} on {v:?} should fail");
    for v in [
        "https://example.com",
        "/a/b",
        "mailto:x@y",
        "http://",
        "localhost:8080",
        "https://a/b c",
    ] {
        ok("isURL(self.v)", v);
    }
    for v in [
        "",
        "example.com",
        "a b",
        ":x",
        "https://h:port/",
        "https://[::1",
    ] {
        fails("isURL(self.v)", v);
    }
    ok(
        "url(self.v).getHost() == '[::1]:80' && url(self.v).getHostname() == '::1' && url(self.v).getPort() == '80'",
        "https://[::1]:80/x",
    );
    ok(
        "url(self.v).getScheme() == 'https' && url(self.v).getHost() == 'example.com'",
        "HTTPS://example.com",
    );
    ok(
        "url(self.v).getHost() == '' && url(self.v).getEscapedPath() == '/a%20b'",
        "/a b",
    );
    ok(
        "url(self.v).getQuery() == {'k': ['1', '2'], 'q': ['a b']}",
        "https://h/p?k=1&q=a+b&k=2",
    );
    ok("url(self.v).getQuery().size() == 0", "https://h/p");
    // The ClusterProfile v1alpha2 rules.
    let server = "isURL(self.v) && url(self.v).getHost() != ''";
    ok(server, "https://10.0.0.1:6443");
    fails(server, "http://");
    fails(server, "localhost:6443");
    fails(server, "/path");
    let proxy = "self.v == '' || (isURL(self.v) && url(self.v).getScheme() in ['http', 'https', 'socks5'] && url(self.v).getHost() != '')";
    ok(proxy, "");
    ok(proxy, "socks5://proxy:1080");
    fails(proxy, "ftp://proxy");
    fails(proxy, "proxy:3128");
}

/// Namespaced calls are checked under their qualified names; comprehension variables and
/// `cel.bind` names are not namespaces.
#[test]
fn unsupported_namespaces_are_not_mistaken_for_member_calls() {
    let s = spec_with_rules(
        json!({"v": {"type": "string"}, "l": {"type": "array", "items": {"type": "string"}}}),
        json!([
            {"rule": "sets.contains(self.l, ['a'])"},
            {"rule": "self.l.all(x, x.startsWith('a')) && self.l.exists(y, y.contains('b'))"},
            {"rule": "cel.bind(n, self.v, n.lowerAscii() == n)"},
            {"rule": "[3, 1].sortBy(x, x) == [1, 3]"},
            {"rule": "[1, 2].transformList(i, v, v * 2) == [2, 4]"},
            {"rule": "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}"},
            {"rule": "self.l.map(x, x.size()).all(n, n > 0) && [1].exists_one(z, z == 1)"},
            {"rule": "!format.dns1123Label().validate(self.v).hasValue() && math.greatest(1, 2) == 2"}
        ]),
    );
    // cel-rust evaluates sortBy but not cel.bind, transformList or transformMap.
    assert_eq!(
        s.unevaluable_rules(),
        vec![
            "sets.contains(self.l, ['a'])".to_string(),
            "cel.bind(n, self.v, n.lowerAscii() == n)".to_string(),
            "[1, 2].transformList(i, v, v * 2) == [2, 4]".to_string(),
            "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}".to_string(),
        ]
    );
    let errs = errors(&s, obj(json!({"v": "ab", "l": ["ab"]})), None);
    assert_eq!(errs.len(), 4, "{errs:?}");
    for (e, f) in errs
        .iter()
        .zip(["sets.contains", "cel.bind", "transformList", "transformMap"])
    {
        assert!(e.contains(&format!("unsupported function(s): {f}")), "{e}");
    }
}

#[test]
fn semver_library() {
    let ok =
        |rule: &str, v: &str| assert_eq!(eval_on(rule, v), Vec::<String>::new(), "{rule} on {v:?}");
    ok(
        "isSemver(self.v) && semver(self.v).major() == 1 && semver(self.v).minor() == 2 && semver(self.v).patch() == 3",
        "1.2.3-rc.1+b",
    );
    ok(
        "!isSemver(self.v) && isSemver(self.v, true) && semver(self.v, true) == semver('1.2.0')",
        "v1.2",
    );
    ok(
        "semver(self.v).isLessThan(semver('1.0.0')) && semver('1.0.0').isGreaterThan(semver(self.v))",
        "1.0.0-alpha",
    );
    ok(
        "semver(self.v).compareTo(semver('1.0.0')) == 0 && semver(self.v).compareTo(semver('2.0.0')) == -1",
        "1.0.0+meta",
    );
    // Quantities keep their own comparison overloads.
    ok("quantity('1Gi').isGreaterThan(quantity('1Mi'))", "");
    let errs = eval_on("semver(self.v).major() == 1", "v1.0.0");
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("Invalid character(s) found in major number"),
        "{errs:?}"
    );
}
