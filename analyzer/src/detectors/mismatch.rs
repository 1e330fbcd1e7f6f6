//! `mismatch`: members of one collective instance called different things (op, size, root or
//! datatype).
//!
//! Measures each member's call of an instance (completed, or in flight when it cannot
//! complete). Fires for the ranks that differ from the majority. A communicator of two has no
//! majority: the tie is broken by its siblings — communicators with the same parent and size,
//! made by the same split — whose members called one thing at the same instance; if they do
//! not tell, both ranks are named and the finding says it is a tie.

use std::collections::BTreeMap;

use commscope_wire::hash::format_comm_id;
use serde_json::json;

use crate::finding::{Class, Finding, Kind, State, finding_id, ranks_phrase};
use crate::stream::Shape;

/// One mismatched instance.
#[derive(Clone, Debug)]
pub struct Mismatch {
    pub comm: u64,
    pub seq: u64,
    pub size: usize,
    /// What each group of members called.
    pub shapes: BTreeMap<Shape, Vec<i32>>,
    /// When it was seen, seconds.
    pub at_s: f64,
}

/// Which call is the right one: the majority, else the one the siblings made at the same
/// instance; `None` when that ties too.
pub fn majority(m: &Mismatch, siblings: &[Shape]) -> Option<Shape> {
    let most = m.shapes.values().map(Vec::len).max()?;
    let top: Vec<Shape> = m
        .shapes
        .iter()
        .filter(|(_, r)| r.len() == most)
        .map(|(s, _)| *s)
        .collect();
    if let [one] = top.as_slice() {
        return Some(*one);
    }
    let votes = |s: &Shape| siblings.iter().filter(|x| same_call(s, x)).count();
    let best = top.iter().map(votes).max()?;
    let winners: Vec<&Shape> = top.iter().filter(|s| votes(s) == best).collect();
    match winners.as_slice() {
        [one] if best > 0 => Some(**one),
        _ => None,
    }
}

/// Whether a sibling's call is `s`, as far as both records say (a call known only from an
/// older `enter` record carries no datatype or reduction: then the rest decides).
fn same_call(s: &Shape, sibling: &Shape) -> bool {
    s.agrees_with(sibling)
}

