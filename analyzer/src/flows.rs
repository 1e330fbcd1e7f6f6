//! **Slow link** from the node agents' transport view: TCP flows (`flow` records), for jobs
//! whose traffic goes over sockets (MPI over TCP, NCCL's socket transport, Gloo) — no profiler
//! plugin needed.
//!
//! A flow record says how many bytes a socket sent during an interval and for how long sent
//! data was waiting for its acknowledgement (the network busy with it). Summed per link —
//! (sending node, receiving node) — over a window, `bytes / busy` is the rate the path moved
//! this job's data while it had some to move. Every link of a ring or tree carries the same
//! bytes; on a slow path they take longer to deliver, so its rate while busy drops, while the
//! other links, idle part of the time waiting for it, keep theirs.
//!
//! A link is slow when its rate is below `ratio` × the median of the job's other TCP links (at
//! least `min_links` links judged, each with `min_bytes` and `min_busy_s` in the window);
//! it recovers above `recover`, and is reported once it has been slow for `sustain_s`. The receiving node is the node whose own flows use the remote
//! address; a peer no agent reports is named by its address. Flows within one node are left
//! out (no network link). RTT and retransmissions of the link and of the others go into the
//! evidence: a congested or throttled path shows a longer RTT, a lossy one retransmits.
//!
//! RDMA `flow` records (NCCL's InfiniBand/RoCE connections, joined to their queue pairs' peer)
//! carry bytes posted but no busy time: they are kept as each link's traffic over the window
//! (evidence and views), and their local addresses name their node; they are never judged.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

use commscope_wire::hash::Hasher;
use commscope_wire::record::Flow;
use serde_json::json;

use crate::finding::{Class, Finding, Kind, Link, State, finding_id};
use crate::stream::{fmt_bw, median};

/// Thresholds of the flow-based slow-link detector.
#[derive(Clone, Debug)]
pub struct FlowTuning {
    /// The window a link's rate is measured over (s).
    pub window_s: f64,
    pub ratio: f64,
    pub recover: f64,
    /// A link is judged with at least this many bytes and this much busy time in the window.
    pub min_bytes: u64,
    pub min_busy_s: f64,
    /// Links judged in the job before one is compared with the others.
    pub min_links: usize,
    /// A link is reported once it has been slow this long (a job's first seconds, and bursts
    /// of CPU contention on a node, make a link look slow for a moment).
    pub sustain_s: f64,
    /// A link is dead after this many retransmissions over at least `dead_after_s` with
    /// nothing acknowledged (TCP's retransmission timer doubles from 200 ms: 3 within about
    /// 1.5 s of the failure). It is forgotten `dead_forget_s` after its last retransmission
    /// (TCP retries at most every 120 s).
    pub dead_retransmits: u64,
    pub dead_after_s: f64,
    pub dead_forget_s: f64,
}

impl Default for FlowTuning {
    fn default() -> Self {
        FlowTuning {
            window_s: 20.0,
            ratio: 0.5,
            recover: 0.7,
            min_bytes: 1 << 20,
            // A healthy link is busy only briefly for its bytes: this only keeps a rate from
            // being divided by next to nothing.
            min_busy_s: 0.001,
            min_links: 3,
            sustain_s: 5.0,
            dead_retransmits: 3,
            dead_after_s: 1.0,
            dead_forget_s: 150.0,
        }
    }
}

/// One flow record's share of a link.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t_s: f64,
    bytes: u64,
    busy_ns: u64,
    srtt_us: u32,
    retransmits: u32,
    rank: i32,
}

/// A link that retransmits with nothing acknowledged: since when, how much, whose sockets.
#[derive(Clone, Debug, Default)]
struct Dead {
    since_s: f64,
    last_s: f64,
    retransmits: u64,
    ranks: Vec<i32>,
}

