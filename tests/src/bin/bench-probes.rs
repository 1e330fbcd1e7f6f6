//! What the transport view's eBPF probes cost (`scripts/bench.sh probes`, root):
//! - per probe hit, in the probed process: a uprobe (`ncclIbIsend` of the NCCL-network
//!   stand-in, the map update only) and a uprobe + uretprobe pair that writes a ring-buffer event
//!   (`ibv_modify_qp` of the verbs stand-in), each timed with and without the probes;
//! - per TCP round trip over loopback (64-byte ping-pong, both ends on one CPU), with and
//!   without the tracepoints;
//! - in the agent: decoding and applying events (per event), reading the flows map (per read,
//!   with 200 live flows), scanning `/proc` for libraries (per scan);
//! - the agent's CPU share at a realistic rate: one map read a second, one scan every 5 s and
//!   1,000 events a second (far above a training job's control-path rate);
//! - zero-touch NCCL recording: what the NCCL API probes add to an `ncclAllReduce` call (the
//!   NCCL test double in no-op mode, `nccl_job 1 bench`), and what recording one call costs the
//!   agent (decode, then the recorder's call record and in-flight slot).

use std::ffi::{CString, c_void};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use commscope_agent::transport::events::{Event, decode};
use commscope_agent::transport::{Options, Probes, TransportView};
use commscope_ebpf_common::{Head, QpEvent, ibv, kind};
use commscope_tests::transport::stand_ins;

type Isend = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    usize,
    i32,
    *mut c_void,
    *mut c_void,
    *mut *mut c_void,
) -> i32;
type ModifyQp = unsafe extern "C" fn(*mut c_void, *mut c_void, i32) -> i32;

fn dlsym(lib: &Path, name: &str, version: Option<&str>) -> *mut c_void {
    let path = CString::new(lib.to_str().expect("utf-8")).expect("path");
    // SAFETY: dlopen/dlsym/dlvsym with valid NUL-terminated strings.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {}", lib.display());
        let n = CString::new(name).expect("name");
        let p = match version {
            Some(v) => {
                let v = CString::new(v).expect("version");
                libc::dlvsym(h, n.as_ptr(), v.as_ptr())
            }
            None => libc::dlsym(h, n.as_ptr()),
        };
        assert!(!p.is_null(), "no {name} in {}", lib.display());
        p
    }
}

