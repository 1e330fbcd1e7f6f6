//! `degraded-collective`: a collective moves data slower than it should while no rank is late.
//!
//! Measures, per (communicator, op, size class) and for messages of at least
//! `degraded_min_bytes`, the bus bandwidth of each instance from its last arriver's duration
//! (the transfer itself, which stragglers do not inflate), as the median of the last `window`
//! instances. Fires when that is below `degraded_ratio` of a reference — the communicator's own
//! best so far; the best current bandwidth of communicators of the same shape (same op, size
//! class, member count and number of nodes), so a collective degraded from its first step is
//! found while its peers are not; or, for a collective across nodes, half of its members' share
//! of their nodes' network line rate ([`LINE_HEALTHY`]), so a transport degraded everywhere from
//! the first step is found too (below a quarter of that share) — and no member is a slow rank
//! and no link of it is slow (those findings explain it). It is reported once it has stayed
//! degraded for `degraded_sustain_s` and over `window` instances since (a burst of contention
//! is not a slow transport), and recovers above `recover_ratio`.
//! All degraded collectives of a job are one finding (one slow transport).

use std::collections::{BTreeSet, HashMap, VecDeque};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::Op;
use serde_json::json;

use crate::finding::{Class, Finding, Kind, State, finding_id};
use crate::stream::{Tuning, fmt_bw, fmt_bytes, median};

/// Bandwidth history of one (communicator, op, size class).
#[derive(Debug, Default)]
struct Perf {
    comm: u64,
    op: u8,
    bytes: u64,
    size: usize,
    /// Best windowed median so far.
    base: Option<f64>,
    recent: VecDeque<f64>,
    /// Median of `recent`.
    current: f64,
    degraded_since: Option<f64>,
    /// Instances completed since `degraded_since`.
    degraded_instances: usize,
    /// An instance completed since the last evaluation: a finding opens on fresh evidence
    /// only (a hung job's last window, once what explained it resolved, is not).
    fresh: bool,
    /// Members' ranks (for "no member is slow").
    members: Vec<i32>,
    /// Nodes the members run on (its shape, with op, size class and size).
    nodes: usize,
}

/// The degraded-collective detector.
#[derive(Debug, Default)]
pub struct Degraded {
    perf: HashMap<(u64, u8, u32), Perf>,
}

/// A healthy collective across nodes reaches at least this fraction of its members' share of
/// their nodes' line rate (the share: the node's summed port rate over the job's ranks on it,
/// as if every rank used the network at once). Conservative: MPI over TCP reaches more, NCCL
/// over InfiniBand nearly all of it.
pub const LINE_HEALTHY: f64 = 0.5;

/// Where a collective's reference came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RefFrom {
    OwnBest,
    SameShape,
    /// Its members' share of the line rate: (the node's rate, Mbit/s; ranks sharing it).
    LineRate(u64, usize),
}

/// What the detector knows of nodes: a rank's node, and its share of the node's line rate
/// (bytes/s, with the node's rate in Mbit/s and the ranks sharing it).
pub struct Nodes<'a> {
    pub node_of: &'a dyn Fn(i32) -> Option<String>,
    pub line_share: &'a dyn Fn(i32) -> Option<(f64, u64, usize)>,
}

impl std::fmt::Debug for Nodes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nodes")
    }
}

/// What else explains slow transfers: ranks that are slow, communicators with a slow link.
#[derive(Debug)]
pub struct Explained<'a> {
    pub slow_ranks: &'a BTreeSet<i32>,
    pub slow_link_comms: &'a [u64],
}