#[derive(Debug, Default)]
struct LinkSt {
    samples: VecDeque<Sample>,
    /// Set by a record that retransmitted with nothing acknowledged, cleared by one that had
    /// data acknowledged.
    dead: Option<Dead>,
    /// The sending node's interface, as its latest record named it.
    iface: Option<String>,
    slow_since: Option<f64>,
    /// Slow for `sustain_s`: reported, and held to the `recover` ratio from then on. Until
    /// then the candidate must stay below `ratio` (a dip below it followed by seconds between
    /// the two ratios is contention, not a slow link).
    reported: bool,
    /// At the last evaluation: its rate, the others' median, their RTTs.
    rate: f64,
    others: f64,
    srtt_us: f64,
    others_srtt_us: f64,
    retransmits: u64,
    bytes: u64,
    busy_s: f64,
}

/// An RDMA link's traffic: (time, bytes posted) in the window, and its sending port.
#[derive(Debug, Default)]
struct RdmaSt {
    samples: VecDeque<(f64, u64)>,
    nic: Option<String>,
}

/// The detector's state: per (sending node, remote address), the window of samples.
#[derive(Debug, Default)]
pub struct FlowLinks {
    pub tuning: FlowTuning,
    links: HashMap<(String, IpAddr), LinkSt>,
    /// RDMA links' traffic, by (sending node, remote address).
    rdma: HashMap<(String, IpAddr), RdmaSt>,
    /// Addresses the job's own flows use locally, and their node.
    addr_node: HashMap<IpAddr, String>,
}

impl FlowLinks {
    /// One flow record of a socket on `node`, at `now_s`.
    pub fn record(&mut self, node: &str, f: &Flow, now_s: f64) {
        let local = f.local_addr().ip();
        if !local.is_unspecified() {
            self.addr_node.insert(local, node.to_owned());
        }
        let remote = f.remote_addr().ip();
        if remote.is_loopback() || remote == local {
            return;
        }
        if f.transport == commscope_wire::record::flow_transport::RDMA {
            let s = self.rdma.entry((node.to_owned(), remote)).or_default();
            s.samples.push_back((now_s, f.bytes_sent));
            if let Some(n) = f.iface_name() {
                s.nic = Some(n);
            }
            let cutoff = now_s - self.tuning.window_s;
            while s.samples.front().is_some_and(|x| x.0 < cutoff) {
                s.samples.pop_front();
            }
            return;
        }
        let s = self.links.entry((node.to_owned(), remote)).or_default();
        if let Some(n) = f.iface_name() {
            s.iface = Some(n);
        }
        // Bytes acknowledged revive a dead link — but not those of a closing socket: its
        // totals are synced at the close and carry bytes acknowledged before the path died.
        let closing = f.flags & commscope_wire::op::flags::FLOW_CLOSED != 0;
        if f.bytes_sent > 0 && !closing {
            s.dead = None;
        } else if f.bytes_sent == 0 && f.retransmits > 0 {
            let d = s.dead.get_or_insert(Dead {
                since_s: now_s,
                ..Default::default()
            });
            d.last_s = now_s;
            d.retransmits += u64::from(f.retransmits);
            if f.rank >= 0 && !d.ranks.contains(&f.rank) {
                d.ranks.push(f.rank);
                d.ranks.sort_unstable();
            }
        }
        s.samples.push_back(Sample {
            t_s: now_s,
            bytes: f.bytes_sent,
            busy_ns: f.busy_ns,
            srtt_us: f.srtt_us,
            retransmits: f.retransmits,
            rank: f.rank,
        });
        let cutoff = now_s - self.tuning.window_s;
        while s.samples.front().is_some_and(|x| x.t_s < cutoff) {
            s.samples.pop_front();
        }
    }

    /// The node whose job flows use `addr` locally, when one does.
    pub fn node_of_addr(&self, addr: &IpAddr) -> Option<String> {
        self.addr_node.get(addr).cloned()
    }

    /// The receiving node of a link (its address when no agent reports it).
    fn dst(&self, remote: &IpAddr) -> String {
        self.addr_node
            .get(remote)
            .cloned()
            .unwrap_or_else(|| remote.to_string())
    }

