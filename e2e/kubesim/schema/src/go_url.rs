//! A port of Go's `url.ParseRequestURI` (net/url), which Kubernetes' CEL URL library
//! (`isURL`, `url`, `url(...).getX()`) and `format.uri()` use: an absolute URI
//! (`scheme:opaque` or `scheme://authority/path`) or an absolute path (`/a/b`); no fragment
//! splitting (`#` stays in the path), the query cut at the first `?`. Errors are worded as
//! Go's (`parse "x": invalid URI for request`).

use std::fmt;

/// The parts of a parsed request URI that the CEL getters expose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoUrl {
    /// Lower-cased scheme, empty for an absolute path.
    pub scheme: String,
    /// `url.Host`: host and optional `:port`, IPv6 literals in brackets, percent-decoded.
    pub host: String,
    /// The path as written (still escaped).
    raw_path: String,
    /// `url.RawQuery`: after the first `?` (empty for a lone trailing `?`).
    raw_query: String,
    /// Set for `scheme:opaque` URIs.
    opaque: bool,
}

/// `*url.Error` of `url.ParseRequestURI`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoUrlError {
    input: String,
    reason: String,
}

impl fmt::Display for GoUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parse {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for GoUrlError {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Host,
    Path,
}

fn is_hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

/// `shouldEscape` for the two modes this port needs.
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if mode == Mode::Host && b"!$&'()*+,;=:[]<>\"".contains(&c) {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => {
            mode == Mode::Host || c == b'?'
        }
        _ => true,
    }
}

/// `unescape`: percent-decoding with Go's checks; the decoded bytes as a (lossy) string.
fn unescape(s: &str, mode: Mode) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                if i + 2 >= b.len() || !is_hex(b[i + 1]) || !is_hex(b[i + 2]) {
                    let bad: String = s[i..].chars().take(3).collect();
                    return Err(format!("invalid URL escape {bad:?}"));
                }
                if mode == Mode::Host && unhex(b[i + 1]) < 8 && &s[i..i + 3] != "%25" {
                    return Err(format!("invalid URL escape {:?}", &s[i..i + 3]));
                }
                out.push(unhex(b[i + 1]) << 4 | unhex(b[i + 2]));
                i += 3;
            }
            c => {
                if mode == Mode::Host && c < 0x80 && should_escape(c, mode) {
                    return Err(format!(
                        "invalid character {:?} in host name",
                        (c as char).to_string()
                    ));
                }
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// `validOptionalPort`: empty, or `:` followed by digits only.
fn valid_optional_port(p: &str) -> bool {
    p.is_empty()
        || p.strip_prefix(':')
            .is_some_and(|d| d.bytes().all(|c| c.is_ascii_digit()))
}

fn parse_host(host: &str) -> Result<String, String> {
    if host.starts_with('[') {
        let Some(i) = host.rfind(']') else {
            return Err("missing ']' in host".to_string());
        };
        let colon_port = &host[i + 1..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {colon_port:?} after host"));
        }
    } else if let Some(i) = host.rfind(':') {
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {colon_port:?} after host"));
        }
    }
    unescape(host, Mode::Host)
}

fn valid_userinfo(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&c))
}

/// `url.ParseRequestURI(s)`.
pub(crate) fn parse_request_uri(s: &str) -> Result<GoUrl, GoUrlError> {
    parse(s).map_err(|reason| GoUrlError {
        input: s.to_string(),
        reason,
    })
}

