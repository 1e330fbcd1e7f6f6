//! **Link error** from the node agents' `link_event` records: a queue pair that moved to ERROR,
//! a fatal asynchronous event, NIC error counters that went up, a port that went down.
//!
//! Events are kept per (node, device): a NIC. It has a `link-error` finding while a port of it
//! is down or while its last event is less than `hold_s` old; it resolves once its ports are up
//! and `hold_s` passed without a new event. One finding per NIC: a flapping port, a burst of
//! counter increments, and the fatal events of its queue pairs (which name no port) are one
//! cause. `ranks` are `[]` (a link is no rank's fault); `link` names
//! the node, its NIC and port, and the peer's node when a queue pair's peer is known.
//!
//! A link error under a hang is that hang's cause, not a second finding: [`fold_into_hangs`]
//! moves it into the `communication-hang` whose link or nodes name its node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use commscope_wire::hash::Hasher;
use commscope_wire::record::{LinkEvent, link_event};
use serde_json::json;

use crate::finding::{Class, Finding, Kind, Link, State, finding_id};

/// Thresholds of the link-error detector.
#[derive(Clone, Debug)]
pub struct LinkErrorTuning {
    /// A port's finding stays open this long after its last event (s).
    pub hold_s: f64,
}

impl Default for LinkErrorTuning {
    fn default() -> Self {
        LinkErrorTuning { hold_s: 60.0 }
    }
}

#[derive(Debug, Default)]
struct PortSt {
    first_s: f64,
    last_s: f64,
    /// Ports down now, and since when.
    down: BTreeMap<u32, f64>,
    /// Ports its events named.
    port_set: BTreeSet<u32>,
    /// Events by what happened (`QP ERROR`, `IBV_EVENT_PORT_ERR`, `symbol_error`, …).
    what: BTreeMap<String, u64>,
    peers: BTreeSet<IpAddr>,
    ranks: BTreeSet<i32>,
    qps: BTreeSet<u32>,
}

/// The detector's state: per (node, device).
#[derive(Debug, Default)]
pub struct LinkErrors {
    pub tuning: LinkErrorTuning,
    ports: BTreeMap<(String, String), PortSt>,
}

impl LinkErrors {
    /// One `link_event` record of `node`'s agent, at `now_s`.
    pub fn record(&mut self, node: &str, e: &LinkEvent, now_s: f64) {
        // Congestion and loss counters corroborate slow links ([`crate::nic`]); no failure.
        if crate::nic::is_corroboration(e) {
            return;
        }
        let hold = self.tuning.hold_s;
        let key = (node.to_owned(), e.device_name());
        let s = self.ports.entry(key).or_default();
        // The last episode was over (up, and quiet for `hold_s`): this one starts afresh.
        if s.down.is_empty() && now_s - s.last_s >= hold {
            *s = PortSt::default();
        }
        if e.event == link_event::PORT_UP {
            s.down.remove(&e.port);
            return;
        }
        if e.event == link_event::PORT_DOWN {
            s.down.entry(e.port).or_insert(now_s);
        }
        if e.port > 0 {
            s.port_set.insert(e.port);
        }
        if s.what.is_empty() {
            s.first_s = now_s;
        }
        s.last_s = now_s;
        let what = match e.event {
            link_event::QP_ERROR => "QP moved to ERROR".to_owned(),
            link_event::PORT_DOWN => "port down".to_owned(),
            _ => e.what_name(),
        };
        *s.what.entry(what).or_default() += e.count.max(1);
        if let Some(p) = e.peer_addr() {
            s.peers.insert(p);
        }
        if e.rank >= 0 {
            s.ranks.insert(e.rank);
        }
        if e.qp_num != 0 {
            s.qps.insert(e.qp_num);
        }
    }

