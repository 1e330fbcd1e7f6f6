//! The shim's trace files (`<trace-dir>/<job>/<node>-<pid>-<rank>.cst`): an append-only,
//! versioned binary format.
//!
//! ```text
//! file    := header block*
//! header  := "CSTRACE\0" version:u16 record_size:u16 header_len:u32 field* end
//! field   := tag:u16 len:u16 bytes[len]          (unknown tags are skipped)
//! end     := tag 0, len 0; then zero padding up to header_len
//! block   := raw | compact
//! raw     := "CBLK" count:u32 crc32c:u32 0:u32 record[count]          (record = 128 bytes)
//! compact := "CBLC" count:u32 crc32c:u32 body_len:u32 body[body_len]  (version 2 on)
//! body    := (slot:u8 mask:u16 delta*)[count]
//! ```
//!
//! A compact record is the raw record's sixteen little-endian 64-bit words, each stored as the
//! zigzag LEB128 varint of its wrapping difference to the same word of a reference record:
//! the last record in this block that used the same `slot` (all zeros at the start of a
//! block). `mask` has bit `i` set when word `i` differs (only those deltas follow). The writer
//! chooses the slot — one per communicator for calls — so consecutive calls on a communicator
//! cost ~12 bytes instead of 128; the reader just follows it. Blocks decode independently.
//!
//! Every reader reads every earlier version; a file of a newer version is refused with a
//! clear error. A block is written with one `write` call, so a crash leaves at most one
//! incomplete block at the end, which the reader reports and skips; a block whose checksum
//! does not match is reported and skipped, and reading resumes at the next block.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::crc::crc32c;
use crate::record::{RECORD_SIZE, RawRecord, Record};

/// The file magic.
pub const MAGIC: [u8; 8] = *b"CSTRACE\0";
/// The magic of a block of raw 128-byte records.
pub const BLOCK_MAGIC: [u8; 4] = *b"CBLK";
/// The magic of a block of compact records (format version 2 on).
pub const COMPACT_MAGIC: [u8; 4] = *b"CBLC";
/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 2;
/// File name extension.
pub const EXTENSION: &str = "cst";
/// Most records one block may claim (a sanity bound for corrupt lengths).
pub const MAX_BLOCK_RECORDS: u32 = 1 << 20;

const FIXED_HEADER: usize = 16;
pub const BLOCK_HEADER: usize = 16;
/// Reference slots of the compact encoding.
const SLOTS: usize = 16;
/// Words per raw record.
const WORDS: usize = RECORD_SIZE / 8;
/// The longest a compact record can be: slot, mask and sixteen 10-byte varints.
const MAX_COMPACT: usize = 3 + WORDS * 10;

/// Header field tags.
mod tag {
    pub const END: u16 = 0;
    pub const JOB: u16 = 1;
    pub const NODE: u16 = 2;
    pub const PID: u16 = 3;
    pub const RANK: u16 = 4;
    pub const WORLD_SIZE: u16 = 5;
    pub const START_TIME: u16 = 6;
    pub const MONO_ANCHOR: u16 = 7;
    pub const REAL_ANCHOR: u16 = 8;
    pub const LIBRARY: u16 = 9;
    pub const FLAVOUR: u16 = 10;
    pub const VERSION: u16 = 11;
}

/// Who wrote a trace file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Format version of the file (set by the reader; the writer always writes the current one).
    pub version: u16,
    pub job: String,
    pub node: String,
    pub pid: u32,
    /// Global rank.
    pub rank: i32,
    pub world_size: i32,
    /// Process start time in clock ticks since boot.
    pub start_time: u64,
    /// A simultaneous reading of `CLOCK_MONOTONIC` and `CLOCK_REALTIME` (ns), relating the two.
    pub mono_anchor: u64,
    pub real_anchor: u64,
    /// The communication library, e.g. `"Open MPI v4.1.4, …"`.
    pub library: String,
    /// `openmpi`, `mpich` or `nccl`.
    pub flavour: String,
    /// The commscope version that wrote the file.
    pub writer_version: String,
}

impl Header {
    /// The node agent's own identity for its transport records (`flow`), not a rank's.
    pub fn is_transport(&self) -> bool {
        self.rank == crate::record::TRANSPORT_RANK
    }

    /// The canonical file name for this header: `<node>-<pid>-<rank>.cst`.
    pub fn file_name(&self) -> String {
        format!(
            "{}-{}-{}.{EXTENSION}",
            sanitize(&self.node),
            self.pid,
            self.rank
        )
    }

