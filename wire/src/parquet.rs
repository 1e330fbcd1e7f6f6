//! The job trace as Parquet: one table, one row per record, a `kind` column telling which
//! columns apply. The schema is documented in `docs/trace-format.md`; columns are only ever
//! added (readers ignore columns they do not know and tolerate missing nullable ones).

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{
    Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::cst::Header;
use crate::hash::format_comm_id;
use crate::op::{Clock, Op, dtype, red_op};
use crate::record::{Call, Comm, CommEvent, Heartbeat, Process, ProcessEvent, Record};

/// The schema version written into the file's key-value metadata (`commscope.schema`).
pub const SCHEMA_VERSION: u32 = 1;
/// Rows per record batch / row group chunk.
const BATCH_ROWS: usize = 64 * 1024;

/// Why a Parquet trace could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// File I/O failed.
    #[error("failed to access {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The Parquet library failed.
    #[error("failed to process Parquet file {path}: {source}")]
    Parquet {
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// Arrow failed.
    #[error("failed to process Parquet file {path}: {source}")]
    Arrow {
        path: String,
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// The file is Parquet but not a commscope trace (a required column is missing or mistyped).
    #[error("{path} is not a commscope Parquet trace: {reason}")]
    NotATrace { path: String, reason: String },
    /// Written by a newer commscope.
    #[error(
        "{path} has Parquet trace schema version {found}, newer than the supported version {SCHEMA_VERSION}; upgrade commscope to read it"
    )]
    NewerVersion { path: String, found: u32 },
}

impl Error {
    /// What is wrong, without the file's name (for a line that names it already).
    pub fn reason(&self) -> String {
        match self {
            Error::Io { source, .. } => source.to_string(),
            Error::Parquet { source, .. } => source.to_string(),
            Error::Arrow { source, .. } => source.to_string(),
            Error::NotATrace { reason, .. } => format!("not a commscope Parquet trace: {reason}"),
            Error::NewerVersion { .. } => self.to_string(),
        }
    }
}

/// One process's records with its identity.
#[derive(Clone, Debug, Default)]
pub struct ProcessTrace {
    pub header: Header,
    pub records: Vec<Record>,
    /// How the process's host clock relates to the collector's, when a collector measured it.
    pub clock: Option<ClockAlignment>,
    /// Some of its records were lost to damage in a file (a corrupt page): where its records
    /// stop says nothing about where the process stopped.
    pub cut_short: bool,
}

/// The collector's estimate of a host's clock: `collector time = host CLOCK_REALTIME +
/// offset_ns`, within `± error_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockAlignment {
    pub offset_ns: i64,
    pub error_ns: u64,
}

