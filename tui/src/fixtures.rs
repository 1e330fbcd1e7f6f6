//! Snapshots for the snapshot tests and the frame benchmark: a healthy job, a straggler, a hang
//! with its culprit, and a job of thousands of ranks — in the Query service's shapes, as a
//! collector would send them. Not used by the TUI itself.

use commscope_wire::grpc::{
    CommState, Finding, InFlightCall, JobDetail, JobSummary, LinkRate, RankDetail, RankHealth,
    RankState, RecentCall,
};

use crate::source::Snapshot;

/// The data clock of every fixture (s since the epoch).
pub const CLOCK_S: f64 = 1_796_400_000.0;
const WORLD: u64 = 0x9a3c_51e2_07d4_11b8;

fn summary(job: &str, state: &str, ranks: u32, per_node: u32, open: u32) -> JobSummary {
    JobSummary {
        job: job.into(),
        state: state.into(),
        ranks,
        world_size: ranks,
        nodes: (0..ranks.div_ceil(per_node))
            .map(|n| format!("node-{n:02}"))
            .collect(),
        records: u64::from(ranks) * 1200,
        first_seen_ns: ((CLOCK_S - 120.0) * 1e9) as u64,
        last_seen_ns: ((CLOCK_S - 1.0) * 1e9) as u64,
        in_flight: 0,
        dropped: 0,
        flavour: "openmpi".into(),
        open_findings: open,
        contact_note: String::new(),
    }
}

fn detail(job: &str, ranks: u32, per_node: u32, seq: u64) -> JobDetail {
    let members: Vec<i32> = (0..ranks as i32).collect();
    JobDetail {
        summary: Some(summary(job, "running", ranks, per_node, 0)),
        ranks: members
            .iter()
            .map(|r| RankState {
                rank: *r,
                node: format!("node-{:02}", *r as u32 / per_node),
                pid: 4000 + *r as u32,
                state: "running".into(),
                records: 1200,
                calls: 600,
                last_seen_ns: ((CLOCK_S - 1.0) * 1e9) as u64,
                ..Default::default()
            })
            .collect(),
        comms: vec![CommState {
            comm_id: WORLD,
            name: String::new(),
            size: ranks,
            members: members.clone(),
            progress: vec![seq; ranks as usize],
            calls: u64::from(ranks) * seq,
            bytes: (u64::from(ranks) * seq * 4) << 20,
        }],
        health: members
            .iter()
            .map(|r| RankHealth {
                rank: *r,
                share: 0.002 + (*r % 5) as f64 * 0.001,
                recent_share: Some(0.002),
                late_ratio: 0.2 + (*r % 3) as f64 * 0.1,
                slow: false,
            })
            .collect(),
        links: vec![
            LinkRate {
                src: "node-00".into(),
                dst: "node-01".into(),
                bytes: 48 << 30,
                network_s: 2.1,
                gpu_wait_s: 0.3,
            },
            LinkRate {
                src: "node-01".into(),
                dst: "node-00".into(),
                bytes: 48 << 30,
                network_s: 2.0,
                gpu_wait_s: 0.2,
            },
        ],
        step_s: Some(0.42),
        step_from: "the period of allreduce on communicator 0x9a3c51e207d411b8".into(),
        ..Default::default()
    }
}

/// No job at all.
pub fn empty() -> Snapshot {
    Snapshot {
        clock_s: CLOCK_S,
        ..Default::default()
    }
}

fn with_jobs(job: Option<JobDetail>, rank: Option<RankDetail>) -> Snapshot {
    let mut jobs = vec![
        summary("bert-large-ft", "running", 16, 8, 0),
        summary("eval-nightly", "ended", 8, 8, 0),
    ];
    if let Some(s) = job.as_ref().and_then(|j| j.summary.clone())
        && !jobs.iter().any(|j| j.job == s.job)
    {
        jobs.insert(0, s);
    }
    Snapshot {
        jobs,
        job,
        rank,
        clock_s: CLOCK_S,
        error: None,
    }
}

/// A healthy 16-rank job.
pub fn healthy() -> Snapshot {
    with_jobs(Some(detail("bert-large-ft", 16, 8, 1840)), None)
}

/// A 16-rank job whose rank 5 computes 50 % longer.
pub fn straggler() -> Snapshot {
    let mut d = detail("llama-7b-pretrain", 16, 8, 2210);
    if let Some(s) = d.summary.as_mut() {
        s.open_findings = 1;
    }
    for h in &mut d.health {
        if h.rank == 5 {
            h.share = 0.21;
            h.recent_share = Some(0.23);
            h.late_ratio = 0.97;
            h.slow = true;
        }
    }
    d.findings = vec![Finding {
        id: "0x5be0cd19137e2179".into(),
        kind: "slow-rank".into(),
        class: "non-communication-slow".into(),
        state: "open".into(),
        job: "llama-7b-pretrain".into(),
        ranks: vec![5],
        nodes: vec!["node-00".into()],
        opened_at: ((CLOCK_S - 40.0) * 1e9) as u64,
        confidence: 0.9,
        summary: "rank 5 on node-00 keeps the job waiting 21 % of the time (about 88 ms of every 420 ms step), persistently: it computes longer before its collectives than its peers — look at that rank's own work (data loading, a slow GPU, CPU contention) on node-00".into(),
        evidence_json: "{}".into(),
        ..Default::default()
    }];
    with_jobs(Some(d), None)
}