    /// Encodes the header.
    pub fn encode(&self) -> Vec<u8> {
        let mut fields = Vec::new();
        let mut put = |t: u16, v: &[u8]| {
            let v = &v[..v.len().min(u16::MAX as usize)];
            fields.extend_from_slice(&t.to_le_bytes());
            fields.extend_from_slice(&(v.len() as u16).to_le_bytes());
            fields.extend_from_slice(v);
        };
        put(tag::JOB, self.job.as_bytes());
        put(tag::NODE, self.node.as_bytes());
        put(tag::PID, &self.pid.to_le_bytes());
        put(tag::RANK, &self.rank.to_le_bytes());
        put(tag::WORLD_SIZE, &self.world_size.to_le_bytes());
        put(tag::START_TIME, &self.start_time.to_le_bytes());
        put(tag::MONO_ANCHOR, &self.mono_anchor.to_le_bytes());
        put(tag::REAL_ANCHOR, &self.real_anchor.to_le_bytes());
        put(tag::LIBRARY, self.library.as_bytes());
        put(tag::FLAVOUR, self.flavour.as_bytes());
        put(tag::VERSION, self.writer_version.as_bytes());
        put(tag::END, &[]);
        let header_len = (FIXED_HEADER + fields.len()).next_multiple_of(16);
        let mut out = Vec::with_capacity(header_len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(RECORD_SIZE as u16).to_le_bytes());
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
        out.extend_from_slice(&fields);
        out.resize(header_len, 0);
        out
    }
}

/// Replaces characters that do not belong in a file name component.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match out.as_str() {
        "" | "." | ".." => "_".repeat(out.len().max(1)),
        _ => out,
    }
}

/// A block being built: records are compacted straight into it as they come (see the module
/// documentation) and [`Block::finish`] completes the header, so a record is read once on its
/// way to the file.
#[derive(Clone, Debug)]
pub struct Block {
    buf: Vec<u8>,
    count: u32,
    refs: [[u64; WORDS]; SLOTS],
}

impl Default for Block {
    fn default() -> Self {
        Block {
            buf: Vec::new(),
            count: 0,
            refs: [[0; WORDS]; SLOTS],
        }
    }
}

impl Block {
    /// An empty block with room for about `records` records.
    pub fn with_capacity(records: usize) -> Block {
        Block {
            buf: Vec::with_capacity(BLOCK_HEADER + records * 32),
            ..Block::default()
        }
    }

    /// Appends a record.
    pub fn push(&mut self, r: &RawRecord) {
        if self.buf.is_empty() {
            self.buf.resize(BLOCK_HEADER, 0);
        }
        let mut words = [0u64; WORDS];
        for (w, chunk) in words.iter_mut().zip(r.chunks_exact(8)) {
            let mut x = [0u8; 8];
            x.copy_from_slice(chunk);
            *w = u64::from_le_bytes(x);
        }
        let slot = slot_of(&words);
        let reference = &mut self.refs[slot];
        let mut out = [0u8; MAX_COMPACT];
        out[0] = slot as u8;
        let mut at = 3;
        let mut mask = 0u16;
        for (i, (w, r)) in words.iter().zip(reference.iter()).enumerate() {
            let d = w.wrapping_sub(*r) as i64;
            if d != 0 {
                mask |= 1 << i;
                let mut z = ((d << 1) ^ (d >> 63)) as u64;
                while z >= 0x80 {
                    out[at] = (z as u8) | 0x80;
                    z >>= 7;
                    at += 1;
                }
                out[at] = z as u8;
                at += 1;
            }
        }
        out[1..3].copy_from_slice(&mask.to_le_bytes());
        *reference = words;
        self.buf.extend_from_slice(&out[..at]);
        self.count += 1;
    }

    /// Records in the block.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the block holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Encoded bytes so far (header included once a record is in).
    pub fn encoded_len(&self) -> usize {
        self.buf.len()
    }

    /// Empties the block, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
        self.refs = [[0; WORDS]; SLOTS];
    }

    /// Completes the header and returns the encoded block.
    pub fn finish(&mut self) -> &[u8] {
        if self.buf.is_empty() {
            return &[];
        }
        let body_len = (self.buf.len() - BLOCK_HEADER) as u32;
        let crc = crc32c(&self.buf[BLOCK_HEADER..]);
        self.buf[0..4].copy_from_slice(&COMPACT_MAGIC);
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        self.buf[8..12].copy_from_slice(&crc.to_le_bytes());
        self.buf[12..16].copy_from_slice(&body_len.to_le_bytes());
        &self.buf
    }
}

