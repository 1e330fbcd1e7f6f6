//! Consistent sampling (ARCHITECTURE.md, "Consistent sampling").
//!
//! At scale the collector asks agents to keep only some instances of busy communicators: an
//! instance `(comm, seq)` is kept when `hash(comm, seq) mod K == 0`, with `K` a power of two set per
//! communicator. Every agent computes the same hash, so a kept instance is complete across its
//! members, and an instance kept under `2K` is also kept under `K` (moduli nest). Point-to-point
//! messages are sampled by (communicator, source, destination, tag, message sequence), which both
//! sides know, so both ends of a message are kept or left out together.
//!
//! What is left out is not lost from the accounting: [`Sampler`] sums left-out calls per
//! (communicator, op) into `skip` records ([`Skip`]) carrying their count, bytes, time inside and
//! seq range; a kept call carries the modulus it was kept under ([`Call::sample_shift`]), its
//! weight, and a kept collective the rank's own compute before it, measured over every call.
//! Calls that returned an error are always kept.

use std::collections::HashMap;

use crate::op::{Op, flags};
use crate::record::{Call, RECORD_SIZE, Record, Skip};

/// SplitMix64's finalizer: a fast, well-mixed 64-bit hash step.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether instance `seq` of communicator `comm` is kept under `modulus` (a power of two; 0
/// and 1 keep everything).
#[inline]
pub fn keep(comm: u64, seq: u64, modulus: u32) -> bool {
    modulus <= 1 || mix(comm ^ mix(seq)) & u64::from(modulus - 1) == 0
}

/// Whether the message `src → dst` (ranks in the communicator) with `tag`, the `op_seq`-th of
/// that (source, destination, tag), is kept under `modulus`.
#[inline]
pub fn keep_message(comm: u64, src: i32, dst: i32, tag: i32, op_seq: u64, modulus: u32) -> bool {
    if modulus <= 1 {
        return true;
    }
    let pair = (u64::from(src as u32) << 32) | u64::from(dst as u32);
    let h = mix(comm ^ mix(pair ^ mix(u64::from(tag as u32) ^ mix(op_seq))));
    h & u64::from(modulus - 1) == 0
}

/// Whether a call is kept under `modulus`: collectives by instance, point-to-point by message
/// (a `sendrecv` when either of its messages is); failed calls and ops commscope cannot pair are
/// always kept.
pub fn keep_call(c: &Call, modulus: u32) -> bool {
    if modulus <= 1 || c.status != 0 {
        return true;
    }
    match c.op() {
        Op::None => true,
        Op::Send => keep_message(c.comm_id, c.comm_rank, c.peer, c.tag, c.op_seq, modulus),
        Op::Recv => {
            c.peer < 0 || keep_message(c.comm_id, c.peer, c.comm_rank, c.tag, c.op_seq, modulus)
        }
        Op::Sendrecv => {
            keep_message(c.comm_id, c.comm_rank, c.peer, c.tag, c.op_seq, modulus)
                || c.peer2 < 0
                || keep_message(c.comm_id, c.peer2, c.comm_rank, c.tag2, c.op_seq2, modulus)
        }
        _ => keep(c.comm_id, c.seq, modulus),
    }
}

/// `log2` of a power-of-two modulus (what [`Call::sample_shift`] holds).
pub fn shift_of(modulus: u32) -> u8 {
    if modulus <= 1 {
        0
    } else {
        (31 - modulus.leading_zeros()) as u8
    }
}

/// A modulus as sampling uses it: the power of two at or below `k` (at least 1).
pub fn modulus_floor(k: u32) -> u32 {
    1 << shift_of(k)
}

/// The modulus of one communicator: `modulus` from instance `from_seq` on, `before` until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub modulus: u32,
    pub from_seq: u64,
    pub before: u32,
}

/// The moduli in force, per communicator (absent: keep everything).
#[derive(Clone, Debug, Default)]
pub struct Rates {
    by_comm: HashMap<u64, Rate>,
}

impl Rates {
    /// Sets communicator `comm` to `modulus` (rounded down to a power of two) from `from_seq` on.
    /// What held before applies to earlier instances. Returns whether anything changed.
    pub fn set(&mut self, comm: u64, modulus: u32, from_seq: u64) -> bool {
        let modulus = modulus_floor(modulus);
        let before = self.by_comm.get(&comm).map_or(1, |r| r.modulus);
        match self.by_comm.get(&comm) {
            Some(r) if r.modulus == modulus => false,
            _ if modulus == 1 && before == 1 => false,
            _ => {
                self.by_comm.insert(
                    comm,
                    Rate {
                        modulus,
                        from_seq,
                        before,
                    },
                );
                true
            }
        }
    }

