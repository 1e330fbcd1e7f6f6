//! `commscope simulate`: a synthetic job ([`commscope_sim`]) that streams to a collector over the
//! real ingest protocol, one stream per simulated node as that node's agent would, in real time.
//! It prints each finding as it opens and resolves and, for every injected fault, whether the
//! expected finding was named and how long after the fault began.
//!
//! Without `--collector` a collector runs inside the command. `--virtual` runs the job in virtual
//! time instead and analyzes its trace in-process (what the accuracy benchmark does).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use commscope_analyzer::finding::{Finding, Kind};
use commscope_sim::{
    Expected, Fault, MIN_SLOW_STEPS, Sim, Spec, Topology, expected_all, judge, simulate,
};
use commscope_wire::cst::Header;
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{
    InFlightEntry, InFlightSnapshot, IngestRequest, NodeRecords, ProcessId, RecordBatch,
};
use commscope_wire::record::RECORD_SIZE;
use tokio::sync::mpsc;

use crate::cli::{Format, SimulateArgs};

mod links;

use links::{Links, RatesMsg};

fn now_real() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The spec the flags describe.
pub fn spec_of(a: &SimulateArgs) -> Result<Spec> {
    let faults = a
        .fault
        .iter()
        .map(|f| Fault::parse(f).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    if a.ranks < 2 || a.ranks > 65_536 {
        bail!("--ranks {}: use 2 to 65536", a.ranks);
    }
    let factor = |f: f64, max: f64| f > 1.0 && f <= max;
    if !factor(a.slowdown, 100.0) || !factor(a.degradation, 1000.0) {
        bail!("--slowdown and --degradation are factors above 1 (1.5: 50 % longer)");
    }
    let spec = Spec {
        job: a
            .job_id
            .clone()
            .unwrap_or_else(|| format!("sim-{}-{}", a.seed, now_real() / 1_000_000 % 1_000_000)),
        ranks: a.ranks,
        per_node: a.ranks_per_node.max(1),
        tp: a.tp.unwrap_or(0),
        pp: a.pp.unwrap_or(0),
        slow_factor: a.slowdown,
        degrade_factor: a.degradation,
        seed: a.seed,
        faults,
        onset_step: a.onset_step,
        compute_ms: a.compute_ms,
        links: a.links,
        steps: u64::MAX,
        sample_modulus: if a.virtual_time {
            a.sample_modulus
                .filter(|k| *k > 1)
                .map_or(1, commscope_wire::sampling::modulus_floor)
        } else {
            1
        },
        ..Default::default()
    };
    let topo =
        Topology::new(spec.ranks, spec.per_node, spec.tp, spec.pp).map_err(anyhow::Error::msg)?;
    expected_all(&spec.faults, &topo).map_err(anyhow::Error::msg)?;
    Ok(spec)
}

/// `commscope simulate`.
pub fn run(a: &SimulateArgs) -> Result<ExitCode> {
    let spec = spec_of(a)?;
    if a.virtual_time {
        return run_in_virtual_time(a, spec);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(run_live(a, spec))
}

/// What the faults should give, each with the tokens it stands for and the step at which its
/// first fault starts.
fn expectations(spec: &Spec) -> Vec<(String, Expected, u64)> {
    expectations_of(spec, &spec.faults)
}

/// The same for the faults that took effect.
fn expectations_of(spec: &Spec, faults: &[Fault]) -> Vec<(String, Expected, u64)> {
    let Ok(topo) = Topology::new(spec.ranks, spec.per_node, spec.tp, spec.pp) else {
        return vec![];
    };
    let Ok(all) = expected_all(faults, &topo) else {
        return vec![];
    };
    all.into_iter()
        .map(|e| {
            let of: Vec<&Fault> = faults
                .iter()
                .filter(|f| {
                    expected_all(std::slice::from_ref(*f), &topo).is_ok_and(|x| {
                        x.iter().all(|y| {
                            y.kinds == e.kinds && y.ranks.iter().all(|r| e.ranks.contains(r))
                        })
                    })
                })
                .collect();
            let tokens: Vec<String> = of.iter().map(|f| f.token()).collect();
            let start = of
                .iter()
                .map(|f| f.start(spec.onset_step))
                .min()
                .unwrap_or(spec.onset_step);
            (tokens.join(" + "), e, start)
        })
        .collect()
}

fn matches(e: &Expected, f: &Finding) -> bool {
    e.matches(f.kind, &f.ranks)
}

fn run_in_virtual_time(a: &SimulateArgs, mut spec: Spec) -> Result<ExitCode> {
    spec.steps = a.steps;
    let t = Instant::now();
    let job = spec.job.clone();
    let (traces, effect) = simulate(spec.clone()).map_err(anyhow::Error::msg)?;
    // A fault whose rank was already blocked behind another when it was due does nothing; a
    // slow fault that acted only a few steps before the job stopped may not be seen.
    let mut want = expectations_of(&spec, &effect.effective);
    for (tokens, mut e, start) in expectations_of(&spec, &effect.borderline) {
        e.optional = true;
        want.push((tokens, e, start));
    }
    let hidden: Vec<&Fault> = spec.faults.iter().filter(|f| effect.hidden(f)).collect();
    let records: usize = traces.iter().map(|p| p.records.len()).sum();
    let made = t.elapsed();
    let found = commscope_analyzer::analyze(&job, &traces, &Default::default());
    let verdict = judge(
        &want.iter().map(|w| w.1.clone()).collect::<Vec<_>>(),
        &found
            .iter()
            .map(|f| (f.kind, f.ranks.clone()))
            .collect::<Vec<_>>(),
    );
    if a.format == Format::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "findings": found }))?
        );
    } else {
        println!(
            "simulated {} ranks for {} steps in virtual time: {records} records in {:.2} s, analyzed in {:.2} s",
            traces.len(),
            a.steps,
            made.as_secs_f64(),
            (t.elapsed() - made).as_secs_f64()
        );
        for f in &found {
            println!("{} — {}", f.kind.name(), f.summary);
        }
        if found.is_empty() {
            println!("no findings");
        }
        for (i, (tokens, e, _)) in want.iter().enumerate() {
            println!(
                "{tokens}: expected {} of {:?}: {}",
                e.kinds_phrase(),
                e.ranks,
                if verdict.missing.contains(&i) {
                    "NOT FOUND"
                } else if e.optional {
                    "it acted in too few steps to be sure of it: found or not, both are right"
                } else {
                    "found"
                }
            );
        }
        for (k, r) in &verdict.extra {
            println!(
                "EXTRA: {} of {r:?}, which no injected fault explains",
                k.name()
            );
        }
        for f in &hidden {
            let t = f.token();
            if matches!(f, Fault::Degraded { .. }) {
                println!(
                    "{t}: not expected (it acted in fewer than {MIN_SLOW_STEPS} steps, or for less than the {:.0} s a degraded collective must last to be reported, before the job stopped)",
                    commscope_analyzer::stream::Tuning::default().degraded_sustain_s
                );
            } else if f.is_slow() {
                println!(
                    "{t}: not expected (it acted in fewer than {MIN_SLOW_STEPS} steps before the job stopped)"
                );
            } else {
                println!("{t}: did not strike (its rank was already blocked behind another fault)");
            }
        }
    }
    Ok(if verdict.exact() || !a.check {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Bytes of records one message of a node's processes carries at most.
const NODE_MESSAGE_BYTES: usize = 1 << 20;

/// A node's record batches as messages: each process's batch in a message of its own, or
/// (`together`: the collector takes them) gathered into messages of up to
/// [`NODE_MESSAGE_BYTES`].
fn messages(batches: impl Iterator<Item = RecordBatch>, together: bool) -> Vec<Payload> {
    if !together {
        return batches.map(Payload::Records).collect();
    }
    let mut out = Vec::new();
    let mut cur: Vec<RecordBatch> = Vec::new();
    let mut bytes = 0;
    for b in batches {
        if !cur.is_empty() && bytes + b.records.len() > NODE_MESSAGE_BYTES {
            out.push(Payload::NodeRecords(NodeRecords {
                batches: std::mem::take(&mut cur),
            }));
            bytes = 0;
        }
        bytes += b.records.len();
        cur.push(b);
    }
    if !cur.is_empty() {
        out.push(Payload::NodeRecords(NodeRecords { batches: cur }));
    }
    out
}

fn process_id(h: &Header) -> ProcessId {
    ProcessId {
        job: h.job.clone(),
        node: h.node.clone(),
        pid: h.pid,
        start_time: h.start_time,
        rank: h.rank,
        world_size: h.world_size,
        flavour: h.flavour.clone(),
        mono_anchor_ns: h.mono_anchor,
        real_anchor_ns: h.real_anchor,
        library: h.library.clone(),
        attribution: None,
    }
}

/// Where findings are read from.
enum Findings {
    Local(Arc<commscope_collector::Shared>),
    Http(SocketAddr, Option<commscope_wire::auth::Token>),
    None,
}

impl Findings {
    fn read(&self, job: &str) -> Vec<Finding> {
        match self {
            Findings::Local(sh) => job_findings(sh, job),
            Findings::Http(addr, token) => {
                http_findings(*addr, job, token.as_ref()).unwrap_or_default()
            }
            Findings::None => Vec::new(),
        }
    }
}

/// Findings of one job in a collector running in this process: open ones and resolved ones.
pub fn job_findings(shared: &commscope_collector::Shared, job: &str) -> Vec<Finding> {
    commscope_collector::http::all_findings(shared, Some(job))
}

/// `GET /api/v1/findings?job=` on a collector's HTTP address.
fn http_findings(
    addr: SocketAddr,
    job: &str,
    token: Option<&commscope_wire::auth::Token>,
) -> Result<Vec<Finding>> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let auth = token.map_or_else(String::new, |t| {
        format!("Authorization: {}\r\n", t.header_value())
    });
    write!(
        s,
        "GET /api/v1/findings?job={job} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let json = body.split_once("\r\n\r\n").map_or("", |x| x.1);
    let v: serde_json::Value = serde_json::from_str(json).context("findings JSON")?;
    serde_json::from_value(v["findings"].clone()).context("findings in the contract's shape")
}

/// What a rank's in-flight snapshot shows: communicator, instance, process state.
type SnapKey = (u64, u64, &'static str);

/// Unacknowledged record bytes beyond which the simulated job waits for the collector.
const BACK_OFF_BYTES: usize = 256 << 20;
/// Records are handed to the nodes' streams only while less than this is unacknowledged; the
/// rest wait with their ranks (as in an agent's rings) and go out in later turns, node after
/// node, so that nothing is dropped unsent however much one turn made.
const SHIP_MAX_BYTES: usize = 2 * BACK_OFF_BYTES;
/// Generation per turn of the loop, at most (then ship, snapshot, poll).
const STEP_FOR: Duration = Duration::from_millis(250);

async fn run_live(a: &SimulateArgs, spec: Spec) -> Result<ExitCode> {
    let epoch = now_real();
    let mut local = None;
    let token = crate::daemons::token(a.auth_token_file.clone())?;
    let (url, findings) = match &a.collector {
        Some(u) => (
            u.clone(),
            match &a.collector_http {
                Some(h) => Findings::Http(
                    h.parse()
                        .with_context(|| format!("--collector-http {h}: not an address"))?,
                    token.clone(),
                ),
                None => Findings::None,
            },
        ),
        None => {
            let dir =
                std::env::temp_dir().join(format!("commscope-simulate-{}", std::process::id()));
            let mut c = commscope_collector::Config::new(&dir);
            c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
            c.http = SocketAddr::from(([127, 0, 0, 1], 0));
            c.max_agent_rate = 1_000_000_000;
            if let Some(b) = a.sample_budget {
                c.sample_budget = b.max(1);
            }
            c.memory_limit = a
                .memory_limit
                .as_deref()
                .map(commscope_collector::memory::parse_limit)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--memory-limit {e}"))?;
            c.sample_modulus = a
                .sample_modulus
                .filter(|k| *k > 1)
                .map(commscope_wire::sampling::modulus_floor);
            let running = commscope_collector::start(c)
                .await
                .context("cannot start the collector")?;
            let url = format!("http://{}", running.listen);
            let sh = running.shared.clone();
            local = Some((running, dir));
            (url, Findings::Local(sh))
        }
    };
    let want = expectations(&spec);
    let job = spec.job.clone();
    let mut sim = Sim::new(spec, epoch).map_err(anyhow::Error::msg)?;
    let topo = sim.topo;
    println!(
        "simulating job {job}: {} ranks on {} nodes ({} pipeline stages × {} data-parallel replicas × {} tensor-parallel), streaming to {}{url} for {:.0} s{}",
        topo.ranks(),
        topo.nodes,
        topo.stages,
        topo.replicas,
        topo.tp,
        if local.is_some() {
            "a collector in this process at "
        } else {
            ""
        },
        a.duration,
        if want.is_empty() {
            String::new()
        } else {
            format!(
                "; faults: {}",
                want.iter()
                    .map(|w| w.0.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    let (rates_tx, mut rates_rx) = mpsc::unbounded_channel::<RatesMsg>();
    let links = Links::start(
        &url,
        token.clone(),
        &a.tls.files(),
        (0..topo.nodes).map(|n| topo.node_name(n)).collect(),
        rates_tx,
    );
    links
        .wait_connected(Duration::from_secs(10))
        .await
        .context("the simulated nodes' streams to the collector did not open")?;
    // The job starts once every node's agent is connected (2,048 streams take a while): its
    // clock, and the latencies measured against it, begin now.
    let start = Instant::now();
    sim.epoch = now_real();
    let mut sampled_nodes = 0usize;
    // What the last line about node 0's sampling said: (largest modulus, communicators sampled).
    let mut node0_shown = (1u32, 0usize);
    let headers: Vec<ProcessId> = (0..topo.ranks())
        .map(|r| process_id(&sim.header(r)))
        .collect();
    let mut batch_id = 0u64;
    let mut seen: BTreeMap<String, (bool, f64)> = BTreeMap::new();
    let mut named: Vec<Option<f64>> = vec![None; want.len()];
    // When the collector's detectors opened each expected finding, in the job's own time (its
    // `opened_at` less the simulated job's epoch): the rest of `named` is delivery and polling.
    let mut opened_job: Vec<Option<f64>> = vec![None; want.len()];
    let mut onset: Vec<Option<f64>> = vec![None; want.len()];
    let mut last_snap = Instant::now();
    // Per rank: the call (communicator, instance, process state) its last snapshot showed, and
    // when it was sent.
    let mut snapped: Vec<Option<(SnapKey, Instant)>> = vec![None; topo.ranks()];
    // Each simulated agent sends its processes' records this often (a real agent batches by
    // time too), whatever the size of the job: one message per process per interval keeps the
    // collector's message rate near 8,000/s; where the collector takes a node's records in one
    // message, one per node keeps it near 4,000/s (2 s at 8,192 nodes, against 8 s: a
    // collector's cost is per message far more than per record, though per process batch too —
    // at 1 s, 65,536 of them a second, the in-process collector fell behind). The nodes are
    // spread evenly over the interval, as agents that are not in step are: all of them at once
    // would queue a whole interval's messages at the collector, and the last node's records
    // would wait twice as long.
    let ship_every = |together: bool| {
        let per_s = if together {
            4 * topo.per_node as u64
        } else {
            8
        };
        Duration::from_millis((topo.ranks() as u64 / per_s).max(100))
    };
    let mut ship_credit = topo.nodes as f64;
    let mut last_turn = Instant::now();
    let mut ship_from = 0usize;
    let mut wound_up = false;
    let mut last_poll = Instant::now();
    let duration = Duration::from_secs_f64(a.duration);
    let mut finished = false;
    let mut was_backed_off = false;
    loop {
        let el = start.elapsed();
        if el >= duration && !finished {
            finished = true;
        }
        // Run the job ahead to real time — for a while at most, so that what was made is
        // shipped as it goes, and not while the collector has too much of it unacknowledged:
        // then the job waits (an agent's backpressure), and falls behind real time rather
        // than dropping anything.
        let g_now = el.as_nanos() as u64;
        let stepping = Instant::now();
        let backed_off = links.held_bytes() > BACK_OFF_BYTES;
        if backed_off && !was_backed_off {
            println!(
                "  {:>6.1} s  the collector is behind ({} MiB unacknowledged): the job waits for it",
                el.as_secs_f64(),
                links.held_bytes() >> 20
            );
        }
        was_backed_off = backed_off;
        while !finished
            && !backed_off
            && !sim.stuck()
            && sim.now() <= g_now
            && stepping.elapsed() < STEP_FOR
        {
            for (i, (_, _, at)) in want.iter().enumerate() {
                if onset[i].is_none() && sim.step == *at {
                    onset[i] = Some(sim.now() as f64 / 1e9);
                }
            }
            sim.step();
        }
        // The job's own clock: real time while it keeps up (or while it is stuck, when time
        // passes with nothing to make); else only as far as it was made. Heartbeats and
        // snapshots never claim more than the records say.
        let g_job = if sim.stuck() {
            g_now
        } else {
            g_now.min(sim.now())
        };
        if finished {
            if !wound_up {
                wound_up = true;
                sim.finish(g_job);
            }
        } else {
            sim.beat_all(g_job);
        }
        // Sampling rates the nodes' streams brought, applied as each node's agent would.
        while let Ok((n, list)) = rates_rx.try_recv() {
            if n == 0 {
                let k = list.iter().map(|l| l.1).max().unwrap_or(1);
                let now_sampled = list.iter().filter(|l| l.1 > 1).count();
                if (k, now_sampled) != node0_shown && (k > 1 || sampled_nodes > 0) {
                    node0_shown = (k, now_sampled);
                    println!(
                        "  {:>6.1} s  consistent sampling: {} communicators of node 0 sampled (up to 1 in {k})",
                        start.elapsed().as_secs_f64(),
                        list.iter().filter(|l| l.1 > 1).count()
                    );
                }
                sampled_nodes = list.iter().filter(|l| l.1 > 1).count();
            }
            sim.replace_rates(n, &list);
        }
        // Ship what is due: records up to now of the nodes whose turn came since the last
        // turn (every node once a round at the end), from where the last turn stopped.
        let turn =
            last_turn.elapsed().as_secs_f64() / ship_every(links.node_records(0)).as_secs_f64();
        last_turn = Instant::now();
        ship_credit = (ship_credit + topo.nodes as f64 * turn).min(topo.nodes as f64);
        let due = if finished {
            topo.nodes
        } else {
            ship_credit as usize
        };
        let mut shipped_nodes = 0;
        let mut all_shipped = true;
        while shipped_nodes < due {
            if links.held_bytes() > SHIP_MAX_BYTES {
                // The collector has enough on its way: the rest wait for the next turn.
                all_shipped = false;
                break;
            }
            let n = ship_from;
            ship_from = (ship_from + 1) % topo.nodes;
            shipped_nodes += 1;
            let batches = topo.node_ranks(n).flat_map(|r| {
                // What the rank wrote by now: a step is made whole, ahead of the clock.
                let recs = if finished {
                    sim.take(r)
                } else {
                    sim.take_until(r, g_now)
                };
                recs.chunks(4096)
                    .map(|chunk| RecordBatch {
                        process: Some(headers[r].clone()),
                        first_rec_seq: chunk[0].rec_seq(),
                        record_size: RECORD_SIZE as u32,
                        records: chunk.iter().flat_map(|rec| rec.encode()).collect(),
                        clock_offset_ns: Some(0),
                        clock_error_ns: 0,
                        dropped_overrun: 0,
                    })
                    .collect::<Vec<_>>()
            });
            for payload in messages(batches, links.node_records(n)) {
                batch_id += 1;
                links.send_batch(
                    n,
                    IngestRequest {
                        batch_id,
                        agent_send_ns: now_real(),
                        payload: Some(payload),
                    },
                );
            }
        }
        ship_credit = (ship_credit - shipped_nodes as f64).max(0.0);
        // In-flight snapshots of blocked ranks, as an agent sends them: when the call a rank is
        // in changed, and at least once a second while it stays in it.
        if last_snap.elapsed() >= Duration::from_millis(250) && !finished {
            last_snap = Instant::now();
            for (r, header) in headers.iter().enumerate() {
                let Some(c) = sim.in_flight(r) else { continue };
                let Some(state) = sim.proc_state(r) else {
                    continue;
                };
                let key = (c.comm_id, c.seq, state);
                match &snapped[r] {
                    Some((k, at)) if *k == key && at.elapsed() < Duration::from_secs(1) => {
                        continue;
                    }
                    _ => snapped[r] = Some((key, Instant::now())),
                }
                batch_id += 1;
                let req = IngestRequest {
                    batch_id,
                    agent_send_ns: now_real(),
                    payload: Some(Payload::InFlight(InFlightSnapshot {
                        process: Some(header.clone()),
                        t_mono_ns: sim.mono(r, g_job),
                        entries: vec![InFlightEntry {
                            comm_id: c.comm_id,
                            seq: c.seq,
                            op: c.op().name().into(),
                            t_enter_ns: c.t_enter,
                            bytes: c.bytes,
                            peer: c.peer,
                            tag: c.tag,
                            comm_rank: c.comm_rank,
                            status: 0,
                            tid: 0,
                            count: c.count,
                            dtype: u32::from(c.dtype),
                            red_op: u32::from(c.red_op),
                        }],
                        dropped_ring_full: 0,
                        proc_state: state.into(),
                        ..Default::default()
                    })),
                };
                links.send_snapshot(topo.node_of(r), req);
            }
        }
        // Findings as they open and resolve.
        if last_poll.elapsed() >= Duration::from_millis(250) || finished {
            last_poll = Instant::now();
            let t = start.elapsed().as_secs_f64();
            for f in findings.read(&job) {
                let open = f.state == commscope_analyzer::finding::State::Open;
                match seen.get(&f.id) {
                    Some((was_open, _)) if *was_open == open => continue,
                    _ => {}
                }
                seen.insert(f.id.clone(), (open, t));
                if open {
                    println!(
                        "[{t:6.1} s] OPEN     {} {:?}: {}",
                        f.kind.name(),
                        f.ranks,
                        f.summary
                    );
                    for (i, (_, e, _)) in want.iter().enumerate() {
                        if named[i].is_none() && matches(e, &f) {
                            named[i] = Some(t);
                            opened_job[i] =
                                Some(f.opened_at.saturating_sub(sim.epoch) as f64 / 1e9);
                        }
                    }
                } else {
                    println!("[{t:6.1} s] RESOLVED {} {:?}", f.kind.name(), f.ranks);
                }
            }
        }
        if finished && all_shipped {
            break;
        }
        links.flush();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the last batches be acknowledged (a collector restarting meanwhile gets them again),
    // as long as the collector answers at all.
    let held = links.held();
    if held > 0 {
        println!("waiting for the collector to acknowledge {held} record batches");
    }
    let totals = links.finish(Duration::from_secs(30)).await;
    println!(
        "{} finding{} opened for this job",
        seen.len(),
        if seen.len() == 1 { "" } else { "s" }
    );
    println!(
        "sent {} messages (record batches and in-flight snapshots; {} acknowledged, {} refused, {} refused for now and sent again) for {} steps; {} record batches, {} never acknowledged, {} dropped unsent; {} streams reopened, {} batches sent again",
        totals.sent,
        totals.acked,
        totals.refused,
        totals.retried,
        sim.step,
        totals.batches,
        totals.unacked,
        totals.dropped,
        totals.reconnects,
        totals.resent,
    );
    let mut ok = totals.unacked == 0 && totals.dropped == 0;
    for (i, (f, e, _)) in want.iter().enumerate() {
        match (named[i], onset[i]) {
            (Some(t), Some(o)) => println!(
                "{}: {} of {:?} named {:.1} s after the fault began (at {o:.1} s); the detectors opened it {:.1} s into the fault by the records' own time",
                f,
                e.kinds_phrase(),
                e.ranks,
                t - o,
                opened_job[i].map_or(f64::NAN, |j| (j - o).max(0.0)),
            ),
            (Some(t), None) => println!(
                "{}: {} of {:?} named at {t:.1} s",
                f,
                e.kinds_phrase(),
                e.ranks
            ),
            (None, _) => {
                ok = false;
                println!(
                    "{}: expected {} of {:?}: NOT FOUND{}",
                    f,
                    e.kinds_phrase(),
                    e.ranks,
                    if matches!(findings, Findings::None) {
                        " (give --collector-http to read the collector's findings)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    // Findings no injected fault explains.
    if !matches!(findings, Findings::None) {
        let all: Vec<(Kind, Vec<i32>)> = findings
            .read(&job)
            .iter()
            .map(|f| (f.kind, f.ranks.clone()))
            .collect();
        let v = judge(&want.iter().map(|w| w.1.clone()).collect::<Vec<_>>(), &all);
        for (k, r) in &v.extra {
            ok = false;
            println!(
                "EXTRA: {} of {r:?}, which no injected fault explains",
                k.name()
            );
        }
    }
    if let Some((running, dir)) = local {
        running.stop().await;
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(if ok || !a.check {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