    /// Updates every link at `now_s`; returns the slow ones.
    fn evaluate(&mut self, now_s: f64) -> Vec<(String, IpAddr)> {
        let t = self.tuning.clone();
        let cutoff = now_s - t.window_s;
        let mut judged: Vec<((String, IpAddr), f64, f64)> = Vec::new();
        for (k, s) in &mut self.links {
            while s.samples.front().is_some_and(|x| x.t_s < cutoff) {
                s.samples.pop_front();
            }
            s.bytes = s.samples.iter().map(|x| x.bytes).sum();
            s.busy_s = s.samples.iter().map(|x| x.busy_ns).sum::<u64>() as f64 / 1e9;
            s.retransmits = s.samples.iter().map(|x| u64::from(x.retransmits)).sum();
            let mut rtts: Vec<f64> = s
                .samples
                .iter()
                .filter(|x| x.srtt_us > 0)
                .map(|x| f64::from(x.srtt_us))
                .collect();
            s.srtt_us = if rtts.is_empty() {
                0.0
            } else {
                median(&mut rtts)
            };
            s.rate = 0.0;
            if s.bytes >= t.min_bytes && s.busy_s >= t.min_busy_s {
                s.rate = s.bytes as f64 / s.busy_s;
                judged.push((k.clone(), s.rate, s.srtt_us));
            } else {
                s.slow_since = None;
                s.reported = false;
            }
        }
        if judged.len() < t.min_links.max(2) {
            for s in self.links.values_mut() {
                s.slow_since = None;
                s.reported = false;
            }
            return Vec::new();
        }
        let mut slow = Vec::new();
        for (k, rate, _) in &judged {
            let mut others: Vec<f64> = judged.iter().filter(|x| &x.0 != k).map(|x| x.1).collect();
            let mut others_rtt: Vec<f64> = judged
                .iter()
                .filter(|x| &x.0 != k && x.2 > 0.0)
                .map(|x| x.2)
                .collect();
            let m = median(&mut others);
            let s = self.links.get_mut(k).expect("judged link");
            s.others = m;
            s.others_srtt_us = if others_rtt.is_empty() {
                0.0
            } else {
                median(&mut others_rtt)
            };
            let limit = if s.reported { t.recover } else { t.ratio };
            if *rate < limit * m {
                let since = *s.slow_since.get_or_insert(now_s);
                s.reported |= now_s - since >= t.sustain_s;
                slow.push(k.clone());
            } else {
                s.slow_since = None;
                s.reported = false;
            }
        }
        slow.sort();
        slow
    }