fn u64f(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::UInt64, nullable)
}
fn i32f(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Int32, nullable)
}
fn strf(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

/// The table's schema.
pub fn schema() -> SchemaRef {
    let fields = vec![
        // identity of the recording process
        strf("job", false),
        strf("node", false),
        Field::new("pid", DataType::UInt32, false),
        u64f("process_start", false),
        i32f("rank", false),
        i32f("world_size", false),
        strf("flavour", false),
        u64f("mono_anchor_ns", false),
        u64f("real_anchor_ns", false),
        // every record
        u64f("rec_seq", false),
        strf("kind", false),
        Field::new("flags", DataType::UInt32, false),
        // call / enter
        strf("op", true),
        i32f("status", true),
        u64f("comm_id", true),
        strf("comm", true),
        u64f("seq", true),
        u64f("op_seq", true),
        u64f("bytes", true),
        u64f("count", true),
        strf("dtype", true),
        strf("red_op", true),
        i32f("peer", true),
        i32f("tag", true),
        i32f("peer2", true),
        i32f("tag2", true),
        u64f("op_seq2", true),
        u64f("t_enter_ns", true),
        u64f("t_exit_ns", true),
        u64f("gpu_start_ns", true),
        u64f("gpu_end_ns", true),
        strf("clock", true),
        strf("library", true),
        Field::new("offset_ns", DataType::Int64, true),
        u64f("error_ns", true),
        i32f("comm_rank", true),
        i32f("comm_size", true),
        // comm
        strf("event", true),
        u64f("parent_comm_id", true),
        strf("comm_name", true),
        i32f("remote_size", true),
        i32f("device", true),
        // heartbeat / process / comm time
        u64f("t_ns", true),
        u64f("t_real_ns", true),
        Field::new("in_flight", DataType::UInt32, true),
        u64f("dropped_ring_full", true),
        u64f("dropped_in_flight", true),
        u64f("dropped_other", true),
        u64f("produced", true),
        i32f("exit_status", true),
        i32f("signal", true),
        u64f("step", true),
        // consistent sampling: call (its weight) and skip
        Field::new("sample_modulus", DataType::UInt32, true),
        // skip
        u64f("skip_calls", true),
        u64f("skip_first_seq", true),
        u64f("skip_inside_ns", true),
        u64f("skip_from_rec_seq", true),
        u64f("skip_through_rec_seq", true),
        // link
        i32f("channels", true),
        Field::new("steps", DataType::UInt32, true),
        u64f("link_net_ns", true),
        u64f("link_gpu_wait_ns", true),
        u64f("link_peer_wait_ns", true),
        u64f("link_xfer_bytes", true),
        Field::new("link_steps_done", DataType::UInt32, true),
        // flow (the agent's transport view)
        strf("flow_transport", true),
        strf("flow_local", true),
        strf("flow_remote", true),
        u64f("flow_bytes_sent", true),
        u64f("flow_bytes_received", true),
        u64f("flow_busy_ns", true),
        Field::new("flow_retransmits", DataType::UInt32, true),
        Field::new("flow_srtt_us", DataType::UInt32, true),
        Field::new("flow_cwnd", DataType::UInt32, true),
        i32f("flow_rank", true),
        Field::new("flow_pid", DataType::UInt32, true),
        strf("flow_iface", true),
        // link_event (the agent's transport view and NIC counters)
        strf("link_event", true),
        strf("link_event_device", true),
        strf("link_event_what", true),
        Field::new("link_event_port", DataType::UInt32, true),
        Field::new("link_event_qp", DataType::UInt32, true),
        Field::new("link_event_peer_qp", DataType::UInt32, true),
        strf("link_event_peer", true),
        u64f("link_event_count", true),
        i32f("link_event_rank", true),
        Field::new("link_event_pid", DataType::UInt32, true),
    ];
    let mut md = std::collections::HashMap::new();
    md.insert("commscope.schema".to_owned(), SCHEMA_VERSION.to_string());
    Arc::new(Schema::new_with_metadata(fields, md))
}

#[derive(Default)]
struct Columns {
    job: StringBuilder,
    node: StringBuilder,
    pid: UInt32Builder,
    process_start: UInt64Builder,
    rank: Int32Builder,
    world_size: Int32Builder,
    flavour: StringBuilder,
    mono_anchor: UInt64Builder,
    real_anchor: UInt64Builder,
    rec_seq: UInt64Builder,
    kind: StringBuilder,
    flags: UInt32Builder,
    op: StringBuilder,
    status: Int32Builder,
    comm_id: UInt64Builder,
    comm: StringBuilder,
    seq: UInt64Builder,
    op_seq: UInt64Builder,
    bytes: UInt64Builder,
    count: UInt64Builder,
    dtype: StringBuilder,
    red_op: StringBuilder,
    peer: Int32Builder,
    tag: Int32Builder,
    peer2: Int32Builder,
    tag2: Int32Builder,
    op_seq2: UInt64Builder,
    t_enter: UInt64Builder,
    t_exit: UInt64Builder,
    gpu_start: UInt64Builder,
    gpu_end: UInt64Builder,
    clock: StringBuilder,
    library: StringBuilder,
    offset: Int64Builder,
    error: UInt64Builder,
    comm_rank: Int32Builder,
    comm_size: Int32Builder,
    event: StringBuilder,
    parent: UInt64Builder,
    comm_name: StringBuilder,
    remote_size: Int32Builder,
    device: Int32Builder,
    t: UInt64Builder,
    t_real: UInt64Builder,
    in_flight: UInt32Builder,
    dropped_ring_full: UInt64Builder,
    dropped_in_flight: UInt64Builder,
    dropped_other: UInt64Builder,
    produced: UInt64Builder,
    exit_status: Int32Builder,
    signal: Int32Builder,
    step: UInt64Builder,
    sample_modulus: UInt32Builder,
    skip_calls: UInt64Builder,
    skip_first_seq: UInt64Builder,
    skip_inside_ns: UInt64Builder,
    skip_from_rec_seq: UInt64Builder,
    skip_through_rec_seq: UInt64Builder,
    channel: Int32Builder,
    steps: UInt32Builder,
    link_net_ns: UInt64Builder,
    link_gpu_wait_ns: UInt64Builder,
    link_peer_wait_ns: UInt64Builder,
    link_xfer_bytes: UInt64Builder,
    link_steps_done: UInt32Builder,
    flow_transport: StringBuilder,
    flow_local: StringBuilder,
    flow_remote: StringBuilder,
    flow_bytes_sent: UInt64Builder,
    flow_bytes_received: UInt64Builder,
    flow_busy_ns: UInt64Builder,
    flow_retransmits: UInt32Builder,
    flow_srtt_us: UInt32Builder,
    flow_cwnd: UInt32Builder,
    flow_rank: Int32Builder,
    flow_pid: UInt32Builder,
    flow_iface: StringBuilder,
    link_event: StringBuilder,
    link_event_device: StringBuilder,
    link_event_what: StringBuilder,
    link_event_port: UInt32Builder,
    link_event_qp: UInt32Builder,
    link_event_peer_qp: UInt32Builder,
    link_event_peer: StringBuilder,
    link_event_count: UInt64Builder,
    link_event_rank: Int32Builder,
    link_event_pid: UInt32Builder,
    rows: usize,
    /// The last communicator id and its printed form (rows of a process mostly repeat it).
    comm_text: (u64, String),
}

impl Columns {
    fn push(&mut self, h: &Header, clock: Option<ClockAlignment>, r: &Record) {
        self.rows += 1;
        self.job.append_value(&h.job);
        self.node.append_value(&h.node);
        self.pid.append_value(h.pid);
        self.process_start.append_value(h.start_time);
        self.rank.append_value(h.rank);
        self.world_size.append_value(h.world_size);
        self.flavour.append_value(&h.flavour);
        self.mono_anchor.append_value(h.mono_anchor);
        self.real_anchor.append_value(h.real_anchor);
        self.rec_seq.append_value(r.rec_seq());
        self.kind.append_value(r.kind_name());
        let call = match r {
            Record::Call(c) | Record::Enter(c) => Some(c),
            _ => None,
        };
        let comm = if let Record::Comm(c) = r {
            Some(c)
        } else {
            None
        };
        let hb = if let Record::Heartbeat(b) = r {
            Some(b)
        } else {
            None
        };
        let pr = if let Record::Process(p) = r {
            Some(p)
        } else {
            None
        };
        let skip = if let Record::Skip(k) = r {
            Some(k)
        } else {
            None
        };
        let link = if let Record::Link(l) = r {
            Some(l)
        } else {
            None
        };
        let flow = if let Record::Flow(f) = r {
            Some(f)
        } else {
            None
        };
        let le = if let Record::LinkEvent(e) = r {
            Some(e)
        } else {
            None
        };
        let flags = match r {
            Record::Call(c) | Record::Enter(c) => c.flags,
            Record::Comm(c) => c.flags,
            Record::Heartbeat(b) => b.flags,
            Record::Process(p) => p.flags,
            Record::Skip(k) => k.flags,
            Record::Link(l) => l.flags,
            Record::Flow(f) => f.flags,
            Record::LinkEvent(e) => e.flags,
        };
        self.flags.append_value(u32::from(flags));
        self.op.append_option(
            call.map(|c| c.op().name())
                .or(skip.map(|k| k.op().name()))
                .or(link.map(|l| Op::from_code(l.op).name())),
        );
        self.status.append_option(
            call.map(|c| c.status).or(comm
                .filter(|c| c.event == CommEvent::Failed)
                .map(|c| c.status)),
        );
        let comm_id = call
            .map(|c| c.comm_id)
            .or(comm.map(|c| c.comm_id))
            .or(skip.map(|k| k.comm_id))
            .or(link.map(|l| l.comm_id));
        self.comm_id.append_option(comm_id);
        match comm_id {
            Some(id) => {
                if self.comm_text.0 != id || self.comm_text.1.is_empty() {
                    self.comm_text = (id, format_comm_id(id));
                }
                self.comm.append_value(&self.comm_text.1);
            }
            None => self.comm.append_null(),
        }
        self.seq.append_option(
            call.map(|c| c.seq)
                .or(skip.map(|k| k.last_seq))
                .or(link.map(|l| l.seq)),
        );
        self.op_seq
            .append_option(call.map(|c| c.op_seq).or(link.map(|l| l.op_seq)));
        self.bytes.append_option(
            call.map(|c| c.bytes)
                .or(skip.map(|k| k.bytes))
                .or(link.map(|l| l.bytes)),
        );
        self.count.append_option(call.map(|c| c.count));
        self.dtype.append_option(call.map(|c| dtype::name(c.dtype)));
        self.red_op.append_option(
            call.filter(|c| c.red_op != red_op::UNKNOWN)
                .map(|c| red_op::name(c.red_op)),
        );
        self.peer
            .append_option(call.map(|c| c.peer).or(link.map(|l| l.peer)));
        self.tag.append_option(call.map(|c| c.tag));
        self.peer2.append_option(call.map(|c| c.peer2));
        self.tag2.append_option(call.map(|c| c.tag2));
        self.op_seq2.append_option(call.map(|c| c.op_seq2));
        self.t_enter.append_option(
            call.map(|c| c.t_enter)
                .or(skip.map(|k| k.t_first))
                .or(link.map(|l| l.t_start))
                .or(flow.map(|f| f.t_start)),
        );
        self.t_exit.append_option(
            call.filter(|_| matches!(r, Record::Call(_)))
                .map(|c| c.t_exit)
                .or(skip.map(|k| k.t_last))
                .or(link.map(|l| l.t_end))
                .or(flow.map(|f| f.t_end))
                .or(le.map(|e| e.t)),
        );
        self.gpu_start
            .append_option(call.filter(|c| c.gpu_end != 0).map(|c| c.gpu_start));
        self.gpu_end
            .append_option(call.filter(|c| c.gpu_end != 0).map(|c| c.gpu_end));
        self.clock.append_option(call.map(|c| c.clock().name()));
        self.library
            .append_option(call.map(|c| crate::op::lib::name(c.lib)));
        self.offset.append_option(clock.map(|c| c.offset_ns));
        self.error.append_option(clock.map(|c| c.error_ns));
        self.comm_rank.append_option(
            call.map(|c| c.comm_rank)
                .or(comm.map(|c| c.comm_rank))
                .or(skip.map(|k| k.comm_rank))
                .or(link.map(|l| l.comm_rank)),
        );
        self.comm_size.append_option(
            call.map(|c| c.comm_size)
                .or(comm.map(|c| c.size))
                .or(skip.map(|k| k.comm_size)),
        );
        self.event.append_option(
            comm.map(|c| match c.event {
                CommEvent::Created => "created",
                CommEvent::Freed => "freed",
                CommEvent::Named => "named",
                CommEvent::Failed => "failed",
            })
            .or(pr.map(|p| match p.event {
                ProcessEvent::Start => "start",
                ProcessEvent::Exit => "exit",
                ProcessEvent::Step => "step",
                ProcessEvent::Network => "network",
            })),
        );
        self.parent.append_option(comm.map(|c| c.parent));
        self.comm_name
            .append_option(comm.map(|c| c.name()).filter(|n| !n.is_empty()));
        self.remote_size.append_option(comm.map(|c| c.remote_size));
        self.device
            .append_option(comm.filter(|c| c.device >= 0).map(|c| c.device));
        self.t.append_option(
            comm.map(|c| c.t)
                .or(hb.map(|b| b.t_mono))
                .or(pr.map(|p| p.t_mono)),
        );
        self.t_real
            .append_option(hb.map(|b| b.t_real).or(pr.map(|p| p.t_real)));
        self.in_flight.append_option(hb.map(|b| b.in_flight));
        self.dropped_ring_full
            .append_option(hb.map(|b| b.dropped_ring_full));
        self.dropped_in_flight
            .append_option(hb.map(|b| b.dropped_in_flight));
        self.dropped_other
            .append_option(hb.map(|b| b.dropped_other));
        self.produced.append_option(hb.map(|b| b.produced));
        self.exit_status.append_option(
            pr.filter(|p| p.exit_status != crate::record::EXIT_STATUS_UNKNOWN)
                .map(|p| p.exit_status),
        );
        self.signal
            .append_option(pr.filter(|p| p.signal != 0).map(|p| p.signal));
        self.step.append_option(
            pr.filter(|p| matches!(p.event, ProcessEvent::Step | ProcessEvent::Network))
                .map(|p| p.step),
        );
        self.sample_modulus.append_option(
            call.filter(|_| matches!(r, Record::Call(_)))
                .map(|c| c.sample_modulus() as u32)
                .or(skip.map(|k| k.modulus)),
        );
        self.skip_calls.append_option(skip.map(|k| k.calls));
        self.skip_first_seq.append_option(skip.map(|k| k.first_seq));
        self.skip_inside_ns.append_option(skip.map(|k| k.inside_ns));
        self.skip_from_rec_seq
            .append_option(skip.map(|k| k.from_rec_seq));
        self.skip_through_rec_seq
            .append_option(skip.map(|k| k.through_rec_seq));
        self.channel
            .append_option(link.map(|l| i32::from(l.channels)));
        self.steps.append_option(link.map(|l| l.steps));
        self.link_net_ns.append_option(link.map(|l| l.net_ns));
        self.link_gpu_wait_ns
            .append_option(link.map(|l| l.gpu_wait_ns));
        self.link_peer_wait_ns
            .append_option(link.map(|l| l.peer_wait_ns));
        self.link_xfer_bytes
            .append_option(link.map(|l| l.xfer_bytes));
        self.link_steps_done
            .append_option(link.map(|l| l.steps_done));
        self.flow_transport
            .append_option(flow.map(|f| crate::record::flow_transport::name(f.transport)));
        self.flow_local
            .append_option(flow.map(|f| f.local_addr().to_string()));
        self.flow_remote
            .append_option(flow.map(|f| f.remote_addr().to_string()));
        self.flow_bytes_sent
            .append_option(flow.map(|f| f.bytes_sent));
        self.flow_bytes_received
            .append_option(flow.map(|f| f.bytes_received));
        self.flow_busy_ns.append_option(flow.map(|f| f.busy_ns));
        self.flow_retransmits
            .append_option(flow.map(|f| f.retransmits));
        self.flow_srtt_us.append_option(flow.map(|f| f.srtt_us));
        self.flow_cwnd.append_option(flow.map(|f| f.cwnd));
        self.flow_rank.append_option(flow.map(|f| f.rank));
        self.flow_pid.append_option(flow.map(|f| f.pid));
        self.flow_iface
            .append_option(flow.and_then(|f| f.iface_name()));
        self.link_event
            .append_option(le.map(|e| crate::record::link_event::name(e.event)));
        self.link_event_device
            .append_option(le.map(|e| e.device_name()));
        self.link_event_what
            .append_option(le.map(|e| e.what_name()));
        self.link_event_port.append_option(le.map(|e| e.port));
        self.link_event_qp.append_option(le.map(|e| e.qp_num));
        self.link_event_peer_qp.append_option(le.map(|e| e.peer_qp));
        self.link_event_peer
            .append_option(le.and_then(|e| e.peer_addr()).map(|a| a.to_string()));
        self.link_event_count.append_option(le.map(|e| e.count));
        self.link_event_rank.append_option(le.map(|e| e.rank));
        self.link_event_pid.append_option(le.map(|e| e.pid));
    }

    fn finish(&mut self) -> Vec<ArrayRef> {
        self.rows = 0;
        vec![
            Arc::new(self.job.finish()),
            Arc::new(self.node.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.process_start.finish()),
            Arc::new(self.rank.finish()),
            Arc::new(self.world_size.finish()),
            Arc::new(self.flavour.finish()),
            Arc::new(self.mono_anchor.finish()),
            Arc::new(self.real_anchor.finish()),
            Arc::new(self.rec_seq.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.flags.finish()),
            Arc::new(self.op.finish()),
            Arc::new(self.status.finish()),
            Arc::new(self.comm_id.finish()),
            Arc::new(self.comm.finish()),
            Arc::new(self.seq.finish()),
            Arc::new(self.op_seq.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.count.finish()),
            Arc::new(self.dtype.finish()),
            Arc::new(self.red_op.finish()),
            Arc::new(self.peer.finish()),
            Arc::new(self.tag.finish()),
            Arc::new(self.peer2.finish()),
            Arc::new(self.tag2.finish()),
            Arc::new(self.op_seq2.finish()),
            Arc::new(self.t_enter.finish()),
            Arc::new(self.t_exit.finish()),
            Arc::new(self.gpu_start.finish()),
            Arc::new(self.gpu_end.finish()),
            Arc::new(self.clock.finish()),
            Arc::new(self.library.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.comm_rank.finish()),
            Arc::new(self.comm_size.finish()),
            Arc::new(self.event.finish()),
            Arc::new(self.parent.finish()),
            Arc::new(self.comm_name.finish()),
            Arc::new(self.remote_size.finish()),
            Arc::new(self.device.finish()),
            Arc::new(self.t.finish()),
            Arc::new(self.t_real.finish()),
            Arc::new(self.in_flight.finish()),
            Arc::new(self.dropped_ring_full.finish()),
            Arc::new(self.dropped_in_flight.finish()),
            Arc::new(self.dropped_other.finish()),
            Arc::new(self.produced.finish()),
            Arc::new(self.exit_status.finish()),
            Arc::new(self.signal.finish()),
            Arc::new(self.step.finish()),
            Arc::new(self.sample_modulus.finish()),
            Arc::new(self.skip_calls.finish()),
            Arc::new(self.skip_first_seq.finish()),
            Arc::new(self.skip_inside_ns.finish()),
            Arc::new(self.skip_from_rec_seq.finish()),
            Arc::new(self.skip_through_rec_seq.finish()),
            Arc::new(self.channel.finish()),
            Arc::new(self.steps.finish()),
            Arc::new(self.link_net_ns.finish()),
            Arc::new(self.link_gpu_wait_ns.finish()),
            Arc::new(self.link_peer_wait_ns.finish()),
            Arc::new(self.link_xfer_bytes.finish()),
            Arc::new(self.link_steps_done.finish()),
            Arc::new(self.flow_transport.finish()),
            Arc::new(self.flow_local.finish()),
            Arc::new(self.flow_remote.finish()),
            Arc::new(self.flow_bytes_sent.finish()),
            Arc::new(self.flow_bytes_received.finish()),
            Arc::new(self.flow_busy_ns.finish()),
            Arc::new(self.flow_retransmits.finish()),
            Arc::new(self.flow_srtt_us.finish()),
            Arc::new(self.flow_cwnd.finish()),
            Arc::new(self.flow_rank.finish()),
            Arc::new(self.flow_pid.finish()),
            Arc::new(self.flow_iface.finish()),
            Arc::new(self.link_event.finish()),
            Arc::new(self.link_event_device.finish()),
            Arc::new(self.link_event_what.finish()),
            Arc::new(self.link_event_port.finish()),
            Arc::new(self.link_event_qp.finish()),
            Arc::new(self.link_event_peer_qp.finish()),
            Arc::new(self.link_event_peer.finish()),
            Arc::new(self.link_event_count.finish()),
            Arc::new(self.link_event_rank.finish()),
            Arc::new(self.link_event_pid.finish()),
        ]
    }
}

/// Writes processes' records to a Parquet file (written to a temporary name, synced, then
/// renamed, so a reader never sees half a file). Returns the rows written.
pub fn write(path: &Path, processes: &[ProcessTrace]) -> Result<u64, Error> {
    write_with_metadata(path, processes, &[])
}

/// [`write`], adding key-value pairs to the file's metadata (keys should start `commscope.`).
pub fn write_with_metadata(
    path: &Path,
    processes: &[ProcessTrace],
    metadata: &[(String, String)],
) -> Result<u64, Error> {
    let mut w = Writer::create(path, metadata)?;
    for proc in processes {
        for r in &proc.records {
            w.push(&proc.header, proc.clock, r)?;
        }
    }
    w.finish()
}

/// Writes a Parquet trace record by record, a batch at a time (a trace of any length in
/// bounded memory), to a temporary file renamed over `path` when [`Writer::finish`]ed.
pub struct Writer {
    path: std::path::PathBuf,
    tmp: std::path::PathBuf,
    schema: SchemaRef,
    w: ArrowWriter<std::fs::File>,
    cols: Columns,
    rows: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("path", &self.path).finish()
    }
}

