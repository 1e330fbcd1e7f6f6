//! Golden fixtures: files written by format version 1 that every later version must still
//! decode to the same values. Written once with `COMMSCOPE_BLESS=1`; never regenerate a
//! released version's fixtures — add new ones beside them.

use std::path::{Path, PathBuf};

use commscope_wire::cst;
use commscope_wire::op::{Op, dtype, flags};
use commscope_wire::record::{Call, Comm, CommEvent, Heartbeat, Process, ProcessEvent, Record};
use commscope_wire::registration::{Reply, Request, Status};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

fn dir_v2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2")
}

fn header() -> cst::Header {
    cst::Header {
        version: 1,
        job: "golden-job".into(),
        node: "gpu-12".into(),
        pid: 4242,
        rank: 37,
        world_size: 256,
        start_time: 987_654,
        mono_anchor: 1_000_000_000,
        real_anchor: 1_764_633_600_000_000_000,
        library: "Open MPI v4.1.4".into(),
        flavour: "openmpi".into(),
        writer_version: "0.1.0".into(),
    }
}

fn records() -> Vec<Record> {
    let mut comm = Comm::new(
        CommEvent::Created,
        0x3f1a_2b3c_4d5e_6f70,
        0x7bbf_d4ee_4c3f_a5a1,
        1_000_000_100,
        37,
        5,
        8,
        0,
    );
    comm.rec_seq = 2;
    comm.set_name(b"TENSOR_MODEL_PARALLEL_GROUP");
    let call = Call {
        rec_seq: 3,
        op: Op::Allreduce as u8,
        flags: flags::IN_PLACE,
        status: 0,
        comm_id: 0x3f1a_2b3c_4d5e_6f70,
        seq: 41,
        op_seq: 40,
        bytes: 1 << 20,
        count: 1 << 18,
        peer: -1,
        tag: -1,
        t_enter: 1_000_500_000,
        t_exit: 1_000_900_000,
        gpu_start: 0,
        gpu_end: 0,
        rank: 37,
        comm_rank: 5,
        comm_size: 8,
        dtype: dtype::FLOAT,
        clock: 0,
        lib: 0,
        peer2: -1,
        tag2: -1,
        // Not in the fixtures: written before calls carried their reduction.
        red_op: commscope_wire::op::red_op::UNKNOWN,
        op_seq2: 0,
        sample_shift: 0,
    };
    let send = Call {
        rec_seq: 4,
        op: Op::Sendrecv as u8,
        flags: flags::ANY_SOURCE,
        seq: 42,
        op_seq: 3,
        bytes: 200,
        count: 200,
        peer: 6,
        tag: 40,
        dtype: dtype::CHAR,
        peer2: 4,
        tag2: 40,
        op_seq2: 2,
        ..call
    };
    vec![
        Record::Process(Process {
            rec_seq: 1,
            event: ProcessEvent::Start,
            t_mono: 1_000_000_000,
            t_real: 1_764_633_600_000_000_000,
            pid: 4242,
            exit_status: i32::MIN,
            start_time: 987_654,
            rank: 37,
            world_size: 256,
            flags: 0,
            signal: 0,
            step: 0,
        }),
        Record::Comm(comm),
        Record::Call(call),
        Record::Call(send),
        Record::Enter(Call {
            rec_seq: 5,
            seq: 43,
            op_seq: 41,
            t_exit: 0,
            ..call
        }),
        Record::Heartbeat(Heartbeat {
            rec_seq: 6,
            flags: flags::FINAL,
            t_mono: 2_000_000_000,
            t_real: 1_764_633_601_000_000_000,
            in_flight: 1,
            rank: 37,
            dropped_ring_full: 12,
            dropped_in_flight: 1,
            dropped_other: 2,
            produced: 6,
        }),
    ]
}

fn request() -> Request {
    Request {
        version: 1,
        layout_version: 1,
        pid: 4242,
        rank: 37,
        world_size: 256,
        start_time: 987_654,
        shm_size: 8_409_088,
        job: "golden-job".into(),
        node: "gpu-12".into(),
        flavour: "openmpi".into(),
    }
}

