//! Named cases for the liveness detectors, over hand-built job views.

use commscope_wire::op::{Op, dtype};

use super::{Liveness, liveness};
use crate::finding::{Class, Finding, Kind};
use crate::stream::Shape;
use crate::view::{CommView, Ending, InFlight, JobView, ProcessState, RankView, Sender};

const S: u64 = 1_000_000_000;
const WORLD: u64 = 0x100;
const NOW: u64 = 1_000 * S;

/// A job of `n` ranks, 4 per node, every one done with `done` world collectives, heard from now.
fn job(n: i32, done: u64, live: bool) -> JobView {
    let mut v = JobView {
        job: "j".into(),
        live,
        now_ns: NOW,
        ..Default::default()
    };
    for r in 0..n {
        v.ranks.insert(
            r,
            RankView {
                rank: r,
                node: format!("n{}", r / 4),
                pid: 100 + r as u32,
                last_heard_ns: NOW,
                process: live.then(|| ProcessState {
                    state: "S".into(),
                    wchan: String::new(),
                    cpu_advancing: true,
                }),
                ..Default::default()
            },
        );
    }
    comm(&mut v, WORLD, &(0..n).collect::<Vec<_>>(), done);
    v
}

fn rank(v: &mut JobView, r: i32) -> &mut RankView {
    v.ranks.get_mut(&r).expect("a rank of the job")
}

fn comm(v: &mut JobView, id: u64, members: &[i32], done: u64) {
    v.comms.insert(
        id,
        CommView {
            name: String::new(),
            members: members
                .iter()
                .enumerate()
                .map(|(i, r)| (i as i32, *r))
                .collect(),
            progress: members.iter().map(|r| (*r, done)).collect(),
            longest_ns: S / 100,
        },
    );
}

/// Rank `r` is inside collective `seq` of `comm` since `age` before now.
fn inside(v: &mut JobView, r: i32, comm: u64, seq: u64, age: u64) {
    rank(v, r).in_flight.push(InFlight {
        comm,
        seq,
        op: Op::Allreduce,
        bytes: 1024,
        peer: None,
        tag: -1,
        entered_ns: NOW - age,
        age_ns: age,
        stream: false,
        issued_only: false,
        posted: false,
        shape: Shape::of(Op::Allreduce, 1024, -1, dtype::NONE, 0),
    });
}

fn recv(v: &mut JobView, r: i32, from: i32, age: u64) {
    p2p_in_flight(v, r, 1, 8, &[(Op::Recv, from, 999, age, false)]);
}

fn run(v: &JobView) -> Vec<Finding> {
    let mut none = vec![];
    let mut f = liveness(v, &Liveness::default(), &mut none);
    f.sort_by(|a, b| (a.kind, &a.ranks).cmp(&(b.kind, &b.ranks)));
    f
}

fn kinds(f: &[Finding]) -> Vec<(Kind, Vec<i32>)> {
    f.iter().map(|f| (f.kind, f.ranks.clone())).collect()
}

#[test]
fn healthy_job_in_short_collectives_has_no_finding() {
    let mut v = job(8, 10, true);
    for r in 0..8 {
        inside(&mut v, r, WORLD, 10, S / 10);
    }
    assert!(run(&v).is_empty());
}

#[test]
fn a_rank_that_never_entered_is_the_hang() {
    let mut v = job(8, 10, true);
    for r in (0..8).filter(|r| *r != 3) {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![3])], "{f:#?}");
    assert_eq!(f[0].class, Class::NonCommunicationHang);
    assert_eq!(f[0].seq, Some(10));
    assert_eq!(
        f[0].evidence["victims"],
        serde_json::json!([0, 1, 2, 4, 5, 6, 7])
    );
}

#[test]
fn an_unmatched_receive_is_named_not_the_peer_it_waits_for() {
    // Rank 1 waits for a message rank 2 never sends; rank 2 and the others wait in the next
    // all-reduce for rank 1.
    let mut v = job(8, 10, true);
    recv(&mut v, 1, 2, 20 * S);
    for r in (0..8).filter(|r| *r != 1) {
        inside(&mut v, r, WORLD, 10, 19 * S);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![1])], "{f:#?}");
    assert_eq!(f[0].class, Class::CommunicationHang);
}

#[test]
fn two_ranks_missing_from_one_instance_are_one_hang() {
    let mut v = job(8, 10, true);
    comm(&mut v, 0x200, &[0, 1, 2, 3], 5);
    for r in [0, 1, 2, 4, 5, 7] {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    // A sub-communicator waits for one of them only.
    inside(&mut v, 0, 0x200, 5, 21 * S);
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![3, 6])], "{f:#?}");
}

#[test]
fn independent_hangs_are_one_finding_each() {
    let mut v = job(8, 10, true);
    comm(&mut v, 0x200, &[0, 1, 2, 3], 5);
    comm(&mut v, 0x300, &[4, 5, 6, 7], 5);
    for r in [0, 1, 2] {
        inside(&mut v, r, 0x200, 5, 20 * S);
    }
    for r in [4, 5, 7] {
        inside(&mut v, r, 0x300, 5, 20 * S);
    }
    let f = run(&v);
    assert_eq!(
        kinds(&f),
        [(Kind::Hang, vec![3]), (Kind::Hang, vec![6])],
        "{f:#?}"
    );
}

#[test]
fn a_stopped_process_inside_the_collective_is_named_alone() {
    let mut v = job(2, 10, true);
    inside(&mut v, 0, WORLD, 10, 20 * S);
    inside(&mut v, 1, WORLD, 10, 20 * S);
    let r1 = rank(&mut v, 1);
    r1.process.as_mut().expect("live").state = "T".into();
    r1.last_heard_ns = NOW - 19 * S;
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![1])], "{f:#?}");
    assert!(f[0].summary.contains("is stopped"), "{}", f[0].summary);
    assert_eq!(f[0].evidence["victims"], serde_json::json!([0]));
}