/// ns per call of `f`, best of 5 runs of `n`.
fn per_call(n: u64, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn round_trips(n: u32) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut b = [0u8; 64];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let mut b = [7u8; 64];
    let t = Instant::now();
    for _ in 0..n {
        c.write_all(&b).expect("write");
        c.read_exact(&mut b).expect("read");
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    drop(c);
    let _ = echo.join();
    ns
}

/// Pins the whole process to CPU 0: a ping-pong between two vCPUs costs wake-up IPIs whose
/// price varies by tens of microseconds on a VM, which would drown what is measured.
fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one CPU set, for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn main() {
    pin_to_cpu0();
    let s = stand_ins();
    let isend: Isend = {
        let p = dlsym(&s.ncclnet, "_Z11ncclIbIsendPvS_miS_S_PS_", None);
        // SAFETY: the stand-in's isend has this signature.
        unsafe { std::mem::transmute::<*mut c_void, Isend>(p) }
    };
    let modify: ModifyQp = {
        let p = dlsym(&s.verbs, "ibv_modify_qp", Some("IBVERBS_1.1"));
        // SAFETY: ibv_modify_qp's signature.
        unsafe { std::mem::transmute::<*mut c_void, ModifyQp>(p) }
    };
    // A fake QP and attributes for ibv_modify_qp to read and change.
    let mut qp = vec![0u8; 256];
    qp[ibv::QP_QP_NUM..ibv::QP_QP_NUM + 4].copy_from_slice(&0x77u32.to_ne_bytes());
    let mut attr = vec![0u8; 256];
    let mut req: *mut c_void = std::ptr::null_mut();
    let mut buf = [0u8; 8];
    let mut call_isend = || {
        // SAFETY: valid pointers for the stand-in, which only stores the request.
        unsafe {
            isend(
                0x1000 as *mut c_void,
                buf.as_mut_ptr().cast(),
                1 << 20,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut req,
            )
        };
    };
    let mut call_modify = || {
        // SAFETY: buffers larger than the structs the stand-in and the probe read.
        unsafe {
            modify(
                qp.as_mut_ptr().cast(),
                attr.as_mut_ptr().cast(),
                ibv::MASK_STATE,
            )
        };
    };
    let n = 100_000;
    let isend_bare = per_call(n, &mut call_isend);
    let modify_bare = per_call(n, &mut call_modify);

    let mut probes = Probes::load(&Options {
        discover: false,
        tcp: false,
        nccl_data: true,
        libraries: vec![s.verbs.clone(), s.ncclnet.clone()],
        ..Options::default()
    })
    .expect("load the probes (root)");
    let mut ring = probes.take_events().expect("ring");
    let _stats = commscope_agent::transport::enable_run_time_stats().expect("BPF stats");
    let isend_probed = per_call(n, &mut call_isend);
    let events_before = std::iter::from_fn(|| ring.next().map(|_| ())).count();
    let modify_probed = per_call(n, &mut call_modify);
    let mut events = 0u64;
    while let Some(item) = ring.next() {
        events += u64::from(decode(&item).is_some());
    }
    probes.read_kernel_drops();
    // Loopback round trips with the tracepoints attached, against the same without them (a
    // second, TCP-only set of probes loaded and dropped in between), alternating, best of each.
    let (mut rtt_bare, mut rtt_probed) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        rtt_bare = rtt_bare.min(round_trips(10_000));
        let tcp = Probes::load(&Options {
            discover: false,
            ..Options::default()
        })
        .expect("load the TCP probes");
        rtt_probed = rtt_probed.min(round_trips(10_000));
        for (name, runs, ns) in tcp.program_stats() {
            if name == "tcp_probe" && runs > 0 {
                println!(
                    "tcp_probe program: {runs} runs, {:.0} ns per run (kernel run-time stats)",
                    ns as f64 / runs as f64
                );
            }
        }
    }
    for (name, runs, ns) in probes.program_stats() {
        if runs > 0 {
            println!(
                "{name}: {runs} runs, {:.0} ns per run inside the program",
                ns as f64 / runs as f64
            );
        }
    }

    println!(
        "uprobe (ncclIbIsend, map update): {:.0} ns per call bare, {:.0} ns probed: {:.2} us per hit",
        isend_bare,
        isend_probed,
        (isend_probed - isend_bare) / 1e3
    );
    println!(
        "uprobe + uretprobe with an event (ibv_modify_qp): {:.0} ns bare, {:.0} ns probed: {:.2} us per call; {} events read, {} lost (ring full) [{events_before} before]",
        modify_bare,
        modify_probed,
        (modify_probed - modify_bare) / 1e3,
        events,
        probes.status().kernel_drops[0]
    );
    println!(
        "TCP 64-byte round trip over loopback (best of 3 x 10,000): {:.1} us bare, {:.1} us with the tracepoints ({:+.2} us)",
        rtt_bare / 1e3,
        rtt_probed / 1e3,
        (rtt_probed - rtt_bare) / 1e3
    );

    // The agent's side: decode + apply.
    let ev = QpEvent {
        head: Head {
            kind: kind::QP_MODIFY,
            pid: 1,
            tid: 1,
            ..Head::default()
        },
        qp_num: 5,
        state: 3,
        attr_mask: ibv::MASK_STATE,
        ..QpEvent::default()
    };
    // SAFETY: the bytes of a plain repr(C) value.
    let bytes = unsafe {
        std::slice::from_raw_parts((&ev as *const QpEvent).cast::<u8>(), size_of::<QpEvent>())
    }
    .to_vec();
    let mut view = TransportView::default();
    let m = 1_000_000;
    let t = Instant::now();
    for _ in 0..m {
        if let Some(Event::Qp(e)) = decode(std::hint::black_box(&bytes)) {
            view.apply(&Event::Qp(e));
        }
    }
    let per_event = t.elapsed().as_nanos() as f64 / m as f64;
    println!(
        "agent: {per_event:.0} ns to decode and apply an event ({:.1} M events/s on one core)",
        1e3 / per_event
    );

    // Map reads with 200 live flows (their sockets opened while the TCP probes are loaded).
    let tcp = Probes::load(&Options {
        discover: false,
        ..Options::default()
    })
    .expect("load the TCP probes");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(addr).expect("connect");
        let (mut srv, _) = l.accept().expect("accept");
        c.write_all(b"hello").expect("write");
        let mut b = [0u8; 5];
        srv.read_exact(&mut b).expect("read");
        srv.write_all(b"world").expect("write");
        c.read_exact(&mut b).expect("read");
        conns.push((c, srv));
    }
    let mut flows = 0;
    let reads = 200;
    let t = Instant::now();
    for i in 0..reads {
        let read = tcp.read_flows();
        flows = read.len();
        view.update_flows(i * 1_000_000_000, &read);
        view.sweep();
    }
    let per_read = t.elapsed().as_secs_f64() / reads as f64;
    let t = Instant::now();
    let scans = 20;
    for _ in 0..scans {
        probes.discover(Path::new("/proc"));
    }
    let per_scan = t.elapsed().as_secs_f64() / f64::from(scans);
    let procs = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0);
    println!(
        "agent: {:.0} us per read of the flows map ({flows} flows), {:.1} ms per /proc scan ({procs} processes)",
        per_read * 1e6,
        per_scan * 1e3
    );
    let share = per_read + per_scan / 5.0 + 1000.0 * per_event / 1e9;
    println!(
        "agent CPU at one map read a second, one scan every 5 s and 1,000 events a second: {:.2} % of one core",
        share * 100.0
    );
    drop(probes);
    zero_touch();
}

