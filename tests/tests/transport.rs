//! The transport view's eBPF programs, on this kernel: they load and attach; the TCP
//! tracepoints see real traffic; every verbs and NCCL probe target resolves in the real
//! libibverbs and libnccl; and on stand-in libraries with the same versioned symbols, the
//! uprobes produce the expected events and queue-pair → peer map.
//!
//! Loading eBPF needs root (CI runs as root); without it the tests that load say so and stop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

use commscope_agent::transport::events::{Event, decode};
use commscope_agent::transport::plan::{self, Library};
use commscope_agent::transport::symbols::Symbols;
use commscope_agent::transport::{Options, Probes, TransportView};
use commscope_ebpf_common::{NetKey, kind, nccl_api, net, verbs_fn};
use commscope_tests::nccl::real_nccl_dir;
use commscope_tests::root;
use commscope_tests::transport::stand_ins;

fn only(opts: Options) -> Options {
    Options {
        discover: false,
        ..opts
    }
}

/// The real libibverbs the system loads.
fn real_verbs() -> PathBuf {
    let p = PathBuf::from("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert!(
        p.exists(),
        "{} is missing (scripts/setup.sh installs libibverbs1)",
        p.display()
    );
    std::fs::canonicalize(p).expect("canonicalize")
}

/// name@version → address, as `readelf` prints the dynamic symbols: an independent reading.
fn readelf_dynsyms(path: &Path) -> BTreeMap<String, u64> {
    let o = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(path)
        .output()
        .expect("readelf");
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 8
            && f[3] == "FUNC"
            && let Ok(a) = u64::from_str_radix(f[1], 16)
        {
            out.insert(f[7].to_owned(), a);
        }
    }
    out
}

#[test]
fn every_verbs_probe_target_resolves_at_its_default_version_in_the_real_libibverbs() {
    let path = real_verbs();
    let symbols = Symbols::read(&path).expect("read libibverbs");
    let p = plan::plan(&symbols);
    assert_eq!(p.library, Some(Library::Verbs));
    assert!(p.missing.is_empty(), "missing: {:?}", p.missing);
    let dynsyms = readelf_dynsyms(&path);
    let mut functions: Vec<&str> = p.targets.iter().map(|t| t.function).collect();
    functions.dedup();
    assert_eq!(
        functions,
        [
            "ibv_create_qp",
            "ibv_modify_qp",
            "ibv_destroy_qp",
            "ibv_reg_mr",
            "ibv_reg_mr_iova2",
            "ibv_reg_dmabuf_mr",
            "ibv_dereg_mr",
            "ibv_get_async_event"
        ]
    );
    for t in &p.targets {
        let version = t.version.as_deref().expect("versioned");
        let want = match t.function {
            "ibv_reg_mr_iova2" => "IBVERBS_1.8",
            "ibv_reg_dmabuf_mr" => "IBVERBS_1.12",
            _ => "IBVERBS_1.1",
        };
        assert_eq!(version, want, "{}", t.function);
        let default = dynsyms[&format!("{}@@{want}", t.function)];
        assert_eq!(t.offset, default, "{} is not at its @@ copy", t.function);
        // Where a 1.0 compatibility copy exists, it is elsewhere and not probed.
        if let Some(compat) = dynsyms.get(&format!("{}@IBVERBS_1.0", t.function)) {
            assert_ne!(*compat, t.offset);
        }
    }
}

