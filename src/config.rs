//! Settings of the long-running commands (`agent`, `collector`, `up`): flags, `COMMSCOPE_*`
//! environment variables and a TOML file (`--config`, `COMMSCOPE_CONFIG`).
//!
//! Precedence, highest first: flag, environment variable, file, built-in default. The file has
//! one table per command, keys spelled like the flags:
//!
//! ```toml
//! [agent]
//! collector = "http://collector.example:4650"
//! spool-max-bytes = 2147483648
//!
//! [collector]
//! trace-dir = "/data/commscope"
//! retention = "7d"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    #[serde(default)]
    pub agent: AgentFile,
    #[serde(default)]
    pub collector: CollectorFile,
}

/// `[agent]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentFile {
    pub collector: Option<String>,
    pub socket: Option<PathBuf>,
    pub node: Option<String>,
    pub trace_dir: Option<PathBuf>,
    pub http: Option<String>,
    pub spool_dir: Option<PathBuf>,
    pub spool_max_bytes: Option<u64>,
    pub batch_records: Option<usize>,
    pub poll: Option<String>,
    pub spool_after: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub pods_url: Option<String>,
    pub pods_token_file: Option<PathBuf>,
    pub pods_ca_file: Option<PathBuf>,
    pub auth_token_file: Option<PathBuf>,
}

/// `[collector]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CollectorFile {
    pub listen: Option<String>,
    pub http: Option<String>,
    pub trace_dir: Option<PathBuf>,
    pub segment_bytes: Option<u64>,
    pub segment_age: Option<String>,
    pub retention: Option<String>,
    pub retention_bytes: Option<u64>,
    pub max_message_bytes: Option<usize>,
    pub max_agent_rate: Option<u64>,
    pub ingest_budget_bytes: Option<usize>,
    pub sample_budget: Option<u64>,
    pub sample_modulus: Option<u32>,
    pub memory_limit: Option<String>,
    pub max_jobs: Option<usize>,
    pub shards: Option<usize>,
    pub peers: Option<Vec<String>>,
    pub job_linger: Option<String>,
    pub otlp: Option<String>,
    pub otlp_interval: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub max_jobs_per_agent: Option<usize>,
    pub max_ranks_per_agent: Option<usize>,
    pub auth_token_file: Option<PathBuf>,
}

/// Reads the file (a missing `--config` file is an error; no file given is an empty one).
pub fn load(path: Option<&Path>) -> Result<File> {
    let Some(path) = path else {
        return Ok(File::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

/// Parses a duration: a number with a unit `ms`, `s`, `m`, `h` or `d` (`500ms`, `60s`, `7d`).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("invalid duration {s:?} (e.g. 500ms, 30s, 5m, 2h, 7d)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => bail!("invalid duration unit {other:?} in {s:?} (ms, s, m, h, d)"),
    };
    let secs = v * scale;
    if !secs.is_finite() || !(0.0..=1e10).contains(&secs) {
        bail!("duration {s:?} is out of range");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a size in bytes: a number, optionally with a unit — `KB`, `MB`, `GB`, `TB` (powers
/// of 1000), `KiB`, `MiB`, `GiB`, `TiB` or `K`, `M`, `G`, `T` (powers of 1024), `B` — any case:
/// `65536`, `64MiB`, `1.5GiB`, `80GB`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("invalid size {s:?} (e.g. 65536, 64MiB, 1.5GiB, 80GB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            bail!("invalid size unit {other:?} in {s:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        }
    };
    let bytes = (v * scale).round();
    if !bytes.is_finite() || !(0.0..=u64::MAX as f64).contains(&bytes) {
        bail!("size {s:?} is out of range");
    }
    Ok(bytes as u64)
}

/// [`parse_bytes`] for clap.
pub fn bytes_arg(s: &str) -> std::result::Result<u64, String> {
    parse_bytes(s).map_err(|e| format!("{e:#}"))
}

/// [`parse_bytes`] for clap, into a `usize`.
pub fn bytes_arg_usize(s: &str) -> std::result::Result<usize, String> {
    let b = bytes_arg(s)?;
    usize::try_from(b).map_err(|_| format!("size {s:?} is out of range"))
}

/// Parses a socket address, accepting `:PORT` for all interfaces and `localhost:PORT`.
pub fn parse_addr(s: &str) -> Result<std::net::SocketAddr> {
    let t = s.trim();
    let t = if let Some(port) = t.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = t.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        t.to_owned()
    };
    t.parse()
        .with_context(|| format!("invalid address {s:?} (expected HOST:PORT, e.g. 127.0.0.1:4650)"))
}

/// First of: flag/env value, file value, default.
pub fn pick<T>(flag: Option<T>, file: Option<T>, default: T) -> T {
    flag.or(file).unwrap_or(default)
}

/// The node name: `NODE_NAME` (Kubernetes downward API) or the host name.
pub fn default_node() -> String {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.trim().is_empty()
    {
        return n;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end])
            && !s.is_empty()
        {
            return s.to_owned();
        }
    }
    "localhost".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        for (text, want) in [
            ("65536", 65_536),
            ("64MiB", 64 << 20),
            ("64mib", 64 << 20),
            ("1.5GiB", 3 << 29),
            ("80GB", 80_000_000_000),
            ("10k", 10_240),
            (" 2 TiB ", 2 << 40),
            ("512B", 512),
        ] {
            assert_eq!(parse_bytes(text).expect(text), want, "{text}");
        }
        for bad in ["", "GiB", "-1", "12 parsecs", "1e9"] {
            let e = parse_bytes(bad).expect_err(bad).to_string();
            assert!(e.contains("size"), "{bad}: {e}");
        }
        assert!(parse_bytes("99999999TiB").is_err());
    }

    #[test]
    fn durations_addresses_and_files() {
        assert_eq!(
            parse_duration("500ms").expect("ms"),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_duration("7d").expect("d"),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("90").expect("s"), Duration::from_secs(90));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_addr(":4650").expect("addr").port(), 4650);
        assert!(parse_addr("localhost:1").expect("addr").ip().is_loopback());
        assert!(parse_addr("nowhere").is_err());

        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("c.toml");
        std::fs::write(
            &p,
            "[collector]\nretention = \"7d\"\nmax-jobs = 9\n[agent]\nspool-max-bytes = 5\n",
        )
        .expect("write");
        let f = load(Some(&p)).expect("load");
        assert_eq!(f.collector.max_jobs, Some(9));
        assert_eq!(f.agent.spool_max_bytes, Some(5));
        std::fs::write(&p, "[collector]\nretension = \"7d\"\n").expect("write");
        let e = load(Some(&p)).expect_err("typo");
        assert!(format!("{e:#}").contains("retension"), "{e:#}");
        assert_eq!(pick(Some(1), Some(2), 3), 1);
        assert_eq!(pick(None, Some(2), 3), 2);
        assert_eq!(pick(None, None, 3), 3);
    }
}