impl Degraded {
    /// One completed instance: `bytes` per member, `busbw` its bus bandwidth (bytes/s);
    /// `members` its ranks and their nodes, asked the first time.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        comm: u64,
        op: Op,
        bytes: u64,
        size: usize,
        busbw: f64,
        window: usize,
        members: impl FnOnce() -> (Vec<i32>, usize),
    ) {
        let class = 64 - bytes.leading_zeros();
        let perf = self.perf.entry((comm, op as u8, class)).or_default();
        if perf.members.is_empty() {
            (perf.members, perf.nodes) = members();
            perf.comm = comm;
            perf.op = op as u8;
            perf.size = size;
        }
        perf.bytes = bytes;
        perf.fresh = true;
        if perf.degraded_since.is_some() {
            perf.degraded_instances += 1;
        }
        perf.recent.push_back(busbw);
        if perf.recent.len() > window {
            perf.recent.pop_front();
        }
        if perf.recent.len() == window {
            let mut r: Vec<f64> = perf.recent.iter().copied().collect();
            let cur = median(&mut r);
            perf.current = cur;
            perf.base = Some(perf.base.map_or(cur, |b| b.max(cur)));
        }
    }

    /// The reference of each collective: its own best, its shape's best current bandwidth, or
    /// (across nodes) its share of the line rate — the highest.
    fn references(&self, nodes: &Nodes) -> HashMap<(u64, u8, u32), (f64, RefFrom)> {
        let mut shape_best: HashMap<(u8, u32, usize, usize), f64> = HashMap::new();
        for (k, p) in &self.perf {
            if p.base.is_some() {
                let b = shape_best.entry((p.op, k.2, p.size, p.nodes)).or_default();
                *b = b.max(p.current);
            }
        }
        self.perf
            .iter()
            .filter_map(|(k, p)| {
                let own = p.base?;
                let mut best = (own, RefFrom::OwnBest);
                if let Some(peers) = shape_best.get(&(p.op, k.2, p.size, p.nodes))
                    && *peers > best.0 * 1.0001
                {
                    best = (*peers, RefFrom::SameShape);
                }
                if p.nodes >= 2
                    && let Some((share, mbps, n)) = p
                        .members
                        .iter()
                        .filter_map(|m| (nodes.line_share)(*m))
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                    && LINE_HEALTHY * share > best.0
                {
                    best = (LINE_HEALTHY * share, RefFrom::LineRate(mbps, n));
                }
                Some((*k, best))
            })
            .collect()
    }

    /// The finding, if any collective is degraded now.
    #[allow(clippy::too_many_arguments)]
    pub fn findings(
        &mut self,
        job: &str,
        t: &Tuning,
        now_s: f64,
        why_else: &Explained,
        nodes: &Nodes,
        out: &mut Vec<Finding>,
    ) {
        let node_of = nodes.node_of;
        let refs = self.references(nodes);
        let mut degraded: Vec<(&Perf, f64, RefFrom)> = Vec::new();
        for (k, perf) in self.perf.iter_mut() {
            let Some(&(reference, from)) = refs.get(k) else {
                continue;
            };
            let cur = perf.current;
            let explained = perf.members.iter().any(|m| why_else.slow_ranks.contains(m))
                || why_else.slow_link_comms.binary_search(&perf.comm).is_ok();
            match perf.degraded_since {
                None if cur < t.degraded_ratio * reference && !explained && perf.fresh => {
                    perf.degraded_since = Some(now_s);
                    perf.degraded_instances = 0;
                }
                Some(_) if cur >= t.recover_ratio * reference || explained => {
                    perf.degraded_since = None;
                }
                _ => {}
            }
            perf.fresh = false;
            if perf
                .degraded_since
                .is_some_and(|since| now_s - since >= t.degraded_sustain_s)
                && perf.degraded_instances >= t.window
            {
                degraded.push((perf, reference, from));
            }
        }
        if degraded.is_empty() {
            return;
        }
        // The worst one leads the sentence; all are in the evidence.
        degraded.sort_by(|a, b| (a.0.current / a.1).total_cmp(&(b.0.current / b.1)));
        let (worst, reference, from) = degraded[0];
        let comms: BTreeSet<u64> = degraded.iter().map(|p| p.0.comm).collect();
        let nodes: Vec<String> = degraded
            .iter()
            .flat_map(|p| p.0.members.iter())
            .filter_map(|m| node_of(*m))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let since = degraded
            .iter()
            .filter_map(|p| p.0.degraded_since)
            .fold(f64::INFINITY, f64::min);
        let op = Op::from_code(worst.op);
        let single = (comms.len() == 1).then_some(worst.comm);
        let scope = if comms.len() == 1 {
            format!(
                "on communicator {} ({} ranks on {} node{})",
                format_comm_id(worst.comm),
                worst.size,
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" }
            )
        } else {
            format!(
                "on {} communicators across {} nodes (worst: {})",
                comms.len(),
                nodes.len(),
                format_comm_id(worst.comm)
            )
        };
        let against = match from {
            RefFrom::SameShape => format!(
                "of the {} that communicators of the same shape reach",
                fmt_bw(reference)
            ),
            RefFrom::OwnBest => format!("of its own best {}", fmt_bw(reference)),
            RefFrom::LineRate(mbps, n) => format!(
                "of the {} a healthy transport reaches at least (half of each rank's share of its node's {} Gbit/s of network ports, shared by {n} ranks)",
                fmt_bw(reference),
                mbps as f64 / 1000.0
            ),
        };
        out.push(Finding {
            // One finding per job: its id stays when more communicators join it.
            id: finding_id(Kind::DegradedCollective, job, None, &[], None),
            kind: Kind::DegradedCollective,
            class: Class::CommunicationSlow,
            state: State::Open,
            job: job.to_owned(),
            comm: single.map(format_comm_id),
            seq: None,
            ranks: vec![],
            nodes,
            link: None,
            opened_at: (since * 1e9) as u64,
            resolved_at: None,
            confidence: 0.8,
            summary: format!(
                "{} of {} {scope} runs at {} bus bandwidth, {:.0} % {against}, while no rank arrives late — the transport is slow: check the links and NICs between these nodes (slow-link findings, NIC counters) and the library's transport choice",
                op.name(),
                fmt_bytes(worst.bytes),
                fmt_bw(worst.current),
                100.0 * worst.current / reference,
            ),
            evidence: json!({
                "collectives": degraded.iter().map(|(p, r, from)| json!({
                    "comm": format_comm_id(p.comm),
                    "op": Op::from_code(p.op).name(),
                    "bytes": p.bytes,
                    "members": p.size,
                    "busbw_now_bytes_per_s": p.current,
                    "busbw_best_bytes_per_s": p.base,
                    "busbw_reference_bytes_per_s": r,
                    "reference_from": match from {
                        RefFrom::OwnBest => "own-best",
                        RefFrom::SameShape => "same-shape",
                        RefFrom::LineRate(..) => "line-rate",
                    },
                    "ratio": p.current / r,
                })).collect::<Vec<_>>(),
                "at_ns": (now_s * 1e9) as u64,
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    fn feed(d: &mut Degraded, comm: u64, bw: f64, n: usize) {
        for _ in 0..n {
            d.observe(comm, Op::Allreduce, 64 << 20, 8, bw, 5, || {
                ((0..8).map(|r| r + comm as i32 * 8).collect(), 2)
            });
        }
    }

    fn run(d: &mut Degraded, slow: &[i32]) -> Vec<Finding> {
        run_on(d, slow, None)
    }

    /// Evaluates at 10 s, then — when something is degraded — again after the sustain time
    /// with `window` more instances like the last one: what is reported once it held.
    fn run_on(d: &mut Degraded, slow: &[i32], mbps: Option<u64>) -> Vec<Finding> {
        let t = Tuning::default();
        let first = eval(d, slow, mbps, 10.0);
        assert!(first.is_empty(), "reported before it held: {first:#?}");
        let held: Vec<u64> = d
            .perf
            .iter()
            .filter(|(_, p)| p.degraded_since.is_some())
            .map(|(k, _)| k.0)
            .collect();
        if held.is_empty() {
            return first;
        }
        for c in held {
            let last = *d
                .perf
                .values()
                .find(|p| p.comm == c)
                .and_then(|p| p.recent.back())
                .expect("an instance");
            feed(d, c, last, t.window);
        }
        eval(d, slow, mbps, 10.0 + t.degraded_sustain_s)
    }

    /// One evaluation at `now_s`, with nodes of 4 ranks whose ports sum to `mbps` (when known).
    fn eval(d: &mut Degraded, slow: &[i32], mbps: Option<u64>, now_s: f64) -> Vec<Finding> {
        let slow: BTreeSet<i32> = slow.iter().copied().collect();
        let mut out = vec![];
        let e = Explained {
            slow_ranks: &slow,
            slow_link_comms: &[],
        };
        let share = |_r: i32| mbps.map(|m| (m as f64 * 1e6 / 8.0 / 4.0, m, 4));
        d.findings(
            "j",
            &Tuning::default(),
            now_s,
            &e,
            &Nodes {
                node_of: &|r| Some(format!("n{}", r / 4)),
                line_share: &share,
            },
            &mut out,
        );
        out
    }

    #[test]
    fn degraded_everywhere_from_the_first_step_is_found_against_the_line_rate() {
        // Four 400 Gb/s ports per node of 4 ranks: 50 GB/s each. Every communicator runs at
        // 10 GB/s from its first instance: no own best, no peer to compare with.
        let mut d = Degraded::default();
        for c in 1..=3 {
            feed(&mut d, c, 10.0 * GB, 20);
        }
        assert!(
            run(&mut d, &[]).is_empty(),
            "no line rate known: no reference"
        );
        // The ports become known; the next instances are judged against them.
        for c in 1..=3 {
            feed(&mut d, c, 10.0 * GB, 1);
        }
        let f = run_on(&mut d, &[], Some(1_600_000));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(f[0].ranks.is_empty());
        assert!(
            f[0].summary
                .contains("40 % of the 25.0 GB/s a healthy transport reaches")
                && f[0]
                    .summary
                    .contains("1600 Gbit/s of network ports, shared by 4 ranks"),
            "{}",
            f[0].summary
        );
        assert_eq!(
            f[0].evidence["collectives"][0]["reference_from"],
            "line-rate"
        );
    }

    #[test]
    fn a_collective_near_its_line_rate_share_or_on_one_node_is_no_finding() {
        // 40 GB/s of a 50 GB/s share: healthy.
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 20);
        assert!(run_on(&mut d, &[], Some(1_600_000)).is_empty());
        // Slow, but inside one node: the network ports say nothing about it.
        let mut d = Degraded::default();
        for _ in 0..20 {
            d.observe(7, Op::Allreduce, 64 << 20, 4, 5.0 * GB, 5, || {
                ((0..4).collect(), 1)
            });
        }
        assert!(run_on(&mut d, &[], Some(1_600_000)).is_empty());
    }

    #[test]
    fn a_slow_window_left_behind_by_a_hung_job_opens_nothing() {
        // Slow instances while a slow rank explained them; then the job hung (nothing
        // completes) and the slow rank resolved: the last window is old news.
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 10);
        feed(&mut d, 1, 10.0 * GB, 10);
        assert!(run(&mut d, &[9]).is_empty());
        assert!(run(&mut d, &[]).is_empty());
        // A new slow instance is fresh evidence.
        feed(&mut d, 1, 10.0 * GB, 1);
        assert_eq!(run(&mut d, &[]).len(), 1);
    }

    #[test]
    fn a_steady_collective_is_no_finding() {
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 20);
        assert!(run(&mut d, &[]).is_empty());
    }

    #[test]
    fn a_collective_that_slows_down_is_degraded_and_recovers() {
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 10);
        feed(&mut d, 1, 10.0 * GB, 10);
        let f = run(&mut d, &[]);
        assert_eq!(f.len(), 1);
        assert!(f[0].ranks.is_empty());
        assert!(
            f[0].summary.contains("25 % of its own best"),
            "{}",
            f[0].summary
        );
        feed(&mut d, 1, 39.0 * GB, 10);
        assert!(run(&mut d, &[]).is_empty());
    }

    #[test]
    fn a_dip_shorter_than_the_sustain_time_is_no_finding() {
        // Half the bandwidth for 3 s (a burst of contention), then back: nothing.
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 10);
        feed(&mut d, 1, 10.0 * GB, 10);
        assert!(eval(&mut d, &[], None, 10.0).is_empty());
        feed(&mut d, 1, 10.0 * GB, 30);
        assert!(eval(&mut d, &[], None, 13.0).is_empty());
        feed(&mut d, 1, 40.0 * GB, 5);
        assert!(eval(&mut d, &[], None, 16.0).is_empty());
        // Held for the sustain time but over fewer instances than a window: not yet.
        feed(&mut d, 1, 10.0 * GB, 5);
        assert!(eval(&mut d, &[], None, 20.0).is_empty());
        feed(&mut d, 1, 10.0 * GB, 2);
        assert!(eval(&mut d, &[], None, 30.0).is_empty());
        feed(&mut d, 1, 10.0 * GB, 3);
        let f = eval(&mut d, &[], None, 31.0);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].opened_at, 20_000_000_000, "degraded since it began");
    }

    #[test]
    fn degraded_from_the_first_step_is_found_against_its_peers() {
        let mut d = Degraded::default();
        for c in 1..=3 {
            feed(&mut d, c, 40.0 * GB, 10);
        }
        feed(&mut d, 4, 12.0 * GB, 10);
        let f = run(&mut d, &[]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].comm.as_deref(), Some("0x4"));
        assert!(
            f[0].summary.contains("of the same shape"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn a_slow_member_explains_it() {
        let mut d = Degraded::default();
        feed(&mut d, 1, 40.0 * GB, 10);
        feed(&mut d, 1, 10.0 * GB, 10);
        assert!(run(&mut d, &[9]).is_empty());
    }
}