/// The finding of a mismatched instance; `siblings`: what sibling communicators called at the
/// same instance; `node_of`: a rank's node.
pub fn finding(
    job: &str,
    m: &Mismatch,
    siblings: &[Shape],
    node_of: impl Fn(i32) -> Option<String>,
) -> Finding {
    let right = majority(m, siblings);
    let mut odd: Vec<i32> = m
        .shapes
        .iter()
        .filter(|(k, _)| Some(**k) != right)
        .flat_map(|(_, r)| r.clone())
        .collect();
    odd.sort_unstable();
    odd.dedup();
    let said: Vec<String> = m
        .shapes
        .iter()
        .filter(|(k, _)| Some(**k) != right)
        .map(|(k, r)| {
            let mut r = r.clone();
            r.sort_unstable();
            format!("{} called {}", ranks_phrase(&r), k.describe())
        })
        .collect();
    let mut nodes: Vec<String> = odd.iter().filter_map(|r| node_of(*r)).collect();
    nodes.sort();
    nodes.dedup();
    let summary = match right {
        Some(s) => format!(
            "collective #{} on communicator {}: {} where the other {} called {}{} — the program's ranks disagree on the sequence of collectives; fix the code path that diverges",
            m.seq,
            format_comm_id(m.comm),
            said.join("; "),
            m.shapes.get(&s).map_or(0, Vec::len),
            s.describe(),
            if m.shapes.get(&s).map_or(0, Vec::len) * 2 <= m.size.max(2) {
                format!(
                    " (as {} sibling communicators did)",
                    siblings.iter().filter(|x| same_call(&s, x)).count()
                )
            } else {
                String::new()
            }
        ),
        None => format!(
            "collective #{} on communicator {}: {} — a tie that neither the majority nor sibling communicators break: one of these ranks took another code path; compare what each called before it",
            m.seq,
            format_comm_id(m.comm),
            said.join("; "),
        ),
    };
    Finding {
        id: finding_id(Kind::Mismatch, job, Some(m.comm), &odd, Some(m.seq)),
        kind: Kind::Mismatch,
        class: Class::CommunicationHang,
        state: State::Open,
        job: job.to_owned(),
        comm: Some(format_comm_id(m.comm)),
        seq: Some(m.seq),
        ranks: odd,
        nodes,
        link: None,
        opened_at: (m.at_s * 1e9) as u64,
        resolved_at: None,
        confidence: if right.is_some() { 0.99 } else { 0.6 },
        summary,
        evidence: json!({
            "shapes": m.shapes.iter().map(|(k, r)| json!({"call": k.describe(), "ranks": r})).collect::<Vec<_>>(),
            "size": m.size,
            "siblings": siblings.iter().map(Shape::describe).collect::<Vec<_>>(),
            "tie": right.is_none(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::op::{Op, dtype};

    fn shape(op: Op) -> Shape {
        Shape::of(op, 1024, 0, dtype::FLOAT, 0)
    }

    fn pair(a: Op, b: Op) -> Mismatch {
        Mismatch {
            comm: 0x42,
            seq: 7,
            size: 2,
            shapes: BTreeMap::from([(shape(a), vec![4]), (shape(b), vec![5])]),
            at_s: 1.0,
        }
    }

    fn ranks(m: &Mismatch, siblings: &[Shape]) -> Vec<i32> {
        finding("j", m, siblings, |_| Some("n0".into())).ranks
    }

    #[test]
    fn the_minority_is_named() {
        let m = Mismatch {
            shapes: BTreeMap::from([
                (shape(Op::Allreduce), vec![0, 1, 3]),
                (shape(Op::Broadcast), vec![2]),
            ]),
            size: 4,
            ..pair(Op::Allreduce, Op::Broadcast)
        };
        assert_eq!(ranks(&m, &[]), [2]);
    }

    #[test]
    fn a_pair_is_decided_by_its_siblings() {
        // Rank 5 called a broadcast where its partner and every other pair called an
        // all-reduce.
        let m = pair(Op::Allreduce, Op::Broadcast);
        let sib = vec![shape(Op::Allreduce); 3];
        assert_eq!(ranks(&m, &sib), [5]);
        let f = finding("j", &m, &sib, |_| None);
        assert!(
            f.summary.contains("rank 5 called broadcast"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("as 3 sibling"), "{}", f.summary);
        // And the other way round.
        let m = pair(Op::Broadcast, Op::Allreduce);
        assert_eq!(ranks(&m, &sib), [4]);
    }

    #[test]
    fn a_pair_without_siblings_is_a_tie_naming_both() {
        let m = pair(Op::Allreduce, Op::Broadcast);
        let f = finding("j", &m, &[], |_| None);
        assert_eq!(f.ranks, [4, 5]);
        assert!(f.summary.contains("a tie"), "{}", f.summary);
        assert_eq!(f.evidence["tie"], true);
        // Siblings that disagree among themselves break nothing.
        let sib = [shape(Op::Allreduce), shape(Op::Broadcast)];
        assert_eq!(ranks(&m, &sib), [4, 5]);
    }

    #[test]
    fn calls_seen_in_flight_are_matched_by_op_and_size() {
        let bare = |op| Shape {
            root: None,
            dtype: None,
            ..shape(op)
        };
        let m = Mismatch {
            shapes: BTreeMap::from([
                (bare(Op::Allreduce), vec![4]),
                (bare(Op::Broadcast), vec![5]),
            ]),
            ..pair(Op::Allreduce, Op::Broadcast)
        };
        assert_eq!(
            ranks(&m, &[shape(Op::Allreduce), shape(Op::Allreduce)]),
            [5]
        );
    }

    #[test]
    fn siblings_vote_on_what_both_records_say() {
        // The pair's shapes come compared without the reduction (a broadcast has none); the
        // siblings' all-reduces carry theirs: they still vote for the all-reduce.
        use commscope_wire::op::red_op;
        let m = pair(Op::Allreduce, Op::Broadcast);
        let sib = vec![shape(Op::Allreduce).reducing(red_op::SUM); 3];
        assert_eq!(ranks(&m, &sib), [5]);
        // A sibling that reduced otherwise does not vote for it.
        let sib = vec![shape(Op::Allreduce).reducing(red_op::SUM)];
        let m = Mismatch {
            shapes: BTreeMap::from([
                (shape(Op::Allreduce).reducing(red_op::MAX), vec![4]),
                (shape(Op::Broadcast), vec![5]),
            ]),
            ..pair(Op::Allreduce, Op::Broadcast)
        };
        assert_eq!(ranks(&m, &sib), [4, 5]);
    }

    #[test]
    fn root_size_and_datatype_count_as_well() {
        for (a, b) in [
            (
                Shape::of(Op::Broadcast, 64, 0, dtype::FLOAT, 0),
                Shape::of(Op::Broadcast, 64, 1, dtype::FLOAT, 0),
            ),
            (
                Shape::of(Op::Allreduce, 64, -1, dtype::FLOAT, 0),
                Shape::of(Op::Allreduce, 128, -1, dtype::FLOAT, 0),
            ),
            (
                Shape::of(Op::Allreduce, 64, -1, dtype::FLOAT, 0),
                Shape::of(Op::Allreduce, 64, -1, dtype::INT32, 0),
            ),
        ] {
            let m = Mismatch {
                shapes: BTreeMap::from([(a, vec![4]), (b, vec![5])]),
                ..pair(Op::Allreduce, Op::Broadcast)
            };
            assert_eq!(ranks(&m, &[a, a]), [5], "{a:?} vs {b:?}");
        }
    }
}
