//! The `kubesim` command line.

use clap::Parser;
use std::path::PathBuf;

/// Help text after the options: files written, the fault endpoint, signals.
const AFTER_HELP: &str = r#"FILES (per cluster, under --state-dir):
  <name>/kubeconfig    admin kubeconfig (token auth, CA embedded, context <name>)
  <name>/ca.crt        the cluster CA certificate (PEM)
  <name>/admin.token   the admin bearer token (user kubesim-admin, group system:masters)
  <name>/server        the API server URL (https://127.0.0.1:<port>)
  kubeconfig           one kubeconfig with a context per cluster

Once every cluster serves, kubesim prints exactly one line `ready` on stdout. It runs until
SIGTERM or SIGINT, then stops every server and exits 0. Logs go to stderr (RUST_LOG).

AUTHENTICATION
  Admin bearer token; client certificates signed by the cluster CA (CN = user,
  O = groups); ServiceAccount tokens from TokenRequest (`kubectl create token`), verified
  like kube-apiserver (signature, audience = the server URL, expiry, ServiceAccount and
  bound pod still exist); with --authentication-config, JWTs of external issuers as
  kube-apiserver's structured authentication verifies them; with --client-ca, client
  certificates of further CAs. Anonymous requests get 401 except /healthz, /livez, /readyz,
  /version, /.well-known/openid-configuration and /openid/v1/jwks.

FAULT INJECTION (admin only: group system:masters)
  GET    /kubesim/faults   current fault state (JSON)
  POST   /kubesim/faults   change it; JSON body, every field optional:
           {"latencyMs": 200,                         added latency per request
            "errors": [{"verb": "list", "resource": "pods", "rate": 0.5, "code": 503}],
                                                      error rate per verb/resource
                                                      (code 429|500|503|504; omit verb or
                                                      resource to match all)
            "failNext": [{"verb": "patch", "resource": "pods", "code": 409, "remaining": 1}],
                                                      exactly the next N matching requests
                                                      fail (code 409|429|500|503|504)
            "dropWatches": true,                      end every open watch now
            "forceGoneWatches": 2,                    next 2 watches get 410 Expired
            "blackhole": true,                        accept, never answer (incl. TLS)
            "refuseConnections": true,                close the port, drop connections
            "goaway": 1,                              GOAWAY on the next N connections
                                                      (open ones first; closed after 1 s)
            "h1Only": true,                           ALPN http/1.1 only, refuse HTTP/2
            "silentConnection": true,                 open connections stop answering
                                                      (socket kept; false: close them)
            "endlessBodies": [{"verb": "watch", "resource": "namespaces", "bytes": 67108864}],
                                                      answer 200 with N bytes of one JSON
                                                      string never closed, no newline
                                                      (a hostile server; "*" matches all)
            "revokeTokens": ["<token>"],              revoke bearer tokens
            "revokeAllServiceAccountTokens": true,    revoke every SA token issued so far
            "tokenClockSkewSeconds": 7200,            verify tokens as if it were later
            "clearAfterSeconds": 10}                  clear everything after 10 s (the
                                                      way to end a blackhole/refusal)
  DELETE /kubesim/faults   clear every fault

  Example:
    curl --cacert DIR/hub/ca.crt -H "Authorization: Bearer $(cat DIR/hub/admin.token)" \
         -X POST --data '{"latencyMs": 100}' "$(cat DIR/hub/server)/kubesim/faults"
"#;

/// kubesim: a Kubernetes API simulator serving one HTTPS API server per simulated cluster
/// on 127.0.0.1 (random ports), each with its own CA, admin token and ServiceAccount issuer.
#[derive(Debug, Parser)]
#[command(name = "kubesim", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Comma-separated cluster names (e.g. hub,spoke-1,spoke-2).
    #[arg(long, value_delimiter = ',', required = true)]
    pub clusters: Vec<String>,
    /// Directory for the per-cluster files (created if missing).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// CRD manifests to install in every cluster: a YAML/JSON file (multi-document) or a
    /// directory of them. Repeatable.
    #[arg(long)]
    pub crds: Vec<PathBuf>,
    /// Do not request client certificates during the TLS handshake.
    #[arg(long)]
    pub no_client_certs: bool,
    /// CLUSTER=FILE: that cluster also authenticates JWTs with the `jwt` authenticators of
    /// FILE, an `apiserver.config.k8s.io/v1beta1` (or `v1alpha1`) `AuthenticationConfiguration` (kube-apiserver's
    /// `--authentication-config`): OIDC discovery over HTTPS with `issuer.certificateAuthority`,
    /// JWKS refetch on an unknown `kid`, `iss`/`aud`/`exp`/`nbf`, `claimValidationRules`,
    /// `claimMappings` (username, groups, uid) and CEL `userValidationRules`. Fields kubesim
    /// does not implement are refused at start-up, named. The file is re-read when it
    /// changes; an invalid new version keeps the previous one (and is logged). Repeatable.
    #[arg(long, value_name = "CLUSTER=FILE", value_parser = cluster_file)]
    pub authentication_config: Vec<(String, PathBuf)>,
    /// CLUSTER=FILE: that cluster also accepts client certificates chaining to the PEM CA
    /// bundle in FILE (kube-apiserver's `--client-ca-file`, in addition to the cluster's own
    /// CA). Repeatable.
    #[arg(long, value_name = "CLUSTER=FILE", value_parser = cluster_file)]
    pub client_ca: Vec<(String, PathBuf)>,
}

