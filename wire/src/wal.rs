//! The collector's write-ahead log (`<dir>/<job>/wal-<generation>.cswal`): records are appended
//! and synced here before a batch is acknowledged, and a generation becomes a Parquet segment
//! when it rolls. Trace readers read it too, so a live collector's directory is a complete trace.
//!
//! ```text
//! file    := "CSWAL\0\0\0" version:u16 0:u16 0:u32  entry*
//! entry   := "CWAL" payload_len:u32 crc32c(payload):u32 kind:u8 0:u8[3] payload
//! payload := header clock_known:u8 0:u8[7] offset_ns:i64 error_ns:u64 block    (kind 1: records)
//! ```
//!
//! `header` is a `.cst` header (the process's identity, self-delimiting), `block` one `.cst`
//! block (raw or compact). An entry is written whole before the file is synced; a crash leaves
//! at most a torn entry at the end, which readers report and ignore (it was never
//! acknowledged).

use crate::crc::crc32c;
use crate::cst::{self, Header};
use crate::record::RawRecord;

/// The file magic.
pub const MAGIC: [u8; 8] = *b"CSWAL\0\0\0";
/// The entry magic.
pub const ENTRY_MAGIC: [u8; 4] = *b"CWAL";
/// The version this build writes and the newest it reads.
pub const VERSION: u16 = 1;
/// Length of the file header.
pub const FILE_HEADER: usize = 16;
/// Length of an entry header.
pub const ENTRY_HEADER: usize = 16;
/// File name extension.
pub const EXTENSION: &str = "cswal";
/// Entry kind: records of one process.
pub const KIND_RECORDS: u8 = 1;
/// The largest payload a reader accepts (a sanity bound against corrupt lengths).
pub const MAX_PAYLOAD: usize = 256 << 20;

/// The file header.
pub fn file_header() -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Whether `bytes` start like a write-ahead log.
pub fn sniff(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// One process's records as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub header: Header,
    /// (offset, error) of the host clock against the collector's, when known.
    pub clock: Option<(i64, u64)>,
    pub records: Vec<RawRecord>,
}

/// Appends the encoding of a records entry to `out`: `header` is the encoded `.cst` header of
/// the process (see [`Header::encode`]), `block` an encoded `.cst` block.
pub fn encode_entry(out: &mut Vec<u8>, header: &[u8], clock: Option<(i64, u64)>, block: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&ENTRY_MAGIC);
    out.extend_from_slice(&[0; 8]);
    out.push(KIND_RECORDS);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(header);
    out.push(u8::from(clock.is_some()));
    out.extend_from_slice(&[0; 7]);
    let (offset, error) = clock.unwrap_or((0, 0));
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&error.to_le_bytes());
    out.extend_from_slice(block);
    let payload = &out[start + ENTRY_HEADER..];
    let len = payload.len() as u32;
    let crc = crc32c(payload);
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// What reading a log found.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub entries: Vec<Entry>,
    /// Bytes of the file that hold complete, valid entries (a writer resuming the file
    /// truncates it here).
    pub valid_len: usize,
    /// Damage that was skipped, one sentence each.
    pub warnings: Vec<String>,
}

