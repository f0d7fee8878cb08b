//! Credential plugins for fleet tests: the real `kleym` binary (bundled plugins) and small
//! shell scripts of the tests' own.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Finds the `kleym` binary next to the running executable (`target/<profile>/kleym` from
/// `target/<profile>/deps/<test>` or `target/<profile>/<bin>`). It exists when the workspace
/// was built (`cargo test --workspace` builds it; else `cargo build -p kleym-hub`).
pub fn kleym_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join("kleym");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the kleym binary was not found near {}; build it first: cargo build -p kleym-hub",
        exe.display()
    ))
}

/// Writes an executable script (written to a temporary name, then renamed, so it is never
/// exec'ed half-written).
pub fn write_script(dir: &Path, name: &str, body: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// A plugin printing a `client.authentication.k8s.io/v1` ExecCredential with a fixed token
/// (no expiry), appending one line to `count_file` per run when given.
pub fn static_token_plugin(
    dir: &Path,
    name: &str,
    token: &str,
    count_file: Option<&Path>,
) -> std::io::Result<PathBuf> {
    let count = count_file
        .map(|p| format!("echo x >> '{}'\n", p.display()))
        .unwrap_or_default();
    let body = format!(
        "#!/bin/sh\n{count}cat <<'EOF'\n{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\"}}}}\nEOF\n"
    );
    write_script(dir, name, &body)
}

/// Number of lines in a count file (0 when absent).
pub fn count_runs(count_file: &Path) -> usize {
    std::fs::read_to_string(count_file)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}
