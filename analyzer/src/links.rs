//! **Slow link**, from the link records of NCCL's profiler plugin (`ProxyStep` timing).
//!
//! A ring or tree runs at the pace of its slowest link, so on a slow link every member's
//! collective takes longer and no rank arrives late: the slow-rank detector sees nothing and the
//! degraded-collective detector sees only that the communicator got slower. The proxy steps say
//! which link: a send step is on the network from its post until the network completes it, and
//! per channel those intervals are united, so `xfer_bytes / net_ns` is the rate the sender moved
//! data while it had data on the network. On the slow link that rate drops; on the others it
//! stays, because their extra time is spent waiting for their GPU (for data from upstream),
//! not on the network.
//!
//! Per (communicator, sender, receiver) the detector keeps the rates of the last `window`
//! operations of at least `min_bytes`. A link whose median rate is below `ratio` × the median of
//! the communicator's other links (at least `min_links` links with `window / 2` samples, seen
//! in the last `stale_s` seconds) is slow; it recovers above `recover`. Receives are not judged:
//! a receive step waits for its sender, so its time on the network includes upstream waiting.
//! Every slow link between the same two ranks is one finding (one cable, one port), whatever the
//! communicator.

use std::collections::{BTreeMap, HashMap, VecDeque};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, flags};
use commscope_wire::record::Link;
use serde_json::json;

use crate::finding::{self, Class, Finding, Kind, State, finding_id};
use crate::stream::{fmt_bw as fmt_rate, median};

/// Thresholds of the slow-link detector.
#[derive(Clone, Debug)]
pub struct LinkTuning {
    /// Operations whose rate is the link's current rate (their median).
    pub window: usize,
    /// Slow below this fraction of the other links' median; recovered above `recover`.
    pub ratio: f64,
    pub recover: f64,
    /// Smallest transfer (bytes moved by one link record) whose rate is judged.
    pub min_bytes: u64,
    /// Links a communicator needs before one of them is compared with the others.
    pub min_links: usize,
    /// A link not seen for this long is left out of the comparison.
    pub stale_s: f64,
}

impl Default for LinkTuning {
    fn default() -> Self {
        LinkTuning {
            window: 8,
            ratio: 0.5,
            recover: 0.7,
            min_bytes: 64 << 10,
            min_links: 3,
            stale_s: 30.0,
        }
    }
}

/// (communicator, sender's comm rank, receiver's comm rank).
type Key = (u64, i32, i32);

#[derive(Debug, Default)]
struct LinkSt {
    /// Global ranks of the sender and (once known) the receiver.
    src: i32,
    dst: Option<i32>,
    op: u8,
    /// The last `window` judged operations: (rate, network ns).
    rates: VecDeque<(f64, u64)>,
    ops: u64,
    xfer_bytes: u64,
    net_ns: u64,
    gpu_wait_ns: u64,
    peer_wait_ns: u64,
    last_s: f64,
    slow_since: Option<f64>,
    /// Its current rate and the others' median, at the last evaluation.
    rate: f64,
    others: f64,
}

/// Proxy sends summed per (sending node, receiving node): the fabric as the profiler plugin
/// saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePair {
    pub src: String,
    /// `unknown` until the receiver's own link records arrived.
    pub dst: String,
    pub bytes: u64,
    /// Channel-nanoseconds on the network, waiting for the GPU, waiting for the receiver.
    pub net_ns: u64,
    pub gpu_wait_ns: u64,
    pub peer_wait_ns: u64,
}

/// The slow-link detector's state.
#[derive(Debug, Default)]
pub struct Links {
    pub tuning: LinkTuning,
    /// (comm, sender's comm rank, receiver's comm rank) → link.
    links: HashMap<Key, LinkSt>,
    /// (comm, comm rank) → global rank, learnt from the link records of both ends.
    members: HashMap<(u64, i32), i32>,
}

impl Links {
    pub fn new(tuning: LinkTuning) -> Links {
        Links {
            tuning,
            ..Links::default()
        }
    }

