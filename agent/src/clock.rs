//! NTP-style estimate of the collector's clock relative to this host's, from the timestamps on
//! every acknowledged request: `t1` agent send, `t2` collector receive, `t3` collector send,
//! `t4` agent receive (all `CLOCK_REALTIME`, ns). offset = ((t2 − t1) + (t3 − t4)) / 2 and the
//! true offset lies within ± (round trip − collector time) / 2 of it. The estimate kept is the
//! sample with the smallest round trip among the last [`WINDOW`], its error grown by a drift
//! allowance for its age.

use std::collections::VecDeque;
use std::time::Instant;

/// Samples considered.
pub const WINDOW: usize = 64;
/// Allowed drift between the two clocks, in ns per second of sample age (100 ppm).
const DRIFT_NS_PER_S: f64 = 100_000.0;

/// The estimator.
#[derive(Debug, Default)]
pub struct ClockEstimate {
    samples: VecDeque<(Instant, i64, u64)>,
}

impl ClockEstimate {
    /// Adds a sample; ignores impossible ones (negative round trip).
    pub fn sample(&mut self, t1: u64, t2: u64, t3: u64, t4: u64) {
        let (t1, t2, t3, t4) = (t1 as i128, t2 as i128, t3 as i128, t4 as i128);
        let rtt = (t4 - t1) - (t3 - t2);
        if t1 == 0 || t2 == 0 || t3 < t2 || t4 < t1 || rtt < 0 {
            return;
        }
        let offset = ((t2 - t1) + (t3 - t4)) / 2;
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples
            .push_back((Instant::now(), offset as i64, (rtt / 2) as u64));
    }

    /// (offset, error) in ns: collector time ≈ host time + offset, within ± error.
    pub fn get(&self) -> Option<(i64, u64)> {
        self.samples
            .iter()
            .map(|(at, off, err)| {
                let aged = *err as f64 + at.elapsed().as_secs_f64() * DRIFT_NS_PER_S;
                (*off, aged as u64)
            })
            .min_by_key(|(_, e)| *e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_round_trip_wins_and_the_offset_is_recovered() {
        let mut c = ClockEstimate::default();
        assert_eq!(c.get(), None);
        // Collector 5 ms ahead; one-way 1 ms; the collector holds the request 2 ms.
        let base = 1_000_000_000_000u64;
        let (t1, t2, t3, t4) = (base, base + 6_000_000, base + 8_000_000, base + 4_000_000);
        c.sample(t1, t2, t3, t4);
        let (off, err) = c.get().expect("estimate");
        assert_eq!(off, 5_000_000);
        assert!((1_000_000..1_001_000).contains(&err), "{err}");
        // A sample with an asymmetric, slower path is less precise: not chosen.
        c.sample(
            base,
            base + 15_000_000,
            base + 15_000_000,
            base + 12_000_000,
        );
        assert_eq!(c.get().expect("estimate").0, 5_000_000);
        // Impossible samples are ignored.
        c.sample(base, base, base - 1, base);
        assert_eq!(c.samples.len(), 2);
    }
}
