use super::*;
use commscope_ebpf_common::Head;
use commscope_wire::record::RECORD_SIZE;

/// A `/proc` with one process: its environment, start time and maps.
fn fake_proc(pid: u32, env: &[(&str, &str)], maps: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("agent.sock"), "").expect("socket stand-in");
    add_proc(root.path(), pid, env, maps);
    root
}

/// Another process in a fake `/proc` (start time 4242), the agent's socket at the default path
/// from its own root.
fn add_proc(root: &Path, pid: u32, env: &[(&str, &str)], maps: &str) {
    let d = root.join(pid.to_string());
    std::fs::create_dir_all(&d).expect("mkdir");
    let environ: Vec<u8> = env
        .iter()
        .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
        .collect();
    std::fs::write(d.join("environ"), environ).expect("environ");
    // Field 22 (start time) is 4242.
    let stat = format!("{pid} (python3 x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0");
    std::fs::write(d.join("stat"), stat).expect("stat");
    std::fs::write(d.join("maps"), maps).expect("maps");
    let theirs = d.join("root/run/commscope");
    std::fs::create_dir_all(&theirs).expect("mkdir");
    std::fs::hard_link(root.join("agent.sock"), theirs.join("agent.sock")).expect("link");
}

/// A fake `/proc` whose process `pid` registers with another agent (its own socket).
fn served_elsewhere(pid: u32) -> tempfile::TempDir {
    let root = fake_proc(pid, &[("COMMSCOPE_AGENT_SOCKET", "/tmp/other.sock")], "");
    let other = root.path().join(format!("{pid}/root/tmp"));
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("other.sock"), "").expect("another agent's socket");
    root
}

fn recorder(root: &tempfile::TempDir, node: &str) -> Recorder {
    Recorder::new(root.path(), node, &root.path().join("agent.sock"))
}

fn init(pid: u32, comm: u64, rank: i32, nranks: i32, id: u8) -> NcclInitEvent {
    NcclInitEvent {
        head: Head {
            kind: commscope_ebpf_common::kind::NCCL_INIT,
            pid,
            tid: pid,
            _pad: 0,
            ts_ns: 2_000,
        },
        t_enter: 1_000,
        comm,
        nranks,
        rank,
        id: [id; 128],
        ..NcclInitEvent::default()
    }
}

fn call(pid: u32, comm: u64, op: u32, count: u64, peer: i32, t: u64) -> NcclCallEvent {
    NcclCallEvent {
        head: Head {
            kind: commscope_ebpf_common::kind::NCCL_CALL,
            pid,
            tid: pid,
            _pad: 0,
            ts_ns: t + 5_000,
        },
        t_enter: t,
        comm,
        count,
        op,
        dtype: 7, // float
        red_op: 0,
        peer,
        ret: 0,
        depth: 0,
    }
}

/// Every record in a registered ring.
fn records(reg: &Registered) -> Vec<Record> {
    let shm = reg.region.shm();
    let mut out = Vec::new();
    shm.read_from(0, 1 << 20, |raw| {
        out.push(Record::decode(raw).expect("a valid record"));
    });
    assert_eq!(RECORD_SIZE, 128);
    out
}

#[test]
fn an_adopted_process_gets_the_launchers_identity_and_its_calls_are_numbered_like_the_preloads() {
    let pid = 4100;
    let root = fake_proc(
        pid,
        &[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("TORCHELASTIC_RUN_ID", "exp1"),
        ],
        "7f00-7f10 r-xp 0 08:01 99 /opt/lib/libnccl.so.2\n",
    );
    let mut r = recorder(&root, "node7");
    let reg = r.init(&init(pid, 0xc0, 1, 2, 9)).expect("adopted");
    assert!(r.adopted(pid));
    assert_eq!(reg.request.job, "torchelastic-exp1");
    assert_eq!((reg.request.rank, reg.request.world_size), (3, 4));
    assert_eq!(reg.request.start_time, 4242);
    assert_eq!(reg.request.node, "node7");
    // Another communicator of the same process: no new registration.
    assert!(r.init(&init(pid, 0xd0, 0, 2, 5)).is_none());
    r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1000, -1, 10_000));
    r.call(&call(pid, 0xc0, nccl_api::ALL_GATHER, 10, -1, 20_000));
    r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1000, -1, 30_000));
    r.call(&call(pid, 0xc0, nccl_api::SEND, 64, 0, 40_000));
    r.call(&call(pid, 0xc0, nccl_api::SEND, 64, 0, 50_000));
    // Unknown communicator: counted, not recorded.
    r.call(&call(pid, 0xee, nccl_api::ALL_REDUCE, 1, -1, 60_000));
    let mut destroy = call(pid, 0xd0, nccl_api::DESTROY, 0, -1, 70_000);
    destroy.dtype = -1;
    r.call(&destroy);
    assert_eq!(r.counts.unknown_comm, 1);
    assert_eq!(r.counts.calls, 5);

    let recs = records(&reg);
    let id_c0 = nccl_hash::init_comm_hash(DEFAULT_VERSION, &[9; 128]);
    let id_d0 = nccl_hash::init_comm_hash(DEFAULT_VERSION, &[5; 128]);
    assert!(matches!(recs[0], Record::Process(p) if p.event == ProcessEvent::Start && p.rank == 3));
    let comms: Vec<(CommEvent, u64, i32, i32)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Comm(c) => Some((c.event, c.comm_id, c.comm_rank, c.size)),
            _ => None,
        })
        .collect();
    assert_eq!(
        comms,
        [
            (CommEvent::Created, id_c0, 1, 2),
            (CommEvent::Created, id_d0, 0, 2),
            (CommEvent::Freed, id_d0, 0, 2)
        ]
    );
    let calls: Vec<Call> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Call(c) => Some(*c),
            _ => None,
        })
        .collect();
    let seqs: Vec<(Op, u64, u64, u64)> = calls
        .iter()
        .map(|c| (c.op(), c.seq, c.op_seq, c.bytes))
        .collect();
    assert_eq!(
        seqs,
        [
            (Op::Allreduce, 0, 0, 4000),
            // All-gather's count is per rank: 10 floats × 2 ranks.
            (Op::Allgather, 1, 0, 80),
            (Op::Allreduce, 2, 1, 4000),
            // Point-to-point: after 3 collectives; message sequence per peer.
            (Op::Send, 3, 0, 256),
            (Op::Send, 3, 1, 256),
        ]
    );
    for c in &calls {
        assert!(c.host_only() && !c.timed(), "{c:?}");
        assert!(!c.has_gpu_time());
        assert_eq!(c.duration_ns(), 5_000);
        assert_eq!((c.rank, c.comm_id, c.lib), (3, id_c0, lib::NCCL));
    }
}

