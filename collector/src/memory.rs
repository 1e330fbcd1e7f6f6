//! The collector's memory bound (`--memory-limit`, default [`DEFAULT_FRACTION`] of the memory it
//! may use: the machine's, or its cgroup's limit where lower). Under more load than it can take
//! the collector degrades, never runs out of memory:
//!
//! - **pressed** (resident memory at [`PRESSED`] of the bound): consistent sampling works to a
//!   budget [`PRESSED_DIVISOR`] times smaller, and keeps two instances per second of a
//!   communicator where it keeps four, so busy communicators are thinned harder;
//! - **full** (at [`FULL`]): record batches are refused with a retry delay — agents and the
//!   simulator keep them and send them again, nothing accepted is lost — but for one in
//!   [`FULL_TAKES_ONE_IN`] while memory is under the bound itself (so a job whose working set
//!   alone keeps the collector full still moves on); sampling is harder
//!   still (one instance per second kept), and freed memory is handed back to the system.
//!
//! Each state holds until memory falls clearly below its threshold ([`RELIEF`]). Overload is a
//! state of the collector, shown in the API (`/api/v1/jobs`' `collector`), in metrics and on the
//! findings made meanwhile (`evidence.overload`); it is never a finding, and the data it keeps
//! back holds verdicts as any lag does (the jobs' nodes fall behind).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// The default bound: this fraction of the memory available to the collector.
pub const DEFAULT_FRACTION: f64 = 0.5;
/// Pressed from this fraction of the bound on.
pub const PRESSED: f64 = 0.80;
/// Full from this fraction of the bound on.
pub const FULL: f64 = 0.95;
/// A state is left once memory is this much (of the bound) below its threshold.
pub const RELIEF: f64 = 0.10;
/// Sampling budgets are divided by this while pressed, and its square while full.
pub const PRESSED_DIVISOR: f64 = 4.0;
/// Record batches refused while full are sent again after this long (ms).
pub const RETRY_MS: u32 = 500;
/// While full but under the bound itself, one record batch in this many is still taken: a job
/// whose working set alone keeps memory near the bound moves on, slowly, instead of waiting for
/// memory that will not come back (at the bound itself none is taken).
pub const FULL_TAKES_ONE_IN: u64 = 4;

/// How close to its bound the collector is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    Normal = 0,
    Pressed = 1,
    Full = 2,
}

impl Pressure {
    pub fn name(self) -> &'static str {
        match self {
            Pressure::Normal => "normal",
            Pressure::Pressed => "pressed",
            Pressure::Full => "full",
        }
    }

    fn of(v: u8) -> Pressure {
        match v {
            2 => Pressure::Full,
            1 => Pressure::Pressed,
            _ => Pressure::Normal,
        }
    }

    /// Kept instances per second a collective communicator is never thinned below.
    pub fn min_instances(self) -> f64 {
        match self {
            Pressure::Normal => crate::sampling::EVIDENCE_FLOOR,
            Pressure::Pressed => crate::sampling::EVIDENCE_FLOOR / 2.0,
            Pressure::Full => crate::sampling::EVIDENCE_FLOOR / 4.0,
        }
    }

    /// What the sampling budget is divided by.
    pub fn budget_divisor(self) -> f64 {
        match self {
            Pressure::Normal => 1.0,
            Pressure::Pressed => PRESSED_DIVISOR,
            Pressure::Full => PRESSED_DIVISOR * PRESSED_DIVISOR,
        }
    }
}

/// The bound and where memory stands against it.
#[derive(Debug)]
pub struct MemoryBound {
    /// The bound (bytes).
    pub limit: u64,
    rss: AtomicU64,
    peak: AtomicU64,
    level: AtomicU8,
    /// Record batches refused because memory was full, and their records.
    pub refused_batches: AtomicU64,
    pub refused_records: AtomicU64,
    /// Times the state went up to pressed or full.
    pub entered: [AtomicU64; 2],
    /// Record batches offered while full.
    offered_full: AtomicU64,
}

impl MemoryBound {
    pub fn new(limit: u64) -> MemoryBound {
        MemoryBound {
            limit: limit.max(1),
            rss: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            level: AtomicU8::new(0),
            refused_batches: AtomicU64::new(0),
            refused_records: AtomicU64::new(0),
            entered: [AtomicU64::new(0), AtomicU64::new(0)],
            offered_full: AtomicU64::new(0),
        }
    }