#[test]
fn a_stopped_process_is_named_by_the_call_it_stopped_in_whoever_waits_on_it() {
    // Rank 1 stopped inside its pair's all-reduce #5; its partner waits there, the others in
    // the world all-reduce #10. Live or from a trace, early or late: the pair's instance.
    const PAIR: u64 = 0x200;
    // (live, how long the others have waited, the job was then killed as a whole)
    for (live, others_age, killed) in [
        (true, S, false),
        (true, 20 * S, false),
        (false, 20 * S, false),
        (false, 20 * S, true),
    ] {
        let mut v = job(4, 10, live);
        if killed {
            ended_at(&mut v, &[1000.0, 1000.0, 1000.0, 1000.0], 9);
        }
        comm(&mut v, PAIR, &[0, 1], 5);
        inside(&mut v, 1, PAIR, 5, 20 * S);
        inside(&mut v, 0, PAIR, 5, 19 * S);
        for r in [2, 3] {
            inside(&mut v, r, WORLD, 10, others_age);
        }
        let r1 = rank(&mut v, 1);
        if let Some(p) = r1.process.as_mut() {
            p.state = "T".into();
        }
        r1.last_heard_ns = NOW - 19 * S;
        let f = run(&v);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].ranks, vec![1], "{f:#?}");
        // From a trace, stopped heartbeats may read as a death.
        assert!(
            f[0].kind == Kind::Hang || (!live && f[0].kind == Kind::DeadRank),
            "{f:#?}"
        );
        if f[0].kind == Kind::DeadRank {
            // A death names what the others were blocked in.
            continue;
        }
        assert_eq!(
            (f[0].comm.as_deref(), f[0].seq),
            (Some("0x200"), Some(5)),
            "live {live}, others waiting {} s, killed {killed}: {f:#?}",
            others_age / S
        );
    }
}

#[test]
fn everyone_inside_and_alive_is_a_stall_with_no_rank() {
    let mut v = job(8, 10, true);
    for r in 0..8 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![])], "{f:#?}");
    assert_eq!(f[0].class, Class::CommunicationHang);
    assert_eq!(f[0].comm.as_deref(), Some("0x100"));
    assert_eq!(f[0].seq, Some(10));
}

#[test]
fn a_transport_that_stops_mid_step_is_one_stall_over_every_communicator_it_stops() {
    // Eight ranks on one node: each step a world all-reduce, then one on each half (even and
    // odd ranks). The transport stopped during step 10: ranks 0, 2, 6 are still in world #10;
    // 1 and 3 got through world #10 and odd #10 and wait in world #11; 4 waits in even #10
    // for 0, 2, 6; 5 and 7 are in odd #10, which 1 and 3 completed.
    const EVEN: u64 = 0x200;
    const ODD: u64 = 0x300;
    let mut v = job(8, 10, true);
    for r in 0..8 {
        rank(&mut v, r).node = "n0".into();
    }
    comm(&mut v, EVEN, &[0, 2, 4, 6], 10);
    comm(&mut v, ODD, &[1, 3, 5, 7], 10);
    for r in [1, 3, 4, 5, 7] {
        v.comms
            .get_mut(&WORLD)
            .expect("world")
            .progress
            .insert(r, 11);
    }
    for r in [1, 3] {
        v.comms
            .get_mut(&ODD)
            .expect("odd half")
            .progress
            .insert(r, 11);
    }
    for r in [0, 2, 6] {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    for r in [1, 3] {
        inside(&mut v, r, WORLD, 11, 19 * S);
    }
    inside(&mut v, 4, EVEN, 10, 19 * S);
    for r in [5, 7] {
        inside(&mut v, r, ODD, 10, 19 * S);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![])], "{f:#?}");
    assert_eq!(f[0].class, Class::CommunicationHang);
    // Named by the instance that stopped first.
    assert_eq!((f[0].comm.as_deref(), f[0].seq), (Some("0x100"), Some(10)));
    let s = &f[0].summary;
    assert!(s.contains("2 collectives make no progress"), "{s}");
    assert!(s.contains("ranks 0, 2 and 6 are still inside it"), "{s}");
    assert!(s.contains("ranks 5 and 7 are still inside it"), "{s}");
    assert!(s.contains("3 other ranks wait behind it"), "{s}");
    assert!(!s.contains("none has completed"), "{s}");
    assert_eq!(f[0].evidence["victims"], serde_json::json!([1, 3, 4]));
}

#[test]
fn a_stall_over_a_dead_link_names_that_link() {
    // Ranks 0-3 on n0, 4-7 on n1, all inside world #10; TCP to and from n1 retransmits with
    // nothing acknowledged. Dead links elsewhere (n5) are not this stall's.
    let mut v = job(8, 10, true);
    for r in 0..8 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    let dead = |src: &str, dst: &str, retransmits| crate::view::DeadLink {
        src: src.into(),
        dst: dst.into(),
        transport: "tcp",
        dead_s: 19.0,
        retransmits,
        ranks: vec![0],
        src_nic: None,
    };
    let plain = run(&v);
    assert_eq!(kinds(&plain), [(Kind::Hang, vec![])], "{plain:#?}");
    assert_eq!(plain[0].link, None);
    v.dead_links = vec![
        dead("n0", "n1", 7),
        dead("n1", "n0", 5),
        dead("n5", "n6", 9),
    ];
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![])], "{f:#?}");
    assert_eq!(f[0].class, Class::CommunicationHang);
    assert_eq!(
        f[0].id, plain[0].id,
        "the link is the stall's evidence, not a new finding"
    );
    let l = f[0].link.as_ref().expect("the dead link");
    assert_eq!((l.src.as_str(), l.dst.as_str()), ("n0", "n1"));
    let s = &f[0].summary;
    assert!(
        s.contains("TCP from n0 to n1 has had nothing acknowledged for 19 s"),
        "{s}"
    );
    assert!(s.contains("between n0 and n1 is dead, not a rank"), "{s}");
    assert_eq!(
        f[0].evidence["transport"]["dead_links"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn a_stall_keeps_its_id_whichever_instance_was_entered_first() {
    // Two halves stalled in their all-reduce #17 at the same moment: which half's entry is
    // earliest is noise that changes from tick to tick, and must not change the finding.
    const EVEN: u64 = 0x200;
    const ODD: u64 = 0x300;
    let stalled = |even_first: bool| {
        let mut v = job(8, 17, true);
        v.comms.clear();
        for r in 0..8 {
            rank(&mut v, r).node = "n0".into();
        }
        comm(&mut v, EVEN, &[0, 2, 4, 6], 17);
        comm(&mut v, ODD, &[1, 3, 5, 7], 17);
        for r in 0..8 {
            let (c, early) = if r % 2 == 0 {
                (EVEN, even_first)
            } else {
                (ODD, !even_first)
            };
            inside(&mut v, r, c, 17, if early { 20 * S } else { 20 * S - 1 });
        }
        run(&v)
    };
    let (a, b) = (stalled(true), stalled(false));
    assert_eq!(kinds(&a), [(Kind::Hang, vec![])], "{a:#?}");
    assert_eq!(kinds(&b), [(Kind::Hang, vec![])], "{b:#?}");
    assert_eq!(a[0].id, b[0].id);
    assert_eq!((a[0].comm.as_deref(), a[0].seq), (Some("0x200"), Some(17)));
    assert_eq!(a[0].summary, b[0].summary);
}

#[test]
fn a_gpu_that_stopped_finishing_work_its_peers_completed_is_the_culprit_not_a_stall() {
    // NCCL work (GPU streams): rank 0 still holds all-reduce #10, which ranks 1-3 completed,
    // and never queued #11, which they wait in. Rank 0 is the culprit; #10 is no stall.
    let mut v = job(4, 10, true);
    for r in 1..4 {
        v.comms
            .get_mut(&WORLD)
            .expect("world")
            .progress
            .insert(r, 11);
        inside(&mut v, r, WORLD, 11, 20 * S);
    }
    inside(&mut v, 0, WORLD, 10, 21 * S);
    for r in 0..4 {
        for c in &mut rank(&mut v, r).in_flight {
            c.stream = true;
        }
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![0])], "{f:#?}");
    assert_eq!((f[0].comm.as_deref(), f[0].seq), (Some("0x100"), Some(11)));
    assert!(
        f[0].summary.contains("GPU had not finished allreduce #10"),
        "{}",
        f[0].summary
    );
}

