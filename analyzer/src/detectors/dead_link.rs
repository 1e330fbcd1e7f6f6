//! What the transport view says about a stall: the dead links ([`crate::view::DeadLink`]) that
//! touch the stalled instances' nodes, folded into one cause — the node every dead link goes
//! through, or the one pair of nodes they connect.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::finding::Link;
use crate::view::{DeadLink, JobView};

/// A stall's dead links as one cause.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadPath {
    /// The link the finding names: `src` is the node every dead link goes through, when there
    /// is one.
    pub link: Link,
    /// The nodes the dead links have in common (one node, a pair, or none).
    pub common: Vec<String>,
    /// "TCP from n1 to n0 has had nothing acknowledged for 6 s while its sender retransmitted
    /// 5 times (and 2 more dead links go through n1)".
    pub measured: String,
    /// "the network path through n1 is dead, not a rank: check …".
    pub advice: String,
    pub evidence: Value,
}

/// The dead links among `nodes` (a stall's members' nodes), as one cause; None when the
/// transport shows none.
pub fn dead_path(view: &JobView, nodes: &[String]) -> Option<DeadPath> {
    let dead: Vec<&DeadLink> = view
        .dead_links
        .iter()
        .filter(|d| nodes.contains(&d.src) || nodes.contains(&d.dst))
        .collect();
    let lead = *dead.first()?;
    let mut common: BTreeSet<&str> = [lead.src.as_str(), lead.dst.as_str()].into();
    for d in &dead[1..] {
        common.retain(|n| *n == d.src || *n == d.dst);
    }
    let common: Vec<String> = common.into_iter().map(str::to_owned).collect();
    let link = match common.as_slice() {
        // Every dead link goes through one node: it leads, whichever way the lead link runs.
        [x] if *x == lead.dst => Link {
            src: lead.dst.clone(),
            dst: lead.src.clone(),
            // Its interface, from a dead link it sends on, when there is one.
            src_nic: dead
                .iter()
                .find(|d| d.src == *x)
                .and_then(|d| d.src_nic.clone()),
            ..Default::default()
        },
        // As measured: the sender's interface is known.
        _ => Link {
            src: lead.src.clone(),
            dst: lead.dst.clone(),
            src_nic: lead.src_nic.clone(),
            ..Default::default()
        },
    };
    let more = dead.len() - 1;
    let measured = format!(
        "{} from {} to {} has had nothing acknowledged for {:.0} s while its sender retransmitted {} time{}{}",
        lead.transport.to_uppercase(),
        lead.src,
        lead.dst,
        lead.dead_s,
        lead.retransmits,
        if lead.retransmits == 1 { "" } else { "s" },
        match (more, common.as_slice()) {
            (0, _) => String::new(),
            (n, [x]) => format!(
                " (and {n} more dead link{} go{} through {x})",
                if n == 1 { "" } else { "s" },
                if n == 1 { "es" } else { "" }
            ),
            (n, [a, b]) => format!(
                " (and {n} more dead connection{} between {a} and {b})",
                if n == 1 { "" } else { "s" }
            ),
            (n, _) => format!(" (and {n} more dead link{})", if n == 1 { "" } else { "s" }),
        }
    );
    let advice = match common.as_slice() {
        [x] => format!(
            "the network path through {x} is dead, not a rank: check {x}'s link (ip link, NIC and switch-port counters, cabling, routes and neighbour entries)"
        ),
        [a, b] => format!(
            "the network path between {a} and {b} is dead, not a rank: check that path (both nodes' NIC and switch-port counters, routes, firewalls)"
        ),
        _ => "several network paths are dead, not a rank: check the nodes' links (NIC and switch-port counters, the switches between them)".to_owned(),
    };
    let evidence = json!({
        "dead_links": dead.iter().map(|d| json!({
            "src": d.src, "dst": d.dst, "transport": d.transport,
            "dead_s": d.dead_s, "retransmits": d.retransmits, "ranks": d.ranks,
        })).collect::<Vec<_>>(),
        "common_nodes": common,
    });
    Some(DeadPath {
        link,
        common,
        measured,
        advice,
        evidence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(src: &str, dst: &str, retransmits: u64) -> DeadLink {
        DeadLink {
            src: src.into(),
            dst: dst.into(),
            transport: "tcp",
            dead_s: 6.0,
            retransmits,
            ranks: vec![],
            src_nic: Some(format!("{src}-eth0")),
        }
    }

    fn view(dead_links: Vec<DeadLink>) -> JobView {
        JobView {
            dead_links,
            ..Default::default()
        }
    }

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn dead_links_through_one_node_name_that_node_as_the_source() {
        // n1 cut off: its peers' sends to it and its own sends retransmit.
        let v = view(vec![
            dead("n0", "n1", 5),
            dead("n1", "n2", 4),
            dead("n2", "n1", 3),
        ]);
        let p = dead_path(&v, &nodes(&["n0", "n1", "n2"])).expect("a dead path");
        assert_eq!(p.common, ["n1"]);
        assert_eq!((p.link.src.as_str(), p.link.dst.as_str()), ("n1", "n0"));
        // Reversed from the lead link (n0 → n1): n1's interface from its own dead link.
        assert_eq!(p.link.src_nic.as_deref(), Some("n1-eth0"));
        assert!(p.measured.contains("TCP from n0 to n1"), "{}", p.measured);
        assert!(
            p.measured.contains("(and 2 more dead links go through n1)"),
            "{}",
            p.measured
        );
        assert!(p.advice.starts_with("the network path through n1 is dead"));
    }

    #[test]
    fn one_pair_is_named_as_the_path_between_them() {
        let v = view(vec![dead("n0", "n1", 5), dead("n1", "n0", 3)]);
        let p = dead_path(&v, &nodes(&["n0", "n1"])).expect("a dead path");
        assert_eq!(p.common, ["n0", "n1"]);
        assert_eq!((p.link.src.as_str(), p.link.dst.as_str()), ("n0", "n1"));
        assert_eq!(p.link.src_nic.as_deref(), Some("n0-eth0"));
        assert!(p.advice.contains("between n0 and n1"), "{}", p.advice);
    }

    #[test]
    fn links_away_from_the_stall_or_none_give_nothing() {
        let v = view(vec![dead("n5", "n6", 5)]);
        assert_eq!(dead_path(&v, &nodes(&["n0", "n1"])), None);
        assert_eq!(dead_path(&view(vec![]), &nodes(&["n0"])), None);
    }
}