/// Columns written delta-encoded ([`Writer::create`]).
const DELTA_COLUMNS: &[&str] = &[
    "t_enter_ns",
    "t_exit_ns",
    "gpu_start_ns",
    "gpu_end_ns",
    "t_ns",
    "t_real_ns",
    "rec_seq",
    "seq",
    "op_seq",
    "op_seq2",
];

impl Writer {
    /// Starts a trace at `path` with key-value `metadata` in its footer.
    pub fn create(path: &Path, metadata: &[(String, String)]) -> Result<Writer, Error> {
        let tmp = path.with_extension("parquet.partial");
        let file = std::fs::File::create(&tmp).map_err(|source| Error::Io {
            path: tmp.display().to_string(),
            source,
        })?;
        let kv: Vec<parquet::file::metadata::KeyValue> = metadata
            .iter()
            .map(|(k, v)| parquet::file::metadata::KeyValue::new(k.clone(), v.clone()))
            .collect();
        let mut props = WriterProperties::builder()
            // Snappy: a trace is read far more often than it is stored for long, and zstd
            // costs a fresh decoder context per page on the read side (a fifth of the time of
            // streaming a large trace, measured: docs/performance.md).
            .set_compression(Compression::SNAPPY)
            // Row groups of 256 Ki rows: what a scanning engine holds in flight is a few of
            // them.
            .set_max_row_group_row_count(Some(1 << 18))
            // Small pages: a reader streaming a process's rows holds one page per column.
            .set_data_page_row_count_limit(8192)
            .set_key_value_metadata((!kv.is_empty()).then_some(kv))
            // Dictionaries: most columns repeat a few values per process (identity, anchors,
            // communicator, size, op), and runs of dictionary indices store them in almost
            // nothing; a column with too many values falls back to plain.
            .set_dictionary_enabled(true);
        // Times and sequence numbers grow by small steps: delta-encoded they take a fraction
        // of their plain size, and decoding them is cheaper than decompressing them
        // (docs/performance.md).
        for col in DELTA_COLUMNS {
            let col = parquet::schema::types::ColumnPath::from(*col);
            props = props
                .set_column_dictionary_enabled(col.clone(), false)
                .set_column_encoding(col, parquet::basic::Encoding::DELTA_BINARY_PACKED);
        }
        let schema = schema();
        let w =
            ArrowWriter::try_new(file, schema.clone(), Some(props.build())).map_err(|source| {
                Error::Parquet {
                    path: path.display().to_string(),
                    source,
                }
            })?;
        Ok(Writer {
            path: path.to_owned(),
            tmp,
            schema,
            w,
            cols: Columns::default(),
            rows: 0,
        })
    }

