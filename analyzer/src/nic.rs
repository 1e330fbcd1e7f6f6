//! NIC counters as corroboration: the node agents report congestion counters (ECN marks, CNPs,
//! pause and transmit-wait counts) and loss counters (sequence errors, retransmissions,
//! timeouts) that went up as `link_event` records. What went up on a slow link's nodes over the
//! last window goes into that `slow-link` finding: its summary says so, its evidence lists the
//! counters, and its confidence rises. No finding of their own: a busy fabric marks packets
//! all the time; only next to a slow link do they say why.

use std::collections::{BTreeMap, VecDeque};

use commscope_wire::record::{LinkEvent, link_event};
use serde_json::json;

use crate::finding::{Finding, Kind};

/// Samples kept at most (oldest dropped).
const MAX_SAMPLES: usize = 16_384;

#[derive(Clone, Debug)]
struct Sample {
    t_s: f64,
    node: String,
    event: u8,
    what: String,
    count: u64,
}

/// The congestion and loss counters of a job's nodes over the last `window_s`.
#[derive(Debug)]
pub struct NicCounters {
    pub window_s: f64,
    samples: VecDeque<Sample>,
}

impl Default for NicCounters {
    fn default() -> Self {
        NicCounters {
            window_s: 20.0,
            samples: VecDeque::new(),
        }
    }
}

/// Whether a link event is a NIC counter this module keeps.
pub fn is_corroboration(e: &LinkEvent) -> bool {
    matches!(e.event, link_event::CONGESTION | link_event::LOSS)
}

impl NicCounters {
    /// One congestion or loss `link_event` of `node` at `now_s` (others are ignored).
    pub fn record(&mut self, node: &str, e: &LinkEvent, now_s: f64) {
        if !is_corroboration(e) {
            return;
        }
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        let port = if e.port > 0 {
            format!(" port {}", e.port)
        } else {
            String::new()
        };
        self.samples.push_back(Sample {
            t_s: now_s,
            node: node.to_owned(),
            event: e.event,
            what: format!("{}{port} {}", e.device_name(), e.what_name()),
            count: e.count,
        });
    }

    /// `node`'s counters that went up since `now_s - window_s`: (congestion, loss), each by
    /// "device port counter".
    fn on(&self, node: &str, now_s: f64) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let mut c = (BTreeMap::new(), BTreeMap::new());
        for s in self
            .samples
            .iter()
            .filter(|s| s.node == node && s.t_s >= now_s - self.window_s && s.t_s <= now_s)
        {
            let m = if s.event == link_event::CONGESTION {
                &mut c.0
            } else {
                &mut c.1
            };
            *m.entry(s.what.clone()).or_default() += s.count;
        }
        c
    }

    /// Adds what the NIC counters of each `slow-link` finding's nodes say, at `now_s`.
    pub fn corroborate(&mut self, findings: &mut [Finding], now_s: f64) {
        let cutoff = now_s - self.window_s;
        while self.samples.front().is_some_and(|s| s.t_s < cutoff) {
            self.samples.pop_front();
        }
        for f in findings.iter_mut().filter(|f| f.kind == Kind::SlowLink) {
            let Some(link) = &f.link else { continue };
            let mut nodes = vec![link.src.clone(), link.dst.clone()];
            nodes.dedup();
            let mut clauses = Vec::new();
            let mut evidence = serde_json::Map::new();
            for node in nodes {
                let (congestion, loss) = self.on(&node, now_s);
                if congestion.is_empty() && loss.is_empty() {
                    continue;
                }
                let list = |m: &BTreeMap<String, u64>| {
                    m.iter()
                        .map(|(w, n)| format!("{w} +{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let mut parts = Vec::new();
                if !congestion.is_empty() {
                    parts.push(format!("congestion ({})", list(&congestion)));
                }
                if !loss.is_empty() {
                    parts.push(format!("loss ({})", list(&loss)));
                }
                clauses.push(format!("on {node}, {}", parts.join(" and ")));
                evidence.insert(node, json!({"congestion": congestion, "loss": loss}));
            }
            if clauses.is_empty() {
                continue;
            }
            f.summary.push_str(&format!(
                "; the NIC counters agree over the last {:.0} s: {}",
                self.window_s,
                clauses.join("; ")
            ));
            f.confidence = (f.confidence + 0.1).min(0.95);
            if let Some(ev) = f.evidence.as_object_mut() {
                ev.insert("nic_counters".into(), serde_json::Value::Object(evidence));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::{Class, Link, State};

    fn counter(event: u8, device: &str, port: u32, what: &str, count: u64) -> LinkEvent {
        LinkEvent {
            rec_seq: 1,
            event,
            count,
            port,
            rank: -1,
            device: LinkEvent::name_bytes(device),
            what: LinkEvent::name_bytes(what),
            ..Default::default()
        }
    }

    fn slow_link(src: &str, dst: &str) -> Finding {
        Finding {
            id: "s".into(),
            kind: Kind::SlowLink,
            class: Class::CommunicationSlow,
            state: State::Open,
            job: "j".into(),
            comm: None,
            seq: None,
            ranks: vec![],
            nodes: vec![src.into(), dst.into()],
            link: Some(Link {
                src: src.into(),
                dst: dst.into(),
                ..Default::default()
            }),
            opened_at: 0,
            resolved_at: None,
            confidence: 0.8,
            summary: "The link from n1 to n2 is slow".into(),
            evidence: json!({"rate_bytes_per_s": 1.0}),
        }
    }

    #[test]
    fn counters_on_a_slow_links_nodes_within_the_window_corroborate_it() {
        let mut n = NicCounters::default();
        n.record(
            "n1",
            &counter(link_event::CONGESTION, "mlx5_0", 1, "np_cnp_sent", 40),
            100.0,
        );
        n.record(
            "n1",
            &counter(link_event::CONGESTION, "mlx5_0", 1, "np_cnp_sent", 2),
            105.0,
        );
        n.record(
            "n2",
            &counter(link_event::LOSS, "mlx5_0", 1, "packet_seq_err", 3),
            106.0,
        );
        // Too old, another node, and a failure (not corroboration): left out.
        n.record(
            "n1",
            &counter(link_event::CONGESTION, "mlx5_0", 1, "rp_cnp_handled", 9),
            50.0,
        );
        n.record(
            "n7",
            &counter(link_event::CONGESTION, "mlx5_0", 1, "np_cnp_sent", 9),
            106.0,
        );
        n.record(
            "n1",
            &counter(link_event::COUNTER, "mlx5_0", 1, "symbol_error", 9),
            106.0,
        );
        let mut f = vec![slow_link("n1", "n2"), slow_link("n5", "n6")];
        n.corroborate(&mut f, 110.0);
        assert_eq!(
            f[0].summary,
            "The link from n1 to n2 is slow; the NIC counters agree over the last 20 s: on n1, congestion (mlx5_0 port 1 np_cnp_sent +42); on n2, loss (mlx5_0 port 1 packet_seq_err +3)"
        );
        assert!((f[0].confidence - 0.9).abs() < 1e-9);
        assert_eq!(
            f[0].evidence["nic_counters"]["n1"]["congestion"]["mlx5_0 port 1 np_cnp_sent"],
            42
        );
        assert_eq!(f[0].evidence["rate_bytes_per_s"], 1.0);
        // No counters on its nodes: unchanged.
        assert_eq!(f[1], slow_link("n5", "n6"));
    }
}
