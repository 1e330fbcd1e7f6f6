//! Findings, as the contract shapes them: one per root cause, `ranks` = the root ranks only,
//! a stable id, and a one-sentence summary that says what to do next.

use std::collections::BTreeMap;

use commscope_wire::hash::{Hasher, format_comm_id};
use serde::{Deserialize, Serialize};

/// What was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    SlowRank,
    Hang,
    Mismatch,
    DeadRank,
    CommError,
    DegradedCollective,
    SlowLink,
    LinkError,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 8] = [
        Kind::SlowRank,
        Kind::Hang,
        Kind::Mismatch,
        Kind::DeadRank,
        Kind::CommError,
        Kind::DegradedCollective,
        Kind::SlowLink,
        Kind::LinkError,
    ];

    /// The contract name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::SlowRank => "slow-rank",
            Kind::Hang => "hang",
            Kind::Mismatch => "mismatch",
            Kind::DeadRank => "dead-rank",
            Kind::CommError => "comm-error",
            Kind::DegradedCollective => "degraded-collective",
            Kind::SlowLink => "slow-link",
            Kind::LinkError => "link-error",
        }
    }
}

/// The taxonomy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    CommunicationHang,
    NonCommunicationHang,
    CommunicationSlow,
    NonCommunicationSlow,
}

/// Open or resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Open,
    Resolved,
}

/// A link between two nodes, with the source's NIC and port when known (`mlx5_0`, 1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub src: String,
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_nic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_port: Option<u32>,
}

/// One finding (the contract's object).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub kind: Kind,
    pub class: Class,
    pub state: State,
    pub job: String,
    /// `0x…`, or null.
    pub comm: Option<String>,
    pub seq: Option<u64>,
    /// Root ranks (global, sorted).
    pub ranks: Vec<i32>,
    /// Their nodes (sorted, distinct).
    pub nodes: Vec<String>,
    pub link: Option<Link>,
    /// When it was opened / resolved, ns since the epoch.
    pub opened_at: u64,
    pub resolved_at: Option<u64>,
    pub confidence: f64,
    pub summary: String,
    pub evidence: serde_json::Value,
}

/// The stable id: a hash of (kind, job, comm, root ranks, first seq), printed like a comm id.
pub fn finding_id(
    kind: Kind,
    job: &str,
    comm: Option<u64>,
    ranks: &[i32],
    seq: Option<u64>,
) -> String {
    let mut h = Hasher::new()
        .str(kind.name())
        .str(job)
        .word(comm.unwrap_or(0))
        .word(seq.map_or(u64::MAX, |s| s));
    for r in ranks {
        h = h.word(*r as u32 as u64);
    }
    format_comm_id(h.finish())
}

/// `[0, 3, 5]` → "ranks 0, 3 and 5"; one rank → "rank 3".
pub fn ranks_phrase(ranks: &[i32]) -> String {
    match ranks {
        [] => "no rank".into(),
        [r] => format!("rank {r}"),
        _ => {
            let (last, rest) = ranks.split_last().expect("two or more");
            let rest: Vec<String> = rest.iter().map(i32::to_string).collect();
            format!("ranks {} and {last}", rest.join(", "))
        }
    }
}

/// The call the victims of a hang wait in (the one waited in longest).
#[derive(Clone, Debug)]
pub struct Waited {
    pub comm: u64,
    /// The communicator's name ("" when it has none).
    pub comm_name: String,
    /// The collective instance; `None` for point-to-point.
    pub seq: Option<u64>,
    pub op: &'static str,
    pub bytes: u64,
    /// Point-to-point tag.
    pub tag: i32,
    pub age_s: f64,
}