#[test]
fn without_a_launcher_the_first_communicator_names_the_job_and_gives_the_rank() {
    let pid = 4200;
    let root = fake_proc(pid, &[("PATH", "/bin")], "");
    let mut r = recorder(&root, "n");
    let reg = r.init(&init(pid, 0xc0, 2, 8, 1)).expect("adopted");
    let id = nccl_hash::init_comm_hash(DEFAULT_VERSION, &[1; 128]);
    assert_eq!(reg.request.job, format!("nccl-{id:016x}"));
    assert_eq!((reg.request.rank, reg.request.world_size), (2, 8));
}

#[test]
fn a_process_carrying_the_preload_is_never_adopted_and_its_calls_are_not_counted() {
    let pid = 4300;
    let root = fake_proc(
        pid,
        &[("RANK", "0")],
        "7f00-7f10 r-xp 0 08:01 98 /usr/lib/commscope/libcommscope.so\n",
    );
    let mut r = recorder(&root, "n");
    assert!(r.init(&init(pid, 0xc0, 0, 2, 1)).is_none());
    r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1, -1, 1));
    assert_eq!(r.counts, Counts::default());
    assert_eq!(r.ignored().collect::<Vec<_>>(), [pid]);
    // Once it is gone, it leaves the skip list.
    std::fs::remove_dir_all(root.path().join(pid.to_string())).expect("rm");
    assert_eq!(r.tick(10_000_000_000), [pid]);
    assert_eq!(r.ignored().count(), 0);
}

#[test]
fn a_process_another_agent_serves_is_left_to_it() {
    let pid = 4350;
    let root = served_elsewhere(pid);
    let mut r = recorder(&root, "n");
    assert!(r.init(&init(pid, 0xc0, 0, 2, 1)).is_none());
    r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1, -1, 1));
    assert_eq!(r.counts, Counts::default());
    assert_eq!(r.ignored().collect::<Vec<_>>(), [pid]);
    // Pointed at this agent's socket, the same process would be adopted.
    let pid2 = 4351;
    add_proc(
        root.path(),
        pid2,
        &[("COMMSCOPE_AGENT_SOCKET", "/x/a.sock")],
        "",
    );
    let d = root.path().join(pid2.to_string());
    std::fs::create_dir_all(d.join("root/x")).expect("mkdir");
    std::fs::hard_link(root.path().join("agent.sock"), d.join("root/x/a.sock")).expect("link");
    assert!(r.init(&init(pid2, 0xc0, 1, 2, 1)).is_some());
}

#[test]
fn calls_of_a_process_whose_init_was_missed_count_only_when_this_agent_serves_it() {
    // Both processes started before the probes: their first events are calls.
    let pid = 4360;
    let root = served_elsewhere(pid);
    let mine = 4361;
    add_proc(root.path(), mine, &[("RANK", "0")], "");
    let mut r = recorder(&root, "n");
    for t in 1..=3 {
        r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1, -1, t));
        r.call(&call(mine, 0xc0, nccl_api::ALL_REDUCE, 1, -1, t));
    }
    assert_eq!(
        r.counts,
        Counts {
            unknown_comm: 3,
            ..Counts::default()
        }
    );
    assert_eq!(r.ignored().collect::<Vec<_>>(), [pid]);
    // A communicator it creates later adopts it after all.
    assert!(r.init(&init(mine, 0xd0, 0, 2, 1)).is_some());
    r.call(&call(mine, 0xd0, nccl_api::ALL_REDUCE, 1, -1, 9));
    assert_eq!(r.counts.calls, 1);
    // Once gone, the other agent's process leaves the skip list.
    std::fs::remove_dir_all(root.path().join(pid.to_string())).expect("rm");
    assert_eq!(r.tick(10_000_000_000), [pid]);
}