    /// Adds one record of the process `header` (with its clock alignment).
    pub fn push(
        &mut self,
        header: &Header,
        clock: Option<ClockAlignment>,
        r: &Record,
    ) -> Result<(), Error> {
        self.cols.push(header, clock, r);
        self.rows += 1;
        if self.cols.rows >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        if self.cols.rows == 0 {
            return Ok(());
        }
        let p = self.path.display().to_string();
        let batch =
            RecordBatch::try_new(self.schema.clone(), self.cols.finish()).map_err(|source| {
                Error::Arrow {
                    path: p.clone(),
                    source,
                }
            })?;
        self.w
            .write(&batch)
            .map_err(|source| Error::Parquet { path: p, source })
    }

    /// Completes the file; returns its rows.
    pub fn finish(mut self) -> Result<u64, Error> {
        self.flush()?;
        let p = self.path.display().to_string();
        let file = self.w.into_inner().map_err(|source| Error::Parquet {
            path: p.clone(),
            source,
        })?;
        file.sync_all().map_err(|source| Error::Io {
            path: self.tmp.display().to_string(),
            source,
        })?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(|source| Error::Io { path: p, source })?;
        Ok(self.rows)
    }
}

/// The key-value metadata of a Parquet file (its footer only is read).
pub fn read_metadata(path: &Path) -> Result<std::collections::HashMap<String, String>, Error> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: p.clone(),
        source,
    })?;
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(file)
        .map_err(|source| Error::Parquet { path: p, source })?;
    use parquet::file::reader::FileReader;
    Ok(reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter_map(|e| Some((e.key.clone(), e.value.clone()?)))
                .collect()
        })
        .unwrap_or_default())
}

/// The rows of a Parquet file (its footer only is read).
pub fn num_rows(path: &Path) -> Result<u64, Error> {
    Ok(open_builder(path)?
        .metadata()
        .file_metadata()
        .num_rows()
        .max(0) as u64)
}

/// The jobs a trace file holds, when its footer's statistics tell (each row group one job,
/// as commscope writes them); `None` when they do not, or the file cannot be read. Only the
/// footer's metadata is read (not the page index).
pub fn jobs_in_file(path: &Path) -> Option<Vec<String>> {
    let file = std::fs::File::open(path).ok()?;
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
        .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Skip);
    let footer = parquet::arrow::arrow_reader::ArrowReaderMetadata::load(&file, options).ok()?;
    let meta = footer.metadata();
    let idx = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == "job")?;
    let mut jobs = std::collections::BTreeSet::new();
    for rg in meta.row_groups() {
        let parquet::file::statistics::Statistics::ByteArray(st) = rg.column(idx).statistics()?
        else {
            return None;
        };
        let (lo, hi) = (st.min_opt()?.as_utf8().ok()?, st.max_opt()?.as_utf8().ok()?);
        if lo != hi {
            return None;
        }
        jobs.insert(lo.to_owned());
    }
    Some(jobs.into_iter().collect())
}

/// Whether `bytes` start like a Parquet file.
pub fn sniff(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PAR1")
}

struct Cols<'a> {
    batch: &'a RecordBatch,
    path: &'a str,
}

impl<'a> Cols<'a> {
    fn get<T: Array + 'static>(&self, name: &str, required: bool) -> Result<Option<&'a T>, Error> {
        let Some(col) = self.batch.column_by_name(name) else {
            return if required {
                Err(Error::NotATrace {
                    path: self.path.to_owned(),
                    reason: format!("column `{name}` is missing"),
                })
            } else {
                Ok(None)
            };
        };
        match col.as_any().downcast_ref::<T>() {
            Some(a) => Ok(Some(a)),
            None => Err(Error::NotATrace {
                path: self.path.to_owned(),
                reason: format!("column `{name}` has type {}", col.data_type()),
            }),
        }
    }
    fn req<T: Array + 'static>(&self, name: &str) -> Result<&'a T, Error> {
        self.get::<T>(name, true)?.ok_or_else(|| Error::NotATrace {
            path: self.path.to_owned(),
            reason: format!("column `{name}` is missing"),
        })
    }
}

fn opt_u64(a: Option<&UInt64Array>, i: usize) -> u64 {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i)).unwrap_or(0)
}
fn opt_i32(a: Option<&Int32Array>, i: usize, default: i32) -> i32 {
    a.filter(|a| !a.is_null(i))
        .map(|a| a.value(i))
        .unwrap_or(default)
}
fn opt_str(a: Option<&StringArray>, i: usize) -> &str {
    a.filter(|a| !a.is_null(i))
        .map(|a| a.value(i))
        .unwrap_or("")
}

/// Reads a Parquet trace back into processes (grouped by job, node, pid and start time, in file
/// order). Rows of kinds this version does not know are counted in the second value.
pub fn read(path: &Path) -> Result<(Vec<ProcessTrace>, usize), Error> {
    let s = read_salvaged(path)?;
    match s.damage {
        Some(e) => Err(e),
        None => Ok((s.processes, s.unknown)),
    }
}

/// A Parquet trace read as far as it could be.
#[derive(Debug)]
pub struct Salvaged {
    /// Processes as in [`read`], with the records read before any damage.
    pub processes: Vec<ProcessTrace>,
    /// Rows of kinds this version does not know.
    pub unknown: usize,
    /// Why reading stopped early, if it did.
    pub damage: Option<Error>,
}

/// Reads a Parquet trace as [`read`] does, but keeps what can be read around damage in the
/// file (a corrupt page): fails only when the file cannot be opened at all. After damage, the
/// file is read again process by process, each as far as its own rows can be read, so a
/// corrupt page costs only the processes with rows in it; they are marked
/// [`ProcessTrace::cut_short`]. When even the processes' rows cannot be told, the records read
/// before the damage are kept and every process is marked cut short.
pub fn read_salvaged(path: &Path) -> Result<Salvaged, Error> {
    let mut out: Vec<ProcessTrace> = Vec::new();
    let mut index: std::collections::HashMap<ProcessKey, usize> = Default::default();
    let mut reader = Reader::open(path, None)?;
    let damage = loop {
        match reader.next_batch(&mut |p, rec| {
            let slot = *index.entry(p.key()).or_insert_with(|| {
                out.push(p.trace());
                out.len() - 1
            });
            out[slot].records.push(rec);
        }) {
            Ok(true) => {}
            Ok(false) => break None,
            Err(e) => break Some(e),
        }
    };
    let mut unknown = reader.unknown();
    if damage.is_some() {
        match read_by_process(path) {
            Ok((processes, n)) => (out, unknown) = (processes, n),
            Err(_) => out.iter_mut().for_each(|p| p.cut_short = true),
        }
    }
    Ok(Salvaged {
        processes: out,
        unknown,
        damage,
    })
}

