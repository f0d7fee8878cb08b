//! Start-up validation of `--clusterprofile-selector`: the label-selector syntax of
//! apimachinery's `labels.Parse` (`a=b,c!=d,e in (f,g),h notin (i),!j,k,l>1`), so a typo fails
//! `kleym hub` with a clear error instead of making every ClusterProfile watch request fail
//! with a 400 that is only retried and logged.

/// Checks `input` as kube-apiserver would; the error says what is wrong and where.
pub fn validate_label_selector(input: &str) -> Result<(), String> {
    let toks = lex(input);
    let mut p = Parser { toks, pos: 0 };
    if p.peek() == &Tok::End {
        return Ok(());
    }
    loop {
        p.requirement()
            .map_err(|e| format!("unable to parse requirement: {e}"))?;
        match p.next() {
            Tok::End => return Ok(()),
            Tok::Comma if p.peek() == &Tok::End => {
                return Err("found '', expected: !, identifier, or 'end of string'".into());
            }
            Tok::Comma => {}
            t => {
                return Err(format!(
                    "found '{}', expected: ',' or 'end of string'",
                    t.literal()
                ));
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
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
    fn literal(&self) -> &str {
        match self {
            Tok::Ident(s) => s,
            Tok::Eq => "=",
            Tok::DoubleEq => "==",
            Tok::NotEq => "!=",
            Tok::Not => "!",
            Tok::Gt => ">",
            Tok::Lt => "<",
            Tok::In => "in",
            Tok::NotIn => "notin",
            Tok::Open => "(",
            Tok::Close => ")",
            Tok::Comma => ",",
            Tok::End => "",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(input: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if is_special(c) {
            chars.next();
            let tok = match (c, chars.peek()) {
                ('=', Some('=')) => Some(Tok::DoubleEq),
                ('!', Some('=')) => Some(Tok::NotEq),
                _ => None,
            };
            match tok {
                Some(t) => {
                    chars.next();
                    out.push(t);
                }
                None => out.push(match c {
                    '=' => Tok::Eq,
                    '!' => Tok::Not,
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    ',' => Tok::Comma,
                    '>' => Tok::Gt,
                    _ => Tok::Lt,
                }),
            }
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || is_special(c) {
                    break;
                }
                word.push(c);
                chars.next();
            }
            out.push(match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident(word),
            });
        }
    }
    out.push(Tok::End);
    out
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        self.toks.get(self.pos).unwrap_or(&Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    fn requirement(&mut self) -> Result<(), String> {
        let negated = self.peek() == &Tok::Not;
        if negated {
            self.next();
        }
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
        if negated || matches!(self.peek(), Tok::Comma | Tok::End) {
            return Ok(());
        }
        match self.next() {
            Tok::In | Tok::NotIn => self.value_set(),
            op @ (Tok::Eq | Tok::DoubleEq | Tok::NotEq | Tok::Gt | Tok::Lt) => {
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
                if matches!(op, Tok::Gt | Tok::Lt) {
                    value.parse::<i64>().map(|_| ()).map_err(|_| {
                        format!("for 'Gt', 'Lt' operators, the value must be an integer: {value:?}")
                    })
                } else {
                    validate_value(&value)
                }
            }
            t => Err(format!(
                "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                t.literal()
            )),
        }
    }

    fn value_set(&mut self) -> Result<(), String> {
        match self.next() {
            Tok::Open => {}
            t => return Err(format!("found '{}', expected: '('", t.literal())),
        }
        loop {
            match self.next() {
                Tok::Ident(v) => {
                    validate_value(&v)?;
                    match self.next() {
                        Tok::Comma => {}
                        Tok::Close => return Ok(()),
                        t => {
                            return Err(format!("found '{}', expected: ',' or ')'", t.literal()));
                        }
                    }
                }
                // `in ()` and `in (a,)` include the empty value.
                Tok::Close => return Ok(()),
                Tok::Comma => {}
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        t.literal()
                    ));
                }
            }
        }
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// An RFC 1123 subdomain: lowercase labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?` joined by
/// dots, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!(
            "key {key:?}: prefix part must be a lowercase RFC 1123 subdomain"
        ));
    }
    if !is_name_part(name) {
        return Err(format!(
            "key {key:?}: name part must be 1-63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ));
    }
    Ok(())
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "value {v:?}: must be empty or 1-63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_apimachinery_syntax() {
        for s in [
            "",
            "env=prod",
            "env==prod,tier!=db",
            "env in (prod, staging),!legacy,team",
            "region notin (eu-west-1)",
            "x in ()",
            "kleym.io/fleet=a_b.c-d",
            "gen>3,gen<10",
            "env=",
        ] {
            assert_eq!(validate_label_selector(s), Ok(()), "{s:?}");
        }
    }

    #[test]
    fn refuses_what_kube_apiserver_refuses() {
        for (s, needle) in [
            ("env=prod,", "end of string"),
            ("env=pr od", "expected: ',' or 'end of string'"),
            ("env in prod", "expected: '('"),
            ("env in (a b)", "expected: ',' or ')'"),
            ("Bad_Prefix/x=y", "prefix part"),
            ("-x=y", "name part"),
            ("env=-bad-", "value \"-bad-\""),
            ("gen>three", "integer"),
            ("=x", "expected: !, identifier"),
            ("env=(x)", "identifier"),
        ] {
            let e = validate_label_selector(s).expect_err(s);
            assert!(e.contains(needle), "{s:?}: {e}");
        }
    }
}