#[test]
fn stalls_on_nodes_that_share_nothing_are_two_findings() {
    // Two independent jobs' worth of communicators in one job: ranks 0-3 on n0, 4-7 on n1,
    // each group stalled in its own communicator.
    const A: u64 = 0x200;
    const B: u64 = 0x300;
    let mut v = job(8, 10, true);
    v.comms.clear();
    comm(&mut v, A, &[0, 1, 2, 3], 10);
    comm(&mut v, B, &[4, 5, 6, 7], 10);
    for r in 0..4 {
        inside(&mut v, r, A, 10, 20 * S);
    }
    for r in 4..8 {
        inside(&mut v, r, B, 10, 20 * S);
    }
    let f = run(&v);
    assert_eq!(
        kinds(&f),
        [(Kind::Hang, vec![]), (Kind::Hang, vec![])],
        "{f:#?}"
    );
    let named: Vec<_> = f.iter().map(|f| (f.comm.clone(), f.seq)).collect();
    assert!(named.contains(&(Some("0x200".into()), Some(10))), "{f:#?}");
    assert!(named.contains(&(Some("0x300".into()), Some(10))), "{f:#?}");
    assert!(
        f.iter()
            .all(|f| f.summary.contains("none has completed it")),
        "{f:#?}"
    );
}

#[test]
fn a_silent_rank_in_a_trace_is_the_dead_rank_not_its_partners() {
    // Frozen inside the collective: from a trace its heartbeats stop while its peers' go on.
    let mut v = job(4, 10, false);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    rank(&mut v, 2).last_heard_ns = NOW - 20 * S;
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2])], "{f:#?}");
    assert_eq!(f[0].evidence["victims"], serde_json::json!([0, 1, 3]));
}

#[test]
fn teardown_names_the_rank_the_others_waited_for() {
    // Rank 5 was killed; the launcher killed the rest 1 s later, all inside the next
    // all-reduce that rank 5 never entered.
    let mut v = job(8, 10, true);
    for r in 0..8 {
        let at = if r == 5 {
            NOW - S
        } else {
            NOW - S / 100 * r as u64
        };
        rank(&mut v, r).ended = Some(Ending {
            at_ns: at,
            observed: true,
            status: None,
            signal: Some(if r == 5 { 9 } else { 15 }),
            ..Default::default()
        });
        if r != 5 {
            inside(&mut v, r, WORLD, 10, S / 2);
        }
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![5])], "{f:#?}");
    assert!(f[0].summary.contains("signal 9"), "{}", f[0].summary);
    // The same from a trace with no exit records: only heartbeats and record order.
    let mut t = v.clone();
    t.live = false;
    for r in t.ranks.values_mut() {
        r.last_heard_ns = r.ended.take().expect("ended").at_ns;
    }
    let f = run(&t);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![5])], "{f:#?}");
}

#[test]
fn a_job_taken_down_as_a_whole_singles_nobody_out() {
    let mut v = job(4, 10, true);
    for r in 0..4 {
        rank(&mut v, r).ended = Some(Ending {
            at_ns: NOW - S + r as u64 * 1_000_000,
            observed: true,
            status: None,
            signal: Some(15),
            ..Default::default()
        });
    }
    assert!(run(&v).is_empty());
}

#[test]
fn a_dead_rank_and_an_unrelated_hang_are_two_findings() {
    let mut v = job(8, 10, true);
    comm(&mut v, 0x200, &[0, 1, 2, 3], 5);
    comm(&mut v, 0x300, &[4, 5, 6, 7], 5);
    // Rank 1 died; ranks 0, 2, 3 wait for it. Rank 6 never entered; 4, 5, 7 wait for it.
    rank(&mut v, 1).ended = Some(Ending {
        at_ns: NOW - 30 * S,
        observed: true,
        status: None,
        signal: Some(9),
        ..Default::default()
    });
    for r in [0, 2, 3] {
        inside(&mut v, r, 0x200, 5, 25 * S);
    }
    for r in [4, 5, 7] {
        inside(&mut v, r, 0x300, 5, 20 * S);
    }
    let f = run(&v);
    assert_eq!(
        kinds(&f),
        [(Kind::Hang, vec![6]), (Kind::DeadRank, vec![1])],
        "{f:#?}"
    );
    assert_eq!(f[1].evidence["victims"], serde_json::json!([0, 2, 3]));
}

#[test]
fn a_job_hung_before_it_was_killed_is_a_hang() {
    let mut v = job(4, 10, false);
    for r in [0, 1, 3] {
        inside(&mut v, r, WORLD, 10, 60 * S);
    }
    // Everyone was killed together a minute into the hang.
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![2])], "{f:#?}");
}

#[test]
fn live_a_hang_ends_when_its_processes_end() {
    let mut v = job(4, 10, true);
    for r in [0, 1, 3] {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    assert_eq!(kinds(&run(&v)), [(Kind::Hang, vec![2])]);
    // The job is killed as a whole (pkill): nobody waits any more, and nobody died first.
    for r in 0..4 {
        rank(&mut v, r).ended = Some(Ending {
            at_ns: NOW - S / 2 + r as u64,
            observed: true,
            status: None,
            signal: Some(9),
            ..Default::default()
        });
    }
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_trace_of_a_frozen_rank_killed_with_the_rest_names_it() {
    // Rank 1 stopped inside the all-reduce with its partners; 30 s later the whole job was
    // killed at once (exits seen by the agent): its silence before the kill tells.
    let mut v = job(4, 10, false);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 31 * S);
        rank(&mut v, r).ended = Some(Ending {
            at_ns: NOW,
            observed: true,
            status: None,
            signal: Some(9),
            ..Default::default()
        });
    }
    rank(&mut v, 1).last_heard_ns = NOW - 30 * S;
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![1])], "{f:#?}");
    assert_eq!(f[0].evidence["victims"], serde_json::json!([0, 2, 3]));
}