    /// Whether to take a record batch now: always unless full; while full, one in
    /// [`FULL_TAKES_ONE_IN`] as long as memory is under the bound itself, none above.
    pub fn admit(&self) -> bool {
        if self.pressure() != Pressure::Full {
            return true;
        }
        if self.rss() >= self.limit {
            return false;
        }
        self.offered_full
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(FULL_TAKES_ONE_IN)
    }

    /// The state now.
    pub fn pressure(&self) -> Pressure {
        Pressure::of(self.level.load(Ordering::Acquire))
    }

    /// Resident memory at the last sample, and the highest seen (bytes).
    pub fn rss(&self) -> u64 {
        self.rss.load(Ordering::Relaxed)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Takes a sample of resident memory; returns the state before and after when it changed.
    pub fn sample(&self) -> Option<(Pressure, Pressure)> {
        let rss = resident_bytes().unwrap_or(0);
        self.observe(rss)
    }

    /// [`MemoryBound::sample`] with the resident memory given.
    pub fn observe(&self, rss: u64) -> Option<(Pressure, Pressure)> {
        self.rss.store(rss, Ordering::Relaxed);
        self.peak.fetch_max(rss, Ordering::Relaxed);
        let was = self.pressure();
        let now = next(was, rss as f64 / self.limit as f64);
        if now == was {
            return None;
        }
        if now > was {
            self.entered[now as usize - 1].fetch_add(1, Ordering::Relaxed);
        }
        self.level.store(now as u8, Ordering::Release);
        Some((was, now))
    }

    /// A record batch of `records` refused for memory.
    pub fn refused(&self, records: u64) {
        self.refused_batches.fetch_add(1, Ordering::Relaxed);
        self.refused_records.fetch_add(records, Ordering::Relaxed);
    }

    /// For the API and the findings' evidence, while not normal.
    pub fn overload(&self) -> Option<serde_json::Value> {
        let p = self.pressure();
        (p != Pressure::Normal).then(|| self.status())
    }

    /// Where memory stands, for the API.
    pub fn status(&self) -> serde_json::Value {
        let p = self.pressure();
        serde_json::json!({
            "state": p.name(),
            "memory_bytes": self.rss(),
            "peak_memory_bytes": self.peak(),
            "memory_limit_bytes": self.limit,
            "refused_batches": self.refused_batches.load(Ordering::Relaxed),
            "refused_records": self.refused_records.load(Ordering::Relaxed),
            "note": self.note(),
        })
    }

    /// A sentence on the state ("" when normal).
    pub fn note(&self) -> String {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        match self.pressure() {
            Pressure::Normal => String::new(),
            Pressure::Pressed => format!(
                "the collector is near its memory bound ({:.1} of {:.1} GiB): it samples busy communicators harder",
                gib(self.rss()),
                gib(self.limit)
            ),
            Pressure::Full => format!(
                "the collector is at its memory bound ({:.1} of {:.1} GiB): agents hold their records and send them again; verdicts wait for them",
                gib(self.rss()),
                gib(self.limit)
            ),
        }
    }
}

/// The state after `was` at `used` (resident memory over the bound).
fn next(was: Pressure, used: f64) -> Pressure {
    let up = if used >= FULL {
        Pressure::Full
    } else if used >= PRESSED {
        Pressure::Pressed
    } else {
        Pressure::Normal
    };
    if up >= was {
        return up;
    }
    // Down only once clearly below the threshold of the state held.
    let threshold = match was {
        Pressure::Full => FULL,
        Pressure::Pressed => PRESSED,
        Pressure::Normal => return up,
    };
    if used < threshold - RELIEF {
        // One step at a time: full relieves to pressed, unless far below that too.
        if was == Pressure::Full && used >= PRESSED - RELIEF {
            Pressure::Pressed
        } else {
            up
        }
    } else {
        was
    }
}

/// Test double: a file holding the resident memory to report instead of the process's own
/// (bytes, decimal), so that a test can drive the bound's states through a real collector.
pub const TEST_RSS_FILE_ENV: &str = "COMMSCOPE_TEST_RSS_FILE";

/// This process's resident memory (bytes), from `/proc/self/statm` (or the test double's file).
pub fn resident_bytes() -> Option<u64> {
    static DOUBLE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    if let Some(f) = DOUBLE.get_or_init(|| std::env::var_os(TEST_RSS_FILE_ENV).map(Into::into)) {
        return std::fs::read_to_string(f).ok()?.trim().parse().ok();
    }
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

/// The memory available to this process: the machine's, or its cgroup's limit where lower.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut total = total_kib * 1024;
    for f in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        if let Some(limit) = std::fs::read_to_string(f)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            total = total.min(limit);
        }
    }
    Some(total)
}

