//! `pattern` is matched with Go's `regexp` (RE2) by kube-apiserver, where `\d`, `\w`, `\s`
//! and `\b` are ASCII-only; in the Rust `regex` crate they are Unicode-aware. This rewrites
//! those escapes to their ASCII meaning so both engines agree.

/// The Rust regex equivalent of a Go RE2 pattern.
pub(crate) fn translate(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let replacement = match (in_class, next) {
                    (false, 'd') => Some("[0-9]"),
                    (false, 'D') => Some("[^0-9]"),
                    (false, 'w') => Some("[0-9A-Za-z_]"),
                    (false, 'W') => Some("[^0-9A-Za-z_]"),
                    (false, 's') => Some("[\\t\\n\\f\\r ]"),
                    (false, 'S') => Some("[^\\t\\n\\f\\r ]"),
                    (false, 'b') => Some("(?-u:\\b)"),
                    (false, 'B') => Some("(?-u:\\B)"),
                    (true, 'd') => Some("0-9"),
                    (true, 'w') => Some("0-9A-Za-z_"),
                    (true, 's') => Some("\\t\\n\\f\\r "),
                    _ => None,
                };
                match replacement {
                    Some(r) => out.push_str(r),
                    None => {
                        out.push('\\');
                        out.push(next);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // A leading `^` and a leading `]` belong to the class.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            '[' if in_class && chars.peek() == Some(&':') => {
                // POSIX class `[:alpha:]` inside a class.
                out.push('[');
                for d in chars.by_ref() {
                    out.push(d);
                    if d == ']' {
                        break;
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::translate;

    fn is_match(pattern: &str, s: &str) -> bool {
        regex::Regex::new(&translate(pattern)).unwrap().is_match(s)
    }

    #[test]
    fn ascii_classes_like_go() {
        assert!(is_match(r"^\d+$", "123"));
        assert!(!is_match(r"^\d+$", "١٢٣")); // Arabic-Indic digits: not \d in Go
        assert!(!is_match(r"^\w+$", "é"));
        assert!(is_match(r"^[\w.-]+$", "a_b.c-d"));
        assert!(!is_match(r"^[\w]+$", "é"));
        assert!(is_match(r"^a\sb$", "a b"));
        assert!(!is_match(r"^a\sb$", "a\u{a0}b"));
        assert!(is_match(r"^[^\]]+$", "abc"));
        assert!(is_match(r"^[[:alpha:]]+$", "abc"));
        assert!(is_match(r"\bfoo\b", "a foo b"));
        // Patterns from the upstream CRDs are unchanged in meaning.
        let p = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";
        assert_eq!(translate(p), p);
        assert!(is_match(p, "example.com/Ready"));
    }
}