/// Every rank of `v` ended (seen by its agent) at these times after `NOW - S`, in ms.
fn ended_at(v: &mut JobView, ms: &[f64], signal: i32) {
    for (r, t) in ms.iter().enumerate() {
        rank(v, r as i32).ended = Some(Ending {
            at_ns: NOW - S + (t * 1e6) as u64,
            observed: true,
            status: None,
            signal: Some(signal),
            ..Default::default()
        });
    }
}

#[test]
fn processes_seen_to_exit_0_with_nothing_to_finalize_end_normally() {
    // NCCL ranks traced without the preload (nothing to finalize): all four exit 0 within a
    // millisecond and a half, two of them first. A normal end, in a trace as live.
    for live in [true, false] {
        let mut v = job(4, 10, live);
        for (r, t) in [(0, 1.01), (1, 0.0), (2, 1.17), (3, 0.12)] {
            rank(&mut v, r).ended = Some(Ending {
                at_ns: NOW - S + (t * 1e6) as u64,
                observed: true,
                status: Some(0),
                ..Default::default()
            });
        }
        let f = run(&v);
        assert!(f.is_empty(), "live {live}: {f:#?}");
        // Under the preload, a rank that recorded exiting 0 without finalizing, the others
        // taken down after it (SIGTERM), is the dead rank.
        for r in [0, 2, 3] {
            if let Some(e) = rank(&mut v, r).ended.as_mut() {
                (e.status, e.signal) = (None, Some(15));
            }
        }
        if let Some(e) = rank(&mut v, 1).ended.as_mut() {
            e.recorded = true;
        }
        assert_eq!(kinds(&run(&v)), [(Kind::DeadRank, vec![1])], "live {live}");
    }
}

#[test]
fn a_launcher_teardown_in_milliseconds_names_the_first_death() {
    // Hydra: rank 3 killed; 8 ms later the launcher kills the rest within microseconds.
    let mut v = job(8, 10, true);
    ended_at(
        &mut v,
        &[8.0, 8.01, 8.02, 0.0, 8.005, 8.012, 8.003, 8.015],
        9,
    );
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![3])], "{f:#?}");
    assert!(f[0].summary.contains("within 8 ms"), "{}", f[0].summary);
}

#[test]
fn a_job_killed_process_by_process_singles_nobody_out() {
    // pkill: one kill after another, the endings spread evenly over 8 ms.
    let mut v = job(8, 10, true);
    ended_at(&mut v, &[0.0, 6.1, 1.2, 2.4, 3.5, 4.8, 7.0, 8.2], 9);
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_teardown_whose_kills_spread_over_milliseconds_still_names_the_first() {
    // Measured under Hydra: rank 3, then 6.9 ms later the rest, spread over 13 ms.
    let mut v = job(8, 10, true);
    ended_at(
        &mut v,
        &[7.26, 6.97, 16.52, 0.0, 15.34, 6.91, 19.99, 9.88],
        9,
    );
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![3])], "{f:#?}");
}

#[test]
fn a_rank_the_others_waited_for_is_first_even_when_the_kernel_orders_it_a_hair_late() {
    // Measured under Hydra: the killed rank's exit event came 23 µs after one the launcher
    // killed in reaction, while every other rank waited 0.3 s in the all-reduce it never
    // entered. Rank 1 ended 5.5 ms after the rest: that alone must not make the rest "first".
    let mut v = job(8, 10, true);
    ended_at(
        &mut v,
        &[0.14, 5.6, 0.076, 0.023, 0.12, 0.047, 0.0, 0.033],
        9,
    );
    for r in (0..8).filter(|r| *r != 3) {
        inside(&mut v, r, WORLD, 10, 3 * S / 10);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![3])], "{f:#?}");
    // Without the waits, nothing tells: no finding rather than a wrong one.
    for r in 0..8 {
        rank(&mut v, r).in_flight.clear();
    }
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

/// A mismatch finding naming `rank` at instance `seq` of `comm`, found at `found`.
fn mismatch(comm: u64, seq: u64, rank: i32, found: u64) -> Finding {
    Finding {
        id: "m".into(),
        kind: Kind::Mismatch,
        class: Class::CommunicationHang,
        state: crate::finding::State::Open,
        job: "j".into(),
        comm: Some(commscope_wire::hash::format_comm_id(comm)),
        seq: Some(seq),
        ranks: vec![rank],
        nodes: vec![],
        link: None,
        opened_at: found,
        resolved_at: None,
        confidence: 0.99,
        summary: String::new(),
        evidence: serde_json::json!({}),
    }
}