#[test]
fn every_nccl_network_probe_target_resolves_in_the_real_libnccl() {
    let path = real_nccl_dir().join("libnccl.so.2");
    let symbols = Symbols::read(&path).expect("read libnccl");
    let p = plan::plan(&symbols);
    assert_eq!(p.library, Some(Library::Nccl));
    assert!(p.missing.is_empty(), "missing: {:?}", p.missing);
    let by_fn: BTreeMap<&str, Vec<&plan::Target>> =
        p.targets.iter().fold(BTreeMap::new(), |mut m, t| {
            m.entry(t.function).or_insert_with(Vec::new).push(t);
            m
        });
    // The network layer's 8 functions, and the API's 16 (zero-touch recording).
    assert_eq!(by_fn.len(), 24, "{:?}", by_fn.keys());
    let dynsyms = readelf_dynsyms(&path);
    for f in [
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclBcast",
        "ncclReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
        "ncclSend",
        "ncclRecv",
        "ncclCommInitRank",
        "ncclCommInitRankConfig",
    ] {
        let t = &by_fn[f];
        assert_eq!(t.len(), 2, "{f}: entry and return");
        // The exported function, the same code as its profiling twin (`pncclAllReduce`).
        assert_eq!(t[0].offset, dynsyms[f], "{f}");
        assert_eq!(t[0].offset, dynsyms[&format!("p{f}")], "{f}");
    }
    for f in ["ncclCommDestroy", "ncclCommAbort", "ncclCommFinalize"] {
        assert_eq!(by_fn[f].len(), 1, "{f}: entry only");
    }
    // The cookie says where each function keeps its communicator: ncclReduce's is argument
    // 6, on the stack.
    let comm_arg = |f: &str| nccl_api::arg(by_fn[f][0].cookie.expect("cookie"), 16);
    assert_eq!(comm_arg("ncclReduce"), 6);
    assert_eq!(comm_arg("ncclAllReduce"), 5);
    assert_eq!(comm_arg("ncclSend"), 4);
    // Addresses observed in the 2.32.3 wheel (`.text` has vaddr == file offset).
    assert_eq!(by_fn["ncclIbIsend"][0].offset, 0x1d49e0);
    assert_eq!(
        by_fn["ncclIbIsend"][0].symbol,
        "_Z11ncclIbIsendPvS_miS_S_PS_"
    );
    assert_eq!(by_fn["ncclIbIrecv"][0].offset, 0x1d55f0);
    assert_eq!(by_fn["ncclNetSocketIsend"][0].offset, 0x1af6d0);
    // Connect and accept write their comm through the argument the mangled name says.
    let out = |f: &str| net::out_arg(by_fn[f][0].cookie.expect("cookie"));
    assert_eq!(out("ncclIbConnect"), 3);
    assert_eq!(out("ncclIbAccept"), 1);
    for f in [
        "ncclIbConnect",
        "ncclIbAccept",
        "ncclNetSocketConnect",
        "ncclNetSocketAccept",
    ] {
        assert_eq!(by_fn[f].len(), 2, "{f}: entry and return");
    }
    // Never the pollers.
    assert!(!p.targets.iter().any(|t| t.symbol.contains("Test")));
}

#[test]
fn the_programs_load_attach_and_see_real_tcp_traffic() {
    if !root() {
        return;
    }
    let mut probes = Probes::load(&only(Options::default())).expect("load");
    let st = probes.status().clone();
    assert!(st.warnings.is_empty(), "warnings: {:?}", st.warnings);
    let attached: Vec<&str> = st.attached.iter().map(|a| a.target.as_str()).collect();
    assert_eq!(
        attached,
        [
            "tcp/tcp_probe",
            "tcp/tcp_retransmit_skb",
            "sock/inet_sock_set_state"
        ]
    );
    let mut ring = probes.take_events().expect("ring buffer");

    // 8 MiB one way, 1 MiB back, over loopback.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server_addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 8 << 20];
        s.read_exact(&mut buf).expect("read");
        s.write_all(&buf[..1 << 20]).expect("write");
    });
    let mut client = TcpStream::connect(server_addr).expect("connect");
    let client_addr = client.local_addr().expect("addr");
    client.write_all(&vec![7u8; 8 << 20]).expect("write");
    let mut back = vec![0u8; 1 << 20];
    client.read_exact(&mut back).expect("read");
    server.join().expect("server");
    drop(client);
    std::thread::sleep(std::time::Duration::from_millis(200));

    let mut view = TransportView::default();
    view.update_flows(1, &probes.read_flows());
    let find = |local, remote| {
        view.flows
            .values()
            .find(|f| f.local == local && f.remote == remote)
            .unwrap_or_else(|| panic!("no flow {local} → {remote}: {:?}", view.flows))
            .clone()
    };
    let c = find(client_addr, server_addr);
    let s = find(server_addr, client_addr);
    // The client's 8 MiB were acknowledged, and it received 1 MiB (payload only, so exact).
    // Acknowledged bytes also count the SYN and the FIN.
    assert!(
        (8 << 20..=(8 << 20) + 2).contains(&c.totals.bytes_acked),
        "{c:?}"
    );
    // `tcp_sock`'s counters are sequence space: the peer's FIN counts one.
    assert!(
        (1 << 20..=(1 << 20) + 1).contains(&c.totals.bytes_received),
        "{c:?}"
    );
    assert!(
        (8 << 20..=(8 << 20) + 1).contains(&s.totals.bytes_received),
        "{s:?}"
    );
    assert!(c.totals.srtt_samples > 0 && s.totals.segs_in > 0);

    // The state changes of this connection, both ends.
    let mut states = Vec::new();
    while let Some(item) = ring.next() {
        if let Some(Event::TcpState(e)) = decode(&item) {
            let ports = (e.sport, e.dport);
            if ports == (client_addr.port(), server_addr.port())
                || ports == (server_addr.port(), client_addr.port())
            {
                states.push((e.sport == client_addr.port(), e.oldstate, e.newstate));
            }
        }
    }
    // The client reached ESTABLISHED from SYN_SENT and left it; the server reached it from
    // SYN_RECV; both ends closed. (The move to SYN_SENT comes before the client's port is
    // chosen, so it is not matched here.)
    let (client, server): (Vec<_>, Vec<_>) = states.iter().partition(|s| s.0);
    assert!(client.contains(&&(true, 2, 1)), "{states:?}");
    assert!(client.iter().any(|s| s.1 == 1 && s.2 != 1), "{states:?}");
    assert!(server.contains(&&(false, 3, 1)), "{states:?}");
    assert!(
        client.iter().any(|s| s.2 == 7) && server.iter().any(|s| s.2 == 7),
        "{states:?}"
    );
}