/// Why a log cannot be read at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    NotALog,
    NewerVersion { found: u16 },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NotALog => write!(f, "not a commscope write-ahead log (bad magic)"),
            Error::NewerVersion { found } => write!(
                f,
                "write-ahead log version {found}, newer than the supported version {VERSION}; upgrade commscope to read it"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Parses a log. Reading stops at the first torn or damaged entry: everything after it was
/// written after the last successful sync, so it was never acknowledged.
pub fn parse(bytes: &[u8]) -> Result<Log, Error> {
    if !sniff(bytes) {
        return Err(Error::NotALog);
    }
    if bytes.len() < FILE_HEADER {
        return Ok(Log {
            warnings: vec!["the file ends inside its header".into()],
            ..Default::default()
        });
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version > VERSION {
        return Err(Error::NewerVersion { found: version });
    }
    let mut log = Log {
        valid_len: FILE_HEADER,
        ..Default::default()
    };
    let mut at = FILE_HEADER;
    while at < bytes.len() {
        match parse_entry(&bytes[at..]) {
            Ok((entry, len)) => {
                if let Some(e) = entry {
                    log.entries.push(e);
                }
                at += len;
                log.valid_len = at;
            }
            Err(why) => {
                log.warnings.push(format!(
                    "{why} at byte {at}; the last {} bytes (never acknowledged) were ignored",
                    bytes.len() - at
                ));
                break;
            }
        }
    }
    Ok(log)
}

/// One entry at the start of `b`: the entry (`None` for a kind this version skips) and its
/// length.
fn parse_entry(b: &[u8]) -> Result<(Option<Entry>, usize), String> {
    if b.len() < ENTRY_HEADER {
        return Err("a torn entry header".into());
    }
    if b[..4] != ENTRY_MAGIC {
        return Err("no entry magic".into());
    }
    let len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    let crc = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if len > MAX_PAYLOAD {
        return Err(format!("an implausible entry length {len}"));
    }
    let payload = b
        .get(ENTRY_HEADER..ENTRY_HEADER + len)
        .ok_or("a torn entry")?;
    if crc32c(payload) != crc {
        return Err("a checksum mismatch".into());
    }
    if b[12] != KIND_RECORDS {
        return Ok((None, ENTRY_HEADER + len));
    }
    let (header, hlen) =
        cst::decode_header(payload).map_err(|e| format!("a bad process header ({e:?})"))?;
    let rest = &payload[hlen..];
    if rest.len() < 24 {
        return Err("an entry without its clock fields".into());
    }
    let known = rest[0] != 0;
    let offset = i64::from_le_bytes(rest[8..16].try_into().map_err(|_| "clock")?);
    let error = u64::from_le_bytes(rest[16..24].try_into().map_err(|_| "clock")?);
    let (records, blen) =
        cst::decode_block(&rest[24..]).map_err(|e| format!("a bad block ({e})"))?;
    if 24 + blen != rest.len() {
        return Err("trailing bytes inside an entry".into());
    }
    Ok((
        Some(Entry {
            header,
            clock: known.then_some((offset, error)),
            records,
        }),
        ENTRY_HEADER + len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Call, Record};

    fn header(pid: u32) -> Header {
        Header {
            version: cst::FORMAT_VERSION,
            job: "j".into(),
            node: "n".into(),
            pid,
            rank: pid as i32,
            world_size: 2,
            ..Default::default()
        }
    }

    fn block(range: std::ops::Range<u64>) -> (Vec<RawRecord>, Vec<u8>) {
        let raws: Vec<RawRecord> = range
            .map(|i| {
                Record::Call(Call {
                    rec_seq: i,
                    seq: i,
                    t_enter: 1000 * i,
                    ..Default::default()
                })
                .encode()
            })
            .collect();
        let bytes = cst::encode_block(&raws);
        (raws, bytes)
    }

    #[test]
    fn entries_round_trip_and_a_torn_tail_is_ignored() {
        let mut file = file_header().to_vec();
        let (r1, b1) = block(1..50);
        let (r2, b2) = block(1..3);
        encode_entry(&mut file, &header(1).encode(), None, &b1);
        encode_entry(&mut file, &header(2).encode(), Some((-5, 7)), &b2);
        let whole = file.len();
        let log = parse(&file).expect("log");
        assert_eq!(log.entries.len(), 2);
        assert_eq!(log.entries[0].records, r1);
        assert_eq!(log.entries[0].header, header(1));
        assert_eq!(log.entries[1].records, r2);
        assert_eq!(log.entries[1].clock, Some((-5, 7)));
        assert_eq!(log.valid_len, whole);
        assert!(log.warnings.is_empty());

        let (_, b3) = block(50..60);
        encode_entry(&mut file, &header(1).encode(), None, &b3);
        for cut in [whole + 3, whole + 20, file.len() - 1] {
            let log = parse(&file[..cut]).expect("log");
            assert_eq!(log.entries.len(), 2, "cut at {cut}");
            assert_eq!(log.valid_len, whole);
            assert_eq!(log.warnings.len(), 1, "{:?}", log.warnings);
        }
        let mut bad = file.clone();
        let last = bad.len() - 3;
        bad[last] ^= 1;
        let log = parse(&bad).expect("log");
        assert_eq!(log.entries.len(), 2);
        assert!(log.warnings[0].contains("checksum"), "{:?}", log.warnings);
    }

    #[test]
    fn foreign_and_newer_files_are_refused() {
        assert_eq!(parse(b"hello").err(), Some(Error::NotALog));
        let mut h = file_header().to_vec();
        h[8] = 9;
        assert_eq!(parse(&h).err(), Some(Error::NewerVersion { found: 9 }));
    }
}