    /// The slow-link findings open now.
    pub fn findings(&mut self, job: &str, now_s: f64, out: &mut Vec<Finding>) {
        let slow: Vec<(String, IpAddr)> = self
            .evaluate(now_s)
            .into_iter()
            .filter(|k| self.links[k].reported)
            .collect();
        let judged_links = self
            .links
            .values()
            .filter(|s| s.rate > 0.0 && s.bytes >= self.tuning.min_bytes)
            .count();
        // Slow links that share a node are one cause (that node's port, cable or path): one
        // finding, led by the slowest against its peers.
        let mut slow = slow;
        slow.sort_by(|a, b| {
            let (x, y) = (&self.links[a], &self.links[b]);
            (x.rate / x.others).total_cmp(&(y.rate / y.others))
        });
        let mut groups: Vec<Vec<(String, IpAddr)>> = Vec::new();
        for k in slow {
            let (src, dst) = (k.0.clone(), self.dst(&k.1));
            let shares = |g: &Vec<(String, IpAddr)>| {
                g.iter().any(|m| {
                    let (a, b) = (m.0.clone(), self.dst(&m.1));
                    a == src || a == dst || b == src || b == dst
                })
            };
            match groups.iter_mut().find(|g| shares(g)) {
                Some(g) => g.push(k),
                None => groups.push(vec![k]),
            }
        }
        for group in groups {
            let k = group[0].clone();
            let s = &self.links[&k];
            let (src, dst) = (k.0.clone(), self.dst(&k.1));
            let also: Vec<serde_json::Value> = group[1..]
                .iter()
                .map(|m| {
                    let l = &self.links[m];
                    json!({"src": m.0, "dst": self.dst(&m.1), "rate_bytes_per_s": l.rate,
                           "others_median_bytes_per_s": l.others, "srtt_us": l.srtt_us,
                           "retransmits": l.retransmits})
                })
                .collect();
            let mut owners: Vec<i32> = s
                .samples
                .iter()
                .map(|x| x.rank)
                .filter(|r| *r >= 0)
                .collect();
            owners.sort_unstable();
            owners.dedup();
            let rtt = |us: f64| {
                if us >= 1000.0 {
                    format!("{:.1} ms", us / 1000.0)
                } else {
                    format!("{us:.0} µs")
                }
            };
            let mut nodes = vec![src.clone(), dst.clone()];
            nodes.sort();
            nodes.dedup();
            // The finding is the nodes every slow link of the group goes through (a node's
            // port, or one pair's path), whichever link leads it at the moment.
            let mut common: Vec<String> = nodes.clone();
            for m in &group[1..] {
                let (a, b) = (m.0.clone(), self.dst(&m.1));
                common.retain(|n| *n == a || *n == b);
            }
            let id = common
                .iter()
                .fold(Hasher::new().str("tcp"), |h, n| h.str(n))
                .finish();
            out.push(Finding {
                id: finding_id(Kind::SlowLink, job, Some(id), &[], None),
                kind: Kind::SlowLink,
                class: Class::CommunicationSlow,
                state: State::Open,
                job: job.to_owned(),
                comm: None,
                seq: None,
                ranks: vec![],
                nodes,
                link: Some(Link {
                    src: src.clone(),
                    dst: dst.clone(),
                    src_nic: s.iface.clone(),
                    ..Default::default()
                }),
                opened_at: (s.slow_since.unwrap_or(now_s) * 1e9) as u64,
                resolved_at: None,
                confidence: 0.8,
                summary: format!(
                    "The TCP link from {src} to {dst} moved this job's data at {} while busy over the last {:.0} s, against a median of {} on its {} other TCP links (round trip {} against {}; {} retransmissions){}: the path between {src} and {dst} is slow, not a rank — check that link (NIC and switch-port counters, ethtool -S, a traffic shaper such as tc qdisc, cabling) or move the job off it",
                    fmt_bw(s.rate),
                    self.tuning.window_s,
                    fmt_bw(s.others),
                    judged_links.saturating_sub(1),
                    rtt(s.srtt_us),
                    rtt(s.others_srtt_us),
                    s.retransmits,
                    match also.len() {
                        0 => String::new(),
                        1 => "; 1 more link through the same node is slower than its peers too".to_owned(),
                        n => format!("; {n} more links through the same nodes are slower than their peers too"),
                    },
                ),
                evidence: json!({
                    "transport": "tcp",
                    "rate_bytes_per_s": s.rate,
                    "others_median_bytes_per_s": s.others,
                    "bytes": s.bytes,
                    "busy_s": s.busy_s,
                    "srtt_us": s.srtt_us,
                    "others_srtt_us": s.others_srtt_us,
                    "retransmits": s.retransmits,
                    "remote_address": k.1.to_string(),
                    "ranks": owners,
                    "also_slow": also,
                    "links": self.summary(),
                }),
            });
        }
    }

    /// Every link with traffic in the window — for evidence and views: TCP links with their
    /// rate while busy, RDMA links with their bytes posted and throughput over the window
    /// (from the newest sample's time).
    pub fn summary(&self) -> Vec<serde_json::Value> {
        let mut v: BTreeMap<(String, String, &str), serde_json::Value> = BTreeMap::new();
        for ((src, remote), s) in &self.links {
            if s.bytes > 0 {
                let dst = self.dst(remote);
                v.insert(
                    (src.clone(), dst.clone(), "tcp"),
                    json!({"src": src, "dst": dst, "transport": "tcp",
                           "rate_bytes_per_s": s.rate, "bytes": s.bytes}),
                );
            }
        }
        let newest = self
            .rdma
            .values()
            .filter_map(|s| s.samples.back().map(|x| x.0))
            .fold(f64::MIN, f64::max);
        for ((src, remote), s) in &self.rdma {
            let cutoff = newest - self.tuning.window_s;
            let bytes: u64 = s
                .samples
                .iter()
                .filter(|x| x.0 >= cutoff)
                .map(|x| x.1)
                .sum();
            if bytes > 0 {
                let dst = self.dst(remote);
                v.insert(
                    (src.clone(), dst.clone(), "rdma"),
                    json!({"src": src, "dst": dst, "transport": "rdma", "src_nic": s.nic,
                           "bytes": bytes,
                           "throughput_bytes_per_s": bytes as f64 / self.tuning.window_s}),
                );
            }
        }
        v.into_values().collect()
    }