fn parse(raw: &str) -> Result<GoUrl, String> {
    if raw.bytes().any(|c| c < 0x20 || c == 0x7f) {
        return Err("net/url: invalid control character in URL".to_string());
    }
    if raw.is_empty() {
        return Err("empty url".to_string());
    }
    let mut url = GoUrl {
        scheme: String::new(),
        host: String::new(),
        raw_path: String::new(),
        raw_query: String::new(),
        opaque: false,
    };
    if raw == "*" {
        url.raw_path = "*".to_string();
        return Ok(url);
    }
    // getScheme
    let mut rest = raw;
    for (i, c) in raw.bytes().enumerate() {
        if c.is_ascii_alphabetic() {
            continue;
        }
        if c.is_ascii_digit() || c == b'+' || c == b'-' || c == b'.' {
            if i == 0 {
                break;
            }
            continue;
        }
        if c == b':' {
            if i == 0 {
                return Err("missing protocol scheme".to_string());
            }
            url.scheme = raw[..i].to_ascii_lowercase();
            rest = &raw[i + 1..];
        }
        break;
    }
    // The query is cut off (its contents are not checked).
    if let Some(q) = rest.find('?') {
        url.raw_query = rest[q + 1..].to_string();
        rest = &rest[..q];
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            url.opaque = true;
            return Ok(url);
        }
        return Err("invalid URI for request".to_string());
    }
    if !url.scheme.is_empty()
        && let Some(after) = rest.strip_prefix("//")
    {
        let (authority, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, ""),
        };
        let (userinfo, host) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        url.host = parse_host(host)?;
        if let Some(u) = userinfo
            && !valid_userinfo(u)
        {
            return Err("net/url: invalid userinfo".to_string());
        }
        rest = path;
    }
    unescape(rest, Mode::Path)?;
    url.raw_path = rest.to_string();
    Ok(url)
}

impl GoUrl {
    /// `url.Hostname()`: the host without port and brackets.
    pub(crate) fn hostname(&self) -> String {
        split_host_port(&self.host).0
    }

    /// `url.Port()`.
    pub(crate) fn port(&self) -> String {
        split_host_port(&self.host).1
    }

    /// `url.EscapedPath()`: the path as written when that is a valid encoding, otherwise
    /// re-escaped; empty for `scheme:opaque` URIs (whose path is empty).
    pub(crate) fn escaped_path(&self) -> String {
        if self.opaque {
            return String::new();
        }
        let p = &self.raw_path;
        if p == "*" {
            return p.clone();
        }
        let valid = p
            .bytes()
            .all(|c| b"!$&'()*+,;=:@[]%".contains(&c) || !should_escape(c, Mode::Path));
        if valid {
            return p.clone();
        }
        let decoded = unescape(p, Mode::Path).unwrap_or_else(|_| p.clone());
        let mut out = String::new();
        for c in decoded.bytes() {
            if should_escape(c, Mode::Path) {
                out.push_str(&format!("%{c:02X}"));
            } else {
                out.push(c as char);
            }
        }
        out
    }
}

impl GoUrl {
    /// `url.Query()`: `ParseQuery` of the raw query, invalid pairs skipped (pairs with `;`,
    /// bad escapes), `+` read as a space; each key's values in order.
    pub(crate) fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for pair in self.raw_query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(k), Some(v)) = (query_unescape(k), query_unescape(v)) else {
                continue;
            };
            match out.iter_mut().find(|(key, _)| *key == k) {
                Some((_, values)) => values.push(v),
                None => out.push((k, vec![v])),
            }
        }
        out
    }
}

/// `url.QueryUnescape`: `%XX` decoded, `+` a space; `None` on a bad escape.
fn query_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                if i + 2 >= b.len() || !is_hex(b[i + 1]) || !is_hex(b[i + 2]) {
                    return None;
                }
                out.push(unhex(b[i + 1]) << 4 | unhex(b[i + 2]));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `splitHostPort` as `Hostname`/`Port` use it.