    /// The link-error findings open at `now_s`; `node_of` names the node of a peer address.
    pub fn findings(
        &mut self,
        job: &str,
        now_s: f64,
        node_of: impl Fn(&IpAddr) -> Option<String>,
        out: &mut Vec<Finding>,
    ) {
        let hold = self.tuning.hold_s;
        // A port quiet for long and up again is forgotten: a later error is a new finding.
        self.ports
            .retain(|_, s| !s.down.is_empty() || now_s - s.last_s < 10.0 * hold);
        for ((node, device), s) in &self.ports {
            if s.what.is_empty() || (s.down.is_empty() && now_s - s.last_s >= hold) {
                continue;
            }
            let peers: Vec<String> = s
                .peers
                .iter()
                .map(|a| node_of(a).unwrap_or_else(|| a.to_string()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let total: u64 = s.what.values().sum();
            let what = s
                .what
                .iter()
                .map(|(w, n)| format!("{w} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ");
            // The port, when its events name exactly one.
            let port = match s.port_set.iter().collect::<Vec<_>>().as_slice() {
                [p] => Some(**p),
                _ => None,
            };
            let place = match port {
                Some(p) => format!("{device} port {p} on {node}"),
                None => format!("{device} on {node}"),
            };
            let down_since = s.down.values().copied().reduce(f64::min);
            let dst = peers.first().cloned().unwrap_or_else(|| node.clone());
            let mut nodes: Vec<String> = std::iter::once(node.clone())
                .chain(peers.iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            nodes.truncate(8);
            let state = match down_since {
                Some(d) => format!("is down since {:.0} s ago", (now_s - d).max(0.0)),
                None => format!(
                    "reported {total} error{}",
                    if total == 1 { "" } else { "s" }
                ),
            };
            let id = Hasher::new().str(node).str(device).finish();
            out.push(Finding {
                id: finding_id(Kind::LinkError, job, Some(id), &[], None),
                kind: Kind::LinkError,
                class: Class::CommunicationSlow,
                state: State::Open,
                job: job.to_owned(),
                comm: None,
                seq: None,
                ranks: vec![],
                nodes,
                link: Some(Link {
                    src: node.clone(),
                    dst,
                    src_nic: Some(device.clone()),
                    src_port: port,
                }),
                opened_at: (s.first_s * 1e9) as u64,
                resolved_at: None,
                confidence: if down_since.is_some() { 0.95 } else { 0.85 },
                summary: format!(
                    "{place} {state} ({what}){}{}: the link is failing, not a rank — check {node}'s {device} (ibstat / ip link, its cable and switch port, dmesg) and move the job off it if it keeps failing",
                    if peers.is_empty() {
                        String::new()
                    } else {
                        format!(", on its connections to {}", peers.join(", "))
                    },
                    if s.ranks.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; ranks {} hold the failed queue pairs",
                            s.ranks
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                ),
                evidence: json!({
                    "node": node,
                    "device": device,
                    "ports": s.port_set,
                    "events": s.what,
                    "down": s.down.keys().collect::<Vec<_>>(),
                    "peers": peers,
                    "ranks": s.ranks,
                    "queue_pairs": s.qps,
                    "first_s_ago": now_s - s.first_s,
                    "last_s_ago": now_s - s.last_s,
                }),
            });
        }
    }
}

/// Moves each link-error finding whose node a `communication-hang` names (its link, or its
/// nodes) into that hang's evidence (`evidence.link_errors`): the failing link is what the
/// hang waits on — one finding per root cause.
pub fn fold_into_hangs(findings: &mut Vec<Finding>) {
    let names = |f: &Finding, node: &str| {
        f.nodes.iter().any(|n| n == node)
            || f.link
                .as_ref()
                .is_some_and(|l| l.src == node || l.dst == node)
    };
    let mut folded = vec![false; findings.len()];
    for i in 0..findings.len() {
        if findings[i].kind != Kind::LinkError {
            continue;
        }
        let node = findings[i].link.as_ref().map(|l| l.src.clone());
        let Some(node) = node else { continue };
        let Some(h) = (0..findings.len()).find(|&h| {
            findings[h].kind == Kind::Hang
                && findings[h].class == Class::CommunicationHang
                && names(&findings[h], &node)
        }) else {
            continue;
        };
        let e = json!({
            "summary": findings[i].summary,
            "link": findings[i].link,
            "evidence": findings[i].evidence,
        });
        let ev = &mut findings[h].evidence;
        if !ev.is_object() {
            *ev = json!({});
        }
        match ev.get_mut("link_errors").and_then(|v| v.as_array_mut()) {
            Some(a) => a.push(e),
            None => ev["link_errors"] = json!([e]),
        }
        folded[i] = true;
    }
    let mut i = 0;
    findings.retain(|_| {
        let keep = !folded[i];
        i += 1;
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::record::Flow;

    fn ev(event: u8, device: &str, port: u32, what: &str, count: u64) -> LinkEvent {
        LinkEvent {
            rec_seq: 1,
            event,
            count,
            port,
            device: LinkEvent::name_bytes(device),
            what: LinkEvent::name_bytes(what),
            rank: -1,
            ..Default::default()
        }
    }

    fn run(d: &mut LinkErrors, now_s: f64) -> Vec<Finding> {
        let mut out = Vec::new();
        d.findings(
            "j",
            now_s,
            |a| (a.to_string() == "10.0.0.2").then(|| "n2".to_owned()),
            &mut out,
        );
        out
    }

    #[test]
    fn a_qp_error_is_one_link_error_naming_the_nic_port_and_peer_until_it_ages_out() {
        let mut d = LinkErrors::default();
        let mut e = ev(link_event::QP_ERROR, "mlx5_0", 1, "", 1);
        e.qp_num = 0x1a2;
        e.rank = 3;
        e.peer = Flow::addr_bytes("10.0.0.2".parse().expect("ip"));
        d.record("n1", &e, 100.0);
        // A fatal event of a queue pair (no port) on the same NIC: the same finding.
        d.record(
            "n1",
            &ev(link_event::FATAL, "mlx5_0", 0, "IBV_EVENT_QP_FATAL", 1),
            101.0,
        );
        let f = run(&mut d, 102.0);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::LinkError);
        assert!(f[0].ranks.is_empty());
        let l = f[0].link.as_ref().expect("link");
        assert_eq!(
            (
                l.src.as_str(),
                l.dst.as_str(),
                l.src_nic.as_deref(),
                l.src_port
            ),
            ("n1", "n2", Some("mlx5_0"), Some(1))
        );
        assert_eq!(f[0].nodes, ["n1", "n2"]);
        let s = &f[0].summary;
        assert!(
            s.starts_with("mlx5_0 port 1 on n1 reported 2 errors"),
            "{s}"
        );
        assert!(
            s.contains("IBV_EVENT_QP_FATAL ×1, QP moved to ERROR ×1"),
            "{s}"
        );
        assert!(s.contains("on its connections to n2; ranks 3 hold"), "{s}");
        let id = f[0].id.clone();
        assert_eq!(run(&mut d, 150.0)[0].id, id);
        assert!(run(&mut d, 161.0).is_empty(), "60 s quiet: resolved");
        // Errors on two ports of one NIC: one finding, no single port named.
        d.record(
            "n1",
            &ev(link_event::PORT_ERROR, "mlx5_0", 1, "IBV_EVENT_PORT_ERR", 1),
            300.0,
        );
        d.record(
            "n1",
            &ev(link_event::PORT_ERROR, "mlx5_0", 2, "IBV_EVENT_PORT_ERR", 1),
            300.0,
        );
        let f = run(&mut d, 301.0);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].link.as_ref().expect("link").src_port, None);
        assert!(
            f[0].summary.starts_with("mlx5_0 on n1 reported 2 errors"),
            "{}",
            f[0].summary
        );
        assert_eq!(f[0].evidence["ports"], json!([1, 2]));
    }

    #[test]
    fn a_port_down_stays_open_until_it_is_up_and_counters_add_up() {
        let mut d = LinkErrors::default();
        d.record("n1", &ev(link_event::PORT_DOWN, "mlx5_1", 1, "", 1), 10.0);
        d.record(
            "n1",
            &ev(link_event::COUNTER, "mlx5_1", 1, "link_downed", 1),
            10.0,
        );
        d.record(
            "n1",
            &ev(link_event::COUNTER, "mlx5_1", 1, "symbol_error", 40),
            11.0,
        );
        let f = run(&mut d, 200.0);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(
            f[0].summary
                .starts_with("mlx5_1 port 1 on n1 is down since 190 s ago (link_downed ×1, port down ×1, symbol_error ×40)"),
            "{}",
            f[0].summary
        );
        assert_eq!(f[0].link.as_ref().expect("link").dst, "n1");
        d.record("n1", &ev(link_event::PORT_UP, "mlx5_1", 1, "", 1), 201.0);
        assert!(run(&mut d, 202.0).is_empty(), "up, and its events are old");
        // Another port of another node: its own finding.
        d.record(
            "n3",
            &ev(link_event::COUNTER, "eth0", 0, "rx_crc_errors", 5),
            203.0,
        );
        let f = run(&mut d, 204.0);
        assert_eq!(f.len(), 1);
        assert!(f[0].summary.starts_with("eth0 on n3 reported 5 errors"));
        assert_eq!(f[0].link.as_ref().expect("link").src_port, None);
    }

    #[test]
    fn a_link_error_under_a_communication_hang_is_its_evidence() {
        let mut d = LinkErrors::default();
        d.record(
            "n1",
            &ev(link_event::COUNTER, "mlx5_0", 1, "link_downed", 1),
            10.0,
        );
        d.record(
            "n4",
            &ev(link_event::COUNTER, "mlx5_0", 1, "symbol_error", 9),
            10.0,
        );
        let mut f = run(&mut d, 11.0);
        assert_eq!(f.len(), 2);
        f.push(Finding {
            id: "h".into(),
            kind: Kind::Hang,
            class: Class::CommunicationHang,
            state: State::Open,
            job: "j".into(),
            comm: None,
            seq: None,
            ranks: vec![],
            nodes: vec![],
            link: Some(Link {
                src: "n1".into(),
                dst: "n0".into(),
                ..Default::default()
            }),
            opened_at: 0,
            resolved_at: None,
            confidence: 0.8,
            summary: String::new(),
            evidence: json!({"members": [0, 1]}),
        });
        fold_into_hangs(&mut f);
        // n1's link error went into the hang; n4's, unrelated, stays a finding.
        assert_eq!(f.len(), 2, "{f:#?}");
        let hang = f.iter().find(|x| x.kind == Kind::Hang).expect("hang");
        assert_eq!(hang.evidence["members"], json!([0, 1]));
        assert_eq!(
            hang.evidence["link_errors"][0]["link"]["src_nic"],
            json!("mlx5_0")
        );
        let other = f.iter().find(|x| x.kind == Kind::LinkError).expect("n4");
        assert_eq!(other.link.as_ref().expect("link").src, "n4");
    }
}