#[test]
fn the_stand_in_libraries_produce_the_expected_events_and_queue_pair_peers() {
    if !root() {
        return;
    }
    let s = stand_ins();
    let mut probes = Probes::load(&only(Options {
        tcp: false,
        nccl_data: true,
        libraries: vec![s.verbs.clone(), s.ncclnet.clone()],
        ..Options::default()
    }))
    .expect("load");
    let st = probes.status().clone();
    assert!(st.warnings.is_empty(), "warnings: {:?}", st.warnings);
    // 8 verbs functions (6 with a return probe), 4 NCCL data functions… of which the stand-in
    // has the InfiniBand half: isend, irecv, connect and accept (2 each).
    assert_eq!(st.attached.len(), 14 + 6, "{:#?}", st.attached);
    let missing: Vec<&String> = st.libraries.iter().flat_map(|l| &l.1).collect();
    assert_eq!(
        missing,
        [
            "ncclNetSocketIsend",
            "ncclNetSocketIrecv",
            "ncclNetSocketConnect",
            "ncclNetSocketAccept"
        ]
    );
    let mut ring = probes.take_events().expect("ring buffer");

    let out = Command::new(&s.driver)
        .arg(&s.verbs)
        .arg(&s.ncclnet)
        .output()
        .expect("run driver");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let f: Vec<&str> = line.split_whitespace().collect();
    let pid: u32 = f[1].parse().expect("pid");
    let ptr = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("ptr");
    let (send_comm, recv_comm) = (ptr(f[3]), ptr(f[5]));

    let mut view = TransportView::default();
    let mut kinds: BTreeMap<u32, u32> = BTreeMap::new();
    let mut mr = Vec::new();
    while let Some(item) = ring.next() {
        let ev = decode(&item).expect("decodable");
        let head = match &ev {
            Event::Qp(e) => e.head,
            Event::Mr(e) => {
                mr.push(*e);
                e.head
            }
            Event::Async(e) => e.head,
            Event::Conn(e) => e.head,
            Event::TcpState(e) => e.head,
            Event::NcclInit(e) => e.head,
            Event::NcclCall(e) => e.head,
        };
        assert_eq!(head.pid, pid, "an event from another process: {ev:?}");
        *kinds.entry(head.kind).or_default() += 1;
        view.apply(&ev);
    }
    view.update_conns(1, &probes.read_conns());

    // Exactly what the driver did: 4 queue pairs created; 3 + 1 modifies on the first, 2 on
    // each NCCL one (the IBVERBS_1.0 call is not seen); 1 destroyed; 2 registrations (the
    // nested iova2 call inside ibv_reg_mr counted once) and 2 deregistrations; 2 async
    // events; 2 connections.
    let want: BTreeMap<u32, u32> = [
        (kind::QP_CREATE, 4),
        (kind::QP_MODIFY, 8),
        (kind::QP_DESTROY, 1),
        (kind::MR_REG, 2),
        (kind::MR_DEREG, 2),
        (kind::ASYNC_EVENT, 2),
        (kind::NET_CONN, 2),
    ]
    .into();
    assert_eq!(kinds, want);

    // Registrations: sizes, which function, and the stand-in's 2 ms of pinning.
    let regs: Vec<(u32, u64)> = mr
        .iter()
        .filter(|e| e.head.kind == kind::MR_REG)
        .map(|e| (e.func, e.length))
        .collect();
    assert_eq!(
        regs,
        [
            (verbs_fn::REG_MR, 1 << 20),
            (verbs_fn::REG_MR_IOVA2, 3 << 20)
        ]
    );
    assert!(
        mr.iter()
            .filter(|e| e.head.kind == kind::MR_REG)
            .all(|e| e.latency_ns >= 2_000_000 && e.mr != 0)
    );

    // The queue-pair → peer map.
    let peers: Vec<(String, u32, String)> = view
        .qp_peers()
        .into_iter()
        .map(|(_, dev, qp, p)| (dev, qp, p.describe()))
        .collect();
    assert_eq!(
        peers,
        [
            (
                "standin_0".to_owned(),
                0x100,
                "10.7.0.2 QP 0x4242".to_owned()
            ),
            (
                "standin_0".to_owned(),
                0x102,
                "10.7.0.3 QP 0x5151".to_owned()
            ),
            (
                "standin_0".to_owned(),
                0x103,
                "10.7.0.4 QP 0x6161".to_owned()
            ),
        ]
    );

    // NCCL's connections, joined to their queue pairs, with the bytes posted on them.
    let send = &view.conns[&NetKey {
        pid,
        side: net::SEND,
        comm: send_comm,
    }];
    assert_eq!(send.qps, [0x102]);
    assert_eq!((send.totals.bytes, send.totals.requests), (10 << 20, 10));
    assert_eq!(send.transport, net::IB);
    let recv = &view.conns[&NetKey {
        pid,
        side: net::RECV,
        comm: recv_comm,
    }];
    assert_eq!(recv.qps, [0x103]);
    assert_eq!((recv.totals.bytes, recv.totals.requests), (5 << 19, 5));
    assert_eq!(view.conns.len(), 2);

    // As a link in the records: from this node's port (its GID at the index the queue pair
    // uses, read from a sysfs tree) to the peer's, with the bytes posted.
    let sysfs = tempfile::tempdir().expect("tempdir");
    let gids = sysfs.path().join("class/infiniband/standin_0/ports/1/gids");
    std::fs::create_dir_all(&gids).expect("mkdir");
    std::fs::write(gids.join("0"), "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n").expect("gid");
    std::fs::write(gids.join("3"), "0000:0000:0000:0000:0000:ffff:0a07:0001\n").expect("gid");
    let recs = view.rdma_records(
        2,
        |p| (p == pid).then_some(0),
        |dev, port, gid| {
            commscope_agent::nic::port_gid(sysfs.path(), dev, port, gid.expect("a global address"))
        },
    );
    assert_eq!(recs.len(), 1, "the send connection: {recs:?}");
    let r = recs[0].1;
    assert_eq!(
        (
            r.local_addr().ip().to_string(),
            r.remote_addr().ip().to_string(),
            r.bytes_sent,
            r.rank,
            r.iface_name()
        ),
        (
            "10.7.0.1".to_owned(),
            "10.7.0.3".to_owned(),
            10 << 20,
            0,
            Some("standin_0:1".to_owned())
        )
    );

    // Link errors: the port, the fatal QP event, the first queue pair's move to ERROR.
    let errors: Vec<&str> = view.link_errors.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(
        errors,
        [
            "IBV_EVENT_PORT_ERR on port 1",
            "IBV_EVENT_QP_FATAL on QP 0x101",
            "QP 0x100 moved from RTS to ERROR (peer 10.7.0.2 QP 0x4242)"
        ]
    );
    // As `link_event` records of the driver's rank, and through the detector: one link-error
    // for the NIC, naming the queue pair's peer.
    use commscope_wire::record::link_event;
    let recs = view.take_link_errors(|p| (p == pid).then_some(3));
    let events: Vec<(u32, u8, i32)> = recs.iter().map(|(p, e)| (*p, e.event, e.rank)).collect();
    assert_eq!(
        events,
        [
            (pid, link_event::PORT_ERROR, 3),
            (pid, link_event::FATAL, 3),
            (pid, link_event::QP_ERROR, 3)
        ]
    );
    let qp = recs[2].1;
    assert_eq!((qp.qp_num, qp.peer_qp), (0x100, 0x4242));
    assert_eq!(qp.peer_addr(), Some("10.7.0.2".parse().expect("ip")));
    let mut det = commscope_analyzer::link_errors::LinkErrors::default();
    for (i, (_, e)) in recs.iter().enumerate() {
        // The agent's queue numbers them (rec_seq 0 is an empty slot).
        let numbered = commscope_wire::record::LinkEvent {
            rec_seq: i as u64 + 1,
            ..*e
        };
        let e = commscope_wire::record::Record::decode(
            &commscope_wire::record::Record::LinkEvent(numbered).encode(),
        );
        let Ok(commscope_wire::record::Record::LinkEvent(e)) = e else {
            panic!("a link_event that does not round-trip: {e:?}");
        };
        det.record("n1", &e, 10.0);
    }
    let mut found = Vec::new();
    det.findings("j", 11.0, |_| None, &mut found);
    assert_eq!(found.len(), 1, "{found:#?}");
    let l = found[0].link.as_ref().expect("link");
    assert_eq!((l.src.as_str(), l.dst.as_str()), ("n1", "10.7.0.2"));
    assert_eq!(found[0].evidence["ranks"], serde_json::json!([3]));
    eprintln!("stand-in link-error: {}", found[0].summary);
    probes.read_kernel_drops();
    assert_eq!(probes.status().kernel_drops, [0, 0, 0]);
}

