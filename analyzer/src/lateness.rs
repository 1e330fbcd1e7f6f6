//! How late each rank arrives at its collectives, over time: each instance's members against
//! its first arrival, accumulated as the batch drivers feed calls in time order
//! ([`crate::batch`], [`crate::large`]), for the report's rank × time heatmap.
//!
//! The state is bounded whatever the trace's length: an instance is held only until its last
//! member has come (or a minute of trace time has passed since one did), and time bins start at
//! one second and double in width whenever the trace spans more than [`MAX_BINS`] of them.

use crate::FastMap;

use commscope_wire::op::Op;
use commscope_wire::record::Call;

/// Time bins per rank, at most.
const MAX_BINS: u64 = 1024;
/// An instance not completed by its members within this much trace time is closed as it is.
const OPEN_FOR_NS: u64 = 60_000_000_000;

#[derive(Debug)]
struct Open {
    size: usize,
    arrivals: Vec<(i32, u64)>,
    /// Feed time of its latest member.
    seen: u64,
}

/// The accumulator.
#[derive(Debug)]
pub struct Lateness {
    open: FastMap<(u64, u64), Open>,
    /// (time bin, rank) → (sum of lateness in ns, arrivals).
    cells: FastMap<(u64, i32), (u64, u64)>,
    bin_ns: u64,
    bins: Option<(u64, u64)>,
    last_sweep: u64,
}

impl Default for Lateness {
    fn default() -> Self {
        Lateness {
            open: FastMap::default(),
            cells: FastMap::default(),
            bin_ns: 1_000_000_000,
            bins: None,
            last_sweep: 0,
        }
    }
}

/// The result: mean lateness per rank and time bin.
#[derive(Clone, Debug, Default)]
pub struct LatenessMap {
    /// Width of a bin (ns); bin `b` starts at `b × bin_ns` on the trace's common base.
    pub bin_ns: u64,
    /// (bin, rank, sum of lateness in ns, arrivals).
    pub cells: Vec<(u64, i32, u64, u64)>,
}

impl Lateness {
    /// A completed call that arrived at `a` (its start on the common base), fed at `t`.
    pub fn call(&mut self, c: &Call, a: u64, t: u64) {
        let op = c.op();
        if op.is_p2p() || op == Op::None || c.comm_size < 2 || !c.timed() {
            return;
        }
        let size = c.comm_size as usize;
        let key = (c.comm_id, c.seq);
        let o = self.open.entry(key).or_insert_with(|| Open {
            size,
            arrivals: Vec::with_capacity(size.min(64)),
            seen: t,
        });
        o.arrivals.push((c.rank, a));
        o.seen = o.seen.max(t);
        if o.arrivals.len() >= o.size
            && let Some(done) = self.open.remove(&key)
        {
            self.close(done);
        }
        if t >= self.last_sweep.saturating_add(OPEN_FOR_NS) {
            self.last_sweep = t;
            let stale: Vec<(u64, u64)> = self
                .open
                .iter()
                .filter(|(_, o)| o.seen.saturating_add(OPEN_FOR_NS) < t)
                .map(|(k, _)| *k)
                .collect();
            for k in stale {
                if let Some(o) = self.open.remove(&k) {
                    self.close(o);
                }
            }
        }
    }

    fn close(&mut self, o: Open) {
        if o.arrivals.len() < 2 {
            return;
        }
        let first = o.arrivals.iter().map(|x| x.1).min().unwrap_or(0);
        for (rank, a) in o.arrivals {
            let b = a / self.bin_ns;
            let (lo, hi) = self.bins.map_or((b, b), |(lo, hi)| (lo.min(b), hi.max(b)));
            self.bins = Some((lo, hi));
            let e = self.cells.entry((b, rank)).or_default();
            e.0 += a - first;
            e.1 += 1;
            if hi - lo >= MAX_BINS {
                self.widen();
            }
        }
    }

    /// Doubles the bins' width, merging pairs.
    fn widen(&mut self) {
        self.bin_ns = self.bin_ns.saturating_mul(2);
        let mut merged: FastMap<(u64, i32), (u64, u64)> =
            FastMap::with_capacity_and_hasher(self.cells.len(), Default::default());
        for ((b, r), (sum, n)) in self.cells.drain() {
            let e = merged.entry((b / 2, r)).or_default();
            e.0 += sum;
            e.1 += n;
        }
        self.cells = merged;
        self.bins = self.bins.map(|(lo, hi)| (lo / 2, hi / 2));
    }

    /// Closes what is still open and gives the map.
    pub fn finish(mut self) -> LatenessMap {
        let open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        for o in open {
            self.close(o);
        }
        let mut cells: Vec<(u64, i32, u64, u64)> = self
            .cells
            .into_iter()
            .map(|((b, r), (sum, n))| (b, r, sum, n))
            .collect();
        cells.sort_unstable();
        LatenessMap {
            bin_ns: self.bin_ns,
            cells,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rank: i32, seq: u64) -> Call {
        Call {
            op: Op::Allreduce as u8,
            comm_id: 7,
            seq,
            rank,
            comm_size: 2,
            ..Default::default()
        }
    }

    #[test]
    fn members_are_measured_against_the_first_arrival_and_bins_widen() {
        let mut l = Lateness::default();
        const S: u64 = 1_000_000_000;
        // Rank 1 arrives 3 ms after rank 0 at every instance, one per second for 3000 s.
        for seq in 0..3000 {
            let t0 = 10 * S + seq * S;
            l.call(&call(1, seq), t0 + 3_000_000, t0 + 5_000_000);
            l.call(&call(0, seq), t0, t0 + 5_000_001);
        }
        let m = l.finish();
        // 3000 one-second bins do not fit in 1024: 4 s bins.
        assert_eq!(m.bin_ns, 4 * S);
        let late: u64 = m.cells.iter().filter(|c| c.1 == 1).map(|c| c.2).sum();
        let n: u64 = m.cells.iter().filter(|c| c.1 == 1).map(|c| c.3).sum();
        assert_eq!((late, n), (3000 * 3_000_000, 3000));
        assert!(m.cells.iter().filter(|c| c.1 == 0).all(|c| c.2 == 0));
    }
}