/// One root cause of a hang, as a detector (batch or live) found it.
#[derive(Clone, Debug)]
pub struct HangCause<'a> {
    pub job: &'a str,
    /// Root culprits (global ranks, sorted) and their nodes.
    pub culprits: Vec<i32>,
    pub nodes: Vec<String>,
    /// Ranks waiting behind them (sorted).
    pub victims: Vec<i32>,
    pub waited: Waited,
    /// Some culprit is inside a communication call itself.
    pub in_library: bool,
    /// Found on a live job (present tense) rather than in a trace.
    pub live: bool,
    /// What the culprits' processes are doing, when known ("its process is sleeping in
    /// hrtimer_nanosleep, CPU time not advancing"); empty otherwise.
    pub state_note: String,
    /// The culprits' GPUs hold work their peers completed (a stuck or failed GPU): what to
    /// say instead of where the host was; empty otherwise.
    pub gpu_note: String,
    /// Where a culprit inside the library is blocked ("it is blocked inside recv from rank 1
    /// (tag 8) on MPI_COMM_WORLD …"); empty when unknown.
    pub inside_note: String,
    /// The culprits shut down (`MPI_Finalize`) while the others wait: their program ended
    /// early there. Empty otherwise.
    pub finalize_note: String,
    /// Where the culprits' records end, cut short by a damaged trace: whether they entered is
    /// unknown. Empty when their records are whole.
    pub cut_note: String,
    /// Other ranks the waiting calls also wait on whose records a damaged trace cut short
    /// ("rank 0's records end 19.2 s earlier …"); empty when there are none.
    pub unknown_note: String,
    /// The waiting ranks are seen from the host only (recorded without the preload): they
    /// issued the call and nothing after it on that communicator.
    pub host_view: bool,
    pub opened_at: u64,
    pub confidence: f64,
    pub evidence: serde_json::Value,
}

/// The finding of ranks that never entered the call others wait in (alive, elsewhere).
pub fn hang_finding(c: HangCause<'_>) -> Finding {
    let w = &c.waited;
    let kind = Kind::Hang;
    let class = if c.in_library {
        Class::CommunicationHang
    } else {
        Class::NonCommunicationHang
    };
    let comm = if w.comm_name.is_empty() {
        format_comm_id(w.comm)
    } else {
        format!("{} ({})", format_comm_id(w.comm), w.comm_name)
    };
    let what = match w.seq {
        Some(seq) => format!(
            "{} #{seq} ({}) on communicator {comm}",
            w.op,
            crate::stream::fmt_bytes(w.bytes)
        ),
        None if w.tag >= 0 => format!("{} (tag {}) on communicator {comm}", w.op, w.tag),
        None => format!("{} on communicator {comm}", w.op),
    };
    let who = if c.nodes.is_empty() {
        ranks_phrase(&c.culprits)
    } else {
        format!("{} on {}", ranks_phrase(&c.culprits), c.nodes.join(", "))
    };
    let others = format!(
        "{} other {}",
        c.victims.len(),
        if c.victims.len() == 1 {
            "rank"
        } else {
            "ranks"
        }
    );
    let wait = match (c.live, c.victims.len()) {
        (false, _) => "waited",
        (true, 1) => "waits",
        (true, _) => "wait",
    };
    let stacks = if c.culprits.len() == 1 {
        "its node's agent takes its stacks into this finding's evidence (or run py-spy dump / gdb on it)"
    } else {
        "their nodes' agents take their stacks into this finding's evidence (or run py-spy dump / gdb on them)"
    };
    // One culprit is "it", several "they".
    let (it, is, was) = if c.culprits.len() == 1 {
        ("it", "is", "was")
    } else {
        ("they", "are", "were")
    };
    let summary = {
        let entered = match (c.live, c.culprits.len(), w.seq.is_some()) {
            (_, 1, true) if !c.cut_note.is_empty() => "has no record of entering",
            (_, _, true) if !c.cut_note.is_empty() => "have no record of entering",
            (_, 1, false) if !c.cut_note.is_empty() => "has no record of posting the match of",
            (_, _, false) if !c.cut_note.is_empty() => "have no record of posting the match of",
            (false, _, true) => "never entered",
            (true, 1, true) => "has not entered",
            (true, _, true) => "have not entered",
            (false, _, false) => "never posted the match of",
            (true, 1, false) => "has not posted the match of",
            (true, _, false) => "have not posted the match of",
        };
        let behind = if c.host_view {
            format!(
                "{others} issued it and {} nothing on that communicator since, for up to {:.1} s (seen from the host: they run without the preload, recorded by the node agent's uprobes)",
                if c.live { "have issued" } else { "issued" },
                w.age_s
            )
        } else {
            format!("{others} {wait} behind it for up to {:.1} s", w.age_s)
        };
        format!(
            "{who} {entered} {what}; {behind} — {}{}",
            match (c.in_library, c.live, c.state_note.is_empty()) {
                _ if !c.cut_note.is_empty() => c.cut_note.clone(),
                _ if !c.gpu_note.is_empty() => c.gpu_note.clone(),
                _ if !c.finalize_note.is_empty() => c.finalize_note.clone(),
                (true, _, _) if !c.inside_note.is_empty() => c.inside_note.clone(),
                (true, _, _) => format!("{it} {is} blocked in another communication call: look at that call's peers"),
                (false, false, _) if c.culprits.len() == 1 => "it was outside the communication library: look at what that rank was doing then (its logs, the code after the previous collective)".to_owned(),
                (false, false, _) => format!("{it} {was} outside the communication library: look at what those ranks were doing then (their logs, the code after the previous collective)"),
                (false, true, true) => format!("{it} {is} outside the communication library: {stacks}"),
                (false, true, false) => format!(
                    "{it} {is} outside the communication library ({}): {stacks}",
                    c.state_note,
                ),
            },
            if c.unknown_note.is_empty() {
                String::new()
            } else {
                format!("; {}", c.unknown_note)
            }
        )
    };
    Finding {
        id: finding_id(kind, c.job, Some(w.comm), &c.culprits, w.seq),
        kind,
        class,
        state: State::Open,
        job: c.job.to_owned(),
        comm: Some(format_comm_id(w.comm)),
        seq: w.seq,
        ranks: c.culprits,
        nodes: c.nodes,
        link: None,
        opened_at: c.opened_at,
        resolved_at: None,
        confidence: c.confidence,
        summary,
        evidence: c.evidence,
    }
}