#[test]
fn the_checked_in_object_matches_its_sources_and_toolchain_pin() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-ebpf.sh");
    let o = Command::new(&script)
        .arg("--check")
        .output()
        .expect("run build-ebpf.sh");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_fresh_build_of_the_programs_has_the_checked_in_objects_programs_and_maps() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-ebpf.sh");
    let o = Command::new(&script)
        .arg("--rebuild-check")
        .output()
        .expect("run build-ebpf.sh");
    assert!(
        o.status.success(),
        "{}{}(scripts/setup.sh installs the eBPF toolchain)",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The libibverbs offsets the probes read, against the installed `infiniband/verbs.h`.
#[test]
fn the_verbs_abi_offsets_match_the_installed_header() {
    use commscope_ebpf_common::ibv;
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("offsets.c");
    std::fs::write(
        &src,
        r#"#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %d %d %d %d\n",
    offsetof(struct ibv_qp, context), offsetof(struct ibv_qp, qp_num),
    offsetof(struct ibv_qp, qp_type), offsetof(struct ibv_context, device),
    offsetof(struct ibv_device, name), offsetof(struct ibv_qp_attr, qp_state),
    offsetof(struct ibv_qp_attr, dest_qp_num), offsetof(struct ibv_qp_attr, ah_attr.grh.dgid),
    offsetof(struct ibv_qp_attr, ah_attr.dlid), offsetof(struct ibv_qp_attr, ah_attr.is_global),
    offsetof(struct ibv_qp_attr, ah_attr.port_num), offsetof(struct ibv_mr, addr),
    offsetof(struct ibv_mr, length), offsetof(struct ibv_async_event, event_type),
    offsetof(struct ibv_qp_attr, ah_attr.grh.sgid_index),
    IBV_QP_STATE, IBV_QP_AV, IBV_QP_DEST_QPN, IBV_QPS_ERR);
  return 0;
}
"#,
    )
    .expect("write");
    let bin = dir.path().join("offsets");
    let o = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = Command::new(&bin).output().expect("run");
    let got: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|v| v.parse().expect("number"))
        .collect();
    let want: Vec<i64> = [
        ibv::QP_CONTEXT,
        ibv::QP_QP_NUM,
        ibv::QP_QP_TYPE,
        ibv::CONTEXT_DEVICE,
        ibv::DEVICE_NAME,
        ibv::ATTR_QP_STATE,
        ibv::ATTR_DEST_QP_NUM,
        ibv::ATTR_AH_DGID,
        ibv::ATTR_AH_DLID,
        ibv::ATTR_AH_IS_GLOBAL,
        ibv::ATTR_AH_PORT_NUM,
        ibv::MR_ADDR,
        ibv::MR_LENGTH,
        ibv::ASYNC_EVENT_TYPE,
        ibv::ATTR_AH_SGID_INDEX,
    ]
    .iter()
    .map(|&v| v as i64)
    .chain(
        [
            ibv::MASK_STATE,
            ibv::MASK_AV,
            ibv::MASK_DEST_QPN,
            ibv::QPS_ERR,
        ]
        .iter()
        .map(|&v| i64::from(v)),
    )
    .collect();
    assert_eq!(got, want);
}

