//! The moment each spoke engages, read from a child hub's log: `kleym hub` logs
//! `spoke engaged spoke=<namespace>/<name>` (info level, text format) in the same step as it
//! publishes the spoke's `Engaged` phase, so tailing the log sees each engagement within
//! one poll interval, without scraping `/metrics` (whose `kleym_hub_spokes` gauge follows the
//! fleet state at most every 0.5 s).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The message `kleym hub` logs when a spoke engages.
pub const ENGAGED_MESSAGE: &str = "spoke engaged";

/// The spoke named by a `spoke engaged` line of the hub's text log, if `line` is one.
pub fn engaged_spoke(line: &str) -> Option<&str> {
    let (_, after) = line.split_once(ENGAGED_MESSAGE)?;
    // Fields follow the message: ` spoke=<name> version=<v>`.
    let rest = after.strip_prefix(' ')?;
    rest.split_whitespace()
        .find_map(|field| field.strip_prefix("spoke="))
        .filter(|s| !s.is_empty())
}

/// Reads the lines appended to a log file since the last call. The file is opened once,
/// so reading keeps working when the reading process has run out of file descriptors.
pub struct LogTail {
    file: File,
    offset: u64,
    partial: Vec<u8>,
}

impl LogTail {
    /// Follows `file` from its start.
    pub fn new(file: File) -> Self {
        Self {
            file,
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The complete lines appended since the last call (a line still being written is kept
    /// for the next call).
    pub fn new_lines(&mut self) -> std::io::Result<Vec<String>> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.file.read_at(&mut buf, self.offset)?;
            if n == 0 {
                break;
            }
            self.offset += n as u64;
            self.partial.extend_from_slice(&buf[..n]);
        }
        let Some(last_newline) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        Ok(String::from_utf8_lossy(&complete)
            .lines()
            .map(str::to_string)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn engaged_lines_name_their_spoke() {
        assert_eq!(
            engaged_spoke(
                "2026-01-01T00:00:00.123456Z  INFO kleym_hub::fleet::spoke_task: spoke engaged spoke=fleet/spoke-0001 version=v1.32.3"
            ),
            Some("fleet/spoke-0001")
        );
        assert_eq!(
            engaged_spoke(
                "2026-01-01T00:00:00Z  INFO run{leader=true}: kleym_hub::fleet::spoke_task: spoke engaged version=v1 spoke=fleet/a"
            ),
            Some("fleet/a")
        );
        assert_eq!(
            engaged_spoke("INFO kleym_hub: spoke engagement failed spoke=fleet/a"),
            None
        );
        assert_eq!(
            engaged_spoke("INFO kleym_hub: spoke engaged version=v1"),
            None
        );
        assert_eq!(engaged_spoke("INFO kleym_hub: spoke engaged"), None);
    }

    #[test]
    fn tail_returns_each_complete_line_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.log");
        let mut w = File::create(&path).unwrap();
        let mut tail = LogTail::new(File::open(&path).unwrap());
        assert!(tail.new_lines().unwrap().is_empty());
        write!(w, "one\ntw").unwrap();
        assert_eq!(tail.new_lines().unwrap(), vec!["one"]);
        assert!(tail.new_lines().unwrap().is_empty());
        write!(w, "o\nthree\n").unwrap();
        assert_eq!(tail.new_lines().unwrap(), vec!["two", "three"]);
        assert!(tail.new_lines().unwrap().is_empty());
    }
}
