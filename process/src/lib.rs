//! What the enclave and gateway binaries do alike as processes: structured logs on stderr, and
//! reading their TOML configuration file.

pub mod config_table;
pub mod crash_point;
pub mod environment;

use std::path::Path;

/// Logs JSON lines to stderr, filtered by `COFFER_LOG` when it is set, else by `default_filter`
/// (the configuration's `log`), in `tracing`'s `EnvFilter` syntax.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COFFER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt().with_env_filter(filter).json().with_writer(std::io::stderr).init();
}

/// The configuration in the TOML file at `path`, or the defaults when no file is given. A file
/// that cannot be read or does not parse as `T` (whose types refuse unknown keys) is an error
/// naming the file.
pub fn read_config<T: serde::de::DeserializeOwned + Default>(path: Option<&Path>) -> anyhow::Result<T> {
    let Some(path) = path else { return Ok(T::default()) };
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The top-level keys the configuration file `path` sets (none without a file): what was named
/// rather than left to its default.
pub fn config_keys(path: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let Some(path) = path else { return Ok(Vec::new()) };
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(table.keys().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Settings {
        name: String,
        size: u32,
    }

    #[test]
    fn a_file_is_read_whole_and_errors_name_it() {
        let dir = std::env::temp_dir().join(format!("coffer-process-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_config::<Settings>(None).unwrap(), Settings::default());
        let good = dir.join("good.toml");
        std::fs::write(&good, "name = \"x\"\nsize = 3\n").unwrap();
        assert_eq!(read_config::<Settings>(Some(&good)).unwrap(), Settings { name: "x".into(), size: 3 });
        let unknown = dir.join("unknown.toml");
        std::fs::write(&unknown, "nmae = \"x\"\n").unwrap();
        let err = read_config::<Settings>(Some(&unknown)).unwrap_err().to_string();
        assert!(err.starts_with(&unknown.display().to_string()) && err.contains("nmae"), "{err}");
        let missing = dir.join("missing.toml");
        let err = read_config::<Settings>(Some(&missing)).unwrap_err().to_string();
        assert!(err.starts_with("reading ") && err.contains("missing.toml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