fn split_host_port(host_port: &str) -> (String, String) {
    let mut host = host_port;
    let mut port = "";
    if let Some(colon) = host.rfind(':')
        && valid_optional_port(&host[colon..])
    {
        port = &host[colon + 1..];
        host = &host[..colon];
    }
    if host.starts_with('[') && host.ends_with(']') && host.len() >= 2 {
        host = &host[1..host.len() - 1];
    }
    (host.to_string(), port.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (input, Ok((scheme, host, hostname, port, escaped path)) or Err(message)), checked
    /// against Go's net/url behaviour.
    #[test]
    fn parse_request_uri_matches_go() {
        type Row = (
            &'static str,
            Result<
                (
                    &'static str,
                    &'static str,
                    &'static str,
                    &'static str,
                    &'static str,
                ),
                &'static str,
            >,
        );
        let rows: &[Row] = &[
            (
                "https://example.com",
                Ok(("https", "example.com", "example.com", "", "")),
            ),
            (
                "https://example.com:6443/api",
                Ok(("https", "example.com:6443", "example.com", "6443", "/api")),
            ),
            (
                "HTTPS://Example.com/",
                Ok(("https", "Example.com", "Example.com", "", "/")),
            ),
            (
                "https://[::1]:8443/x",
                Ok(("https", "[::1]:8443", "::1", "8443", "/x")),
            ),
            (
                "https://[2001:db8::1]",
                Ok(("https", "[2001:db8::1]", "2001:db8::1", "", "")),
            ),
            (
                "https://user:pw@host:1/p?q=1",
                Ok(("https", "host:1", "host", "1", "/p")),
            ),
            ("http://", Ok(("http", "", "", "", ""))),
            ("http:///path", Ok(("http", "", "", "", "/path"))),
            ("/api/v1", Ok(("", "", "", "", "/api/v1"))),
            ("//example.com/a", Ok(("", "", "", "", "//example.com/a"))),
            ("mailto:someone@example.com", Ok(("mailto", "", "", "", ""))),
            ("localhost:8080", Ok(("localhost", "", "", "", ""))),
            ("http:", Ok(("http", "", "", "", ""))),
            ("https://a/b c", Ok(("https", "a", "a", "", "/b%20c"))),
            ("https://a/b#frag", Ok(("https", "a", "a", "", "/b%23frag"))),
            ("https://a/%41", Ok(("https", "a", "a", "", "/%41"))),
            ("*", Ok(("", "", "", "", "*"))),
            ("", Err("parse \"\": empty url")),
            (
                "example.com",
                Err("parse \"example.com\": invalid URI for request"),
            ),
            (
                "example.com/path",
                Err("parse \"example.com/path\": invalid URI for request"),
            ),
            (
                "not a url",
                Err("parse \"not a url\": invalid URI for request"),
            ),
            (":foo", Err("parse \":foo\": missing protocol scheme")),
            (
                "https://host:abc/",
                Err("parse \"https://host:abc/\": invalid port \":abc\" after host"),
            ),
            (
                "https://[::1/",
                Err("parse \"https://[::1/\": missing ']' in host"),
            ),
            (
                "https://a b/",
                Err("parse \"https://a b/\": invalid character \" \" in host name"),
            ),
            (
                "https://a/%zz",
                Err("parse \"https://a/%zz\": invalid URL escape \"%zz\""),
            ),
            (
                "https://a\n",
                Err("parse \"https://a\\n\": net/url: invalid control character in URL"),
            ),
            (
                "https://us{er@a/",
                Err("parse \"https://us{er@a/\": net/url: invalid userinfo"),
            ),
        ];
        for (input, want) in rows {
            let got = parse_request_uri(input).map(|u| {
                (
                    u.scheme.clone(),
                    u.host.clone(),
                    u.hostname(),
                    u.port(),
                    u.escaped_path(),
                )
            });
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(
                    (
                        g.0.as_str(),
                        g.1.as_str(),
                        g.2.as_str(),
                        g.3.as_str(),
                        g.4.as_str()
                    ),
                    *w,
                    "{input}"
                ),
                (Err(e), Err(w)) => assert_eq!(e.to_string(), *w, "{input}"),
                (g, w) => panic!("{input}: got {g:?}, want {w:?}"),
            }
        }
    }
}