#[test]
fn a_mismatched_job_killed_afterwards_is_the_mismatch_alone() {
    // Rank 4 called another collective; a second later the operator killed the job process
    // by process, rank 0 first and 12 ms before the rest.
    let mut v = job(8, 10, true);
    ended_at(
        &mut v,
        &[0.0, 12.0, 12.01, 12.02, 12.03, 12.04, 12.05, 12.06],
        9,
    );
    for r in 0..8 {
        inside(&mut v, r, WORLD, 10, S);
    }
    let mut m = vec![mismatch(WORLD, 10, 4, NOW - 2 * S)];
    let f = liveness(&v, &Liveness::default(), &mut m);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_rank_silent_inside_a_mismatched_instance_is_not_a_death() {
    // From the shim's own files: rank 6 called broadcast on its pair where rank 7 called
    // all-reduce; 6 went on into the world all-reduce, 7 sat in the pair's. The whole job was
    // killed at once seconds later, but rank 7's writer thread (starved of CPU by spinning
    // ranks) had last written 3 s before the rest. The mismatch, found only from the calls
    // in flight at the trace's end, is the one finding.
    let pair = 0x200;
    let mut v = job(8, 59, false);
    comm(&mut v, pair, &[6, 7], 59);
    for r in 0..7 {
        inside(&mut v, r, WORLD, 60, 3 * S);
        rank(&mut v, r).last_heard_ns = NOW - S / 10 * r as u64;
    }
    inside(&mut v, 7, pair, 60, 3 * S + S / 8);
    let r7 = rank(&mut v, 7);
    r7.last_heard_ns = NOW - 3 * S;
    r7.in_flight[0].age_ns = S / 8;
    let mut m = vec![mismatch(pair, 60, 6, NOW)];
    let f = liveness(&v, &Liveness::default(), &mut m);
    assert!(f.is_empty(), "{f:#?}");
}

/// Node n1 (ranks 4–7) out of contact since 15 s ago: its last known state is stale.
fn lose_n1(v: &mut JobView) {
    v.lost.insert(
        "n1".into(),
        crate::view::LostContact {
            since_ns: NOW - 15 * S,
            why: "its stream ended".into(),
            awaited: false,
        },
    );
    for r in 4..8 {
        let p = rank(v, r);
        p.last_heard_ns = NOW - 15 * S;
        // What its agent last said: running, CPU standing still (it is gone from sight).
        if let Some(ps) = p.process.as_mut() {
            ps.cpu_advancing = false;
        }
    }
}

#[test]
fn a_node_not_back_since_the_collector_started_is_unknown_not_lost() {
    // The same wait, but n1's agent has not reconnected since the collector restarted: nothing
    // is known of n1 yet, and nothing is said.
    let mut v = job(8, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    lose_n1(&mut v);
    v.lost.get_mut("n1").expect("n1").awaited = true;
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn ranks_on_a_node_behind_are_neither_blamed_nor_frozen() {
    // n1's stream is open but its data lags the others: its ranks' silence is the lag. Rank 5
    // looks silent and stopped, ranks 0–3 wait for n1's ranks: no finding.
    let mut v = job(8, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    for r in 4..8 {
        rank(&mut v, r).last_heard_ns = NOW - 15 * S;
    }
    if let Some(p) = rank(&mut v, 5).process.as_mut() {
        p.cpu_advancing = false;
    }
    v.behind.insert("n1".into());
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
    // Caught up, the same state is a finding (what the lag hid).
    v.behind.clear();
    assert!(!run(&v).is_empty());
    // The same when only those ranks' own data lags (their batches still on their way).
    for r in 4..8 {
        rank(&mut v, r).behind = true;
    }
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn ranks_waiting_for_a_node_out_of_contact_are_one_communication_hang_naming_it() {
    // Ranks 0–3 (n0) wait in the all-reduce; ranks 4–7 (n1) had not been seen entering it when
    // contact with n1 was lost.
    let mut v = job(8, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    lose_n1(&mut v);
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![])], "{f:#?}");
    assert_eq!(f[0].class, Class::CommunicationHang);
    let link = f[0].link.as_ref().expect("link");
    assert_eq!((link.src.as_str(), link.dst.as_str()), ("n1", "n0"));
    assert_eq!(f[0].nodes, ["n1"]);
    assert_eq!(
        f[0].evidence["out_of_sight"],
        serde_json::json!([4, 5, 6, 7])
    );
    assert_eq!(f[0].evidence["waiting"], serde_json::json!([0, 1, 2, 3]));
    assert!(
        f[0].summary
            .starts_with("Contact with node n1 was lost 15 s ago"),
        "{}",
        f[0].summary
    );

    // The same when n1's ranks had entered too: not a stall "while every process is alive".
    for r in 4..8 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![])], "{f:#?}");
    assert_eq!(f[0].link.as_ref().map(|l| l.src.as_str()), Some("n1"));
    assert!(
        f[0].summary.starts_with("Contact with node n1"),
        "{}",
        f[0].summary
    );
}

#[test]
fn without_lost_contact_the_same_silence_is_a_frozen_rank() {
    // The control: the same stale state with n1's agent still connected blames its ranks.
    let mut v = job(8, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    lose_n1(&mut v);
    v.lost.clear();
    let f = run(&v);
    // (Each frozen process is a finding of its own.)
    let want: Vec<(Kind, Vec<i32>)> = (4..8).map(|r| (Kind::Hang, vec![r])).collect();
    assert_eq!(kinds(&f), want, "{f:#?}");
    assert!(f.iter().all(|x| x.class == Class::NonCommunicationHang));
}

#[test]
fn a_node_out_of_contact_that_nobody_waits_for_is_no_finding() {
    let mut v = job(8, 10, true);
    lose_n1(&mut v);
    assert!(run(&v).is_empty());
}

#[test]
fn ranks_whose_agent_went_silent_are_held_until_contact_is_known() {
    // n1's agent has not reported for 3 s (its stream not yet known dead): its ranks are
    // neither frozen nor culprits, and nothing waits on a verdict about them.
    let mut v = job(8, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, 20 * S);
    }
    lose_n1(&mut v);
    v.lost.clear();
    for r in 4..8 {
        rank(&mut v, r).observed_age_ns = Some(3 * S);
    }
    assert!(run(&v).is_empty(), "{:#?}", run(&v));
    // Reports fresh again (the agent is back and sees them stuck): the frozen ranks are named.
    for r in 4..8 {
        rank(&mut v, r).observed_age_ns = Some(S / 2);
    }
    assert_eq!(run(&v).len(), 4);
}

/// Rank `r` (recorded without the preload) issued collective `seq` of the world `age` ago and
/// nothing after it: its progress counts the issued call.
fn issued(v: &mut JobView, r: i32, seq: u64, age: u64) {
    rank(v, r).in_flight.push(InFlight {
        comm: WORLD,
        seq,
        op: Op::Allreduce,
        bytes: 1024,
        peer: None,
        tag: -1,
        entered_ns: NOW - age,
        age_ns: age,
        stream: true,
        issued_only: true,
        posted: false,
        shape: Shape::of(Op::Allreduce, 1024, -1, dtype::NONE, 0),
    });
    v.comms
        .get_mut(&WORLD)
        .expect("world")
        .progress
        .insert(r, seq + 1);
}

#[test]
fn a_rank_recorded_from_the_host_that_never_issued_what_the_others_did_is_the_hang() {
    let mut v = job(4, 10, true);
    for r in [0, 1, 3] {
        issued(&mut v, r, 10, 20 * S);
    }
    issued(&mut v, 2, 9, 21 * S);
    rank(&mut v, 2).process = Some(ProcessState {
        state: "S".into(),
        wchan: "hrtimer_nanosleep".into(),
        cpu_advancing: false,
    });
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![2])], "{f:#?}");
    // What it only issued does not put it inside the library.
    assert_eq!(f[0].class, Class::NonCommunicationHang);
    assert_eq!(f[0].seq, Some(10));
    assert_eq!(f[0].evidence["victims"], serde_json::json!([0, 1, 3]));
    assert!(
        f[0].summary
            .contains("rank 2 on n0 has not entered allreduce #10")
            && f[0]
                .summary
                .contains("issued it and have issued nothing on that communicator since")
            && f[0].summary.contains("seen from the host")
            && !f[0].summary.contains("GPU had not finished"),
        "{}",
        f[0].summary
    );
}