/// The writer's choice of reference: calls and `enter` records follow the previous record of
/// their communicator (by kind), everything else the previous record of its kind.
#[inline]
fn slot_of(words: &[u64; WORDS]) -> usize {
    let kind = (words[1] & 0xff) as u8;
    if kind == crate::record::kind::CALL || kind == crate::record::kind::ENTER {
        let h = words[2].wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
        4 + (h as usize % (SLOTS - 4))
    } else {
        usize::from(kind) % 4
    }
}

/// Expands a compact block body into raw records; `None` if it does not hold exactly `count`
/// well-formed records.
fn expand(body: &[u8], count: u32) -> Option<Vec<RawRecord>> {
    let mut refs = [[0u64; WORDS]; SLOTS];
    let mut out = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    for _ in 0..count {
        let slot = usize::from(*body.get(at)?);
        let mask = u16::from_le_bytes([*body.get(at + 1)?, *body.get(at + 2)?]);
        at += 3;
        let reference = refs.get_mut(slot)?;
        for (i, w) in reference.iter_mut().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            let mut z = 0u64;
            let mut shift = 0u32;
            loop {
                let b = *body.get(at)?;
                at += 1;
                if shift == 63 && b > 1 {
                    return None;
                }
                z |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    break;
                }
                shift += 7;
                if shift > 63 {
                    return None;
                }
            }
            let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
            *w = w.wrapping_add(d as u64);
        }
        let mut raw = [0u8; RECORD_SIZE];
        for (chunk, w) in raw.chunks_exact_mut(8).zip(reference.iter()) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out.push(raw);
    }
    (at == body.len()).then_some(out)
}