/// Which ranks lost records to a file's damage, as the end of its warning.
pub fn lost_ranks_phrase(ranks: &[i32]) -> String {
    let mut ranks = ranks.to_vec();
    ranks.sort_unstable();
    ranks.dedup();
    match ranks.as_slice() {
        [] => String::new(),
        [r] => format!(" (rank {r} lost records to it)"),
        _ if ranks.len() > 8 => format!(
            " ({} ranks lost records to it, ranks {} … {})",
            ranks.len(),
            ranks[0],
            ranks[ranks.len() - 1]
        ),
        _ => format!(
            " (ranks {} lost records to it)",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Rows a process's reader decodes at a time after damage: what a corrupt page can take with
/// it besides its own rows.
const SALVAGE_ROWS: usize = 1024;

/// Every process's rows read on their own ([`read_salvaged`]), and the rows of unknown kind.
fn read_by_process(path: &Path) -> Result<(Vec<ProcessTrace>, usize), Error> {
    let footer = Footer::read(path)?;
    let mut out = Vec::new();
    let mut unknown = 0;
    for (mut trace, ranges) in process_rows(path, &footer)? {
        match Reader::open_with(path, &footer, Some((&ranges, SALVAGE_ROWS))) {
            Ok(mut reader) => {
                let records = &mut trace.records;
                loop {
                    match reader.next_batch(&mut |_, rec| records.push(rec)) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(_) => {
                            trace.cut_short = true;
                            break;
                        }
                    }
                }
                unknown += reader.unknown();
            }
            Err(_) => trace.cut_short = true,
        }
        out.push(trace);
    }
    Ok((out, unknown))
}

/// Row ranges `[from, to)` of a file.
pub type RowRanges = Vec<(u64, u64)>;

/// What identifies a process in a trace: job, node, pid and start time.
pub type ProcessKey = (String, String, u32, u64);

/// The process a row belongs to, as its identity columns give it.
#[derive(Debug)]
pub struct RowProcess<'a> {
    pub job: &'a str,
    pub node: &'a str,
    pub pid: u32,
    pub start: u64,
    pub rank: i32,
    pub world_size: i32,
    pub flavour: &'a str,
    pub mono_anchor: u64,
    pub real_anchor: u64,
    pub clock: Option<ClockAlignment>,
}

impl RowProcess<'_> {
    /// The process's key.
    pub fn key(&self) -> ProcessKey {
        (
            self.job.to_owned(),
            self.node.to_owned(),
            self.pid,
            self.start,
        )
    }

    /// An empty trace of the process, its header and clock from this row.
    pub fn trace(&self) -> ProcessTrace {
        ProcessTrace {
            header: Header {
                version: crate::cst::FORMAT_VERSION,
                job: self.job.to_owned(),
                node: self.node.to_owned(),
                pid: self.pid,
                rank: self.rank,
                world_size: self.world_size,
                start_time: self.start,
                mono_anchor: self.mono_anchor,
                real_anchor: self.real_anchor,
                flavour: self.flavour.to_owned(),
                ..Default::default()
            },
            records: Vec::new(),
            clock: self.clock,
            cut_short: false,
        }
    }
}

/// Reads a Parquet trace batch by batch, whole or some row ranges of it: the one decoder of
/// rows into records, for [`read`] and for drivers that stream a trace too big to hold.
pub struct Reader {
    path: String,
    batches: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
    unknown: usize,
    /// Every row, with its process's identity (else one process's rows, whose identity the
    /// caller knows: job and node are not read).
    full: bool,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("path", &self.path).finish()
    }
}

/// A trace file's footer (schema, row groups, page index), read once and shared by every
/// reader of the file ([`Reader::open_with`]).
#[derive(Clone, Debug)]
pub struct Footer(parquet::arrow::arrow_reader::ArrowReaderMetadata);

impl Footer {
    /// Reads the footer of `path`.
    pub fn read(path: &Path) -> Result<Footer, Error> {
        let p = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: p.clone(),
            source,
        })?;
        let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
        let meta = parquet::arrow::arrow_reader::ArrowReaderMetadata::load(&file, options)
            .map_err(|source| Error::Parquet { path: p, source })?;
        Ok(Footer(meta))
    }
}

/// Opens a trace's footer, checking that it is a commscope trace this version reads.
fn open_builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<std::fs::File>, Error> {
    open_with(path, &Footer::read(path)?)
}

/// Opens a trace whose footer was read, checking that it is a commscope trace this version reads.
fn open_with(
    path: &Path,
    footer: &Footer,
) -> Result<ParquetRecordBatchReaderBuilder<std::fs::File>, Error> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: p.clone(),
        source,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, footer.0.clone());
    if let Some(v) = builder.schema().metadata().get("commscope.schema") {
        let found: u32 = v.parse().unwrap_or(u32::MAX);
        if found > SCHEMA_VERSION {
            return Err(Error::NewerVersion { path: p, found });
        }
    } else {
        return Err(Error::NotATrace {
            path: p,
            reason: "no commscope schema metadata".into(),
        });
    }
    Ok(builder)
}

/// The row ranges `[from, to)` of each process in a trace, in file order of first appearance,
/// with the process's empty trace (header and clock); only the identity columns are read.
/// `footer` is the file's ([`Footer::read`]), shared with the readers of those rows.
pub fn process_rows(path: &Path, footer: &Footer) -> Result<Vec<(ProcessTrace, RowRanges)>, Error> {
    let p = path.display().to_string();
    let builder = open_with(path, footer)?;
    let mask = parquet::arrow::ProjectionMask::columns(
        builder.parquet_schema(),
        [
            "job",
            "node",
            "pid",
            "process_start",
            "rank",
            "world_size",
            "flavour",
            "mono_anchor_ns",
            "real_anchor_ns",
            "offset_ns",
            "error_ns",
        ],
    );
    let batches = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|source| Error::Parquet {
            path: p.clone(),
            source,
        })?;
    let mut out: Vec<(ProcessTrace, RowRanges)> = Vec::new();
    let mut index: std::collections::HashMap<ProcessKey, usize> = Default::default();
    let mut row = 0u64;
    let mut current: Option<usize> = None;
    for batch in batches {
        let batch = batch.map_err(|source| Error::Arrow {
            path: p.clone(),
            source,
        })?;
        let ids = Identity::of(&batch, &p, true)?;
        for i in 0..batch.num_rows() {
            // A run of one process's rows: same pid, start time and rank (the strings are
            // compared where a run starts).
            let same = current.is_some_and(|slot| {
                let h = &out[slot].0.header;
                h.pid == ids.pid.value(i)
                    && h.start_time == ids.start.value(i)
                    && h.rank == ids.rank.value(i)
            });
            if same {
                if let Some(r) = current.and_then(|s| out[s].1.last_mut()) {
                    r.1 = row + 1;
                }
            } else {
                let rp = ids.row(i);
                let slot = *index.entry(rp.key()).or_insert_with(|| {
                    out.push((rp.trace(), Vec::new()));
                    out.len() - 1
                });
                out[slot].1.push((row, row + 1));
                current = Some(slot);
            }
            row += 1;
        }
    }
    Ok(out)
}

/// The identity columns of a batch.
struct Identity<'a> {
    /// Absent when only one process's rows are read ([`Reader::open_with`] with row ranges).
    job: Option<&'a StringArray>,
    node: Option<&'a StringArray>,
    pid: &'a UInt32Array,
    start: &'a UInt64Array,
    rank: &'a Int32Array,
    world: &'a Int32Array,
    flavour: Option<&'a StringArray>,
    mono_anchor: Option<&'a UInt64Array>,
    real_anchor: Option<&'a UInt64Array>,
    offset: Option<&'a Int64Array>,
    error: Option<&'a UInt64Array>,
}

impl<'a> Identity<'a> {
    fn of(batch: &'a RecordBatch, path: &'a str, full: bool) -> Result<Identity<'a>, Error> {
        let c = Cols { batch, path };
        Ok(Identity {
            job: c.get::<StringArray>("job", full)?,
            node: c.get::<StringArray>("node", full)?,
            pid: c.req::<UInt32Array>("pid")?,
            start: c.req::<UInt64Array>("process_start")?,
            rank: c.req::<Int32Array>("rank")?,
            world: c.req::<Int32Array>("world_size")?,
            flavour: c.get::<StringArray>("flavour", false)?,
            mono_anchor: c.get::<UInt64Array>("mono_anchor_ns", false)?,
            real_anchor: c.get::<UInt64Array>("real_anchor_ns", false)?,
            offset: c.get::<Int64Array>("offset_ns", false)?,
            error: c.get::<UInt64Array>("error_ns", false)?,
        })
    }

    fn row(&self, i: usize) -> RowProcess<'a> {
        RowProcess {
            job: opt_str(self.job, i),
            node: opt_str(self.node, i),
            pid: self.pid.value(i),
            start: self.start.value(i),
            rank: self.rank.value(i),
            world_size: self.world.value(i),
            flavour: opt_str(self.flavour, i),
            mono_anchor: opt_u64(self.mono_anchor, i),
            real_anchor: opt_u64(self.real_anchor, i),
            clock: self
                .offset
                .filter(|a| !a.is_null(i))
                .map(|a| ClockAlignment {
                    offset_ns: a.value(i),
                    error_ns: opt_u64(self.error, i),
                }),
        }
    }
}

impl Reader {
    /// Opens `path`, every row or only the row ranges `[from, to)` given, decoded `batch_rows`
    /// at a time. Row ranges are one process's: its records are decoded without the columns
    /// only summaries read (data types, element counts, drop counters, clock alignment, which
    /// the process's header holds).
    pub fn open(path: &Path, rows: Option<(&[(u64, u64)], usize)>) -> Result<Reader, Error> {
        Reader::open_with(path, &Footer::read(path)?, rows)
    }

