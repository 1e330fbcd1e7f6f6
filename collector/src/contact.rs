//! What the collector can see of each node, and how far behind it is.
//!
//! A rank's silence is evidence only when the path that carries its records is caught up. Each
//! node's agent stream has a **watermark**: the newest record or snapshot time (realtime, this
//! collector's clock) the collector has applied from it. The path may be behind anywhere — in
//! the agent's spool after an outage, in a stream that queues faster than this collector stores,
//! in the generator of a simulated job — and wherever it is, the watermark stays back with it.
//! The liveness detectors therefore judge a job "as of" its watermark, never as of the wall clock
//! ([`Contact::job_clock`]): a rank is silent only when data newer than its last record has
//! arrived from the other nodes.
//!
//! Three states, apart from dead, hung and resolved:
//! - **in contact**: a stream is open and its data arrives;
//! - **behind**: a stream is open but its data lags the job's other nodes by more than
//!   [`BEHIND_AFTER_NS`]: its ranks are not judged until it catches up;
//! - **out of contact**: no stream is open (the agent went away, or has not come back since
//!   this collector started): its ranks are out of sight, and their silence says nothing.
//!
//! An open finding that names a node behind or out of contact is held open — neither resolved
//! nor judged again — and says so in its evidence (`crate::findings`).

use std::collections::BTreeMap;

use commscope_analyzer::view::LostContact;
use serde::Serialize;

/// A node whose data lags the job's freshest node by more than this is behind: its ranks are
/// left unjudged (a stream that catches up after an outage, a spool replaying).
pub const BEHIND_AFTER_NS: u64 = 10_000_000_000;

/// After this collector starts, agents of the nodes its logs name have this long to reconnect
/// (their backoff reaches 5 s; a Kubernetes restart takes longer) before their absence is taken
/// for a loss of contact rather than for not being back yet.
pub const AWAIT_AGENTS_NS: u64 = 60_000_000_000;

/// A node's agent as its streams show it.
#[derive(Clone, Debug, Default)]
pub struct NodeContact {
    /// Streams open now.
    pub streams: u32,
    /// When the last stream opened or the last one ended (collector realtime, ns).
    pub since_ns: u64,
    /// Why its last stream ended, when none is open: the transport's error, `its stream ended`
    /// (closed by the agent, or by the collector when its keepalive pings went unanswered: the
    /// two look alike from here), or that it has not come back since this collector started.
    pub ended: Option<String>,
    /// The watermark: the newest record or snapshot time applied from this node (realtime,
    /// ns; 0: none yet).
    pub fresh_ns: u64,
    /// When that was applied (collector realtime, ns).
    pub applied_ns: u64,
    /// Streams opened after the first (reconnects).
    pub reopened: u64,
    /// Known from the logs of a previous run, and no stream since this collector started.
    pub recovered: bool,
}

impl NodeContact {
    /// How far its data is behind the wall clock `now` (0 before any arrived).
    pub fn lag_ns(&self, now: u64) -> u64 {
        if self.fresh_ns == 0 {
            return 0;
        }
        now.saturating_sub(self.fresh_ns)
    }
}

/// Every node the collector has heard of.
#[derive(Clone, Debug, Default)]
pub struct Contact {
    nodes: BTreeMap<String, NodeContact>,
}

/// How the collector stands with the nodes of one job at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobClock {
    /// The time the job is judged at: the oldest watermark among its nodes in contact and not
    /// behind (the wall clock when none has sent anything yet).
    pub as_of_ns: u64,
    /// Nodes with running ranks whose stream is open but whose data lags the rest by more than
    /// [`BEHIND_AFTER_NS`]: their ranks are not judged.
    pub behind: Vec<String>,
}

impl Contact {
    /// An agent's stream said hello.
    pub fn connected(&mut self, node: &str, now: u64) {
        let l = self.nodes.entry(node.to_owned()).or_default();
        if l.since_ns > 0 && l.streams == 0 && !l.recovered {
            l.reopened += 1;
        }
        l.streams += 1;
        l.since_ns = now;
        l.ended = None;
        l.recovered = false;
    }

    /// An agent's stream ended (`why`: the transport's error, if there was one). Returns
    /// whether the node is now out of contact.
    pub fn stream_ended(&mut self, node: &str, why: Option<&str>, now: u64) -> bool {
        let l = self.nodes.entry(node.to_owned()).or_default();
        l.streams = l.streams.saturating_sub(1);
        if l.streams > 0 {
            return false;
        }
        l.since_ns = now;
        l.ended = Some(why.unwrap_or("its stream ended").to_owned());
        true
    }

    /// A node known from the logs a previous run left: out of contact until its agent
    /// reconnects (`fresh_ns`: the newest of its records recovered).
    pub fn recovered(&mut self, node: &str, fresh_ns: u64, now: u64) {
        let l = self.nodes.entry(node.to_owned()).or_default();
        l.fresh_ns = l.fresh_ns.max(fresh_ns);
        if l.streams == 0 && l.ended.is_none() {
            l.since_ns = now;
            l.recovered = true;
            l.ended = Some("no stream from its agent since this collector started".into());
        }
    }

