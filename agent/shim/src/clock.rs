//! The recorder's clock: `CLOCK_MONOTONIC` nanoseconds, read from the TSC where the kernel itself
//! keeps time with it.
//!
//! `clock_gettime` costs 15–30 ns; the two reads per call were half of the shim's cost. Where the
//! kernel's clocksource is `tsc` and the processor's TSC is constant and non-stop, [`now`] reads
//! the TSC (≈ 8 ns) and maps it linearly onto `CLOCK_MONOTONIC`.
//!
//! The map's first slope is measured over [`FIRST_CALIBRATION_NS`] from the reading [`start`]
//! takes at activation, by whichever thread gets there first: the application's own calls (the
//! slow path of [`now`]) or the background thread. It must not wait for the background thread
//! alone: that thread runs in the idle class, and on cores the ranks keep busy (polling MPI
//! progress) it may not run for seconds — every call meanwhile paid two `clock_gettime`s.
//! The background thread ([`Calibrator::tick`]) then re-anchors the map every tick: the new map
//! starts where the old one is at that instant (so time never jumps or runs backwards) and its
//! slope is steered so that it meets `CLOCK_MONOTONIC` again one period later, the way NTP slews
//! a clock. The error stays within microseconds; a larger disagreement (suspend, migration)
//! resets the map. Everywhere else, before the first calibration, and with
//! `COMMSCOPE_CLOCK=mono`, [`now`] is `clock_gettime(CLOCK_MONOTONIC)`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The TSC can stand in for `CLOCK_MONOTONIC` (decided by [`start`]).
static USABLE: AtomicBool = AtomicBool::new(false);
/// The paired reading the first slope is measured from.
static START_TSC: AtomicU64 = AtomicU64::new(0);
static START_NS: AtomicU64 = AtomicU64::new(0);
/// Taken by the one thread that publishes the first calibration.
static CALIBRATING: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicU64 = AtomicU64::new(0);
static BASE_TSC: AtomicU64 = AtomicU64::new(0);
static BASE_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per TSC tick, as a 32.32 fixed-point number; 0 until calibrated.
static MULT: AtomicU64 = AtomicU64::new(0);

/// Discrepancy beyond which the map is reset instead of slewed.
const RESET_NS: u64 = 1_000_000;
/// Shortest interval the first calibration uses.
const FIRST_CALIBRATION_NS: u64 = 50_000_000;

