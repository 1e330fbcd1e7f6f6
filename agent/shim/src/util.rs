//! Clocks, thread ids, warnings and configuration from the environment.

use std::io::Write;

/// `CLOCK_MONOTONIC` in nanoseconds (from the TSC where possible: [`crate::clock`]).
#[inline]
pub fn now_mono() -> u64 {
    crate::clock::now()
}

/// `CLOCK_REALTIME` in nanoseconds since the epoch.
#[inline]
pub fn now_real() -> u64 {
    crate::clock::read(libc::CLOCK_REALTIME)
}

/// The kernel thread id of the caller, cached per thread.
#[inline]
pub fn tid() -> u32 {
    thread_local! {
        static TID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    TID.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid has no preconditions.
        let v = unsafe { libc::gettid() } as u32;
        t.set(v);
        v
    })
}

/// Writes one `commscope: …` line to stderr (never per call: only for configuration problems
/// and failures, each reported once).
pub fn warn(args: std::fmt::Arguments<'_>) {
    let mut line = Vec::with_capacity(160);
    let _ = writeln!(line, "commscope: {args}");
    let _ = std::io::stderr().write_all(&line);
}

pub use commscope_wire::registration::process_start_time;

/// An environment variable, if set and valid UTF-8.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A boolean switch: `1/true/yes/on` or `0/false/no/off/""`; anything else is reported and
/// treated as `default`.
pub fn env_flag(name: &str, default: bool) -> bool {
    match env(name)
        .as_deref()
        .map(str::trim)
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None => default,
        Some("1" | "true" | "yes" | "on") => true,
        Some("0" | "false" | "no" | "off" | "") => false,
        Some(other) => {
            warn(format_args!(
                "ignoring {name}={other:?}: expected 1 or 0; using {}",
                u8::from(default)
            ));
            default
        }
    }
}

/// An integer setting within `[min, max]`; a bad value is reported and `default` used.
pub fn env_u64(name: &str, default: u64, min: u64, max: u64) -> u64 {
    match env(name) {
        None => default,
        Some(s) => match s.trim().parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => v,
            _ => {
                warn(format_args!(
                    "ignoring {name}={s:?}: expected an integer from {min} to {max}; using {default}"
                ));
                default
            }
        },
    }
}

/// The shim's settings, read once at activation.
#[derive(Clone, Debug)]
pub struct Config {
    /// `COMMSCOPE_TRACE_DIR`: write local trace files there.
    pub trace_dir: Option<std::path::PathBuf>,
    /// `COMMSCOPE_AGENT_SOCKET` (default `/run/commscope/agent.sock`).
    pub agent_socket: std::path::PathBuf,
    /// Whether the socket was named explicitly (then failures to reach it are reported).
    pub agent_socket_explicit: bool,
    /// `COMMSCOPE_RING_RECORDS`: ring capacity (rounded up to a power of two).
    pub ring_records: u64,
    /// `COMMSCOPE_IN_FLIGHT_SLOTS`.
    pub in_flight_slots: u32,
    /// `COMMSCOPE_FLUSH_MS`: how often the background thread drains the ring.
    pub flush_ms: u64,
    /// `COMMSCOPE_EXIT_WAIT_MS`: at exit, how long to wait for an agent that served this process
    /// and went away (restarting) to come back for the last records.
    pub exit_wait_ms: u64,
    /// `COMMSCOPE_KEEPER_SOCKET` (set by `commscope run --trace-dir`): the trace keeper that
    /// completes this process's trace file if it is killed.
    pub keeper_socket: Option<std::path::PathBuf>,
}

/// The default agent socket.
pub const DEFAULT_AGENT_SOCKET: &str = commscope_wire::registration::DEFAULT_SOCKET;

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Config {
        let trace_dir = env("COMMSCOPE_TRACE_DIR")
            .filter(|s| !s.trim().is_empty())
            .map(Into::into);
        let explicit = env("COMMSCOPE_AGENT_SOCKET").filter(|s| !s.trim().is_empty());
        Config {
            trace_dir,
            agent_socket_explicit: explicit.is_some(),
            agent_socket: explicit
                .unwrap_or_else(|| DEFAULT_AGENT_SOCKET.to_owned())
                .into(),
            ring_records: env_u64("COMMSCOPE_RING_RECORDS", 1 << 16, 1 << 6, 1 << 24)
                .next_power_of_two(),
            in_flight_slots: env_u64("COMMSCOPE_IN_FLIGHT_SLOTS", 1024, 1, 1 << 16) as u32,
            flush_ms: env_u64("COMMSCOPE_FLUSH_MS", 200, 10, 1000),
            exit_wait_ms: env_u64("COMMSCOPE_EXIT_WAIT_MS", 5000, 0, 60_000),
            keeper_socket: env("COMMSCOPE_KEEPER_SOCKET")
                .filter(|s| !s.trim().is_empty())
                .map(Into::into),
        }
    }
}

pub use commscope_wire::launcher::sanitize_job;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_from_proc() {
        assert!(process_start_time() > 0);
    }
}