    /// The links dead at `now_s`: their senders retransmitted at least `dead_retransmits`
    /// times over at least `dead_after_s` with nothing acknowledged. Sorted, most
    /// retransmissions first.
    pub fn dead_links(&self, now_s: f64) -> Vec<crate::view::DeadLink> {
        let t = &self.tuning;
        let mut v: Vec<crate::view::DeadLink> = self
            .links
            .iter()
            .filter_map(|((src, remote), s)| {
                let d = s.dead.as_ref()?;
                (d.retransmits >= t.dead_retransmits
                    && now_s - d.since_s >= t.dead_after_s
                    && now_s - d.last_s <= t.dead_forget_s)
                    .then(|| crate::view::DeadLink {
                        src: src.clone(),
                        dst: self.dst(remote),
                        transport: "tcp",
                        dead_s: now_s - d.since_s,
                        retransmits: d.retransmits,
                        ranks: d.ranks.clone(),
                        src_nic: s.iface.clone(),
                    })
            })
            .collect();
        v.sort_by(|a, b| (b.retransmits, &a.src, &a.dst).cmp(&(a.retransmits, &b.src, &b.dst)));
        v
    }

    /// Whether any link is slow now (the degraded-collective detector defers to it).
    pub fn any_slow(&self) -> bool {
        self.links.values().any(|s| s.slow_since.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::record::flow_transport;

    fn flow(local: &str, remote: &str, bytes: u64, busy_ms: u64, srtt_us: u32, rank: i32) -> Flow {
        Flow {
            iface: Flow::iface_bytes("eth1"),
            transport: flow_transport::TCP,
            bytes_sent: bytes,
            busy_ns: busy_ms * 1_000_000,
            srtt_us,
            local: Flow::addr_bytes(local.parse().expect("ip")),
            remote: Flow::addr_bytes(remote.parse().expect("ip")),
            local_port: 40000,
            remote_port: 1024,
            rank,
            ..Flow::default()
        }
    }

    /// A link's second: (node, local, remote, busy ms, RTT µs, owning rank), 8 MiB sent.
    type Second<'a> = (&'a str, &'a str, &'a str, u64, u32, i32);

    /// Each of `links` records a second of 8 MiB for every second in `secs`; the detector
    /// evaluates after each second, as the collector's tick does.
    fn each_second(f: &mut FlowLinks, secs: std::ops::Range<u32>, links: &[Second]) {
        for t in secs {
            for &(node, local, remote, busy_ms, rtt_us, rank) in links {
                f.record(
                    node,
                    &flow(local, remote, 8 << 20, busy_ms, rtt_us, rank),
                    f64::from(t),
                );
            }
            f.evaluate(f64::from(t));
        }
    }

    /// Three nodes in a ring, a second of records each for 10 s: node 1 → node 2 throttled.
    /// Every link moves 8 MiB a second; the others are busy 20 ms for it.
    fn ring(f: &mut FlowLinks, slow: bool) {
        let (busy, rtt) = if slow { (900, 40_000) } else { (20, 100) };
        each_second(
            f,
            0..10,
            &[
                ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
                ("n1", "10.0.0.2", "10.0.0.3", busy, rtt, 1),
                ("n2", "10.0.0.3", "10.0.0.1", 20, 100, 2),
            ],
        );
    }

    /// A record of `node`'s socket to `remote` that retransmitted `n` times with nothing
    /// acknowledged.
    fn retransmitted(f: &mut FlowLinks, node: &str, local: &str, remote: &str, n: u32, t: f64) {
        let mut r = flow(local, remote, 0, 0, 0, 1);
        r.retransmits = n;
        f.record(node, &r, t);
    }

    /// An RDMA record: `bytes` posted from `local`'s port to `remote`'s GID (RoCE v2).
    fn rdma(local: &str, remote: &str, bytes: u64) -> Flow {
        Flow {
            iface: Flow::iface_bytes("mlx5_0:1"),
            transport: flow_transport::RDMA,
            bytes_sent: bytes,
            local: Flow::addr_bytes(local.parse().expect("ip")),
            remote: Flow::addr_bytes(remote.parse().expect("ip")),
            rank: 0,
            ..Flow::default()
        }
    }

    #[test]
    fn rdma_links_are_traffic_by_node_never_judged_and_apart_from_tcp() {
        let mut f = FlowLinks::default();
        ring(&mut f, false);
        // RoCE over the same addresses: n1 → n2 posts a tenth of the others' bytes.
        for t in 0..10 {
            for (node, local, remote, mib) in [
                ("n0", "10.0.0.1", "10.0.0.2", 40u64),
                ("n1", "10.0.0.2", "10.0.0.3", 4),
                ("n2", "10.0.0.3", "10.0.0.1", 40),
                // A peer no agent reports: named by its GID.
                ("n2", "10.0.0.3", "10.0.0.9", 40),
            ] {
                f.record(node, &rdma(local, remote, mib << 20), f64::from(t));
            }
        }
        let mut out = Vec::new();
        f.findings("j", 10.0, &mut out);
        assert!(out.is_empty(), "bytes posted alone judge no link: {out:#?}");
        let links = f.summary();
        let rdma: Vec<(String, String, u64, f64)> = links
            .iter()
            .filter(|l| l["transport"] == "rdma")
            .map(|l| {
                (
                    l["src"].as_str().unwrap_or_default().to_owned(),
                    l["dst"].as_str().unwrap_or_default().to_owned(),
                    l["bytes"].as_u64().unwrap_or(0),
                    l["throughput_bytes_per_s"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        assert_eq!(
            rdma,
            [
                (
                    "n0".to_owned(),
                    "n1".to_owned(),
                    400 << 20,
                    (400u64 << 20) as f64 / 20.0
                ),
                (
                    "n1".to_owned(),
                    "n2".to_owned(),
                    40 << 20,
                    (40u64 << 20) as f64 / 20.0
                ),
                (
                    "n2".to_owned(),
                    "10.0.0.9".to_owned(),
                    400 << 20,
                    (400u64 << 20) as f64 / 20.0
                ),
                (
                    "n2".to_owned(),
                    "n0".to_owned(),
                    400 << 20,
                    (400u64 << 20) as f64 / 20.0
                ),
            ]
        );
        assert!(
            links
                .iter()
                .any(|l| l["transport"] == "rdma" && l["src_nic"] == "mlx5_0:1")
        );
        // The TCP links keep their own bytes (10 s of 8 MiB), not the RDMA ones.
        let tcp: Vec<u64> = links
            .iter()
            .filter(|l| l["transport"] == "tcp")
            .map(|l| l["bytes"].as_u64().unwrap_or(0))
            .collect();
        assert_eq!(tcp, [80 << 20; 3]);
    }

    #[test]
    fn retransmissions_with_nothing_acknowledged_make_a_dead_link_until_data_moves() {
        let mut f = FlowLinks::default();
        ring(&mut f, false);
        // n1 cut off at 10 s: n0's sends to it retransmit at 10.2, 10.6, 11.4 s.
        retransmitted(&mut f, "n0", "10.0.0.1", "10.0.0.2", 1, 10.5);
        assert_eq!(f.dead_links(11.0), [], "one retransmission is no dead link");
        retransmitted(&mut f, "n0", "10.0.0.1", "10.0.0.2", 1, 11.0);
        retransmitted(&mut f, "n0", "10.0.0.1", "10.0.0.2", 1, 11.5);
        let d = f.dead_links(12.0);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!((d[0].src.as_str(), d[0].dst.as_str()), ("n0", "n1"));
        assert_eq!(
            (d[0].retransmits, d[0].dead_s, d[0].ranks.clone()),
            (3, 1.5, vec![1])
        );
        // Long after the last retransmission (the connection gave up), it is forgotten.
        assert_eq!(f.dead_links(200.0), []);
        // Data acknowledged again: alive.
        let mut f2 = FlowLinks::default();
        for t in [10.5, 11.0, 11.5] {
            retransmitted(&mut f2, "n0", "10.0.0.1", "10.0.0.2", 1, t);
        }
        assert_eq!(f2.dead_links(12.0).len(), 1);
        // The job killed while the path is dead: the closing socket's totals, synced at the
        // close, add bytes its last ACK before the cut acknowledged. No revival.
        let mut close = flow("10.0.0.1", "10.0.0.2", 24_000, 0, 100, 0);
        close.flags = commscope_wire::op::flags::FLOW_CLOSED;
        f2.record("n0", &close, 12.2);
        assert_eq!(f2.dead_links(12.3).len(), 1);
        f2.record(
            "n0",
            &flow("10.0.0.1", "10.0.0.2", 1 << 20, 5, 100, 0),
            12.5,
        );
        assert_eq!(f2.dead_links(13.0), []);
        // Retransmissions in a second that also had data acknowledged are loss, not death.
        let mut f3 = FlowLinks::default();
        for t in 0..5 {
            let mut r = flow("10.0.0.1", "10.0.0.2", 1 << 20, 5, 100, 0);
            r.retransmits = 4;
            f3.record("n0", &r, f64::from(t));
        }
        assert_eq!(f3.dead_links(5.0), []);
    }

    #[test]
    fn a_link_slow_for_less_than_the_sustain_time_is_not_reported_yet() {
        let mut f = FlowLinks::default();
        ring(&mut f, true);
        // Slow from the first second: at 4 s it has been slow for 4 s, at 10 s for 10 s.
        let mut early = FlowLinks::default();
        let (busy, rtt) = (900, 40_000);
        each_second(
            &mut early,
            0..4,
            &[
                ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
                ("n1", "10.0.0.2", "10.0.0.3", busy, rtt, 1),
                ("n2", "10.0.0.3", "10.0.0.1", 20, 100, 2),
            ],
        );
        let mut out = Vec::new();
        early.findings("j", 4.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        assert!(early.any_slow());
        f.findings("j", 10.0, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
    }

    /// A ring whose n1 → n2 link is busy `busy_ms` a second over `secs`, the others 20 ms,
    /// judged on each second alone.
    fn ring_busy(f: &mut FlowLinks, secs: std::ops::Range<u32>, busy_ms: u64) {
        f.tuning.window_s = 0.5;
        each_second(
            f,
            secs,
            &[
                ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
                ("n1", "10.0.0.2", "10.0.0.3", busy_ms, 100, 1),
                ("n2", "10.0.0.3", "10.0.0.1", 20, 100, 2),
            ],
        );
    }

    #[test]
    fn a_dip_below_the_ratio_then_seconds_between_the_ratios_is_not_a_slow_link() {
        // 0.4 of the others for 2 s (contention), then 0.6 for 8 s: never below half for the
        // 5 s a report needs.
        let mut f = FlowLinks::default();
        ring_busy(&mut f, 0..2, 50);
        ring_busy(&mut f, 2..10, 33);
        let mut out = Vec::new();
        f.findings("j", 9.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        // Below half for 6 s: reported, and then held while under 0.7 of the others.
        let mut f = FlowLinks::default();
        ring_busy(&mut f, 0..6, 50);
        ring_busy(&mut f, 6..12, 33);
        f.findings("j", 11.0, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        ring_busy(&mut f, 12..14, 20);
        out.clear();
        f.findings("j", 13.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn the_throttled_link_of_a_ring_is_the_one_slow_link() {
        let mut f = FlowLinks::default();
        ring(&mut f, true);
        let mut out = Vec::new();
        f.findings("j", 10.0, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let l = out[0].link.as_ref().expect("link");
        assert_eq!((l.src.as_str(), l.dst.as_str()), ("n1", "n2"));
        assert_eq!(l.src_nic.as_deref(), Some("eth1"));
        assert!(out[0].ranks.is_empty());
        assert_eq!(out[0].evidence["ranks"], json!([1]));
        assert!(
            out[0]
                .summary
                .starts_with("The TCP link from n1 to n2 moved this job's data at"),
            "{}",
            out[0].summary
        );
        assert!(
            out[0].summary.contains("round trip 40.0 ms against 100 µs"),
            "{}",
            out[0].summary
        );
        assert!(f.any_slow());
    }

    #[test]
    fn slow_links_through_one_node_are_one_finding_led_by_the_slowest() {
        // n1 → n2 throttled; n2 → n1 (its acknowledgements queue behind that) slowed too.
        let mut f = FlowLinks::default();
        ring(&mut f, true);
        each_second(
            &mut f,
            0..10,
            &[
                ("n2", "10.0.0.3", "10.0.0.2", 200, 300, 2),
                ("n0", "10.0.0.1", "10.0.0.3", 20, 100, 0),
            ],
        );
        let mut out = Vec::new();
        f.findings("j", 10.0, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let l = out[0].link.as_ref().expect("link");
        assert_eq!((l.src.as_str(), l.dst.as_str()), ("n1", "n2"));
        assert_eq!(out[0].evidence["also_slow"][0]["src"], "n2");
        assert!(
            out[0].summary.contains("1 more link through the same node"),
            "{}",
            out[0].summary
        );
    }

    #[test]
    fn a_nodes_slow_links_keep_one_finding_whichever_leads() {
        // n2's port is slow: n0 → n2 and n3 → n2 both; which is the slower one changes.
        let fast = [
            ("n2", "10.0.0.3", "10.0.0.1", 20, 100, 2),
            ("n1", "10.0.0.2", "10.0.0.1", 20, 100, 1),
            ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
        ];
        let mut f = FlowLinks::default();
        let mut ids = Vec::new();
        for (secs, busy0, busy3) in [(0..20, 900, 600), (20..40, 600, 900)] {
            let mut links = fast.to_vec();
            links.push(("n0", "10.0.0.1", "10.0.0.3", busy0, 100, 0));
            links.push(("n3", "10.0.0.4", "10.0.0.3", busy3, 100, 3));
            let end = secs.end;
            each_second(&mut f, secs, &links);
            let mut out = Vec::new();
            f.findings("j", f64::from(end), &mut out);
            assert_eq!(out.len(), 1, "{out:#?}");
            ids.push((out[0].id.clone(), out[0].link.clone().expect("link").src));
        }
        assert_eq!(ids[0].0, ids[1].0);
        assert_eq!((ids[0].1.as_str(), ids[1].1.as_str()), ("n0", "n3"));
    }

    #[test]
    fn an_even_ring_has_no_slow_link_and_two_links_are_not_judged() {
        let mut f = FlowLinks::default();
        ring(&mut f, false);
        let mut out = Vec::new();
        f.findings("j", 10.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        // Two links only: nothing to compare against.
        let mut two = FlowLinks::default();
        each_second(
            &mut two,
            0..10,
            &[
                ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
                ("n1", "10.0.0.2", "10.0.0.1", 900, 100, 1),
            ],
        );
        two.findings("j", 10.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn a_slow_link_recovers_once_its_window_is_fast_again() {
        let mut f = FlowLinks::default();
        ring(&mut f, true);
        let mut out = Vec::new();
        f.findings("j", 10.0, &mut out);
        assert_eq!(out.len(), 1);
        each_second(
            &mut f,
            10..40,
            &[
                ("n0", "10.0.0.1", "10.0.0.2", 20, 100, 0),
                ("n1", "10.0.0.2", "10.0.0.3", 20, 100, 1),
                ("n2", "10.0.0.3", "10.0.0.1", 20, 100, 2),
            ],
        );
        out.clear();
        f.findings("j", 40.0, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        assert!(!f.any_slow());
    }
}