/// An agent that may not load eBPF (an unprivileged user here) keeps working: one clear
/// warning in its log, and the metrics say the transport view is off and why-count.
#[test]
fn an_agent_without_the_privilege_for_ebpf_warns_once_and_keeps_working() {
    use commscope_tests::services::{Service, free_port, http_get};
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("mkdir");
    for p in [dir.path(), run.as_path()] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
    }
    let port = free_port();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(commscope_tests::commscope_bin())
        .arg("agent")
        .arg("--trace-dir")
        .arg(dir.path().join("traces"))
        .arg("--socket")
        .arg(run.join("agent.sock"))
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .arg("--http")
        .arg(format!("127.0.0.1:{port}"))
        .env("COMMSCOPE_SYSFS_ROOT", "off");
    let mut agent = Service::spawn(cmd, "agent");
    agent.wait_log("transport view off", std::time::Duration::from_secs(20));
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let metrics =
        commscope_tests::wait("agent metrics", std::time::Duration::from_secs(10), || {
            let (code, text) = http_get(addr, "/metrics");
            (code == 200 && text.contains("commscope_agent_ebpf_loaded")).then_some(text)
        });
    agent.stop();
    let log = agent.log();
    // (Other parts warn too when unprivileged, e.g. about process exit statuses.)
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && (l.contains("eBPF") || l.contains("transport view")))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("the eBPF programs could not be loaded")
            && warnings[0].contains("Operation not permitted"),
        "{log}"
    );
    for line in [
        "commscope_agent_ebpf_loaded{node=",
        "commscope_agent_ebpf_warnings{node=",
        "commscope_agent_ebpf_probes_attached{node=",
    ] {
        let v = metrics
            .lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line} in\n{metrics}"));
        let want = if line.contains("warnings") {
            " 1"
        } else {
            " 0"
        };
        assert!(v.ends_with(want), "{v}");
    }
}

