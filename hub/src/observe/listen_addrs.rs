//! `--listen-addrs-file`: once a command has bound its listeners, the address each one got,
//! as a small JSON object (`{"metrics": "127.0.0.1:41234", "health": ...}`). A supervisor or
//! a test passes port 0 (`--metrics-addr 127.0.0.1:0`), lets the system choose a free port,
//! and reads the port it got here, instead of reserving one and racing other processes for it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("--listen-addrs-file {path}: {source}")]
pub struct ListenAddrsError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Writes `addrs` (listener name, bound address) to `path` as one JSON object, whole or not
/// at all: written beside it, then renamed over it, so a reader polling for the file never
/// sees half of it.
pub fn write(path: &Path, addrs: &[(&str, SocketAddr)]) -> Result<(), ListenAddrsError> {
    let err = |source| ListenAddrsError {
        path: path.to_path_buf(),
        source,
    };
    let object: serde_json::Map<String, serde_json::Value> = addrs
        .iter()
        .map(|(name, addr)| ((*name).to_string(), addr.to_string().into()))
        .collect();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::Value::Object(object).to_string();
    std::fs::write(&tmp, text + "\n").map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_address_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("addrs.json");
        std::fs::write(&path, "stale").unwrap();
        let metrics: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let api: SocketAddr = "[::1]:8443".parse().unwrap();
        write(&path, &[("metrics", metrics), ("api", api)]).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"metrics": "127.0.0.1:41234", "api": "[::1]:8443"})
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_the_flag_and_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("addrs.json");
        let err = write(&path, &[]).unwrap_err().to_string();
        assert!(err.starts_with("--listen-addrs-file "), "{err}");
        assert!(err.contains("missing-dir"), "{err}");
    }
}