/// The default bound: [`DEFAULT_FRACTION`] of [`available_bytes`] (8 GiB when unknown).
pub fn default_limit() -> u64 {
    available_bytes().map_or(8 << 30, |b| (b as f64 * DEFAULT_FRACTION) as u64)
}

/// Parses a bound: bytes with an optional unit (`8G`, `512MiB`, `2000000000`), or a percentage
/// of the memory available (`40%`).
pub fn parse_limit(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: not a percentage"))?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!("{s:?}: a percentage from 0 to 100"));
        }
        let avail = available_bytes().ok_or("the machine's memory is not known")?;
        return Ok((avail as f64 * p / 100.0) as u64);
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: not a size (e.g. 8G, 512MiB, 40%)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("{s:?}: unknown unit {u:?} (B, K, M, G, T)")),
    };
    let bytes = (n * mult as f64) as u64;
    if bytes < 64 << 20 {
        return Err(format!("{s:?}: at least 64 MiB"));
    }
    Ok(bytes)
}

/// Hands memory the allocator holds free back to the system (glibc).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_rise_at_once_and_fall_only_clearly_below() {
        let m = MemoryBound::new(1000);
        assert_eq!(m.observe(500), None);
        assert_eq!(m.observe(800), Some((Pressure::Normal, Pressure::Pressed)));
        assert_eq!(m.observe(960), Some((Pressure::Pressed, Pressure::Full)));
        // Just under full: still full.
        assert_eq!(m.observe(900), None);
        assert_eq!(m.observe(840), Some((Pressure::Full, Pressure::Pressed)));
        assert_eq!(m.observe(750), None);
        assert_eq!(m.observe(690), Some((Pressure::Pressed, Pressure::Normal)));
        // From full straight to normal when far below both.
        m.observe(990);
        assert_eq!(m.observe(100), Some((Pressure::Full, Pressure::Normal)));
        assert_eq!(m.entered[0].load(Ordering::Relaxed), 1);
        assert_eq!(m.entered[1].load(Ordering::Relaxed), 2);
        assert_eq!(m.peak(), 990);
    }

    #[test]
    fn full_takes_a_trickle_under_the_bound_and_nothing_over_it() {
        let m = MemoryBound::new(1000);
        m.observe(500);
        assert!((0..1000).all(|_| m.admit()), "normal takes everything");
        m.observe(970);
        assert_eq!(m.pressure(), Pressure::Full);
        let taken = (0..400).filter(|_| m.admit()).count();
        assert_eq!(taken, 100);
        m.observe(1000);
        assert!(!m.admit(), "none at the bound itself");
    }

    #[test]
    fn limits_parse_with_units_and_percentages() {
        assert_eq!(parse_limit("8G"), Ok(8 << 30));
        assert_eq!(parse_limit("512MiB"), Ok(512 << 20));
        assert_eq!(parse_limit("1.5g"), Ok(3 << 29));
        assert_eq!(parse_limit("2000000000"), Ok(2_000_000_000));
        let half = parse_limit("50%").expect("a percentage");
        let avail = available_bytes().expect("meminfo");
        assert!(half.abs_diff(avail / 2) <= 1, "{half} vs {avail}");
        for bad in ["", "8X", "-1G", "0%", "150%", "1M", "G"] {
            assert!(parse_limit(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resident_memory_is_read() {
        let rss = resident_bytes().expect("statm");
        assert!(rss > 1 << 20 && rss < 64 << 30, "{rss}");
        assert!(default_limit() > 0);
    }
}