    /// One link record, at `now_s`.
    pub fn record(&mut self, l: &Link, now_s: f64) {
        if l.comm_rank >= 0 {
            self.members.insert((l.comm_id, l.comm_rank), l.rank);
        }
        if l.flags & flags::LINK_SEND == 0 || l.comm_rank < 0 || l.peer < 0 {
            return;
        }
        let Some(rate) = l.net_rate() else { return };
        let t = &self.tuning;
        let s = self
            .links
            .entry((l.comm_id, l.comm_rank, l.peer))
            .or_default();
        s.src = l.rank;
        s.op = l.op;
        s.ops += 1;
        s.xfer_bytes += l.xfer_bytes;
        s.net_ns += l.net_ns;
        s.gpu_wait_ns += l.gpu_wait_ns;
        s.peer_wait_ns += l.peer_wait_ns;
        s.last_s = s.last_s.max(now_s);
        if l.xfer_bytes >= t.min_bytes {
            s.rates.push_back((rate, l.net_ns));
            while s.rates.len() > t.window.max(1) {
                s.rates.pop_front();
            }
        }
    }

    /// Every link's totals summed per node pair (`node_of` names a global rank's node), most
    /// bytes first.
    pub fn node_pairs(&self, node_of: impl Fn(i32) -> Option<String>) -> Vec<NodePair> {
        let mut pairs: BTreeMap<(String, String), NodePair> = BTreeMap::new();
        let name = |r: Option<i32>| {
            r.and_then(&node_of)
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "unknown".to_owned())
        };
        for (&(comm, _, peer), l) in &self.links {
            let (src, dst) = (name(Some(l.src)), name(self.global_rank(comm, peer)));
            let e = pairs
                .entry((src.clone(), dst.clone()))
                .or_insert_with(|| NodePair {
                    src,
                    dst,
                    ..Default::default()
                });
            e.bytes += l.xfer_bytes;
            e.net_ns += l.net_ns;
            e.gpu_wait_ns += l.gpu_wait_ns;
            e.peer_wait_ns += l.peer_wait_ns;
        }
        let mut v: Vec<NodePair> = pairs.into_values().collect();
        v.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| (&a.src, &a.dst).cmp(&(&b.src, &b.dst)))
        });
        v
    }

    /// The global rank of `comm_rank` in `comm`, once a link record of it was seen.
    pub fn global_rank(&self, comm: u64, comm_rank: i32) -> Option<i32> {
        self.members.get(&(comm, comm_rank)).copied()
    }

    /// Updates every link's state at `now_s`; returns the slow ones' keys.
    fn evaluate(&mut self, now_s: f64) -> Vec<Key> {
        let t = self.tuning.clone();
        let need = (t.window / 2).max(1);
        let mut by_comm: BTreeMap<u64, Vec<(i32, i32, f64)>> = BTreeMap::new();
        for (&(comm, a, b), s) in &self.links {
            if s.rates.len() >= need && now_s - s.last_s <= t.stale_s {
                let mut r: Vec<f64> = s.rates.iter().map(|x| x.0).collect();
                by_comm
                    .entry(comm)
                    .or_default()
                    .push((a, b, median(&mut r)));
            }
        }
        let mut slow = Vec::new();
        for (comm, v) in by_comm {
            if v.len() < t.min_links.max(2) {
                continue;
            }
            for &(a, b, rate) in &v {
                let mut others: Vec<f64> = v
                    .iter()
                    .filter(|x| (x.0, x.1) != (a, b))
                    .map(|x| x.2)
                    .collect();
                let others = median(&mut others);
                let Some(s) = self.links.get_mut(&(comm, a, b)) else {
                    continue;
                };
                s.dst = self.members.get(&(comm, b)).copied();
                (s.rate, s.others) = (rate, others);
                match s.slow_since {
                    None if rate < t.ratio * others => s.slow_since = Some(now_s),
                    Some(_) if rate >= t.recover * others => s.slow_since = None,
                    _ => {}
                }
                if s.slow_since.is_some() {
                    slow.push((comm, a, b));
                }
            }
        }
        // Stale links stop being slow (the job moved on, or ended).
        for s in self.links.values_mut() {
            if now_s - s.last_s > t.stale_s {
                s.slow_since = None;
            }
        }
        slow
    }

    /// Communicators with a slow link open (a degraded collective there is this finding's).
    pub fn slow_comms(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .links
            .iter()
            .filter(|(_, s)| s.slow_since.is_some())
            .map(|(k, _)| k.0)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The slow-link findings open at `now_s`; `node` names a global rank's node.
    pub fn findings(
        &mut self,
        job: &str,
        now_s: f64,
        node: impl Fn(i32) -> Option<String>,
        out: &mut Vec<Finding>,
    ) {
        let slow = self.evaluate(now_s);
        // One finding per pair of global ranks: the worst communicator leads.
        let mut by_pair: BTreeMap<(i32, i32), Vec<Key>> = BTreeMap::new();
        for k in slow {
            let s = &self.links[&k];
            let Some(dst) = s.dst else { continue };
            by_pair.entry((s.src, dst)).or_default().push(k);
        }
        for ((src, dst), mut keys) in by_pair {
            keys.sort_by(|x, y| {
                let (a, b) = (&self.links[x], &self.links[y]);
                (a.rate / a.others).total_cmp(&(b.rate / b.others))
            });
            let lead = keys[0];
            let s = &self.links[&lead];
            let (sn, dn) = (node(src).unwrap_or_default(), node(dst).unwrap_or_default());
            let mut nodes = vec![sn.clone(), dn.clone()];
            nodes.retain(|n| !n.is_empty());
            nodes.sort();
            nodes.dedup();
            let since = keys
                .iter()
                .filter_map(|k| self.links[k].slow_since)
                .fold(f64::INFINITY, f64::min);
            let per_op_ms =
                s.rates.iter().map(|x| x.1 as f64).sum::<f64>() / s.rates.len().max(1) as f64 / 1e6;
            let place = if sn.is_empty() || dn.is_empty() {
                format!("rank {src} → rank {dst}")
            } else if sn == dn {
                format!("rank {src} → rank {dst} (both on {sn})")
            } else {
                format!("{sn} → {dn} (rank {src} → rank {dst})")
            };
            let advice = if !sn.is_empty() && sn == dn {
                format!(
                    "check the GPU interconnect on {sn} (nvidia-smi topo -m, NVLink/PCIe error counters) and that NCCL chose the expected transport"
                )
            } else {
                format!(
                    "check the NIC port and switch path from {} to {} (port error and congestion counters, cable/optics, ibstat) or move the job off that link",
                    if sn.is_empty() { "the sender" } else { &sn },
                    if dn.is_empty() { "the receiver" } else { &dn }
                )
            };
            out.push(Finding {
                id: finding_id(Kind::SlowLink, job, None, &[src, dst], None),
                kind: Kind::SlowLink,
                class: Class::CommunicationSlow,
                state: State::Open,
                job: job.to_owned(),
                comm: Some(format_comm_id(lead.0)),
                seq: None,
                ranks: {
                    let mut r = vec![src, dst];
                    r.sort_unstable();
                    r.dedup();
                    r
                },
                nodes,
                link: (!sn.is_empty() && !dn.is_empty()).then(|| finding::Link {
                    src: sn.clone(),
                    dst: dn.clone(),
                    ..Default::default()
                }),
                opened_at: (since * 1e9) as u64,
                resolved_at: None,
                confidence: 0.85,
                summary: format!(
                    "link {place} moves {} while it has data on the network, {:.0} % of the {} of communicator {}'s other links ({} {} sends so far; lately {:.1} ms on the network per operation) — every collective on that ring runs at its pace: {advice}",
                    fmt_rate(s.rate),
                    100.0 * s.rate / s.others.max(f64::MIN_POSITIVE),
                    fmt_rate(s.others),
                    format_comm_id(lead.0),
                    s.ops,
                    Op::from_code(s.op).name(),
                    per_op_ms,
                ),
                evidence: json!({
                    "links": keys.iter().map(|k| {
                        let s = &self.links[k];
                        json!({
                            "comm": format_comm_id(k.0),
                            "src_comm_rank": k.1,
                            "dst_comm_rank": k.2,
                            "op": Op::from_code(s.op).name(),
                            "rate_bytes_per_s": s.rate,
                            "others_median_bytes_per_s": s.others,
                            "ratio": s.rate / s.others.max(f64::MIN_POSITIVE),
                            "operations": s.ops,
                            "xfer_bytes": s.xfer_bytes,
                            "net_ns": s.net_ns,
                            "gpu_wait_ns": s.gpu_wait_ns,
                            "peer_wait_ns": s.peer_wait_ns,
                        })
                    }).collect::<Vec<_>>(),
                }),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(comm_rank: i32, peer: i32, rate_gbps: f64) -> Link {
        let bytes = 4u64 << 20;
        Link {
            op: Op::Allreduce as u8,
            flags: flags::LINK_SEND,
            comm_id: 0xc0,
            rank: comm_rank + 100,
            comm_rank,
            peer,
            xfer_bytes: bytes,
            steps_done: 4,
            net_ns: (bytes as f64 / rate_gbps) as u64,
            ..Link::default()
        }
    }

    fn recv(comm_rank: i32, peer: i32) -> Link {
        Link {
            flags: 0,
            ..send(comm_rank, peer, 1.0)
        }
    }

    fn node(r: i32) -> Option<String> {
        Some(format!("n{}", r - 100))
    }

    #[test]
    fn the_one_slow_sender_of_a_ring_is_named_with_both_ends() {
        let mut l = Links::new(LinkTuning::default());
        for i in 0..10 {
            for r in 0..4 {
                let rate = if r == 2 { 2.0 } else { 20.0 + i as f64 * 0.1 };
                l.record(&send(r, (r + 1) % 4, rate), i as f64);
                l.record(&recv(r, (r + 3) % 4), i as f64);
            }
        }
        let mut out = Vec::new();
        l.findings("j", 10.0, node, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let f = &out[0];
        assert_eq!(f.kind, Kind::SlowLink);
        assert_eq!(f.ranks, vec![102, 103]);
        assert_eq!(
            f.link,
            Some(finding::Link {
                src: "n2".into(),
                dst: "n3".into(),
                ..Default::default()
            })
        );
        assert!(f.summary.contains("n2 → n3"), "{}", f.summary);
        assert!(f.summary.contains("2.0 GB/s"), "{}", f.summary);
        assert_eq!(l.slow_comms(), vec![0xc0]);

        // The link recovers: new operations at full rate push the old ones out of the window.
        for i in 10..20 {
            for r in 0..4 {
                l.record(&send(r, (r + 1) % 4, 20.0), i as f64);
            }
        }
        let mut out = Vec::new();
        l.findings("j", 20.0, node, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn equal_links_small_transfers_and_untimed_records_give_nothing() {
        let mut l = Links::new(LinkTuning::default());
        for i in 0..10 {
            for r in 0..4 {
                l.record(
                    &send(r, (r + 1) % 4, 20.0 * (1.0 + 0.2 * r as f64)),
                    i as f64,
                );
                // Small: latency-bound, not judged.
                l.record(
                    &Link {
                        comm_id: 0xc1,
                        xfer_bytes: 1024,
                        net_ns: if r == 0 { 1_000_000 } else { 100 },
                        ..send(r, (r + 1) % 4, 1.0)
                    },
                    i as f64,
                );
                // No step timing.
                l.record(
                    &Link {
                        comm_id: 0xc2,
                        steps_done: 0,
                        net_ns: 0,
                        ..send(r, (r + 1) % 4, 1.0)
                    },
                    i as f64,
                );
            }
        }
        let mut out = Vec::new();
        l.findings("j", 10.0, node, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn two_links_are_too_few_to_compare_and_stale_links_drop_out() {
        let mut l = Links::new(LinkTuning::default());
        for i in 0..10 {
            l.record(&send(0, 1, 20.0), i as f64);
            l.record(&send(1, 0, 1.0), i as f64);
        }
        let mut out = Vec::new();
        l.findings("j", 10.0, node, &mut out);
        assert!(out.is_empty(), "{out:#?}");

        let mut l = Links::new(LinkTuning::default());
        for i in 0..10 {
            for r in 0..4 {
                l.record(
                    &send(r, (r + 1) % 4, if r == 1 { 1.0 } else { 20.0 }),
                    i as f64,
                );
            }
        }
        let mut out = Vec::new();
        l.findings("j", 10.0, node, &mut out);
        assert_eq!(out.len(), 1);
        let mut out = Vec::new();
        l.findings("j", 100.0, node, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }
}