#[test]
fn ranks_recorded_from_the_host_that_all_issued_the_same_call_are_no_finding() {
    // A long quiet phase (evaluation, a checkpoint) and a GPU stall look the same from the
    // host: nothing is said.
    let mut v = job(4, 10, true);
    for r in 0..4 {
        issued(&mut v, r, 10, 300 * S);
    }
    assert!(run(&v).is_empty(), "{:#?}", run(&v));
    // The same while their records lag their in-flight state (progress not yet counting the
    // issued call): still nothing, where GPU-timed work would be a stall.
    for r in 0..4 {
        v.comms
            .get_mut(&WORLD)
            .expect("world")
            .progress
            .insert(r, 10);
    }
    assert!(run(&v).is_empty(), "{:#?}", run(&v));
    // One still short of the others, but for less than the hang floor: none either.
    let mut v = job(4, 10, true);
    for r in [0, 1, 3] {
        issued(&mut v, r, 10, S / 2);
    }
    issued(&mut v, 2, 9, S);
    assert!(run(&v).is_empty(), "{:#?}", run(&v));
}

/// Rank 2 posted a send to rank 3 (tag 7), then blocked in a receive from rank 1 with tag 8,
/// which rank 1 never sends: it has moved on into all-reduce #121.
fn blocked_in_a_receive_of_the_wrong_tag(v: &mut JobView) {
    p2p_in_flight(
        v,
        2,
        120,
        2048,
        &[
            (Op::Send, 3, 7, 20 * S + 2, true),
            (Op::Recv, 1, 8, 20 * S + 1, false),
        ],
    );
}

/// Point-to-point calls of rank `r` in flight on the world (after its call `seq`), each
/// (op, peer, tag, age, posted).
fn p2p_in_flight(
    v: &mut JobView,
    r: i32,
    seq: u64,
    bytes: u64,
    calls: &[(Op, i32, i32, u64, bool)],
) {
    for &(op, peer, tag, age, posted) in calls {
        rank(v, r).in_flight.push(InFlight {
            comm: WORLD,
            seq,
            op,
            bytes,
            peer: Some(peer),
            tag,
            entered_ns: NOW - age,
            age_ns: age,
            stream: false,
            issued_only: false,
            posted,
            shape: Shape::of(op, bytes, peer, dtype::NONE, 0),
        });
    }
}

#[test]
fn a_rank_blocked_in_a_receive_its_sender_waits_behind_is_named_with_that_receive() {
    // Ranks 0, 1 and 3 wait in all-reduce #121; rank 2 waits for a tag rank 1 never sends.
    let mut v = job(4, 121, false);
    for r in [0, 1, 3] {
        inside(&mut v, r, WORLD, 121, 20 * S);
    }
    blocked_in_a_receive_of_the_wrong_tag(&mut v);
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![2])], "{f:#?}");
    let s = &f[0].summary;
    // The posted send is not where it blocks.
    assert!(
        s.contains("— it is blocked inside recv from rank 1 (tag 8) on communicator")
            && s.contains("for up to 20.0 s, with send to rank 3 (tag 7) on communicator")
            && s.ends_with(
                "posted and not complete; rank 1 waits for it in turn, so the two wait on each other: check that recv's source and tag against what rank 1 sends"
            ),
        "{s}"
    );
    let inside = &f[0].evidence["culprits"][0]["inside"];
    assert_eq!(inside[1]["op"], "recv", "{inside:#}");
    assert_eq!(
        (inside[1]["peer"].as_i64(), inside[1]["tag"].as_i64()),
        (Some(1), Some(8))
    );
    assert_eq!(
        (&inside[0]["posted"], &inside[1]["posted"]),
        (&serde_json::json!(true), &serde_json::json!(false))
    );
}

#[test]
fn a_rank_in_waitall_is_named_with_the_receive_its_peer_never_sends() {
    // A ring exchange: rank 1 posted a receive from rank 0 with tag 6, which rank 0 never sends,
    // and a send to rank 2, then waits in `MPI_Waitall` (not a call of its own in flight). Ranks
    // 0, 2 and 3 went on into all-reduce #150; rank 2 received rank 1's message, so the send is
    // complete though rank 1 has not seen it. The receive is what to check.
    let mut v = job(4, 150, false);
    for r in [0, 2, 3] {
        inside(&mut v, r, WORLD, 150, 10 * S);
    }
    p2p_in_flight(
        &mut v,
        1,
        149,
        512,
        &[
            (Op::Recv, 0, 6, 10 * S + 2, true),
            (Op::Send, 2, 5, 10 * S + 1, true),
        ],
    );
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![1])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.contains("— it posted recv from rank 0 (tag 6) on communicator")
            && s.contains("and has not seen them complete for up to 10.0 s")
            && s.ends_with(
                "rank 0 waits for it in turn, so the two wait on each other: check that recv's source and tag against what rank 0 sends"
            ),
        "{s}"
    );
}

/// Rank `r`'s records end `early` before the others', in damage: what it did next is unknown.
fn cut_short(v: &mut JobView, r: i32, early: u64) {
    let p = rank(v, r);
    p.data_lost = true;
    p.last_heard_ns = NOW - early;
    p.in_flight.clear();
}

#[test]
fn a_rank_whose_records_end_in_damage_is_not_taken_for_the_culprit_of_a_deadlock() {
    // As above, but rank 0's trace is damaged: its records end 19 s before the others'. Ranks 1
    // and 3 wait for rank 0 too, but whatever rank 0 did, ranks 1 and 2 wait on each other.
    let mut v = job(4, 121, false);
    for r in [0, 1, 3] {
        inside(&mut v, r, WORLD, 121, 20 * S);
    }
    blocked_in_a_receive_of_the_wrong_tag(&mut v);
    cut_short(&mut v, 0, 19 * S);
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![2])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.starts_with("rank 2 on n0 never entered allreduce #121")
            && s.contains("2 other ranks waited behind it")
            && s.contains("so the two wait on each other")
            && s.ends_with(
                "; rank 0's records end 19.0 s earlier, where its trace is damaged, so whether it took part is unknown"
            ),
        "{s}"
    );
}

#[test]
fn a_rank_whose_records_end_in_damage_is_named_as_unknown_when_the_others_wait_only_for_it() {
    // Rank 0's records end in damage; ranks 1 and 3 wait in all-reduce #121 for it (and rank
    // 2), and rank 2 waits in a receive from rank 0: every wait leads to rank 0, and nothing is
    // known of it, so it is named as such — never as a rank seen outside the library.
    let mut v = job(4, 121, false);
    for r in [1, 3] {
        inside(&mut v, r, WORLD, 121, 20 * S);
    }
    recv(&mut v, 2, 0, 19 * S);
    cut_short(&mut v, 0, 19 * S);
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::Hang, vec![0])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.starts_with("rank 0 on n0 has no record of entering allreduce #121")
            && s.contains("3 other ranks waited behind it")
            && s.ends_with(
                "— its records end 19.0 s before the others', where its trace is damaged, so what it did from there on is unknown: look at its logs and at what is left of its trace"
            ),
        "{s}"
    );
    assert!(f[0].confidence < 0.9, "{:?}", f[0].confidence);
    assert_eq!(f[0].evidence["culprits"][0]["records_cut_short"], true);
}