#[test]
fn version_1_fixtures_still_decode() {
    let trace = dir().join("trace.cst");
    let reg = dir().join("register-request.bin");
    let ack = dir().join("register-reply.bin");
    if std::env::var_os("COMMSCOPE_BLESS").is_some() && !trace.exists() {
        let raws: Vec<_> = records().iter().map(Record::encode).collect();
        let mut w = cst::Writer::new(Vec::new(), &header()).expect("header");
        w.append(&raws[..3]).expect("block");
        w.append(&raws[3..]).expect("block");
        std::fs::write(&trace, w.get_mut()).expect("write fixture");
        std::fs::write(&reg, request().encode()).expect("write fixture");
        std::fs::write(
            &ack,
            Reply {
                version: 1,
                status: Status::Accepted,
            }
            .encode(),
        )
        .expect("write fixture");
    }
    let t = cst::read_file(&trace).expect("the version 1 trace fixture decodes");
    assert_eq!(t.header, header());
    assert_eq!(t.records, records());
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let bytes = std::fs::read(&reg).expect("fixture");
    assert_eq!(Request::decode(&bytes), Ok(request()));
    let bytes = std::fs::read(&ack).expect("fixture");
    assert_eq!(
        Reply::decode(&bytes),
        Ok(Reply {
            version: 1,
            status: Status::Accepted
        })
    );
}

/// Version 2 files hold compact blocks; the same records must keep decoding from them.
#[test]
fn version_2_fixtures_still_decode() {
    let trace = dir_v2().join("trace.cst");
    if std::env::var_os("COMMSCOPE_BLESS").is_some() && !trace.exists() {
        std::fs::create_dir_all(dir_v2()).expect("fixture dir");
        let raws: Vec<_> = records().iter().map(Record::encode).collect();
        let mut w = cst::Writer::new(Vec::new(), &header()).expect("header");
        w.append(&raws[..3]).expect("block");
        w.append(&raws[3..]).expect("block");
        std::fs::write(&trace, w.get_mut()).expect("write fixture");
    }
    let bytes = std::fs::read(&trace).expect("the version 2 trace fixture exists");
    assert!(
        bytes.windows(4).any(|w| w == cst::COMPACT_MAGIC),
        "the fixture holds compact blocks"
    );
    let t = cst::read_file(&trace).expect("the version 2 trace fixture decodes");
    assert_eq!(
        t.header,
        cst::Header {
            version: 2,
            ..header()
        }
    );
    assert_eq!(t.records, records());
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

/// What later writers add in bytes earlier ones left unused reads back whole, and an earlier
/// record of the same kind reads as "not known" (the fixtures above): a call's reduction, and
/// how a process ended when it did not shut down cleanly.
#[test]
fn a_reduction_and_an_unclean_end_round_trip_through_a_trace_file() {
    let Record::Call(call) = &records()[2] else {
        panic!("the fixture's third record is a call")
    };
    let reducing = Call {
        red_op: commscope_wire::op::red_op::MAX,
        ..*call
    };
    let aborted = Record::Process(Process {
        rec_seq: 9,
        event: ProcessEvent::Exit,
        flags: flags::UNFINALIZED | flags::ABORTED,
        t_mono: 3_000_000_000,
        t_real: 1_764_633_602_000_000_000,
        pid: 4242,
        exit_status: 7,
        start_time: 987_654,
        rank: 37,
        world_size: 256,
        signal: 0,
        step: 0,
    });
    let written = vec![Record::Call(reducing), Record::Enter(reducing), aborted];
    let raws: Vec<_> = written.iter().map(Record::encode).collect();
    let mut w = cst::Writer::new(Vec::new(), &header()).expect("header");
    w.append(&raws).expect("block");
    let dir = tempfile_dir();
    let path = dir.join("trace.cst");
    std::fs::write(&path, w.get_mut()).expect("write");
    let t = cst::read_file(&path).expect("decodes");
    assert_eq!(t.records, written);
    // A send-receive keeps its receive tag in the same bytes.
    let Record::Call(sendrecv) = &records()[3] else {
        panic!("the fixture's fourth record is a send-receive")
    };
    let back = Record::decode(&Record::Call(*sendrecv).encode()).expect("decodes");
    assert_eq!(back, Record::Call(*sendrecv));
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("commscope-golden-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