/// A 16-rank job in which rank 2 never entered all-reduce #10; its agent took its stacks.
pub fn hang() -> Snapshot {
    let mut d = detail("resnet-dp", 16, 8, 10);
    if let Some(s) = d.summary.as_mut() {
        s.open_findings = 1;
        s.in_flight = 15;
    }
    d.comms[0].progress[2] = 10;
    d.in_flight = (0..16)
        .filter(|r| *r != 2)
        .map(|r| InFlightCall {
            rank: r,
            comm_id: WORLD,
            seq: 10,
            op: "allreduce".into(),
            age_ns: 12_400_000_000 - r as u64 * 10_000_000,
            bytes: 2048,
            peer: -1,
        })
        .collect();
    let victims: Vec<i32> = (0..16).filter(|r| *r != 2).collect();
    let stuck: Vec<serde_json::Value> = victims
        .iter()
        .map(|r| serde_json::json!({"rank": r, "comm": "0x9a3c51e207d411b8", "seq": 10, "op": "allreduce", "bytes": 2048, "in_flight_s": 12.4 - *r as f64 * 0.01}))
        .collect();
    let evidence = serde_json::json!({
        "victims": victims,
        "stuck": stuck,
        "culprits": [{
            "rank": 2, "node": "node-00", "pid": 4002, "in_library": false, "progress_on_comm": 10,
            "state": "running",
            "process": {"state": "S", "state_name": "sleeping", "wchan": "hrtimer_nanosleep", "cpu_s": 3.21, "cpu_advancing": false},
            "stacks": {"native": "#0  clock_nanosleep ()\n#1  nanosleep ()\n#2  main () at hang.c:41", "python": "", "error": "", "at_ns": 0}
        }]
    });
    d.findings = vec![Finding {
        id: "0x5a8129ca03d5d371".into(),
        kind: "hang".into(),
        class: "non-communication-hang".into(),
        state: "open".into(),
        job: "resnet-dp".into(),
        comm: Some("0x9a3c51e207d411b8".into()),
        seq: Some(10),
        ranks: vec![2],
        nodes: vec!["node-00".into()],
        opened_at: ((CLOCK_S - 7.0) * 1e9) as u64,
        confidence: 0.9,
        summary: "rank 2 on node-00 has not entered allreduce #10 on communicator 0x9a3c51e207d411b8 (2048 B); 15 other ranks wait behind it for up to 12.4 s — it is outside the communication library (its process is sleeping in hrtimer_nanosleep, its CPU time not advancing): its node's agent takes its stacks into this finding's evidence (or run py-spy dump / gdb on it)".into(),
        evidence_json: evidence.to_string(),
        ..Default::default()
    }];
    with_jobs(Some(d), None)
}

/// The hang job, but its culprit is inside the library: rank 2 posted a send to rank 3 and
/// blocks in a receive from rank 1 with a tag rank 1 never sends; rank 0's records end early.
pub fn deadlock() -> Snapshot {
    let mut s = hang();
    if let Some(f) = s.job.as_mut().and_then(|d| d.findings.first_mut()) {
        let mut e: serde_json::Value =
            serde_json::from_str(&f.evidence_json).expect("the fixture's evidence");
        e["culprits"][0]["in_library"] = true.into();
        e["culprits"][0]["process"] = serde_json::Value::Null;
        e["culprits"][0]["inside"] = serde_json::json!([
            {"op": "send", "comm": "0x9a3c51e207d411b8", "seq": 9, "peer": 3, "tag": 7,
             "bytes": 2048, "posted": true, "in_flight_s": 12.5},
            {"op": "recv", "comm": "0x9a3c51e207d411b8", "seq": 9, "peer": 1, "tag": 8,
             "bytes": 2048, "posted": false, "in_flight_s": 12.5}
        ]);
        f.class = "communication-hang".into();
        f.evidence_json = e.to_string();
    }
    s
}

/// A 4,096-rank job on 512 nodes; rank 3001 is slow.
pub fn big() -> Snapshot {
    let mut d = detail("gpt-4k", 4096, 8, 512);
    for h in &mut d.health {
        if h.rank == 3001 {
            h.share = 0.3;
            h.late_ratio = 1.0;
            h.slow = true;
        }
    }
    with_jobs(Some(d), None)
}

/// Rank 5 of the straggler job.
pub fn rank5() -> Snapshot {
    let mut s = straggler();
    let d = s.job.as_ref().cloned().unwrap_or_default();
    s.rank = Some(RankDetail {
        state: d.ranks.iter().find(|r| r.rank == 5).cloned(),
        recent: (0..48)
            .map(|i| RecentCall {
                comm_id: WORLD,
                seq: 2162 + i,
                op: "allreduce".into(),
                bytes: 64 << 20,
                duration_ns: 30_000_000 + (i % 7) * 9_000_000,
                end_ns: ((CLOCK_S - 20.0 + i as f64 * 0.42) * 1e9) as u64,
                peer: -1,
            })
            .collect(),
        in_flight: vec![],
        health: d.health.iter().find(|h| h.rank == 5).cloned(),
    });
    s
}