    /// The modulus for instance `seq` of `comm`.
    #[inline]
    pub fn modulus(&self, comm: u64, seq: u64) -> u32 {
        if self.by_comm.is_empty() {
            return 1;
        }
        match self.by_comm.get(&comm) {
            Some(r) if seq >= r.from_seq => r.modulus,
            Some(r) => r.before,
            None => 1,
        }
    }

    /// Whether any communicator is sampled.
    pub fn is_empty(&self) -> bool {
        self.by_comm
            .values()
            .all(|r| r.modulus <= 1 && r.before <= 1)
    }

    /// Every communicator's rate.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Rate)> + '_ {
        self.by_comm.iter().map(|(c, r)| (*c, *r))
    }

    /// Forgets every rate.
    pub fn clear(&mut self) {
        self.by_comm.clear();
    }
}

/// What [`Sampler::filter`] did with a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Calls kept, calls left out, skip records written.
    pub kept: u64,
    pub left_out: u64,
    pub skips: u64,
}

/// A skip being filled, with the `rec_seq` of its first call.
#[derive(Debug)]
struct Open {
    skip: Skip,
    first_rec_seq: u64,
}

/// How long left-out calls are held before their skip is sent (ns of the process's clock).
pub const SKIP_MAX_AGE_NS: u64 = 500_000_000;

/// Applies the rates to a process's records, in order (the node agent's half of consistent
/// sampling).
///
/// - A kept call is marked with its modulus ([`Call::sample_shift`]); a kept collective also
///   carries the rank's own compute since its previous call on the communicator
///   ([`flags::COMPUTE_KNOWN`], in `op_seq2`), which only the agent, seeing every call, can
///   measure.
/// - Left-out calls are summed per (communicator, op) into a skip, sent when its first call is
///   [`SKIP_MAX_AGE_NS`] old (at the next record of the process) or by [`Sampler::flush`].
/// - Each skip says through which `rec_seq` everything has been sent, so the receiver's dedup
///   marks stay a few ranges.
#[derive(Debug, Default)]
pub struct Sampler {
    open: Vec<Open>,
    /// Per communicator: `t_exit` of its latest call, time inside after it, whether it blocked.
    last_on_comm: HashMap<u64, (u64, u64, bool)>,
    /// Time inside every blocking call seen so far.
    inside: u64,
    /// Highest `rec_seq` read, and the latest time seen.
    read_through: u64,
    now: u64,
}