/// A finding that opened or resolved.
#[derive(Clone, Debug)]
pub enum Change {
    Opened(Finding),
    Resolved(Finding),
}

/// Open and resolved findings over time: each evaluation's findings are matched by id with the
/// open ones — new ids open, missing ids resolve, the same id keeps when it opened.
#[derive(Debug, Default)]
pub struct Tracker {
    pub open: BTreeMap<String, Finding>,
    pub resolved: Vec<Finding>,
    /// Resolved findings kept, at most (0: all).
    pub keep_resolved: usize,
}

impl Tracker {
    /// Takes the findings of one evaluation at `at_ns`; returns what opened and resolved.
    pub fn update(&mut self, now: Vec<Finding>, at_ns: u64) -> Vec<Change> {
        let now: BTreeMap<String, Finding> = now.into_iter().map(|f| (f.id.clone(), f)).collect();
        let mut changes = Vec::new();
        let gone: Vec<String> = self
            .open
            .keys()
            .filter(|id| !now.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(mut f) = self.open.remove(&id) {
                f.state = State::Resolved;
                f.resolved_at = Some(at_ns);
                changes.push(Change::Resolved(f.clone()));
                self.resolved.push(f);
            }
        }
        if self.keep_resolved > 0 && self.resolved.len() > self.keep_resolved {
            let cut = self.resolved.len() - self.keep_resolved;
            self.resolved.drain(..cut);
        }
        for (id, mut f) in now {
            match self.open.get(&id) {
                Some(old) => {
                    // Same cause: keep when it opened, refresh the rest.
                    f.opened_at = old.opened_at;
                    self.open.insert(id, f);
                }
                None => {
                    // Found again after it resolved: the same finding, open again.
                    self.resolved.retain(|r| r.id != id);
                    changes.push(Change::Opened(f.clone()));
                    self.open.insert(id, f);
                }
            }
        }
        changes
    }

    /// Every finding, open and resolved, in the order they opened.
    pub fn all(&self) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .resolved
            .iter()
            .chain(self.open.values())
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.opened_at, &a.id).cmp(&(b.opened_at, &b.id)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = finding_id(Kind::Hang, "j", Some(7), &[3], Some(10));
        assert_eq!(a, finding_id(Kind::Hang, "j", Some(7), &[3], Some(10)));
        assert_ne!(a, finding_id(Kind::Hang, "j", Some(7), &[4], Some(10)));
        assert_ne!(a, finding_id(Kind::DeadRank, "j", Some(7), &[3], Some(10)));
        assert_eq!(ranks_phrase(&[0, 3, 5]), "ranks 0, 3 and 5");
        assert_eq!(ranks_phrase(&[2]), "rank 2");
        let f = Finding {
            id: a,
            kind: Kind::DeadRank,
            class: Class::CommunicationHang,
            state: State::Open,
            job: "j".into(),
            comm: None,
            seq: None,
            ranks: vec![1],
            nodes: vec!["n".into()],
            link: None,
            opened_at: 1,
            resolved_at: None,
            confidence: 0.9,
            summary: "s".into(),
            evidence: serde_json::json!({}),
        };
        let v = serde_json::to_value(&f).expect("json");
        assert_eq!(v["kind"], "dead-rank");
        assert_eq!(v["class"], "communication-hang");
        assert_eq!(v["state"], "open");
        assert!(v["comm"].is_null());
    }
}