/// Without the kernel's BTF the TCP view still runs, summing segments instead of reading
/// `tcp_sock`'s counters, with one warning that says so; a library that is not there is one
/// warning too, and nothing else is lost.
#[test]
fn without_btf_or_a_library_the_probes_warn_once_each_and_keep_working() {
    if !root() {
        return;
    }
    let mut probes = Probes::load(&only(Options {
        btf: PathBuf::from("/nonexistent/vmlinux"),
        libraries: vec![PathBuf::from("/nonexistent/libibverbs.so.1")],
        ..Options::default()
    }))
    .expect("load");
    let st = probes.status().clone();
    assert_eq!(st.warnings.len(), 2, "{:#?}", st.warnings);
    assert!(
        st.warnings[0].starts_with("no kernel BTF (/nonexistent/vmlinux: No such file")
            && st.warnings[0].contains("summed from segment lengths"),
        "{}",
        st.warnings[0]
    );
    assert!(
        st.warnings[1].starts_with("/nonexistent/libibverbs.so.1: No such file"),
        "{}",
        st.warnings[1]
    );
    assert_eq!(st.attached.len(), 3, "{:#?}", st.attached);

    // 1 MiB each way in 16 KiB writes: segments small enough for the 16-bit `data_len`.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server_addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        s.read_exact(&mut buf).expect("read");
    });
    let mut client = TcpStream::connect(server_addr).expect("connect");
    let client_addr = client.local_addr().expect("addr");
    for _ in 0..64 {
        client.write_all(&[1u8; 16 << 10]).expect("write");
    }
    server.join().expect("server");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let flows = probes.read_flows();
    let flow = |sport: u16, dport: u16| {
        *flows
            .iter()
            .map(|(_, f)| f)
            .find(|f| f.sport == sport && f.dport == dport)
            .unwrap_or_else(|| panic!("no flow {sport} → {dport}: {flows:?}"))
    };
    let c = flow(client_addr.port(), server_addr.port());
    let s = flow(server_addr.port(), client_addr.port());
    // Sent bytes from the advance of `snd_una`: all but what the first acknowledgement
    // covered (it precedes the flow's first sample).
    assert!(
        ((1 << 20) - (128 << 10)..=1 << 20).contains(&c.bytes_acked),
        "{c:?}"
    );
    // Received bytes from `data_len`, which coalesced 64 KiB segments overflow (what the
    // warning says): some, never more than was sent.
    assert!(
        s.segs_in > 0 && s.bytes_received > 0 && s.bytes_received <= 1 << 20,
        "{s:?}"
    );
    let _ = probes.take_events();
}

