//! The agent's on-disk spool: record batches that could not reach the collector, kept (synced)
//! so their ring space can be released, and sent again in order once it answers. Bounded in
//! bytes; a full spool (or a full disk) makes the agent stop consuming rings, so the shims
//! count what they cannot keep — nothing goes missing without a counted reason.
//!
//! One file per batch: `<dir>/<sequence>.batch` holding `"CSSPOOL1" crc32c:u32 len:u32` and the
//! protobuf `RecordBatch`. Written to a temporary name, synced, renamed.

use std::io::Write;
use std::path::{Path, PathBuf};

use commscope_wire::crc::crc32c;
use commscope_wire::grpc::RecordBatch;
use prost::Message;

const MAGIC: &[u8; 8] = b"CSSPOOL1";

/// A spooled batch, by its sequence number.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    bytes: u64,
    next: u64,
    /// Sequence numbers on disk, oldest first, with their sizes.
    files: std::collections::BTreeMap<u64, u64>,
}

/// Why a batch could not be spooled.
#[derive(Debug)]
pub enum SpoolError {
    /// The configured bound would be exceeded.
    Full { bytes: u64, max: u64 },
    /// Writing failed (e.g. the disk is full).
    Io(std::io::Error),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::Full { bytes, max } => {
                write!(f, "the spool holds {bytes} bytes, its limit is {max}")
            }
            SpoolError::Io(e) => write!(f, "cannot write the spool: {e}"),
        }
    }
}

impl Spool {
    /// Opens the spool directory, finding batches a previous agent left. Damaged files are
    /// reported and removed.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<(Spool, Vec<String>)> {
        std::fs::create_dir_all(dir)?;
        let mut files = std::collections::BTreeMap::new();
        let mut bytes = 0;
        let mut warnings = Vec::new();
        for e in std::fs::read_dir(dir)?.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let Some(seq) = name
                .strip_suffix(".batch")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            files.insert(seq, len);
            bytes += len;
        }
        let next = files.keys().next_back().map_or(1, |k| k + 1);
        let mut s = Spool {
            dir: dir.to_owned(),
            max_bytes,
            bytes,
            next,
            files,
        };
        // Validate what is there now, so a damaged file is reported once, at start.
        let seqs: Vec<u64> = s.files.keys().copied().collect();
        for seq in seqs {
            if let Err(e) = s.read(seq) {
                warnings.push(format!("spooled batch {seq} is damaged ({e}); removed"));
                s.remove(seq);
            }
        }
        Ok((s, warnings))
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:016}.batch"))
    }

    /// Writes a batch durably; returns its sequence number.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<u64, SpoolError> {
        let body = batch.encode_to_vec();
        let len = (16 + body.len()) as u64;
        if self.bytes + len > self.max_bytes {
            return Err(SpoolError::Full {
                bytes: self.bytes,
                max: self.max_bytes,
            });
        }
        let seq = self.next;
        let path = self.path(seq);
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            let mut head = Vec::with_capacity(16);
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&crc32c(&body).to_le_bytes());
            head.extend_from_slice(&(body.len() as u32).to_le_bytes());
            f.write_all(&head)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(SpoolError::Io(e));
        }
        self.next += 1;
        self.files.insert(seq, len);
        self.bytes += len;
        Ok(seq)
    }

    /// Reads a spooled batch.
    pub fn read(&self, seq: u64) -> Result<RecordBatch, String> {
        let b = std::fs::read(self.path(seq)).map_err(|e| e.to_string())?;
        if b.len() < 16 || &b[..8] != MAGIC {
            return Err("not a spool file".into());
        }
        let crc = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let len = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
        let body = b.get(16..16 + len).ok_or("truncated")?;
        if crc32c(body) != crc {
            return Err("checksum mismatch".into());
        }
        RecordBatch::decode(body).map_err(|e| e.to_string())
    }

    /// Deletes a batch (acknowledged).
    pub fn remove(&mut self, seq: u64) {
        if let Some(len) = self.files.remove(&seq) {
            self.bytes -= len;
            let _ = std::fs::remove_file(self.path(seq));
        }
    }

    /// Spooled batches, oldest first.
    pub fn pending(&self) -> Vec<u64> {
        self.files.keys().copied().collect()
    }

    /// Bytes on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Batches on disk.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether nothing is spooled.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u8) -> RecordBatch {
        RecordBatch {
            first_rec_seq: u64::from(n),
            record_size: 128,
            records: vec![n; 256],
            ..Default::default()
        }
    }

    #[test]
    fn batches_survive_a_restart_in_order_and_the_bound_holds() {
        let d = tempfile::tempdir().expect("tempdir");
        let (mut s, w) = Spool::open(d.path(), 2000).expect("open");
        assert!(w.is_empty());
        let a = s.push(&batch(1)).expect("push");
        let b = s.push(&batch(2)).expect("push");
        let per = s.bytes() / 2;
        let mut n = 2;
        let full = loop {
            match s.push(&batch(n as u8 + 1)) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(full, SpoolError::Full { .. }), "{full}");
        assert_eq!(n as u64, 2000 / per, "as many batches as fit in the bound");
        assert!(s.bytes() <= 2000);
        s.remove(a);
        drop(s);
        // Damage one file: reported and removed at the next open.
        let third = d.path().join(format!("{:016}.batch", 3));
        let total = n;
        let mut bytes = std::fs::read(&third).expect("read");
        bytes[20] ^= 0xff;
        std::fs::write(&third, bytes).expect("write");
        let (s, w) = Spool::open(d.path(), 2000).expect("open");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(s.pending()[0], b);
        assert_eq!(s.read(b).expect("read").records, vec![2; 256]);
        assert_eq!(s.len(), total - 2);
    }
}