impl Sampler {
    /// Filters raw records (whole 128-byte records) from `records` into `out`.
    pub fn filter(&mut self, rates: &Rates, records: &[u8], out: &mut Vec<u8>) -> Filtered {
        let mut f = Filtered::default();
        out.reserve(records.len());
        for chunk in records.chunks_exact(RECORD_SIZE) {
            let raw: &[u8; RECORD_SIZE] = chunk.try_into().expect("exact chunk");
            let rec = Record::decode(raw);
            if let Ok(r) = &rec {
                self.read_through = self.read_through.max(r.rec_seq());
            }
            let Ok(Record::Call(mut c)) = rec else {
                if let Ok(Record::Heartbeat(h)) = rec {
                    self.now = self.now.max(h.t_mono);
                }
                out.extend_from_slice(raw);
                continue;
            };
            self.now = self.now.max(c.t_exit);
            let modulus = rates.modulus(c.comm_id, c.seq);
            let blocking =
                c.flags & (flags::NONBLOCKING | flags::PERSISTENT | flags::UNTRACKED) == 0;
            let op = c.op();
            let collective = !op.is_p2p() && op != Op::None;
            // GPU interval for NCCL calls that have one, else the host's time inside the call.
            let (t_start, t_end) = c.span();
            let compute = match self.last_on_comm.get(&c.comm_id) {
                Some(&(t_exit, inside, true)) if blocking && collective && t_start >= t_exit => {
                    Some((t_start - t_exit).saturating_sub(self.inside - inside))
                }
                _ => None,
            };
            if blocking {
                self.inside += c.span_ns();
            }
            if self.last_on_comm.len() >= 4096 && !self.last_on_comm.contains_key(&c.comm_id) {
                self.last_on_comm.clear();
            }
            self.last_on_comm
                .insert(c.comm_id, (t_end, self.inside, blocking));
            if keep_call(&c, modulus) {
                f.kept += 1;
                c.sample_shift = shift_of(modulus);
                if let Some(ns) = compute {
                    c.flags |= flags::COMPUTE_KNOWN;
                    c.op_seq2 = ns;
                }
                out.extend_from_slice(&Record::Call(c).encode());
                continue;
            }
            f.left_out += 1;
            match self
                .open
                .iter_mut()
                .find(|o| o.skip.comm_id == c.comm_id && o.skip.op == c.op)
            {
                Some(o) => {
                    let k = &mut o.skip;
                    k.rec_seq = c.rec_seq;
                    k.last_seq = c.seq;
                    k.calls += 1;
                    k.bytes += c.bytes;
                    k.t_last = c.t_exit;
                    k.modulus = modulus;
                    if blocking {
                        k.inside_ns += c.duration_ns();
                    } else {
                        k.flags |= flags::NONBLOCKING;
                    }
                }
                None => self.open.push(Open {
                    first_rec_seq: c.rec_seq,
                    skip: Skip {
                        rec_seq: c.rec_seq,
                        from_rec_seq: 0,
                        through_rec_seq: 0,
                        op: c.op,
                        flags: if blocking { 0 } else { flags::NONBLOCKING },
                        comm_id: c.comm_id,
                        first_seq: c.seq,
                        last_seq: c.seq,
                        calls: 1,
                        bytes: c.bytes,
                        inside_ns: if blocking { c.duration_ns() } else { 0 },
                        t_first: c.t_enter,
                        t_last: c.t_exit,
                        rank: c.rank,
                        comm_rank: c.comm_rank,
                        comm_size: c.comm_size,
                        modulus,
                    },
                }),
            }
        }
        let now = self.now;
        f.skips += self.send(out, |o| {
            o.skip.t_first.saturating_add(SKIP_MAX_AGE_NS) <= now
        });
        f
    }

    /// Sends every open skip (the process is gone, or sampling stopped).
    pub fn flush(&mut self, out: &mut Vec<u8>) -> u64 {
        self.send(out, |_| true)
    }

