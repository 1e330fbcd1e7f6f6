//! A job killed while hung: the in-flight table shows the stuck ranks live to another process,
//! the shim registers with an agent (and again after the agent restarts, resuming where the
//! agent left off), and after `kill -9` the trace lists exactly the ranks inside the collective.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use commscope_agent::region::Region;
use commscope_agent::registration::{self, Registered};
use commscope_tests::{Flavour, build, commscope, launch, summary_json, wait};
use commscope_wire::op::Op;
use commscope_wire::record::Record;
use commscope_wire::shm::{Consumer, in_flight_status};

const HANG_RANK: i32 = 3;

/// Rank → pid, from the trace file names (`<node>-<pid>-<rank>.cst`).
fn rank_pids(job_dir: &Path) -> BTreeMap<i32, u32> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(job_dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".cst") else {
            continue;
        };
        let mut parts = stem.rsplitn(3, '-');
        let (Some(rank), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        if let (Ok(r), Ok(p)) = (rank.parse(), pid.parse()) {
            out.insert(r, p);
        }
    }
    out
}

/// Accepts registrations on a socket in the background until `n` arrived.
fn accept_n(listener: UnixListener, n: usize) -> std::thread::JoinHandle<Vec<Registered>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        while out.len() < n {
            let (stream, _) = listener.accept().expect("accept");
            match registration::handle(stream) {
                Ok(r) => out.push(r),
                Err(e) => panic!("registration refused: {e}"),
            }
        }
        out
    })
}

struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        // Whatever happened, take the whole job down (its own process group).
        unsafe_kill(-(self.0.id() as i32), libc::SIGKILL);
        let _ = self.0.wait();
    }
}

fn unsafe_kill(pid: i32, sig: i32) {
    // SAFETY: sending a signal; no memory is involved.
    unsafe { libc::kill(pid, sig) };
}

fn hung_job(flavour: Flavour) {
    let prog = build(flavour, "hang");
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace_dir = tmp.path().join("trace");
    let sock = tmp.path().join("agent.sock");
    let job = format!("hang-{}", flavour.name());
    let job_dir = trace_dir.join(&job);

    // A first agent.
    let agent_a = accept_n(UnixListener::bind(&sock).expect("bind"), 8);
    let child = commscope()
        .arg("run")
        .arg("--trace-dir")
        .arg(&trace_dir)
        .arg("--job-id")
        .arg(&job)
        .arg("--agent-socket")
        .arg(&sock)
        .arg("--")
        .args(launch(flavour, 8, &prog, &[&HANG_RANK.to_string()]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start job");
    let mut job_proc = Job(child);

    let regs = agent_a.join().expect("agent thread");
    let ranks: BTreeSet<i32> = regs.iter().map(|r| r.request.rank).collect();
    assert_eq!(ranks, (0..8).collect(), "every rank registered");
    assert!(
        regs.iter()
            .all(|r| r.request.job == job && r.request.world_size == 8)
    );

    // The stuck ranks show their all-reduce in the in-flight table, live, to another process.
    let pids = wait("8 trace files", Duration::from_secs(30), || {
        Some(rank_pids(&job_dir)).filter(|m| m.len() == 8)
    });
    let stuck: BTreeMap<i32, (u64, u64)> = wait(
        "7 ranks stuck in the all-reduce",
        Duration::from_secs(30),
        || {
            let mut stuck = BTreeMap::new();
            for (&rank, &pid) in &pids {
                let region = Region::of_process(pid).ok()?;
                for (_, e) in region.shm().in_flight() {
                    if e.op == Op::Allreduce as u8 && e.status == in_flight_status::IN_CALL {
                        stuck.insert(rank, (e.comm_id, e.seq));
                    }
                }
            }
            // Ranks pass through earlier all-reduces on the way: wait until all seven sit in one.
            let one_instance = stuck.values().collect::<BTreeSet<_>>().len() == 1;
            (stuck.len() == 7 && one_instance && !stuck.contains_key(&HANG_RANK)).then_some(stuck)
        },
    );
    assert_eq!(
        stuck.values().next().map(|v| v.1),
        Some(10),
        "the 11th collective on the world communicator"
    );

    // The first agent consumes part of each ring, then dies (its connections close). A second
    // agent at the same path gets every process back, each resuming at the first agent's cursor.
    let mut cursors = BTreeMap::new();
    for r in &regs {
        let shm = r.region.shm();
        let from = shm.cursor(Consumer::Agent);
        let end = shm.read_from(from, 5, |_| {});
        shm.advance(Consumer::Agent, end);
        cursors.insert(r.request.rank, end);
        assert!(
            end > from,
            "rank {} had records for the agent",
            r.request.rank
        );
    }
    std::fs::remove_file(&sock).expect("remove socket");
    drop(regs);
    let agent_b = accept_n(UnixListener::bind(&sock).expect("rebind"), 8);
    let regs_b = agent_b.join().expect("second agent");
    for r in &regs_b {
        assert_eq!(
            r.region.shm().cursor(Consumer::Agent),
            cursors[&r.request.rank],
            "rank {} resumes",
            r.request.rank
        );
        let mut kinds = BTreeMap::<&str, u64>::new();
        let shm = r.region.shm();
        shm.read_from(shm.cursor(Consumer::Agent), 1 << 20, |raw| {
            if let Ok(rec) = Record::decode(raw) {
                *kinds.entry(rec.kind_name()).or_default() += 1;
            }
        });
        assert!(
            kinds.get("call").copied().unwrap_or(0) >= 8,
            "rank {}: {kinds:?}",
            r.request.rank
        );
    }

    // The trace shows the stuck calls before anything is killed (enter records, flushed).
    wait(
        "enter records in the trace",
        Duration::from_secs(30),
        || {
            let (s, _) = summary_json(&[&job_dir]);
            (s["in_flight"].as_array().map(Vec::len) == Some(7)).then_some(())
        },
    );

    // kill -9 every rank.
    for &pid in pids.values() {
        unsafe_kill(pid as i32, libc::SIGKILL);
    }
    let status = wait("the launcher to exit", Duration::from_secs(30), || {
        job_proc.0.try_wait().ok().flatten()
    });
    assert!(!status.success(), "a killed job does not succeed");

    let (s, o) = summary_json(&[&job_dir]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let in_flight: Vec<(i64, String, u64)> = s["in_flight"]
        .as_array()
        .expect("in_flight")
        .iter()
        .map(|f| {
            (
                f["rank"].as_i64().unwrap_or(-1),
                f["op"].as_str().unwrap_or("").to_owned(),
                f["seq"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let expected: Vec<(i64, String, u64)> = (0..8)
        .filter(|&r| r != HANG_RANK)
        .map(|r| (i64::from(r), "allreduce".to_owned(), 10))
        .collect();
    assert_eq!(
        in_flight, expected,
        "exactly the ranks inside the collective"
    );
    let world = s["in_flight"][0]["comm_id"].clone();
    assert!(
        s["in_flight"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|f| f["comm_id"] == world)
    );
    assert_eq!(
        s["unfinished_ranks"].as_array().map(Vec::len),
        Some(8),
        "no rank shut down cleanly"
    );
}

#[test]
fn open_mpi_job_killed_while_hung() {
    hung_job(Flavour::OpenMpi);
}

#[test]
fn mpich_job_killed_while_hung() {
    hung_job(Flavour::Mpich);
}