    /// [`Reader::open`] with the file's footer already read.
    pub fn open_with(
        path: &Path,
        footer: &Footer,
        rows: Option<(&[(u64, u64)], usize)>,
    ) -> Result<Reader, Error> {
        let p = path.display().to_string();
        let mut builder = open_with(path, footer)?;
        let mut batch_rows = BATCH_ROWS;
        if let Some((ranges, n)) = rows {
            let total = builder.metadata().file_metadata().num_rows().max(0) as usize;
            let selection = parquet::arrow::arrow_reader::RowSelection::from_consecutive_ranges(
                ranges
                    .iter()
                    .map(|&(a, b)| (a as usize).min(total)..(b as usize).min(total)),
                total,
            );
            // A process's rows: its identity is known, and what only summaries read is left.
            let skip = [
                "job",
                "node",
                "flavour",
                "mono_anchor_ns",
                "real_anchor_ns",
                "comm",
                "count",
                "dtype",
                "offset_ns",
                "error_ns",
                "remote_size",
                "device",
                "dropped_ring_full",
                "dropped_in_flight",
                "dropped_other",
                "produced",
            ];
            let names: Vec<String> = builder
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| !skip.contains(&n.as_str()))
                .collect();
            let mask = parquet::arrow::ProjectionMask::columns(
                builder.parquet_schema(),
                names.iter().map(String::as_str),
            );
            builder = builder.with_row_selection(selection).with_projection(mask);
            batch_rows = n.max(1);
        }
        let batches = builder
            .with_batch_size(batch_rows)
            .build()
            .map_err(|source| Error::Parquet {
                path: p.clone(),
                source,
            })?;
        Ok(Reader {
            path: p,
            batches,
            unknown: 0,
            full: rows.is_none(),
        })
    }

    /// Rows of kinds this version does not know, so far.
    pub fn unknown(&self) -> usize {
        self.unknown
    }

    /// Decodes the next batch, handing each row's process and record to `f`; false at the end.
    pub fn next_batch(
        &mut self,
        f: &mut dyn FnMut(&RowProcess<'_>, Record),
    ) -> Result<bool, Error> {
        let Some(batch) = self.batches.next() else {
            return Ok(false);
        };
        let p = self.path.as_str();
        let batch = batch.map_err(|source| Error::Arrow {
            path: p.to_owned(),
            source,
        })?;
        let ids = Identity::of(&batch, p, self.full)?;
        let rank = ids.rank;
        let world = ids.world;
        let pid = ids.pid;
        let start = ids.start;
        let mut dtypes = Codes::new(dtype_code);
        let mut ops = Codes::new(op_code);
        let c = Cols {
            batch: &batch,
            path: p,
        };
        let rec_seq = c.req::<UInt64Array>("rec_seq")?;
        let kind = c.req::<StringArray>("kind")?;
        let flags = c.req::<UInt32Array>("flags")?;
        let op = c.get::<StringArray>("op", false)?;
        let status = c.get::<Int32Array>("status", false)?;
        let comm_id = c.get::<UInt64Array>("comm_id", false)?;
        let seq = c.get::<UInt64Array>("seq", false)?;
        let op_seq = c.get::<UInt64Array>("op_seq", false)?;
        let bytes = c.get::<UInt64Array>("bytes", false)?;
        let count = c.get::<UInt64Array>("count", false)?;
        let dtype_col = c.get::<StringArray>("dtype", false)?;
        // Written since calls carry their reduction; older files read as not known.
        let red_op_col = c.get::<StringArray>("red_op", false)?;
        let peer = c.get::<Int32Array>("peer", false)?;
        let tag = c.get::<Int32Array>("tag", false)?;
        let peer2 = c.get::<Int32Array>("peer2", false)?;
        let tag2 = c.get::<Int32Array>("tag2", false)?;
        let op_seq2 = c.get::<UInt64Array>("op_seq2", false)?;
        let t_enter = c.get::<UInt64Array>("t_enter_ns", false)?;
        let t_exit = c.get::<UInt64Array>("t_exit_ns", false)?;
        let gpu_start = c.get::<UInt64Array>("gpu_start_ns", false)?;
        let gpu_end = c.get::<UInt64Array>("gpu_end_ns", false)?;
        let clock = c.get::<StringArray>("clock", false)?;
        // Written since NCCL calls are recorded; older files hold MPI calls only.
        let library = c.get::<StringArray>("library", false)?;
        let comm_rank = c.get::<Int32Array>("comm_rank", false)?;
        let comm_size = c.get::<Int32Array>("comm_size", false)?;
        let event = c.get::<StringArray>("event", false)?;
        let parent = c.get::<UInt64Array>("parent_comm_id", false)?;
        let comm_name = c.get::<StringArray>("comm_name", false)?;
        let remote_size = c.get::<Int32Array>("remote_size", false)?;
        let device = c.get::<Int32Array>("device", false)?;
        let t = c.get::<UInt64Array>("t_ns", false)?;
        let t_real = c.get::<UInt64Array>("t_real_ns", false)?;
        let in_flight = c.get::<UInt32Array>("in_flight", false)?;
        let d_full = c.get::<UInt64Array>("dropped_ring_full", false)?;
        let d_infl = c.get::<UInt64Array>("dropped_in_flight", false)?;
        let d_other = c.get::<UInt64Array>("dropped_other", false)?;
        let produced = c.get::<UInt64Array>("produced", false)?;
        let exit_status = c.get::<Int32Array>("exit_status", false)?;
        let signal = c.get::<Int32Array>("signal", false)?;
        // Written since the step marker exists; older files have no step events.
        let step = c.get::<UInt64Array>("step", false)?;
        // Written since consistent sampling exists.
        let sample_modulus = c.get::<UInt32Array>("sample_modulus", false)?;
        let skip_calls = c.get::<UInt64Array>("skip_calls", false)?;
        let skip_first_seq = c.get::<UInt64Array>("skip_first_seq", false)?;
        let skip_inside_ns = c.get::<UInt64Array>("skip_inside_ns", false)?;
        let skip_from_rec_seq = c.get::<UInt64Array>("skip_from_rec_seq", false)?;
        let skip_through_rec_seq = c.get::<UInt64Array>("skip_through_rec_seq", false)?;
        // Written since link records exist.
        let channel = c.get::<Int32Array>("channels", false)?;
        let steps = c.get::<UInt32Array>("steps", false)?;
        // Written since links carry step timing.
        let link_net_ns = c.get::<UInt64Array>("link_net_ns", false)?;
        let link_gpu_wait_ns = c.get::<UInt64Array>("link_gpu_wait_ns", false)?;
        let link_peer_wait_ns = c.get::<UInt64Array>("link_peer_wait_ns", false)?;
        let link_xfer_bytes = c.get::<UInt64Array>("link_xfer_bytes", false)?;
        let link_steps_done = c.get::<UInt32Array>("link_steps_done", false)?;
        // Written since the agent's transport view records flows.
        let flow_transport = c.get::<StringArray>("flow_transport", false)?;
        let flow_local = c.get::<StringArray>("flow_local", false)?;
        let flow_remote = c.get::<StringArray>("flow_remote", false)?;
        let flow_bytes_sent = c.get::<UInt64Array>("flow_bytes_sent", false)?;
        let flow_bytes_received = c.get::<UInt64Array>("flow_bytes_received", false)?;
        let flow_busy_ns = c.get::<UInt64Array>("flow_busy_ns", false)?;
        let flow_retransmits = c.get::<UInt32Array>("flow_retransmits", false)?;
        let flow_srtt_us = c.get::<UInt32Array>("flow_srtt_us", false)?;
        let flow_cwnd = c.get::<UInt32Array>("flow_cwnd", false)?;
        let flow_rank = c.get::<Int32Array>("flow_rank", false)?;
        let flow_pid = c.get::<UInt32Array>("flow_pid", false)?;
        // Written since flows name their interface.
        let flow_iface = c.get::<StringArray>("flow_iface", false)?;
        // Written since the agent records link events.
        let le_event = c.get::<StringArray>("link_event", false)?;
        let le_device = c.get::<StringArray>("link_event_device", false)?;
        let le_what = c.get::<StringArray>("link_event_what", false)?;
        let le_port = c.get::<UInt32Array>("link_event_port", false)?;
        let le_qp = c.get::<UInt32Array>("link_event_qp", false)?;
        let le_peer_qp = c.get::<UInt32Array>("link_event_peer_qp", false)?;
        let le_peer = c.get::<StringArray>("link_event_peer", false)?;
        let le_count = c.get::<UInt64Array>("link_event_count", false)?;
        let le_rank = c.get::<Int32Array>("link_event_rank", false)?;
        let le_pid = c.get::<UInt32Array>("link_event_pid", false)?;
        let u32_of = |a: Option<&UInt32Array>, i: usize| {
            a.filter(|a| !a.is_null(i)).map_or(0, |a| a.value(i))
        };
        let addr_of = |a: Option<&StringArray>, i: usize| {
            opt_str(a, i)
                .parse::<std::net::SocketAddr>()
                .map_or(([0u8; 16], 0), |s| {
                    (crate::record::Flow::addr_bytes(s.ip()), s.port())
                })
        };

        for i in 0..batch.num_rows() {
            let row = ids.row(i);
            let fl = flags.value(i) as u16;
            let modulus = |i: usize| {
                sample_modulus
                    .filter(|a| !a.is_null(i))
                    .map_or(1, |a| a.value(i))
            };
            let k = kind.value(i);
            let with_op = matches!(k, "call" | "enter" | "skip" | "link");
            let dt = if matches!(k, "call" | "enter") && dtype_col.is_some() {
                dtypes.code(opt_str(dtype_col, i))
            } else {
                dtype::NONE
            };
            let opc = if with_op { ops.code(opt_str(op, i)) } else { 0 };
            let call = || Call {
                rec_seq: rec_seq.value(i),
                op: opc,
                flags: fl,
                status: opt_i32(status, i, 0),
                comm_id: opt_u64(comm_id, i),
                seq: opt_u64(seq, i),
                op_seq: opt_u64(op_seq, i),
                bytes: opt_u64(bytes, i),
                count: opt_u64(count, i),
                peer: opt_i32(peer, i, -1),
                tag: opt_i32(tag, i, -1),
                t_enter: opt_u64(t_enter, i),
                t_exit: opt_u64(t_exit, i),
                gpu_start: opt_u64(gpu_start, i),
                gpu_end: opt_u64(gpu_end, i),
                rank: rank.value(i),
                comm_rank: opt_i32(comm_rank, i, -1),
                comm_size: opt_i32(comm_size, i, 0),
                dtype: dt,
                clock: match opt_str(clock, i) {
                    "host-real" => Clock::HostReal as u8,
                    "gpu" => Clock::Gpu as u8,
                    _ => Clock::HostMono as u8,
                },
                lib: crate::op::lib::from_name(opt_str(library, i)).unwrap_or(crate::op::lib::MPI),
                peer2: opt_i32(peer2, i, -1),
                tag2: opt_i32(tag2, i, -1),
                red_op: red_op::from_name(opt_str(red_op_col, i)),
                op_seq2: opt_u64(op_seq2, i),
                sample_shift: crate::sampling::shift_of(modulus(i)),
            };
            let rec = match k {
                "call" => Record::Call(call()),
                "enter" => Record::Enter(call()),
                "comm" => {
                    let ev = match opt_str(event, i) {
                        "freed" => CommEvent::Freed,
                        "named" => CommEvent::Named,
                        "failed" => CommEvent::Failed,
                        _ => CommEvent::Created,
                    };
                    let mut cm = Comm::new(
                        ev,
                        opt_u64(comm_id, i),
                        opt_u64(parent, i),
                        opt_u64(t, i),
                        rank.value(i),
                        opt_i32(comm_rank, i, -1),
                        opt_i32(comm_size, i, 0),
                        opt_i32(remote_size, i, 0),
                    );
                    cm.rec_seq = rec_seq.value(i);
                    cm.flags = fl;
                    cm.status = opt_i32(status, i, 0);
                    cm.device = opt_i32(device, i, -1);
                    cm.set_name(opt_str(comm_name, i).as_bytes());
                    Record::Comm(cm)
                }
                "heartbeat" => Record::Heartbeat(Heartbeat {
                    rec_seq: rec_seq.value(i),
                    flags: fl,
                    t_mono: opt_u64(t, i),
                    t_real: opt_u64(t_real, i),
                    in_flight: in_flight
                        .filter(|a| !a.is_null(i))
                        .map(|a| a.value(i))
                        .unwrap_or(0),
                    rank: rank.value(i),
                    dropped_ring_full: opt_u64(d_full, i),
                    dropped_in_flight: opt_u64(d_infl, i),
                    dropped_other: opt_u64(d_other, i),
                    produced: opt_u64(produced, i),
                }),
                "process" => Record::Process(Process {
                    rec_seq: rec_seq.value(i),
                    event: match opt_str(event, i) {
                        "exit" => ProcessEvent::Exit,
                        "step" => ProcessEvent::Step,
                        "network" => ProcessEvent::Network,
                        _ => ProcessEvent::Start,
                    },
                    t_mono: opt_u64(t, i),
                    t_real: opt_u64(t_real, i),
                    pid: pid.value(i),
                    exit_status: opt_i32(exit_status, i, crate::record::EXIT_STATUS_UNKNOWN),
                    start_time: start.value(i),
                    rank: rank.value(i),
                    world_size: world.value(i),
                    flags: fl,
                    signal: opt_i32(signal, i, 0),
                    step: opt_u64(step, i),
                }),
                "skip" => Record::Skip(crate::record::Skip {
                    rec_seq: rec_seq.value(i),
                    from_rec_seq: opt_u64(skip_from_rec_seq, i),
                    through_rec_seq: opt_u64(skip_through_rec_seq, i),
                    op: opc,
                    flags: fl,
                    comm_id: opt_u64(comm_id, i),
                    first_seq: opt_u64(skip_first_seq, i),
                    last_seq: opt_u64(seq, i),
                    calls: opt_u64(skip_calls, i),
                    bytes: opt_u64(bytes, i),
                    inside_ns: opt_u64(skip_inside_ns, i),
                    t_first: opt_u64(t_enter, i),
                    t_last: opt_u64(t_exit, i),
                    rank: rank.value(i),
                    comm_rank: opt_i32(comm_rank, i, -1),
                    comm_size: opt_i32(comm_size, i, 0),
                    modulus: modulus(i),
                }),
                "flow" => {
                    let (local, local_port) = addr_of(flow_local, i);
                    let (remote, remote_port) = addr_of(flow_remote, i);
                    Record::Flow(crate::record::Flow {
                        rec_seq: rec_seq.value(i),
                        transport: crate::record::flow_transport::from_name(opt_str(
                            flow_transport,
                            i,
                        )),
                        flags: fl,
                        bytes_sent: opt_u64(flow_bytes_sent, i),
                        bytes_received: opt_u64(flow_bytes_received, i),
                        busy_ns: opt_u64(flow_busy_ns, i),
                        retransmits: u32_of(flow_retransmits, i),
                        srtt_us: u32_of(flow_srtt_us, i),
                        cwnd: u32_of(flow_cwnd, i),
                        local,
                        remote,
                        local_port,
                        remote_port,
                        t_start: opt_u64(t_enter, i),
                        t_end: opt_u64(t_exit, i),
                        rank: opt_i32(flow_rank, i, -1),
                        pid: u32_of(flow_pid, i),
                        iface: crate::record::Flow::iface_bytes(opt_str(flow_iface, i)),
                    })
                }
                "link_event" => {
                    use crate::record::{LinkEvent, link_event};
                    let event = link_event::from_name(opt_str(le_event, i));
                    if event == 0 {
                        // Written by a newer commscope: skipped and counted, like an unknown kind.
                        self.unknown += 1;
                        continue;
                    }
                    Record::LinkEvent(LinkEvent {
                        rec_seq: rec_seq.value(i),
                        event,
                        flags: fl,
                        t: opt_u64(t_exit, i),
                        count: opt_u64(le_count, i),
                        port: u32_of(le_port, i),
                        qp_num: u32_of(le_qp, i),
                        peer_qp: u32_of(le_peer_qp, i),
                        pid: u32_of(le_pid, i),
                        rank: opt_i32(le_rank, i, -1),
                        peer: opt_str(le_peer, i)
                            .parse::<std::net::IpAddr>()
                            .map_or([0u8; 16], crate::record::Flow::addr_bytes),
                        device: LinkEvent::name_bytes(opt_str(le_device, i)),
                        what: LinkEvent::name_bytes(opt_str(le_what, i)),
                    })
                }
                "link" => Record::Link(crate::record::Link {
                    rec_seq: rec_seq.value(i),
                    op: opc,
                    flags: fl,
                    comm_id: opt_u64(comm_id, i),
                    seq: opt_u64(seq, i),
                    op_seq: opt_u64(op_seq, i),
                    bytes: opt_u64(bytes, i),
                    steps: steps.filter(|a| !a.is_null(i)).map_or(0, |a| a.value(i)),
                    channels: opt_i32(channel, i, 0).clamp(0, 255) as u8,
                    peer: opt_i32(peer, i, -1),
                    t_start: opt_u64(t_enter, i),
                    t_end: opt_u64(t_exit, i),
                    rank: rank.value(i),
                    comm_rank: opt_i32(comm_rank, i, -1),
                    net_ns: opt_u64(link_net_ns, i),
                    gpu_wait_ns: opt_u64(link_gpu_wait_ns, i),
                    peer_wait_ns: opt_u64(link_peer_wait_ns, i),
                    xfer_bytes: opt_u64(link_xfer_bytes, i),
                    steps_done: link_steps_done
                        .filter(|a| !a.is_null(i))
                        .map_or(0, |a| a.value(i)),
                }),
                _ => {
                    self.unknown += 1;
                    continue;
                }
            };
            f(&row, rec);
        }
        Ok(true)
    }
}

