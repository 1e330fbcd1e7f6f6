//! The shim's trace files (`<trace-dir>/<job>/<node>-<pid>-<rank>.cst`): an append-only,
//! versioned binary format.
//!
//! ```text
//! file   := header block*
//! header := "CSTRACE\0" version:u16 record_size:u16 header_len:u32 field* end
//! field  := tag:u16 len:u16 bytes[len]          (unknown tags are skipped)
//! end    := tag 0, len 0; then zero padding up to header_len
//! block  := "CBLK" count:u32 crc32c:u32 reserved:u32 record[count]   (record = 128 bytes)
//! ```
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
/// The block magic.
pub const BLOCK_MAGIC: [u8; 4] = *b"CBLK";
/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// File name extension.
pub const EXTENSION: &str = "cst";
/// Most records one block may claim (a sanity bound for corrupt lengths).
pub const MAX_BLOCK_RECORDS: u32 = 1 << 20;

const FIXED_HEADER: usize = 16;
const BLOCK_HEADER: usize = 16;

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

/// A block being built: records are appended in place and [`Block::finish`] completes the
/// header (count and checksum), so a record is copied once on its way to the file.
#[derive(Clone, Debug, Default)]
pub struct Block {
    buf: Vec<u8>,
}

impl Block {
    /// An empty block with room for `records` records.
    pub fn with_capacity(records: usize) -> Block {
        Block {
            buf: Vec::with_capacity(BLOCK_HEADER + records * RECORD_SIZE),
        }
    }

    /// Appends a record.
    pub fn push(&mut self, r: &RawRecord) {
        if self.buf.is_empty() {
            self.buf.resize(BLOCK_HEADER, 0);
        }
        self.buf.extend_from_slice(r);
    }

    /// Records in the block.
    pub fn len(&self) -> usize {
        self.buf.len().saturating_sub(BLOCK_HEADER) / RECORD_SIZE
    }

    /// Whether the block holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the block, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Completes the header and returns the encoded block.
    pub fn finish(&mut self) -> &[u8] {
        if self.buf.is_empty() {
            return &[];
        }
        let count = self.len() as u32;
        let crc = crc32c(&self.buf[BLOCK_HEADER..]);
        self.buf[0..4].copy_from_slice(&BLOCK_MAGIC);
        self.buf[4..8].copy_from_slice(&count.to_le_bytes());
        self.buf[8..12].copy_from_slice(&crc.to_le_bytes());
        self.buf[12..16].fill(0);
        &self.buf
    }
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

/// Parses the bytes of a trace file.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<TraceFile, Error> {
    let bad = |reason: &str| Error::BadHeader {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if !sniff(bytes) {
        return Err(Error::NotATrace {
            path: path.to_owned(),
        });
    }
    if bytes.len() < FIXED_HEADER {
        return Err(bad("file ends inside the header"));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version > FORMAT_VERSION {
        return Err(Error::NewerVersion {
            path: path.to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        });
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
        let int = |n: usize| -> Result<u64, Error> {
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

    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut undecodable = 0usize;
    let mut at = header_len;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < BLOCK_HEADER || rest[..4] != BLOCK_MAGIC {
            if rest.len() < BLOCK_HEADER && BLOCK_MAGIC.starts_with(&rest[..rest.len().min(4)]) {
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
        let body_len = count as usize * RECORD_SIZE;
        if count == 0 || count > MAX_BLOCK_RECORDS {
            warnings.push(format!(
                "corrupt block header at byte {at} (claims {count} records): skipped"
            ));
            at += find_block(rest, 4).unwrap_or(rest.len());
            continue;
        }
        if rest.len() < BLOCK_HEADER + body_len {
            let whole = (rest.len() - BLOCK_HEADER) / RECORD_SIZE;
            warnings.push(format!(
                "truncated: the last block at byte {at} holds {whole} of {count} records; {} records before it were read",
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
        for chunk in body.chunks_exact(RECORD_SIZE) {
            let mut raw = [0u8; RECORD_SIZE];
            raw.copy_from_slice(chunk);
            match Record::decode(&raw) {
                Ok(r) => records.push(r),
                Err(_) => undecodable += 1,
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
        .position(|w| w == BLOCK_MAGIC)
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
        assert_eq!(t.records.len(), 10);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        assert_eq!(header().file_name(), "node-a-4242-3.cst");
    }

    #[test]
    fn truncated_file_keeps_every_complete_block() {
        let bytes = write(&[recs(0..3), recs(3..10)]);
        for cut in [
            bytes.len() - 1,
            bytes.len() - RECORD_SIZE * 3,
            bytes.len() - 7 * RECORD_SIZE - 10,
        ] {
            let t = parse(Path::new("t.cst"), &bytes[..cut]).expect("parse");
            assert_eq!(t.records.len(), 3, "cut at {cut}");
            assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
            assert!(t.warnings[0].starts_with("truncated"), "{:?}", t.warnings);
        }
    }

    #[test]
    fn corrupt_block_is_skipped_and_the_rest_read() {
        let mut bytes = write(&[recs(0..3), recs(3..5), recs(5..6)]);
        let second = header().encode().len() + 16 + 3 * RECORD_SIZE;
        bytes[second + 16 + 40] ^= 0xff; // inside the second block's first record
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
    }

    #[test]
    fn newer_versions_and_foreign_files_are_refused_clearly() {
        let mut bytes = write(&[recs(0..1)]);
        bytes[8] = 9;
        let err = parse(Path::new("x.cst"), &bytes).expect_err("newer");
        assert!(
            err.to_string()
                .contains("version 9, newer than the supported version 1"),
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