    /// Whether left-out calls wait in open skips.
    pub fn has_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// Sends the open skips `due` picks, oldest first, each marked with how far everything has
    /// been sent.
    fn send(&mut self, out: &mut Vec<u8>, due: impl Fn(&Open) -> bool) -> u64 {
        if !self.open.iter().any(&due) {
            return 0;
        }
        let (mut go, stay): (Vec<Open>, Vec<Open>) = self.open.drain(..).partition(|o| due(o));
        self.open = stay;
        go.sort_unstable_by_key(|o| o.first_rec_seq);
        let through = match self.open.iter().map(|o| o.first_rec_seq).min() {
            Some(first_waiting) => first_waiting - 1,
            None => self.read_through,
        };
        let from = go.first().map_or(0, |o| o.first_rec_seq);
        let n = go.len() as u64;
        for o in go {
            let mut k = o.skip;
            k.from_rec_seq = from;
            k.through_rec_seq = through;
            out.extend_from_slice(&Record::Skip(k).encode());
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rec_seq: u64, comm: u64, seq: u64, op: Op, dur: u64) -> Call {
        Call {
            rec_seq,
            op: op as u8,
            comm_id: comm,
            seq,
            op_seq: seq,
            bytes: 1024,
            count: 256,
            peer: -1,
            tag: -1,
            t_enter: rec_seq * 1000,
            t_exit: rec_seq * 1000 + dur,
            rank: 3,
            comm_rank: 3,
            comm_size: 8,
            peer2: -1,
            tag2: -1,
            ..Default::default()
        }
    }

    #[test]
    fn moduli_nest_and_keep_about_one_in_k() {
        for k in [2u32, 4, 8, 64] {
            let kept: Vec<u64> = (0..100_000).filter(|s| keep(0xabc, *s, k)).collect();
            let expect = 100_000.0 / f64::from(k);
            assert!(
                (kept.len() as f64 - expect).abs() < 5.0 * expect.sqrt(),
                "K={k}: {} kept",
                kept.len()
            );
            // Everything kept under 2K is kept under K.
            assert!(kept.iter().all(|s| keep(0xabc, *s, k / 2)));
        }
        // Different communicators keep different instances.
        let a: Vec<u64> = (0..64).filter(|s| keep(1, *s, 8)).collect();
        let b: Vec<u64> = (0..64).filter(|s| keep(2, *s, 8)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn both_sides_of_a_message_agree() {
        for op_seq in 0..2000 {
            let mut send = call(1, 9, 0, Op::Send, 10);
            send.comm_rank = 2;
            send.peer = 5;
            send.tag = 7;
            send.op_seq = op_seq;
            let mut recv = call(1, 9, 0, Op::Recv, 10);
            recv.comm_rank = 5;
            recv.peer = 2;
            recv.tag = 7;
            recv.op_seq = op_seq;
            assert_eq!(keep_call(&send, 8), keep_call(&recv, 8));
        }
    }

    #[test]
    fn rates_apply_from_their_seq() {
        let mut r = Rates::default();
        assert_eq!(r.modulus(5, 0), 1);
        assert!(r.set(5, 6, 100)); // rounded down to 4
        assert_eq!((r.modulus(5, 99), r.modulus(5, 100)), (1, 4));
        assert!(!r.set(5, 4, 200));
        assert!(r.set(5, 16, 300));
        assert_eq!((r.modulus(5, 299), r.modulus(5, 300)), (4, 16));
        assert_eq!(r.modulus(6, 1000), 1);
        assert!(!r.is_empty());
    }

    #[test]
    fn left_out_calls_become_skips_that_account_for_every_record() {
        let mut rates = Rates::default();
        rates.set(0xa, 4, 0);
        let mut input = Vec::new();
        let mut all = Vec::new();
        let mut rec = 1;
        for seq in 0..200u64 {
            // Two communicators interleaved; 0xb is not sampled.
            for (comm, op) in [(0xa, Op::Allreduce), (0xb, Op::Barrier)] {
                let mut c = call(rec, comm, seq, op, 500);
                if seq % 10 == 3 && comm == 0xa {
                    c.flags = flags::NONBLOCKING;
                }
                all.push(c);
                input.extend_from_slice(&Record::Call(c).encode());
                rec += 1;
            }
        }
        let mut out = Vec::new();
        let mut sampler = Sampler::default();
        // In two batches, as an agent reads a ring.
        let half = input.len() / 2;
        let mut f = sampler.filter(&rates, &input[..half], &mut out);
        let g = sampler.filter(&rates, &input[half..], &mut out);
        f.kept += g.kept;
        f.left_out += g.left_out;
        f.skips += g.skips;
        assert!(sampler.has_open());
        f.skips += sampler.flush(&mut out);
        assert!(!sampler.has_open());
        let recs: Vec<Record> = out
            .chunks_exact(RECORD_SIZE)
            .map(|c| Record::decode(c.try_into().expect("whole record")).expect("decodes"))
            .collect();
        let kept_a: Vec<&Call> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Call(c) if c.comm_id == 0xa => Some(c),
                _ => None,
            })
            .collect();
        assert!(
            kept_a
                .iter()
                .all(|c| keep(0xa, c.seq, 4) && c.sample_shift == 2)
        );
        assert_eq!(kept_a.len() as u64 + f.left_out, 200);
        assert_eq!(f.kept, kept_a.len() as u64 + 200);
        // Each kept blocking collective knows the rank's compute since its previous call on
        // the communicator: 1.5 µs from that call's end, minus the 500 ns barrier in between.
        for c in &kept_a {
            let prev_blocking = c.seq > 0 && (c.seq - 1) % 10 != 3;
            let blocking = c.flags & flags::NONBLOCKING == 0;
            if prev_blocking && blocking {
                assert!(c.flags & flags::COMPUTE_KNOWN != 0, "{c:?}");
                assert_eq!(c.op_seq2, 1500 - 500, "{c:?}");
            } else {
                assert_eq!(c.flags & flags::COMPUTE_KNOWN, 0, "{c:?}");
            }
        }
        // The skips: calls, bytes and time inside add up.
        let skips: Vec<&Skip> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Skip(k) => Some(k),
                _ => None,
            })
            .collect();
        assert_eq!(skips.len() as u64, f.skips);
        assert_eq!(skips.iter().map(|k| k.calls).sum::<u64>(), f.left_out);
        assert_eq!(
            skips.iter().map(|k| k.bytes).sum::<u64>(),
            f.left_out * 1024
        );
        let nonblocking_left = all
            .iter()
            .filter(|c| c.comm_id == 0xa && !keep(0xa, c.seq, 4) && c.flags != 0)
            .count() as u64;
        assert_eq!(
            skips.iter().map(|k| k.inside_ns).sum::<u64>(),
            (f.left_out - nonblocking_left) * 500
        );
        // Every rec_seq is accounted for: records sent, and the spans skips mark.
        let mut covered = std::collections::BTreeSet::new();
        for r in &recs {
            covered.insert(r.rec_seq());
            if let Record::Skip(k) = r {
                let (a, b) = k.sent_span().expect("a span");
                covered.extend(a..=b);
            }
        }
        assert_eq!(covered.len() as u64, rec - 1);
        assert_eq!(covered.last(), Some(&(rec - 1)));
    }

    #[test]
    fn old_left_out_calls_are_sent_without_waiting_for_more() {
        let mut rates = Rates::default();
        rates.set(7, 1 << 16, 0);
        let mut s = Sampler::default();
        let mut out = Vec::new();
        let c = call(1, 7, 1, Op::Allreduce, 10);
        assert!(!keep(7, 1, 1 << 16));
        s.filter(&rates, &Record::Call(c).encode(), &mut out);
        assert!(out.is_empty() && s.has_open());
        // A heartbeat 0.6 s later: the skip goes.
        let hb = Record::Heartbeat(crate::record::Heartbeat {
            rec_seq: 2,
            t_mono: c.t_exit + 600_000_000,
            ..Default::default()
        });
        let f = s.filter(&rates, &hb.encode(), &mut out);
        assert_eq!(f.skips, 1);
        assert!(!s.has_open());
        let recs: Vec<Record> = out
            .chunks_exact(RECORD_SIZE)
            .map(|c| Record::decode(c.try_into().expect("whole record")).expect("decodes"))
            .collect();
        assert!(matches!(recs[0], Record::Heartbeat(_)));
        assert!(matches!(recs[1], Record::Skip(k) if k.calls == 1 && k.through_rec_seq == 2));
    }

    #[test]
    fn every_call_is_counted_once_whatever_the_batches() {
        // Three communicators, heartbeats, calls minutes apart and microseconds apart, read
        // in batches of every size: kept calls plus skipped calls are exactly the calls made.
        let mut rates = Rates::default();
        rates.set(0xa, 4, 0);
        rates.set(0xb, 2, 10);
        let mut x = 12345u64;
        let mut rnd = move || {
            x = mix(x);
            x
        };
        let mut input = Vec::new();
        let mut rec = 1;
        let mut t = 1_000_000u64;
        let mut made = 0u64;
        let mut seqs = [0u64; 3];
        for _ in 0..5000 {
            t += rnd() % 200_000_000;
            if rnd() % 10 == 0 {
                let hb = Record::Heartbeat(crate::record::Heartbeat {
                    rec_seq: rec,
                    t_mono: t,
                    ..Default::default()
                });
                input.extend_from_slice(&hb.encode());
            } else {
                let k = (rnd() % 3) as usize;
                let mut c = call(rec, [0xa, 0xb, 0xc][k], seqs[k], Op::Allreduce, 1000);
                seqs[k] += 1;
                c.t_enter = t;
                c.t_exit = t + 1000;
                input.extend_from_slice(&Record::Call(c).encode());
                made += 1;
            }
            rec += 1;
        }
        let mut sampler = Sampler::default();
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let n = (1 + rnd() as usize % 300) * RECORD_SIZE;
            let end = (at + n).min(input.len());
            sampler.filter(&rates, &input[at..end], &mut out);
            at = end;
        }
        sampler.flush(&mut out);
        let mut counted = 0;
        let mut covered = std::collections::BTreeSet::new();
        for c in out.chunks_exact(RECORD_SIZE) {
            let r = Record::decode(c.try_into().expect("whole")).expect("decodes");
            assert!(covered.insert(r.rec_seq()) || matches!(r, Record::Skip(_)));
            match r {
                Record::Call(_) => counted += 1,
                Record::Skip(k) => {
                    counted += k.calls;
                    if let Some((a, b)) = k.sent_span() {
                        covered.extend(a..=b);
                    }
                }
                _ => {}
            }
        }
        assert_eq!(counted, made);
        assert_eq!(covered.len() as u64, rec - 1);
    }
}