/// Zero-touch: a process in a mount namespace of its own (as in a container) maps libraries
/// at a path only it sees; the agent's `/proc` scan finds them through `/proc/<pid>/root` and
/// probes them, and the process's calls produce events — no preload, no registration.
#[test]
fn libraries_of_a_process_in_its_own_mount_namespace_are_found_and_probed() {
    if !root() {
        return;
    }
    let s = stand_ins();
    let dir = tempfile::tempdir().expect("tempdir");
    let private = dir.path().join("private");
    std::fs::create_dir_all(&private).expect("mkdir");
    let go = dir.path().join("go");
    // Inside: a tmpfs over `private` (invisible outside), holding the stand-ins under the
    // names the scan looks for.
    let script = format!(
        "mount -t tmpfs commscope-test {p} && cp {v} {p}/libibverbs.so.1 && cp {n} {p}/libnccl.so.2 && exec {d} {p}/libibverbs.so.1 {p}/libnccl.so.2",
        p = private.display(),
        v = s.verbs.display(),
        n = s.ncclnet.display(),
        d = s.driver.display()
    );
    let mut probes = Probes::load(&Options {
        tcp: false,
        discover: false,
        nccl_data: true,
        ..Options::default()
    })
    .expect("load");
    let mut ring = probes.take_events().expect("ring");
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c", &script])
        .env("TRANSPORT_DRIVER_WAIT", &go)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let pid = child.id();
    assert!(
        !private.join("libibverbs.so.1").exists(),
        "the private mount is visible outside"
    );
    let found = commscope_tests::wait(
        "the scan to find both libraries",
        std::time::Duration::from_secs(30),
        || {
            probes.discover(Path::new("/proc"));
            let libs: Vec<String> = probes
                .status()
                .libraries
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            (libs.len() == 2).then_some(libs)
        },
    );
    for l in &found {
        assert!(
            l.starts_with(&format!("/proc/{pid}/root/")),
            "{l} is not reached through the process's root"
        );
    }
    assert!(
        probes.status().warnings.is_empty(),
        "{:?}",
        probes.status().warnings
    );
    std::fs::write(&go, b"").expect("go");
    let out = child.wait_with_output().expect("driver");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut kinds: BTreeMap<u32, u32> = BTreeMap::new();
    while let Some(item) = ring.next() {
        let ev = decode(&item).expect("decodable");
        let head = match &ev {
            Event::Qp(e) => e.head,
            Event::Mr(e) => e.head,
            Event::Async(e) => e.head,
            Event::Conn(e) => e.head,
            Event::TcpState(e) => e.head,
            Event::NcclInit(e) => e.head,
            Event::NcclCall(e) => e.head,
        };
        assert_eq!(head.pid, pid, "{ev:?}");
        *kinds.entry(head.kind).or_default() += 1;
    }
    assert_eq!(kinds.get(&kind::QP_CREATE), Some(&4), "{kinds:?}");
    assert_eq!(kinds.get(&kind::NET_CONN), Some(&2), "{kinds:?}");
    let conns = probes.read_conns();
    assert_eq!(conns.len(), 2, "{conns:?}");
    assert!(conns.iter().all(|(k, _)| k.pid == pid));
}