    /// Data up to `content_ns` (a record's or a snapshot's time) from `node` was applied at
    /// `now`.
    pub fn arrived(&mut self, node: &str, content_ns: u64, now: u64) {
        if content_ns == 0 {
            return;
        }
        let l = self.nodes.entry(node.to_owned()).or_default();
        if content_ns > l.fresh_ns {
            // Never ahead of the collector's own clock (a sender's clock running fast).
            l.fresh_ns = content_ns.min(now);
            l.applied_ns = now;
        }
    }

    /// Nodes with no stream open at `now`, with when and how the last one ended.
    pub fn lost(&self, now: u64) -> BTreeMap<String, LostContact> {
        self.nodes
            .iter()
            .filter(|(_, l)| l.streams == 0)
            .filter_map(|(node, l)| {
                Some((
                    node.clone(),
                    LostContact {
                        since_ns: l.since_ns,
                        why: l.ended.clone()?,
                        awaited: l.recovered && now.saturating_sub(l.since_ns) < AWAIT_AGENTS_NS,
                    },
                ))
            })
            .collect()
    }

    /// The clock of a job whose running ranks are on `nodes`, at wall-clock `now`.
    pub fn job_clock<'a>(&self, nodes: impl IntoIterator<Item = &'a str>, now: u64) -> JobClock {
        let mut fresh: Vec<(&str, u64)> = Vec::new();
        for n in nodes {
            match self.nodes.get(n) {
                Some(l) if l.streams > 0 && l.fresh_ns > 0 => fresh.push((n, l.fresh_ns)),
                // Out of contact (its ranks are out of sight), or nothing applied yet.
                _ => {}
            }
        }
        let Some(newest) = fresh.iter().map(|f| f.1).max() else {
            return JobClock {
                as_of_ns: now,
                behind: vec![],
            };
        };
        let (behind, current): (Vec<_>, Vec<_>) = fresh
            .into_iter()
            .partition(|(_, t)| newest.saturating_sub(*t) > BEHIND_AFTER_NS);
        let mut behind: Vec<String> = behind.into_iter().map(|(n, _)| n.to_owned()).collect();
        behind.sort();
        behind.dedup();
        JobClock {
            as_of_ns: current.iter().map(|c| c.1).min().unwrap_or(now).min(now),
            behind,
        }
    }

    /// Every node, as it stands.
    pub fn nodes(&self) -> &BTreeMap<String, NodeContact> {
        &self.nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_job_is_judged_as_of_its_oldest_current_node() {
        let mut c = Contact::default();
        c.connected("a", 100 * S);
        c.connected("b", 100 * S);
        c.arrived("a", 108 * S, 110 * S);
        c.arrived("b", 105 * S, 110 * S);
        let j = c.job_clock(["a", "b"], 110 * S);
        assert_eq!(j.as_of_ns, 105 * S);
        assert!(j.behind.is_empty());
        // A node far behind the others is left out and named.
        c.connected("c", 100 * S);
        c.arrived("c", 90 * S, 110 * S);
        let j = c.job_clock(["a", "b", "c"], 110 * S);
        assert_eq!(j.as_of_ns, 105 * S);
        assert_eq!(j.behind, vec!["c".to_owned()]);
        // Nothing sent yet: the wall clock.
        assert_eq!(c.job_clock(["z"], 110 * S).as_of_ns, 110 * S);
    }

    #[test]
    fn a_recovered_node_is_out_of_contact_until_its_agent_returns() {
        let mut c = Contact::default();
        c.recovered("a", 50 * S, 100 * S);
        assert!(c.lost(101 * S)["a"].awaited);
        assert!(!c.lost(100 * S + AWAIT_AGENTS_NS)["a"].awaited);
        let lost = c.lost(101 * S);
        assert_eq!(lost.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(lost["a"].since_ns, 100 * S);
        // The recovered watermark does not count: only a stream's data does.
        assert_eq!(c.job_clock(["a"], 101 * S).as_of_ns, 101 * S);
        c.connected("a", 102 * S);
        assert!(c.lost(102 * S).is_empty());
        assert_eq!(c.nodes()["a"].reopened, 0);
        assert!(c.stream_ended("a", None, 103 * S));
        c.connected("a", 104 * S);
        assert_eq!(c.nodes()["a"].reopened, 1);
    }

    #[test]
    fn the_watermark_never_runs_ahead_of_the_collector() {
        let mut c = Contact::default();
        c.connected("a", S);
        c.arrived("a", 20 * S, 10 * S);
        assert_eq!(c.nodes()["a"].fresh_ns, 10 * S);
        c.arrived("a", 5 * S, 11 * S);
        assert_eq!(c.nodes()["a"].fresh_ns, 10 * S);
        assert_eq!(c.nodes()["a"].lag_ns(12 * S), 2 * S);
    }
}