/// Encodes one block of raw (uncompacted) records, the layout of format version 1.
pub fn encode_raw_block(records: &[RawRecord]) -> Vec<u8> {
    if records.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(BLOCK_HEADER + records.len() * RECORD_SIZE);
    out.extend_from_slice(&BLOCK_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    for r in records {
        out.extend_from_slice(r);
    }
    let crc = crc32c(&out[BLOCK_HEADER..]);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The header of a block of raw records (the version 1 layout, which every reader reads) whose
/// `count` records are `body`; the block is the header followed by `body`. Allocation-free, so
/// a process can write its last records from a signal handler.
pub fn raw_block_header(body: &[u8], count: u32) -> [u8; BLOCK_HEADER] {
    let mut h = [0u8; BLOCK_HEADER];
    h[0..4].copy_from_slice(&BLOCK_MAGIC);
    h[4..8].copy_from_slice(&count.to_le_bytes());
    h[8..12].copy_from_slice(&crc32c(body).to_le_bytes());
    h
}

/// Decodes one block (either layout) at the start of `bytes`: its raw records and its encoded
/// length. Records are not interpreted (see [`Record::decode`]).
pub fn decode_block(bytes: &[u8]) -> Result<(Vec<RawRecord>, usize), String> {
    let magic = bytes.get(..4).ok_or("shorter than a block header")?;
    let compact = magic == COMPACT_MAGIC;
    if !compact && magic != BLOCK_MAGIC {
        return Err("no block magic".into());
    }
    if bytes.len() < BLOCK_HEADER {
        return Err("shorter than a block header".into());
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let (count, crc) = (word(4), word(8));
    let body_len = if compact {
        word(12) as usize
    } else {
        count as usize * RECORD_SIZE
    };
    if count == 0
        || count > MAX_BLOCK_RECORDS
        || body_len > count as usize * MAX_COMPACT.max(RECORD_SIZE)
    {
        return Err(format!(
            "implausible block header ({count} records in {body_len} bytes)"
        ));
    }
    let body = bytes
        .get(BLOCK_HEADER..BLOCK_HEADER + body_len)
        .ok_or("the block is truncated")?;
    if crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    let raws = if compact {
        expand(body, count).ok_or("malformed compact body")?
    } else {
        body.chunks_exact(RECORD_SIZE)
            .map(|c| {
                let mut r = [0u8; RECORD_SIZE];
                r.copy_from_slice(c);
                r
            })
            .collect()
    };
    Ok((raws, BLOCK_HEADER + body_len))
}

/// Encodes one block of records.
pub fn encode_block(records: &[RawRecord]) -> Vec<u8> {
    let mut b = Block::with_capacity(records.len());
    for r in records {
        b.push(r);
    }
    b.finish().to_vec()
}

/// Appends records to a trace file. Each block is written with one `write`.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    scratch: Block,
}

impl<W: Write> Writer<W> {
    /// Writes the header and returns the writer.
    pub fn new(mut out: W, header: &Header) -> io::Result<Self> {
        out.write_all(&header.encode())?;
        out.flush()?;
        Ok(Writer {
            out,
            scratch: Block::default(),
        })
    }

    /// Appends one block holding `records` (nothing for an empty slice).
    pub fn append(&mut self, records: &[RawRecord]) -> io::Result<()> {
        let mut block = std::mem::take(&mut self.scratch);
        for r in records {
            block.push(r);
        }
        let result = self.write_block(&mut block);
        self.scratch = block;
        result
    }

    /// Writes a block built by the caller and empties it (nothing for an empty block).
    pub fn write_block(&mut self, block: &mut Block) -> io::Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        self.out.write_all(block.finish())?;
        block.clear();
        self.out.flush()
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

/// Why a trace file cannot be read at all.
#[derive(Debug)]
pub enum Error {
    /// Reading failed.
    Io { path: PathBuf, source: io::Error },
    /// The file does not start with the `.cst` magic.
    NotATrace { path: PathBuf },
    /// The file was written by a newer commscope.
    NewerVersion {
        path: PathBuf,
        found: u16,
        supported: u16,
    },
    /// The header is damaged.
    BadHeader { path: PathBuf, reason: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "failed to read {}: {source}", path.display()),
            Error::NotATrace { path } => write!(
                f,
                "{} is not a commscope trace file (bad magic)",
                path.display()
            ),
            Error::NewerVersion {
                path,
                found,
                supported,
            } => write!(
                f,
                "{} has trace format version {found}, newer than the supported version {supported}; upgrade commscope to read it",
                path.display()
            ),
            Error::BadHeader { path, reason } => {
                write!(f, "{} has a damaged header: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A decoded trace file.
#[derive(Clone, Debug)]
pub struct TraceFile {
    pub path: PathBuf,
    pub header: Header,
    pub records: Vec<Record>,
    /// Damage that was skipped (truncated last block, bad checksums, undecodable records),
    /// one sentence each.
    pub warnings: Vec<String>,
}

/// Whether `bytes` start like a `.cst` file.
pub fn sniff(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// Where a trace file's intact part ends, for completing it after its writer is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tail {
    /// The header, as written.
    pub header: Header,
    /// The offset just past the last intact block (a block cut short by the writer's death, and
    /// anything after it, lies beyond).
    pub intact_len: u64,
    /// The highest `rec_seq` of the intact blocks (0: none).
    pub last_rec_seq: u64,
}

/// Finds a trace file's [`Tail`], reading block headers and the last intact block only.
pub fn tail(path: &Path) -> Result<Tail, Error> {
    use std::io::{Seek, SeekFrom};
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut first = vec![0u8; (len as usize).min(64 << 10)];
    f.read_exact(&mut first).map_err(io)?;
    let (header, header_len) = decode_header(&first).map_err(|e| e.at(path))?;
    let mut at = header_len as u64;
    let mut last: Option<(u64, usize)> = None;
    loop {
        let mut h = [0u8; BLOCK_HEADER];
        if at + BLOCK_HEADER as u64 > len {
            break;
        }
        f.seek(SeekFrom::Start(at)).map_err(io)?;
        f.read_exact(&mut h).map_err(io)?;
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let body = match &h[..4] {
            m if m == COMPACT_MAGIC => word(12) as u64,
            m if m == BLOCK_MAGIC => u64::from(word(4)) * RECORD_SIZE as u64,
            _ => break,
        };
        let total = BLOCK_HEADER as u64 + body;
        if word(4) == 0 || at + total > len {
            break;
        }
        last = Some((at, total as usize));
        at += total;
    }
    // The last block must decode whole (its checksum holds); else the one before it is the end.
    let mut intact_len = header_len as u64;
    let mut last_rec_seq = 0;
    if let Some((off, n)) = last {
        let mut b = vec![0u8; n];
        f.seek(SeekFrom::Start(off)).map_err(io)?;
        f.read_exact(&mut b).map_err(io)?;
        if let Ok((raws, _)) = decode_block(&b) {
            intact_len = off + n as u64;
            last_rec_seq = raws
                .iter()
                .map(|r| u64::from_le_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]))
                .max()
                .unwrap_or(0);
        } else {
            // Rare (a block torn mid-write): read the file to find the last good block.
            let t = read_file(path)?;
            return Ok(Tail {
                header,
                intact_len: off,
                last_rec_seq: t.records.iter().map(Record::rec_seq).max().unwrap_or(0),
            });
        }
    }
    Ok(Tail {
        header,
        intact_len,
        last_rec_seq,
    })
}

/// Reads a trace file.
pub fn read_file(path: &Path) -> Result<TraceFile, Error> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
    parse(path, &bytes)
}

/// Why a `.cst` header cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// The bytes do not start with the magic.
    NotATrace,
    /// Written by a newer version.
    NewerVersion { found: u16 },
    /// Damaged.
    Bad(String),
}

impl HeaderError {
    /// The file-level error for the file at `path`.
    fn at(self, path: &Path) -> Error {
        let path = path.to_owned();
        match self {
            HeaderError::NotATrace => Error::NotATrace { path },
            HeaderError::NewerVersion { found } => Error::NewerVersion {
                path,
                found,
                supported: FORMAT_VERSION,
            },
            HeaderError::Bad(reason) => Error::BadHeader { path, reason },
        }
    }
}

/// Decodes a header at the start of `bytes`; returns it with its encoded length.
pub fn decode_header(bytes: &[u8]) -> Result<(Header, usize), HeaderError> {
    let bad = |reason: &str| HeaderError::Bad(reason.to_owned());
    if !sniff(bytes) {
        return Err(HeaderError::NotATrace);
    }
    if bytes.len() < FIXED_HEADER {
        return Err(bad("file ends inside the header"));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version > FORMAT_VERSION {
        return Err(HeaderError::NewerVersion { found: version });
    }
    if version == 0 {
        return Err(bad("version 0"));
    }
    let record_size = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
    if record_size != RECORD_SIZE {
        return Err(bad(&format!(
            "record size {record_size}, expected {RECORD_SIZE}"
        )));
    }
    let header_len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    if header_len < FIXED_HEADER || header_len > bytes.len() {
        return Err(bad("header length beyond the end of the file"));
    }
    let mut header = Header {
        version,
        rank: -1,
        ..Default::default()
    };
    let mut at = FIXED_HEADER;
    loop {
        if at + 4 > header_len {
            return Err(bad("header fields run past the header"));
        }
        let t = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let len = u16::from_le_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
        at += 4;
        if t == tag::END {
            break;
        }
        let v = bytes
            .get(at..at + len)
            .filter(|_| at + len <= header_len)
            .ok_or_else(|| bad("field runs past the header"))?;
        at += len;
        let text = || String::from_utf8_lossy(v).into_owned();
        let int = |n: usize| -> Result<u64, HeaderError> {
            if v.len() != n {
                return Err(bad(&format!(
                    "field {t} has length {}, expected {n}",
                    v.len()
                )));
            }
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(v);
            Ok(u64::from_le_bytes(w))
        };
        match t {
            tag::JOB => header.job = text(),
            tag::NODE => header.node = text(),
            tag::PID => header.pid = int(4)? as u32,
            tag::RANK => header.rank = int(4)? as u32 as i32,
            tag::WORLD_SIZE => header.world_size = int(4)? as u32 as i32,
            tag::START_TIME => header.start_time = int(8)?,
            tag::MONO_ANCHOR => header.mono_anchor = int(8)?,
            tag::REAL_ANCHOR => header.real_anchor = int(8)?,
            tag::LIBRARY => header.library = text(),
            tag::FLAVOUR => header.flavour = text(),
            tag::VERSION => header.writer_version = text(),
            _ => {} // a field from a later minor revision: skip
        }
    }

    Ok((header, header_len))
}

/// Parses the bytes of a trace file.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<TraceFile, Error> {
    let (header, header_len) = decode_header(bytes).map_err(|e| e.at(path))?;
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut undecodable = 0usize;
    let mut at = header_len;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let magic = rest.get(..4);
        let compact = magic == Some(&COMPACT_MAGIC[..]);
        if rest.len() < BLOCK_HEADER || !(compact || magic == Some(&BLOCK_MAGIC[..])) {
            let head = &rest[..rest.len().min(4)];
            if rest.len() < BLOCK_HEADER
                && (BLOCK_MAGIC.starts_with(head) || COMPACT_MAGIC.starts_with(head))
            {
                warnings.push(format!(
                    "truncated: the file ends inside a block header at byte {at}"
                ));
                break;
            }
            match find_block(rest, 1) {
                Some(skip) => {
                    warnings.push(format!(
                        "corrupt data at byte {at}: skipped {skip} bytes to the next block"
                    ));
                    at += skip;
                    continue;
                }
                None => {
                    warnings.push(format!(
                        "corrupt data at byte {at}: the last {} bytes were skipped",
                        rest.len()
                    ));
                    break;
                }
            }
        }
        let count = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let body_len = if compact {
            u32::from_le_bytes([rest[12], rest[13], rest[14], rest[15]]) as usize
        } else {
            count as usize * RECORD_SIZE
        };
        let min_len = if compact { 3 } else { RECORD_SIZE };
        if count == 0
            || count > MAX_BLOCK_RECORDS
            || body_len < count as usize * min_len
            || body_len > count as usize * MAX_COMPACT.max(RECORD_SIZE)
        {
            warnings.push(format!(
                "corrupt block header at byte {at} (claims {count} records in {body_len} bytes): skipped"
            ));
            at += find_block(rest, 4).unwrap_or(rest.len());
            continue;
        }
        if rest.len() < BLOCK_HEADER + body_len {
            let held = if compact {
                "part".to_owned()
            } else {
                ((rest.len() - BLOCK_HEADER) / RECORD_SIZE).to_string()
            };
            warnings.push(format!(
                "truncated: the last block at byte {at} holds {held} of {count} records; {} records before it were read",
                records.len()
            ));
            break;
        }
        let body = &rest[BLOCK_HEADER..BLOCK_HEADER + body_len];
        if crc32c(body) != crc {
            warnings.push(format!(
                "checksum mismatch in the block at byte {at} ({count} records): skipped"
            ));
            at += BLOCK_HEADER + body_len;
            continue;
        }
        let mut take = |raw: &RawRecord| match Record::decode(raw) {
            Ok(r) => records.push(r),
            Err(_) => undecodable += 1,
        };
        if compact {
            match expand(body, count) {
                Some(raws) => raws.iter().for_each(&mut take),
                None => warnings.push(format!(
                    "malformed compact block at byte {at} ({count} records) despite a valid checksum: skipped"
                )),
            }
        } else {
            for chunk in body.chunks_exact(RECORD_SIZE) {
                let mut raw = [0u8; RECORD_SIZE];
                raw.copy_from_slice(chunk);
                take(&raw);
            }
        }
        at += BLOCK_HEADER + body_len;
    }
    if undecodable > 0 {
        warnings.push(format!(
            "{undecodable} records of unknown kind were skipped"
        ));
    }
    Ok(TraceFile {
        path: path.to_owned(),
        header,
        records,
        warnings,
    })
}

fn find_block(bytes: &[u8], from: usize) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(4)
        .position(|w| w == BLOCK_MAGIC || w == COMPACT_MAGIC)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Call, Heartbeat};

    fn header() -> Header {
        Header {
            version: FORMAT_VERSION,
            job: "job-7".into(),
            node: "node-a".into(),
            pid: 4242,
            rank: 3,
            world_size: 8,
            start_time: 123,
            mono_anchor: 1_000,
            real_anchor: 1_700_000_000_000_000_000,
            library: "Open MPI v4.1.4".into(),
            flavour: "openmpi".into(),
            writer_version: "0.1.0".into(),
        }
    }

    fn recs(range: std::ops::Range<u64>) -> Vec<RawRecord> {
        range
            .map(|i| {
                Record::Call(Call {
                    rec_seq: i + 1,
                    seq: i,
                    ..Default::default()
                })
                .encode()
            })
            .collect()
    }

    fn write(blocks: &[Vec<RawRecord>]) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), &header()).expect("header");
        for b in blocks {
            w.append(b).expect("append");
        }
        std::mem::take(w.get_mut())
    }

    #[test]
    fn round_trip() {
        let bytes = write(&[recs(0..3), recs(3..10)]);
        let t = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(t.header, header());
        let want: Vec<Record> = recs(0..10)
            .iter()
            .map(|r| Record::decode(r).expect("decodes"))
            .collect();
        assert_eq!(t.records, want);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        assert_eq!(header().file_name(), "node-a-4242-3.cst");
    }

    #[test]
    fn the_tail_of_a_file_is_its_last_intact_block_and_a_raw_block_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.cst");
        let whole = write(&[recs(0..3), recs(3..10)]);
        std::fs::write(&path, &whole).expect("write");
        let t = tail(&path).expect("tail");
        assert_eq!((t.intact_len, t.last_rec_seq), (whole.len() as u64, 10));
        assert_eq!(t.header, header());
        // A writer killed mid-block: the torn block is past the intact end.
        let torn = &whole[..whole.len() - 5];
        std::fs::write(&path, torn).expect("write");
        let t = tail(&path).expect("tail");
        let first_two = write(&[recs(0..3)]);
        assert_eq!((t.intact_len, t.last_rec_seq), (first_two.len() as u64, 3));
        // What a signal handler writes: a raw block from a stack buffer, its header apart.
        let body: Vec<u8> = recs(3..5).concat();
        let mut raw = raw_block_header(&body, 2).to_vec();
        raw.extend_from_slice(&body);
        assert_eq!(raw, encode_raw_block(&recs(3..5)));
        let mut bytes = first_two;
        bytes.extend_from_slice(&raw);
        let parsed = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(parsed.records.len(), 5);
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    }

    /// A training-like stream: calls on three communicators interleaved, p2p, heartbeats.
    fn realistic(n: u64) -> Vec<RawRecord> {
        let comms = [
            0x3f1a_2b3c_4d5e_6f70u64,
            0x1234_5678_9abc_def0,
            0x0bad_cafe_f00d_d00d,
        ];
        let mut t = 1_000_000_000u64;
        let mut seqs = [0u64; 3];
        let mut out = Vec::new();
        for i in 0..n {
            t += 9_000 + (i * 7919) % 3_000;
            let c = (i % 3) as usize;
            seqs[c] += 1;
            let r = if i % 97 == 0 {
                Record::Heartbeat(Heartbeat {
                    rec_seq: i + 1,
                    t_mono: t,
                    t_real: t + 1_700_000_000_000_000_000,
                    rank: 3,
                    produced: i,
                    ..Default::default()
                })
            } else {
                Record::Call(Call {
                    rec_seq: i + 1,
                    op: if c == 2 { 13 } else { 4 },
                    comm_id: comms[c],
                    seq: seqs[c],
                    op_seq: seqs[c],
                    bytes: 8 << c,
                    count: 1 << c,
                    peer: if c == 2 { (i % 8) as i32 } else { -1 },
                    tag: if c == 2 { 7 } else { -1 },
                    t_enter: t,
                    t_exit: t + 4_000 + (i * 104_729) % 2_000,
                    rank: 3,
                    comm_rank: 3,
                    comm_size: 8,
                    dtype: 5,
                    clock: 1,
                    peer2: -1,
                    tag2: -1,
                    ..Default::default()
                })
            };
            out.push(r.encode());
        }
        out
    }

    #[test]
    fn compact_blocks_are_exact_and_small() {
        let raws = realistic(2000);
        let mut block = Block::default();
        for r in &raws {
            block.push(r);
        }
        let per_record = (block.encoded_len() - BLOCK_HEADER) as f64 / raws.len() as f64;
        assert!(per_record < 24.0, "{per_record:.1} bytes per record");
        let body_len = block.encoded_len() - BLOCK_HEADER;
        let encoded = block.finish().to_vec();
        let expanded = expand(&encoded[BLOCK_HEADER..], raws.len() as u32).expect("expands");
        assert_eq!(expanded, raws);
        assert_eq!(
            u32::from_le_bytes(encoded[12..16].try_into().expect("4 bytes")) as usize,
            body_len
        );
    }

    #[test]
    fn compact_encoding_round_trips_arbitrary_words() {
        // Any 128 bytes, including words whose differences overflow: every record comes back.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut raws = Vec::new();
        for i in 0..500 {
            let mut r = [0u8; RECORD_SIZE];
            for chunk in r.chunks_exact_mut(8) {
                let v = match next() % 4 {
                    0 => 0,
                    1 => u64::MAX,
                    2 => next() % 300,
                    _ => next(),
                };
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            r[8] = (i % 6) as u8; // spread over the slots
            raws.push(r);
        }
        let mut block = Block::default();
        raws.iter().for_each(|r| block.push(r));
        let encoded = block.finish().to_vec();
        assert_eq!(expand(&encoded[BLOCK_HEADER..], 500), Some(raws));
        // A body that ends early, runs on, or holds an over-long varint is refused.
        let body = &encoded[BLOCK_HEADER..];
        assert_eq!(expand(&body[..body.len() - 1], 500), None);
        assert_eq!(expand(body, 499), None);
        assert_eq!(
            expand(
                &[
                    0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
                ],
                1
            ),
            None
        );
        assert_eq!(expand(&[99, 0, 0], 1), None);
    }

    #[test]
    fn version_1_raw_blocks_are_still_read() {
        let mut bytes = header().encode();
        bytes[8] = 1;
        bytes.extend_from_slice(&encode_raw_block(&recs(0..3)));
        bytes.extend_from_slice(&encode_block(&recs(3..5)));
        let t = parse(Path::new("v1.cst"), &bytes).expect("parse");
        assert_eq!(t.header.version, 1);
        assert_eq!(t.records.len(), 5);
        assert_eq!(t.records[4].rec_seq(), 5);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    }

    #[test]
    fn truncated_file_keeps_every_complete_block() {
        let bytes = write(&[recs(0..3), recs(3..10)]);
        let second = header().encode().len() + encode_block(&recs(0..3)).len();
        for cut in [bytes.len() - 1, bytes.len() - 5, second + 20, second + 3] {
            let t = parse(Path::new("t.cst"), &bytes[..cut]).expect("parse");
            assert_eq!(t.records.len(), 3, "cut at {cut}");
            assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
            assert!(t.warnings[0].starts_with("truncated"), "{:?}", t.warnings);
        }
    }

    #[test]
    fn corrupt_block_is_skipped_and_the_rest_read() {
        let mut bytes = write(&[recs(0..3), recs(3..5), recs(5..6)]);
        let second = header().encode().len() + encode_block(&recs(0..3)).len();
        bytes[second + 16 + 4] ^= 0xff; // inside the second block's body
        let t = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(t.records.len(), 4);
        assert!(t.warnings[0].contains("checksum"), "{:?}", t.warnings);
        // Garbage between blocks: resynchronised at the next block magic.
        let mut bytes = write(&[recs(0..1)]);
        bytes.extend_from_slice(b"garbage!");
        bytes.extend_from_slice(&encode_block(&recs(1..2)));
        let t = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(t.records.len(), 2);
        assert!(
            t.warnings[0].contains("skipped 8 bytes"),
            "{:?}",
            t.warnings
        );
        // A compact body that is malformed although its checksum matches is skipped, the
        // blocks around it read.
        let mut bytes = write(&[recs(0..2)]);
        let mut bad = encode_block(&recs(2..4));
        bad[16] = 200; // an impossible slot
        let crc = crc32c(&bad[16..]);
        bad[8..12].copy_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&bad);
        bytes.extend_from_slice(&encode_block(&recs(4..5)));
        let t = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(t.records.len(), 3);
        assert!(t.warnings[0].contains("malformed"), "{:?}", t.warnings);
    }

    #[test]
    fn newer_versions_and_foreign_files_are_refused_clearly() {
        let mut bytes = write(&[recs(0..1)]);
        bytes[8] = 9;
        let err = parse(Path::new("x.cst"), &bytes).expect_err("newer");
        assert!(
            err.to_string()
                .contains("version 9, newer than the supported version 2"),
            "{err}"
        );
        let err = parse(Path::new("y.txt"), b"hello world").expect_err("foreign");
        assert!(
            err.to_string().contains("not a commscope trace file"),
            "{err}"
        );
        let mut bytes = write(&[]);
        bytes.truncate(20);
        assert!(parse(Path::new("z.cst"), &bytes).is_err());
    }

    #[test]
    fn unknown_header_fields_are_skipped() {
        let mut h = header().encode();
        // Insert an unknown field (tag 99) before the end marker.
        let fields_end = {
            let mut at = FIXED_HEADER;
            loop {
                let t = u16::from_le_bytes([h[at], h[at + 1]]);
                let len = u16::from_le_bytes([h[at + 2], h[at + 3]]) as usize;
                if t == 0 {
                    break at;
                }
                at += 4 + len;
            }
        };
        let extra = [99u8, 0, 2, 0, 0xaa, 0xbb];
        h.splice(fields_end..fields_end, extra);
        let new_len = h.len().next_multiple_of(16);
        h.resize(new_len, 0);
        h[12..16].copy_from_slice(&(new_len as u32).to_le_bytes());
        let mut bytes = h;
        bytes.extend_from_slice(&encode_block(&[Record::Heartbeat(Heartbeat {
            rec_seq: 1,
            ..Default::default()
        })
        .encode()]));
        let t = parse(Path::new("t.cst"), &bytes).expect("parse");
        assert_eq!(t.header.job, "job-7");
        assert_eq!(t.records.len(), 1);
    }
}