/// A kernel clock in nanoseconds (vDSO: no system call).
#[inline]
pub fn read(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` read from the kernel.
#[inline]
pub fn mono_raw() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

#[inline]
fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86-64.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
pub fn now() -> u64 {
    if ENABLED.load(Ordering::Relaxed) {
        for _ in 0..4 {
            let s = SEQ.load(Ordering::Acquire);
            if s & 1 == 1 {
                continue;
            }
            let (bt, bn, m) = (
                BASE_TSC.load(Ordering::Relaxed),
                BASE_NS.load(Ordering::Relaxed),
                MULT.load(Ordering::Relaxed),
            );
            fence(Ordering::Acquire);
            if SEQ.load(Ordering::Relaxed) != s {
                continue;
            }
            if m == 0 {
                break;
            }
            return map(tsc(), bt, bn, m);
        }
    }
    uncalibrated()
}

/// `clock_gettime`, and the first calibration once its interval has passed.
#[cold]
fn uncalibrated() -> u64 {
    let m = mono_raw();
    if USABLE.load(Ordering::Relaxed)
        && !ENABLED.load(Ordering::Relaxed)
        && m.saturating_sub(START_NS.load(Ordering::Relaxed)) >= FIRST_CALIBRATION_NS
    {
        first_calibration();
    }
    m
}

/// Decides whether to use the TSC and takes the reading the first slope is measured from; at
/// activation, before any record.
pub fn start() {
    if !tsc_usable() {
        return;
    }
    let (t, m) = paired();
    START_TSC.store(t, Ordering::Relaxed);
    START_NS.store(m, Ordering::Relaxed);
    USABLE.store(true, Ordering::Release);
}

/// Publishes the first map (once, by whichever thread comes first); its slope is the TSC's rate
/// since [`start`]. Returns the reading it was published at.
fn first_calibration() -> Option<(u64, u64)> {
    if CALIBRATING.swap(true, Ordering::AcqRel) {
        return None;
    }
    let (t0, m0) = (
        START_TSC.load(Ordering::Relaxed),
        START_NS.load(Ordering::Relaxed),
    );
    let (t, m) = paired();
    if t <= t0 || m.saturating_sub(m0) < FIRST_CALIBRATION_NS {
        CALIBRATING.store(false, Ordering::Release);
        return None;
    }
    let slope = ((u128::from(m - m0) << 32) / u128::from(t - t0)) as u64;
    publish(t, m, slope);
    ENABLED.store(true, Ordering::Release);
    Some((t, m))
}

#[inline]
fn map(t: u64, bt: u64, bn: u64, m: u64) -> u64 {
    bn + ((u128::from(t.saturating_sub(bt)) * u128::from(m)) >> 32) as u64
}

fn publish(bt: u64, bn: u64, m: u64) {
    let s = SEQ.load(Ordering::Relaxed);
    SEQ.store(s | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    BASE_TSC.store(bt, Ordering::Relaxed);
    BASE_NS.store(bn, Ordering::Relaxed);
    MULT.store(m, Ordering::Relaxed);
    SEQ.store((s | 1) + 1, Ordering::Release);
}

/// Whether the TSC can stand in for `CLOCK_MONOTONIC` here.
fn tsc_usable() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    match crate::util::env("COMMSCOPE_CLOCK")
        .as_deref()
        .map(str::trim)
    {
        Some("mono") => return false,
        Some("tsc") | None => {}
        Some(other) => crate::util::warn(format_args!(
            "ignoring COMMSCOPE_CLOCK={other:?}: expected tsc or mono"
        )),
    }
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    if source.trim() != "tsc" {
        return false;
    }
    invariant_tsc()
}

/// Whether the processor says its TSC runs at a constant rate in every power state (CPUID
/// 0x8000_0007, EDX bit 8: what Linux reports as `constant_tsc` and `nonstop_tsc`). Asked of the
/// processor rather than parsed from `/proc/cpuinfo`, which the kernel generates for every CPU
/// (slow on large hosts) and which this runs at activation, inside `MPI_Init`.
fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // The extended leaf is read only when the processor reports it.
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A simultaneous reading of the TSC and `CLOCK_MONOTONIC` (the TSC at the middle of the
/// `clock_gettime` call).
fn paired() -> (u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..3 {
        let t1 = tsc();
        let m = mono_raw();
        let t2 = tsc();
        let width = t2.wrapping_sub(t1);
        if width < best.2 {
            best = (t1 + width / 2, m, width);
        }
    }
    (best.0, best.1)
}

/// Keeps the TSC map calibrated; owned by the background thread.
#[derive(Debug)]
pub struct Calibrator {
    /// The reading the slope is measured from (once the map is published).
    anchor: Option<(u64, u64)>,
}

impl Calibrator {
    /// A calibrator for the map [`start`] began.
    pub fn new() -> Calibrator {
        Calibrator { anchor: None }
    }

    /// Re-anchors the map (call every few hundred milliseconds); publishes the first map when
    /// the application's calls have not yet.
    pub fn tick(&mut self) {
        if !USABLE.load(Ordering::Acquire) {
            return;
        }
        let Some((t0, m0)) = self.anchor else {
            if let Some(reading) = first_calibration() {
                self.anchor = Some(reading);
            } else if ENABLED.load(Ordering::Acquire) {
                // Published by an application thread: measure from here on.
                self.anchor = Some(paired());
            }
            return;
        };
        let (t, m) = paired();
        if t <= t0 || m <= m0 {
            return;
        }
        // The true slope over the last interval, ns per tick in 32.32.
        let slope = ((u128::from(m - m0) << 32) / u128::from(t - t0)) as u64;
        let (bt, bn, mult) = (
            BASE_TSC.load(Ordering::Relaxed),
            BASE_NS.load(Ordering::Relaxed),
            MULT.load(Ordering::Relaxed),
        );
        let ours = map(t, bt, bn, mult);
        if ours.abs_diff(m) > RESET_NS {
            publish(t, m, slope);
        } else {
            // Start where the map is now; aim to meet CLOCK_MONOTONIC one interval later.
            let interval = (t - t0).max(1);
            let target = u128::from(m) + u128::from(m - m0);
            let needed = target.saturating_sub(u128::from(ours));
            let steered = ((needed << 32) / u128::from(interval)) as u64;
            // Never slew faster than 0.1 % away from the measured slope.
            let lo = slope - slope / 1000;
            let hi = slope + slope / 1000;
            publish(t, ours, steered.clamp(lo, hi));
        }
        self.anchor = Some((t, m));
    }
}

impl Default for Calibrator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_map_is_calibrated_by_the_callers_and_tracks_clock_monotonic() {
        start();
        if !USABLE.load(Ordering::Acquire) {
            return; // nothing to check on a machine whose kernel does not keep time with the TSC
        }
        // No background thread yet: the callers' own reads calibrate the map.
        let mut last = 0;
        let begin = mono_raw();
        while !ENABLED.load(Ordering::Acquire) {
            let n = now();
            assert!(n >= last, "time ran backwards: {n} < {last}");
            last = n;
            assert!(
                mono_raw() - begin < 2 * FIRST_CALIBRATION_NS,
                "not calibrated by the callers"
            );
        }
        let mut c = Calibrator::new();
        for _ in 0..8 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            c.tick();
            for _ in 0..1000 {
                let n = now();
                assert!(n >= last, "time ran backwards: {n} < {last}");
                last = n;
            }
            let (ours, theirs) = (now(), mono_raw());
            assert!(
                ours.abs_diff(theirs) < 200_000,
                "map off by {} ns",
                ours.abs_diff(theirs)
            );
        }
        assert!(c.anchor.is_some(), "the background thread took over");
    }
}