/// `nccl_job 1 bench CALLS` on the no-op NCCL double: ns inside one `ncclAllReduce`.
fn allreduce_ns(dir: &Path, calls: u32) -> f64 {
    let o = std::process::Command::new(dir.join("nccl_job"))
        .args(["1", "bench", &calls.to_string()])
        .env("TESTDOUBLE_NCCL_NOOP", "1")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run nccl_job");
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find_map(|l| l.strip_prefix("allreduce: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("nccl_job bench printed no time: {out}"))
}

fn zero_touch() {
    use commscope_agent::zerotouch::Recorder;
    use commscope_ebpf_common::{NcclCallEvent, NcclInitEvent, nccl_api};

    let d = commscope_tests::nccl::doubles();
    let calls = 10_000;
    let bare = (0..3)
        .map(|_| allreduce_ns(&d, calls))
        .fold(f64::INFINITY, f64::min);
    let mut probes = Probes::load(&Options {
        discover: false,
        tcp: false,
        libraries: vec![d.join("libnccl.so.2")],
        ..Options::default()
    })
    .expect("load the NCCL API probes");
    let mut ring = probes.take_events().expect("ring");
    let mut probed = f64::INFINITY;
    let mut events = 0u64;
    for _ in 0..3 {
        probed = probed.min(allreduce_ns(&d, calls));
        while let Some(item) = ring.next() {
            events += u64::from(matches!(decode(&item), Some(Event::NcclCall(_))));
        }
    }
    probes.read_kernel_drops();
    println!(
        "zero-touch: ncclAllReduce (no-op double) {bare:.0} ns bare, {probed:.0} ns with the NCCL API probes: {:.2} us per call (uprobe + uretprobe); {events} call events read, {} lost (ring full)",
        (probed - bare) / 1e3,
        probes.status().kernel_drops[0]
    );

    // The agent: one process adopted from a fixture /proc, then a million calls recorded.
    let root = tempfile::tempdir().expect("tempdir");
    let pid = 4242u32;
    let pd = root.path().join(pid.to_string());
    std::fs::create_dir_all(pd.join("root/run/commscope")).expect("mkdir");
    std::fs::write(pd.join("environ"), b"RANK=0\0WORLD_SIZE=8\0").expect("environ");
    std::fs::write(
        pd.join("stat"),
        format!("{pid} (bench) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0"),
    )
    .expect("stat");
    std::fs::write(pd.join("maps"), "").expect("maps");
    let sock = root.path().join("agent.sock");
    std::fs::write(&sock, "").expect("socket stand-in");
    std::fs::hard_link(&sock, pd.join("root/run/commscope/agent.sock")).expect("link");
    let mut rec = Recorder::new(root.path(), "bench", &sock);
    let init = NcclInitEvent {
        head: Head {
            kind: kind::NCCL_INIT,
            pid,
            tid: pid,
            ..Head::default()
        },
        comm: 0xc0,
        nranks: 8,
        rank: 0,
        ..NcclInitEvent::default()
    };
    let reg = rec.init(&init).expect("adopted");
    let call = NcclCallEvent {
        head: Head {
            kind: kind::NCCL_CALL,
            pid,
            tid: pid,
            ..Head::default()
        },
        comm: 0xc0,
        count: 1 << 20,
        op: nccl_api::ALL_REDUCE,
        dtype: 7,
        peer: -1,
        ..NcclCallEvent::default()
    };
    // SAFETY: the bytes of a plain repr(C) value.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&call as *const NcclCallEvent).cast::<u8>(),
            size_of::<NcclCallEvent>(),
        )
    }
    .to_vec();
    let shm = reg.region.shm();
    let m = 1_000_000u64;
    let t = Instant::now();
    for i in 0..m {
        if let Some(Event::NcclCall(e)) = decode(std::hint::black_box(&bytes)) {
            rec.call(&e);
        }
        // The pump's reading, so the ring never fills.
        if i % 4096 == 0 {
            shm.advance(commscope_wire::shm::Consumer::Agent, shm.head());
        }
    }
    let per_call = t.elapsed().as_nanos() as f64 / m as f64;
    println!(
        "zero-touch agent: {per_call:.0} ns to decode and record one call ({:.1} M calls/s on one core; {} lost to a full ring); at 10,000 NCCL calls a second on the node: {:.2} % of one core",
        1e3 / per_call,
        rec.counts.ring_full,
        per_call * 10_000.0 / 1e9 * 100.0
    );
}