// ----- how a rank ended: its own doing before the launcher's teardown -------------------------

/// Rank `r` ended as `e` says, `ms` milliseconds after `NOW - S`.
fn ends(v: &mut JobView, r: i32, ms: f64, e: Ending) {
    rank(v, r).ended = Some(Ending {
        at_ns: NOW - S + (ms * 1e6) as u64,
        ..e
    });
}

/// An ending the process recorded itself: `exit(status)` without finalizing.
fn exited(status: i32) -> Ending {
    Ending {
        observed: true,
        recorded: true,
        status: Some(status),
        ..Default::default()
    }
}

/// An ending the kernel reported: killed by `sig`.
fn killed(sig: i32) -> Ending {
    Ending {
        observed: true,
        signal: Some(sig),
        ..Default::default()
    }
}

#[test]
fn a_rank_that_exited_by_itself_comes_before_the_ranks_the_launcher_killed() {
    // Rank 4 exited with status 3 in its compute; the others sat in the next all-reduce it never
    // entered until Open MPI's launcher sent them SIGTERM a second later.
    let mut v = job(8, 10, true);
    ends(&mut v, 4, 0.0, exited(3));
    for r in (0..8).filter(|r| *r != 4) {
        inside(&mut v, r, WORLD, 10, S);
        ends(&mut v, r, 1000.0 + f64::from(r), killed(15));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![4])], "{f:#?}");
    let s = &f[0].summary;
    assert!(s.contains("exited with status 3 without finalizing"), "{s}");
    assert!(
        s.contains("7 other ranks were blocked waiting for it"),
        "{s}"
    );
    assert!(s.contains("by signal 15 (SIGTERM)"), "{s}");
    assert!(s.contains("look at rank 4's output"), "{s}");
}

#[test]
fn an_own_end_stands_against_silences_around_it_in_a_trace() {
    // MPICH's Hydra killed the rest with SIGKILL within milliseconds: their files end at their
    // last flush, before rank 6's own record of its segfault. Nobody's wait was recorded.
    let mut v = job(8, 10, false);
    ends(
        &mut v,
        6,
        300.0,
        Ending {
            signal: Some(11),
            ..exited(0)
        },
    );
    rank(&mut v, 6).ended.as_mut().expect("ended").status = None;
    for r in (0..8).filter(|r| *r != 6) {
        rank(&mut v, r).last_heard_ns = NOW - S + 150_000_000 + r as u64 * 10_000_000;
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![6])], "{f:#?}");
    assert!(
        f[0].summary.contains("crashed on signal 11 (SIGSEGV)"),
        "{}",
        f[0].summary
    );
    // Without its own record, the silences tell nothing: no finding rather than a guess.
    rank(&mut v, 6).ended = None;
    rank(&mut v, 6).last_heard_ns = NOW - S + 120_000_000;
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_rank_that_exits_unfinalized_while_the_rest_finish_is_no_finding() {
    // Nobody waited for rank 5 and nobody was taken down after it: the job finished.
    let mut v = job(4, 10, false);
    ends(&mut v, 5 - 2, 0.0, exited(0));
    for r in [0, 1, 2] {
        rank(&mut v, r).finalized = true;
    }
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_kill_clearly_before_an_error_exit_is_the_first_death() {
    // Rank 1 was OOM-killed; 100 ms later the others' MPI calls failed and they exited with
    // status 1 of their own doing, one after another.
    let mut v = job(4, 10, true);
    ends(&mut v, 1, 0.0, killed(9));
    for r in [0, 2, 3] {
        ends(&mut v, r, 100.0 + f64::from(r), exited(1));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![1])], "{f:#?}");
    assert!(f[0].summary.contains("OOM killer"), "{}", f[0].summary);
}

#[test]
fn a_rank_killed_in_the_teardown_is_not_a_root_though_others_waited_for_it() {
    // Hydra: rank 2 was killed; 1 ms later so was rank 5, which the other data-parallel half
    // was waiting for (it had not reached the all-reduce yet). Only rank 2 is the root.
    let even = 0x200;
    let odd = 0x300;
    let mut v = job(8, 10, false);
    comm(&mut v, even, &[0, 2, 4, 6], 40);
    comm(&mut v, odd, &[1, 3, 5, 7], 40);
    ends(&mut v, 2, 0.0, killed(9));
    ends(&mut v, 5, 1.0, killed(9));
    for r in [0, 4, 6] {
        inside(&mut v, r, even, 40, 3 * S / 10);
        ends(&mut v, r, 2.0 + f64::from(r), killed(9));
    }
    for r in [1, 3, 7] {
        inside(&mut v, r, odd, 40, 3 * S / 10);
        ends(&mut v, r, 2.0 + f64::from(r), killed(9));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2])], "{f:#?}");
}

/// Killed by `sig`, sent by `by`.
fn killed_by(sig: i32, by: Sender) -> Ending {
    Ending {
        sent_by: Some(by),
        ..killed(sig)
    }
}

/// The exit times of an 8-rank MPICH job on a loaded 2-core node (measured): rank 2 died
/// first, Hydra's SIGKILLs took the others 0.75 to 12 ms after it, spaced unevenly; nobody had
/// reached a call rank 2 missed yet.
const LOADED_TEARDOWN_MS: [(i32, f64); 7] = [
    (3, 0.748),
    (5, 0.767),
    (4, 4.189),
    (6, 7.595),
    (7, 7.846),
    (1, 9.969),
    (0, 11.993),
];

#[test]
fn the_rank_the_kernel_killed_comes_before_the_ranks_its_launcher_killed_on_a_loaded_node() {
    let mut v = job(8, 10, true);
    ends(&mut v, 2, 0.0, killed(9));
    for (r, ms) in LOADED_TEARDOWN_MS {
        ends(&mut v, r, ms, killed(9));
    }
    // Exit times alone: too close and too uneven to tell a teardown from a job killed one
    // process after another. No finding rather than a guess.
    assert!(run(&v).is_empty(), "{:#?}", run(&v));
    // Who sent each SIGKILL tells it.
    ends(&mut v, 2, 0.0, killed_by(9, Sender::Kernel));
    for (r, ms) in LOADED_TEARDOWN_MS {
        ends(&mut v, r, ms, killed_by(9, Sender::Launcher(4000)));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.contains("was killed by signal 9 (SIGKILL), sent by the kernel (the OOM killer), and the 7 other ranks were taken down after it (within 12 ms, by their launcher's signal 9 (SIGKILL))"),
        "{s}"
    );
    assert!(s.contains("rank 2's memory use"), "{s}");
    assert_eq!(
        f[0].evidence["found_by"],
        "it was killed from outside the job's teardown (not by its launcher), and the others were blocked waiting for it or taken down after it"
    );
}