/// Parses `CLUSTER=FILE`.
fn cluster_file(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((c, f)) if !c.is_empty() && !f.is_empty() => Ok((c.to_string(), PathBuf::from(f))),
        _ => Err(format!("{s:?}: expected CLUSTER=FILE")),
    }
}

impl Args {
    /// Validate cluster names (they become directory names and kubeconfig contexts).
    pub fn validate(&self) -> Result<(), String> {
        for c in &self.clusters {
            let ok = !c.is_empty()
                && c.len() <= 63
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
                && !c.starts_with('-')
                && !c.ends_with('-');
            if !ok {
                return Err(format!(
                    "invalid cluster name {c:?}: use lower-case letters, digits and '-' (DNS label)"
                ));
            }
        }
        for (flag, list) in [
            ("--authentication-config", &self.authentication_config),
            ("--client-ca", &self.client_ca),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for (c, _) in list {
                if !self.clusters.contains(c) {
                    return Err(format!("{flag} {c}=…: no cluster {c:?} in --clusters"));
                }
                if !seen.insert(c) {
                    return Err(format!("{flag}: cluster {c:?} given twice"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn parses_the_documented_command_line() {
        let a = Args::try_parse_from([
            "kubesim",
            "--clusters",
            "hub,spoke-1,spoke-2",
            "--state-dir",
            "/tmp/x",
            "--crds",
            "a.yaml",
            "--crds",
            "dir",
        ])
        .unwrap();
        assert_eq!(a.clusters, vec!["hub", "spoke-1", "spoke-2"]);
        assert_eq!(a.crds.len(), 2);
        assert!(a.validate().is_ok());
        let bad =
            Args::try_parse_from(["kubesim", "--clusters", "Hub", "--state-dir", "x"]).unwrap();
        assert!(bad.validate().is_err());
        assert!(Args::try_parse_from(["kubesim", "--state-dir", "x"]).is_err());
    }

    #[test]
    fn authentication_config_and_client_ca_name_a_listed_cluster() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["kubesim", "--clusters", "a,b", "--state-dir", "x"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v)
        };
        let a = parse(&[
            "--authentication-config",
            "a=authn.yaml",
            "--client-ca",
            "b=ca.pem",
        ])
        .unwrap();
        assert_eq!(
            a.authentication_config,
            vec![("a".to_string(), PathBuf::from("authn.yaml"))]
        );
        assert!(a.validate().is_ok());
        assert!(parse(&["--authentication-config", "a"]).is_err());
        let unknown = parse(&["--authentication-config", "c=x.yaml"]).unwrap();
        assert!(unknown.validate().unwrap_err().contains("no cluster \"c\""));
        let twice = parse(&["--client-ca", "a=x", "--client-ca", "a=y"]).unwrap();
        assert!(twice.validate().unwrap_err().contains("given twice"));
    }

    #[test]
    fn help_documents_the_fault_endpoint() {
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("/kubesim/faults"));
        assert!(help.contains("ready"));
        Args::command().debug_assert();
    }
}
