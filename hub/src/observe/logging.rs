//! The log subscriber of `kleym hub` and `kleym spoke`, set from their `--log-format` and
//! `--log-level` flags.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A `--log-level` that is not a tracing filter directive.
#[derive(Debug, thiserror::Error)]
#[error("invalid --log-level {level:?}")]
pub struct LogLevelError {
    level: String,
    #[source]
    source: ParseError,
}

/// Installs the process's log subscriber: `format` lines filtered by `level` (a tracing
/// directive such as `info` or `kleym_hub=debug`). A subscriber installed already (tests
/// running several commands in one process) is kept.
pub fn init(format: LogFormat, level: &str) -> Result<(), LogLevelError> {
    let filter = EnvFilter::try_new(level).map_err(|source| LogLevelError {
        level: level.to_string(),
        source,
    })?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // Already initialised (tests): keep the existing subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_level_is_refused_naming_the_flag() {
        let e = init(LogFormat::Text, "kleym_hub=loud").expect_err("not a level");
        assert!(e.to_string().contains("--log-level"), "{e}");
        // A valid level would install the process-wide subscriber, which the other tests
        // of this binary would then write through: not exercised here.
    }
}