#[test]
fn a_rank_killed_by_itself_or_by_an_operator_is_named_with_its_sender() {
    let mut v = job(8, 10, true);
    ends(&mut v, 2, 0.0, killed_by(9, Sender::Itself));
    for (r, ms) in LOADED_TEARDOWN_MS {
        ends(&mut v, r, ms, killed_by(9, Sender::Launcher(4000)));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2])], "{f:#?}");
    assert!(
        f[0].summary.contains("(SIGKILL), sent by itself"),
        "{}",
        f[0].summary
    );
    assert!(
        f[0].summary.contains("why it killed itself"),
        "{}",
        f[0].summary
    );
    ends(&mut v, 2, 0.0, killed_by(15, Sender::Other(777)));
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2])], "{f:#?}");
    let s = &f[0].summary;
    assert!(s.contains("signal 15 (SIGTERM), sent by pid 777"), "{s}");
    assert!(s.contains("what process 777 on n0 was"), "{s}");
}

#[test]
fn a_job_killed_whole_by_one_sender_has_no_root() {
    // `pkill -9` (one process killed them all, one after another), and a terminal's Ctrl-C (the
    // kernel sent SIGINT to every rank): the job was taken down as a whole.
    for (sig, by) in [(9, Sender::Other(4242)), (2, Sender::Kernel)] {
        let mut v = job(8, 10, true);
        ends(&mut v, 2, 0.0, killed_by(sig, by));
        for (r, ms) in LOADED_TEARDOWN_MS {
            ends(&mut v, r, ms, killed_by(sig, by));
        }
        let f = run(&v);
        assert!(f.is_empty(), "{by:?}: {f:#?}");
    }
    // Every rank taken down by its launcher, nobody else: no root either.
    let mut v = job(8, 10, true);
    ends(&mut v, 2, 0.0, killed_by(9, Sender::Launcher(4000)));
    for (r, ms) in LOADED_TEARDOWN_MS {
        ends(&mut v, r, ms, killed_by(9, Sender::Launcher(4000)));
    }
    let f = run(&v);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_rank_that_crashed_inside_a_collective_is_named_with_that_call() {
    // Rank 3 segfaulted inside the all-reduce (the others inside it too); a second later the
    // launcher killed the rest. The others' records stop at their last flush.
    let mut v = job(4, 10, true);
    for r in 0..4 {
        inside(&mut v, r, WORLD, 10, S / 2);
    }
    ends(
        &mut v,
        3,
        0.0,
        Ending {
            observed: true,
            recorded: true,
            signal: Some(7),
            ..Default::default()
        },
    );
    for r in 0..3 {
        ends(&mut v, r, 1000.0, killed(15));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![3])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.contains("crashed on signal 7 (SIGBUS) inside allreduce #10"),
        "{s}"
    );
}

#[test]
fn two_ranks_that_end_together_are_one_finding_said_in_the_plural() {
    // Two ranks of one node were OOM-killed together; the others waited for both.
    let mut v = job(8, 10, true);
    ends(&mut v, 2, 0.0, killed(9));
    ends(&mut v, 3, 0.1, killed(9));
    for r in [0, 1, 4, 5, 6, 7] {
        inside(&mut v, r, WORLD, 10, S);
        ends(&mut v, r, 1000.0, killed(15));
    }
    let f = run(&v);
    assert_eq!(kinds(&f), [(Kind::DeadRank, vec![2, 3])], "{f:#?}");
    let s = &f[0].summary;
    assert!(
        s.contains("ranks 2 and 3 on n0 were killed by signal 9"),
        "{s}"
    );
    assert!(s.contains("waiting for them"), "{s}");
    assert!(s.contains("they are the first to stop"), "{s}");
}

#[test]
fn an_ending_recorded_by_the_process_merges_with_what_the_kernel_saw() {
    let own_abort = Ending {
        at_ns: 10,
        observed: true,
        recorded: true,
        status: Some(7),
        aborted: true,
        ..Default::default()
    };
    // The launcher then killed the aborting process: it still aborted, at its own time.
    let m = own_abort.merged(Ending {
        at_ns: 20,
        ..killed(9)
    });
    assert_eq!(
        (m.at_ns, m.aborted, m.status, m.signal),
        (10, true, Some(7), None)
    );
    assert!(m.by_itself());
    // An exit whose status the process could not know takes the kernel's.
    let unknown = Ending {
        at_ns: 10,
        observed: true,
        recorded: true,
        ..Default::default()
    };
    let m = unknown.merged(Ending {
        at_ns: 12,
        observed: true,
        status: Some(2),
        ..Default::default()
    });
    assert_eq!((m.at_ns, m.status), (10, Some(2)));
    // A launcher's SIGTERM the process recorded is not its own doing.
    assert!(
        !Ending {
            recorded: true,
            ..killed(15)
        }
        .by_itself()
    );
}

#[test]
fn a_live_hang_names_the_same_call_whichever_of_two_was_entered_a_hair_first() {
    // Rank 2 never entered: its data-parallel half waits in all-reduce #20, its tensor-parallel
    // partner in the pair's, entered within a microsecond of each other. Live, entry times move
    // by microseconds as clock alignment is refined: the finding (its id names the call) must
    // stay on one call.
    let (half, pair) = (0x200, 0x300);
    let named = |pair_first: bool, live: bool| {
        let mut v = job(8, 19, live);
        comm(&mut v, half, &[0, 2, 4, 6], 20);
        comm(&mut v, pair, &[2, 3], 20);
        for r in [0, 4, 6] {
            inside(&mut v, r, half, 20, 10 * S + u64::from(!pair_first) * 1000);
        }
        inside(&mut v, 3, pair, 20, 10 * S + u64::from(pair_first) * 1000);
        let f = run(&v);
        assert_eq!(kinds(&f), [(Kind::Hang, vec![2])], "{f:#?}");
        f[0].comm.clone()
    };
    assert_eq!(named(true, true), named(false, true));
    // A trace's entry times stay put: there the call entered first is named.
    assert_ne!(named(true, false), named(false, false));
}