fn dtype_code(name: &str) -> u16 {
    if name.is_empty() {
        return dtype::NONE;
    }
    (0..=255u16)
        .chain([dtype::DERIVED, dtype::MIXED])
        .find(|&c| dtype::name(c) == name)
        .unwrap_or(dtype::NONE)
}

/// Codes of the names a column holds (a handful: ops, data types), each looked up once, so a
/// row costs a compare or two rather than a search of every name.
struct Codes<T> {
    seen: Vec<(String, T)>,
    lookup: fn(&str) -> T,
}

impl<T: Copy> Codes<T> {
    fn new(lookup: fn(&str) -> T) -> Codes<T> {
        Codes {
            seen: Vec::new(),
            lookup,
        }
    }

    fn code(&mut self, name: &str) -> T {
        if let Some((_, c)) = self
            .seen
            .iter()
            .find(|(n, _)| n.len() == name.len() && n.as_bytes() == name.as_bytes())
        {
            return *c;
        }
        let c = (self.lookup)(name);
        if self.seen.len() < 64 {
            self.seen.push((name.to_owned(), c));
        }
        c
    }
}

fn op_code(name: &str) -> u8 {
    Op::from_name(name).map_or(0, |o| o as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::flags;

    #[test]
    fn round_trip_through_parquet() {
        let header = Header {
            version: 1,
            job: "j".into(),
            node: "n".into(),
            pid: 7,
            rank: 2,
            world_size: 4,
            start_time: 99,
            mono_anchor: 5,
            real_anchor: 6,
            flavour: "mpich".into(),
            ..Default::default()
        };
        let mut comm = Comm::new(CommEvent::Created, 0xabc, 0x1, 10, 2, 1, 4, 0);
        comm.rec_seq = 1;
        comm.set_name(b"TP");
        let call = Call {
            rec_seq: 2,
            op: Op::Allgather as u8,
            flags: flags::IN_PLACE,
            comm_id: 0xabc,
            seq: 3,
            op_seq: 1,
            bytes: 64,
            count: 16,
            peer: -1,
            tag: -1,
            t_enter: 100,
            t_exit: 200,
            rank: 2,
            comm_rank: 1,
            comm_size: 4,
            dtype: dtype::FLOAT,
            peer2: -1,
            tag2: -1,
            ..Default::default()
        };
        let hb = Heartbeat {
            rec_seq: 3,
            flags: flags::FINAL,
            t_mono: 300,
            t_real: 400,
            in_flight: 0,
            rank: 2,
            produced: 3,
            ..Default::default()
        };
        let recs = vec![
            Record::Comm(comm),
            Record::Call(call),
            Record::Enter(Call {
                rec_seq: 4,
                t_exit: 0,
                ..call
            }),
            Record::Heartbeat(hb),
            Record::Process(Process {
                rec_seq: 5,
                event: ProcessEvent::Exit,
                flags: flags::OBSERVED,
                t_mono: 500,
                t_real: 600,
                pid: 7,
                exit_status: crate::record::EXIT_STATUS_UNKNOWN,
                start_time: 99,
                rank: 2,
                world_size: 4,
                signal: 9,
                step: 0,
            }),
            Record::Process(Process {
                rec_seq: 6,
                event: ProcessEvent::Step,
                flags: 0,
                t_mono: 450,
                t_real: 550,
                pid: 7,
                exit_status: crate::record::EXIT_STATUS_UNKNOWN,
                start_time: 99,
                rank: 2,
                world_size: 4,
                signal: 0,
                step: 41,
            }),
            Record::Call(Call {
                rec_seq: 7,
                sample_shift: 2,
                ..call
            }),
            Record::Skip(crate::record::Skip {
                rec_seq: 10,
                from_rec_seq: 8,
                through_rec_seq: 10,
                op: Op::Allgather as u8,
                flags: flags::NONBLOCKING,
                comm_id: 0xabc,
                first_seq: 5,
                last_seq: 7,
                calls: 3,
                bytes: 192,
                inside_ns: 777,
                t_first: 700,
                t_last: 900,
                rank: 2,
                comm_rank: 1,
                comm_size: 4,
                modulus: 4,
            }),
            Record::Call(Call {
                rec_seq: 11,
                lib: crate::op::lib::NCCL,
                gpu_start: 150,
                gpu_end: 190,
                ..call
            }),
            Record::Link(crate::record::Link {
                rec_seq: 12,
                op: Op::Allgather as u8,
                flags: flags::LINK_SEND,
                comm_id: 0xabc,
                seq: 3,
                op_seq: 1,
                bytes: 4096,
                steps: 8,
                channels: 2,
                peer: 2,
                t_start: 160,
                t_end: 185,
                rank: 2,
                comm_rank: 1,
                net_ns: 18,
                gpu_wait_ns: 4,
                peer_wait_ns: 1,
                xfer_bytes: 4000,
                steps_done: 8,
            }),
            Record::Comm({
                let mut c = Comm::new(CommEvent::Failed, 0xdef, 0, 950, 2, 1, 4, 0);
                c.rec_seq = 13;
                c.flags = flags::NCCL_COMM;
                c.status = 2;
                c.device = 1;
                c.set_name(b"unhandled system error");
                c
            }),
            Record::Flow(crate::record::Flow {
                rec_seq: 14,
                transport: crate::record::flow_transport::RDMA,
                bytes_sent: 1 << 30,
                local: crate::record::Flow::lid_address(5),
                remote: crate::record::Flow::lid_address(9),
                t_start: 960,
                t_end: 965,
                rank: 2,
                pid: 8,
                iface: crate::record::Flow::iface_bytes("mlx5_0:1"),
                ..Default::default()
            }),
            Record::Flow(crate::record::Flow {
                rec_seq: 15,
                transport: crate::record::flow_transport::TCP,
                flags: flags::FLOW_CLOSED,
                bytes_sent: 1 << 33,
                bytes_received: 12,
                busy_ns: 900,
                retransmits: 2,
                srtt_us: 41,
                cwnd: 10,
                local: crate::record::Flow::addr_bytes("10.0.0.1".parse().expect("ip")),
                remote: crate::record::Flow::addr_bytes("fd00::2".parse().expect("ip")),
                local_port: 1,
                remote_port: 65535,
                t_start: 970,
                t_end: 990,
                rank: 2,
                pid: 8,
                iface: crate::record::Flow::iface_bytes("eth0"),
            }),
            Record::LinkEvent(crate::record::LinkEvent {
                rec_seq: 16,
                event: crate::record::link_event::QP_ERROR,
                flags: 0,
                t: 995,
                count: 1,
                port: 1,
                qp_num: 0x1a2,
                peer_qp: 0x3b4,
                pid: 8,
                rank: 2,
                peer: crate::record::Flow::addr_bytes("10.0.0.2".parse().expect("ip")),
                device: crate::record::LinkEvent::name_bytes("mlx5_0"),
                what: crate::record::LinkEvent::name_bytes("QP 0x1a2 to ERROR"),
            }),
            Record::LinkEvent(crate::record::LinkEvent {
                rec_seq: 17,
                event: crate::record::link_event::COUNTER,
                t: 996,
                count: 40,
                rank: -1,
                device: crate::record::LinkEvent::name_bytes("eth0"),
                what: crate::record::LinkEvent::name_bytes("rx_crc_errors"),
                ..Default::default()
            }),
            Record::Process(Process {
                rec_seq: 14,
                event: ProcessEvent::Network,
                flags: 0,
                t_mono: 960,
                t_real: 1060,
                pid: 7,
                exit_status: crate::record::EXIT_STATUS_UNKNOWN,
                start_time: 99,
                rank: 2,
                world_size: 4,
                signal: 0,
                step: 1_600_000,
            }),
        ];
        let clock = Some(ClockAlignment {
            offset_ns: -1234,
            error_ns: 56,
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        let n = write(
            &path,
            &[ProcessTrace {
                header: header.clone(),
                records: recs.clone(),
                clock,
                cut_short: false,
            }],
        )
        .expect("write");
        assert_eq!(n, recs.len() as u64);
        let (back, unknown) = read(&path).expect("read");
        assert_eq!(unknown, 0);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].header.job, "j");
        assert_eq!(back[0].header.rank, 2);
        assert_eq!(back[0].records, recs);
        assert_eq!(back[0].clock, clock);
    }

    #[test]
    fn foreign_parquet_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("other.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
        let file = std::fs::File::create(&path).expect("create");
        let mut w = ArrowWriter::try_new(file, schema.clone(), None).expect("writer");
        let batch = RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![1u64]))])
            .expect("batch");
        w.write(&batch).expect("write");
        w.close().expect("close");
        let err = read(&path).expect_err("foreign");
        assert!(
            err.to_string().contains("not a commscope Parquet trace"),
            "{err}"
        );
    }
}