#[test]
fn a_failed_init_is_a_failed_communicator_and_later_calls_on_it_are_unknown() {
    let pid = 4400;
    let root = fake_proc(pid, &[("RANK", "1")], "");
    let mut r = recorder(&root, "n");
    let mut e = init(pid, 0, 1, 2, 3);
    e.ret = 6;
    let reg = r.init(&e).expect("adopted");
    r.call(&call(pid, 0xc0, nccl_api::ALL_REDUCE, 1, -1, 1));
    assert_eq!(r.counts.unknown_comm, 1);
    let failed: Vec<i32> = records(&reg)
        .iter()
        .filter_map(|r| match r {
            Record::Comm(c) if c.event == CommEvent::Failed => Some(c.status),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [6]);
}

#[test]
fn heartbeats_go_once_a_second_and_a_process_that_is_gone_is_forgotten() {
    let pid = 4500;
    let root = fake_proc(pid, &[], "");
    let mut r = recorder(&root, "n");
    let reg = r.init(&init(pid, 0xc0, 0, 2, 3)).expect("adopted");
    let t0 = now_mono() + 2_000_000_000;
    r.tick(t0);
    r.tick(t0 + 500_000_000);
    r.tick(t0 + 1_000_000_000);
    let beats = records(&reg)
        .iter()
        .filter(|r| matches!(r, Record::Heartbeat(_)))
        .count();
    assert_eq!(beats, 2);
    assert_eq!(reg.region.shm().last_beat(), t0 + 1_000_000_000);
    std::fs::remove_dir_all(root.path().join(pid.to_string())).expect("rm");
    r.tick(t0 + 3_000_000_000);
    assert!(!r.adopted(pid));
}

#[test]
fn a_tick_a_little_early_still_beats_and_a_zombie_is_gone() {
    let pid = 4510;
    let root = fake_proc(pid, &[], "");
    let mut r = recorder(&root, "n");
    let reg = r.init(&init(pid, 0xc0, 0, 2, 3)).expect("adopted");
    // Ticks of a one-second interval, each late by a different delay.
    let t0 = now_mono() + 2_000_000_000;
    for late_ms in [40, 5, 30, 2] {
        r.tick(t0 + late_ms * 1_000_000);
    }
    for (i, late_ms) in [40u64, 5, 30, 2].iter().enumerate() {
        r.tick(t0 + (i as u64 + 1) * 1_000_000_000 + late_ms * 1_000_000);
    }
    let beats = || {
        records(&reg)
            .iter()
            .filter(|r| matches!(r, Record::Heartbeat(_)))
            .count()
    };
    assert_eq!(beats(), 5);
    // Its main thread gone (`pthread_exit`), another running on: it runs.
    let stat = root.path().join(format!("{pid}/stat"));
    let s = std::fs::read_to_string(&stat).expect("stat");
    let zombie_leader = s
        .replace(") S ", ") Z ")
        .replace(" 20 0 1 0 4242 ", " 20 0 2 0 4242 ");
    std::fs::write(&stat, zombie_leader).expect("zombie leader");
    r.tick(t0 + 5_000_000_000);
    assert!(r.adopted(pid));
    assert_eq!(beats(), 6);
    // Killed, not yet reaped: it writes nothing more.
    std::fs::write(&stat, s.replace(") S ", ") Z ")).expect("zombie");
    r.tick(t0 + 6_000_000_000);
    assert!(!r.adopted(pid));
    assert_eq!(beats(), 6);
}

#[test]
fn the_version_string_in_a_library_says_how_it_hashes() {
    assert_eq!(
        version_in(b"\0junk NCCL version information\0NCCL version 2.32.3+cuda12.9\0"),
        Some(Version(23203))
    );
    assert_eq!(version_in(b"NCCL version 2.8.4"), Some(Version(2804)));
    assert_eq!(version_in(b"NCCL version x"), None);
    assert_eq!(version_in(b""), None);
}

#[test]
fn the_version_is_found_in_a_file_across_its_pieces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("libnccl.so.2");
    // The string straddles the first 1 MiB boundary.
    let mut b = vec![0u8; (1 << 20) - 5];
    b.extend_from_slice(b"NCCL version 2.27.7+cuda12.4\0");
    b.extend(vec![0u8; 1000]);
    std::fs::write(&f, &b).expect("write");
    assert_eq!(version_in_file(&f), Some(Version(22707)));
    std::fs::write(&f, vec![1u8; 3 << 20]).expect("write");
    assert_eq!(version_in_file(&f), None);
    assert_eq!(version_in_file(&dir.path().join("missing")), None);
}
