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
        self.push_all(std::slice::from_ref(batch))
            .pop()
            .unwrap_or_else(|| Err(SpoolError::Io(std::io::Error::other("nothing written"))))
    }

    /// Writes batches durably with one sync for all of them (the files, then the directory):
    /// a process's whole tail costs two syncs, not two per batch. Returns each batch's sequence
    /// number, in order; after the first failure the rest are not written.
    pub fn push_all(&mut self, batches: &[RecordBatch]) -> Vec<Result<u64, SpoolError>> {
        let mut out = Vec::with_capacity(batches.len());
        let mut staged: Vec<(u64, PathBuf, PathBuf, u64)> = Vec::new();
        let mut staged_bytes = 0u64;
        for batch in batches {
            let body = batch.encode_to_vec();
            let len = (16 + body.len()) as u64;
            if self.bytes + staged_bytes + len > self.max_bytes {
                out.push(Err(SpoolError::Full {
                    bytes: self.bytes + staged_bytes,
                    max: self.max_bytes,
                }));
                break;
            }
            let seq = self.next + staged.len() as u64;
            let path = self.path(seq);
            let tmp = path.with_extension("tmp");
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::File::create(&tmp)?;
                let mut head = Vec::with_capacity(16);
                head.extend_from_slice(MAGIC);
                head.extend_from_slice(&crc32c(&body).to_le_bytes());
                head.extend_from_slice(&(body.len() as u32).to_le_bytes());
                f.write_all(&head)?;
                f.write_all(&body)
            };
            if let Err(e) = write() {
                let _ = std::fs::remove_file(&tmp);
                out.push(Err(SpoolError::Io(e)));
                break;
            }
            staged_bytes += len;
            staged.push((seq, tmp, path, len));
        }
        if staged.is_empty() {
            return out;
        }
        // The files' contents, then their names.
        let synced = sync_fs(&self.dir).and_then(|()| {
            for (_, tmp, path, _) in &staged {
                std::fs::rename(tmp, path)?;
            }
            std::fs::File::open(&self.dir)?.sync_all()
        });
        if let Err(e) = synced {
            for (_, tmp, path, _) in &staged {
                let _ = std::fs::remove_file(tmp);
                let _ = std::fs::remove_file(path);
            }
            let kind = e.kind();
            let mut failed: Vec<Result<u64, SpoolError>> = staged
                .iter()
                .map(|_| Err(SpoolError::Io(std::io::Error::new(kind, e.to_string()))))
                .collect();
            failed.extend(out);
            return failed;
        }
        let mut done: Vec<Result<u64, SpoolError>> = Vec::with_capacity(staged.len() + 1);
        for (seq, _, _, len) in staged {
            self.next = seq + 1;
            self.files.insert(seq, len);
            self.bytes += len;
            done.push(Ok(seq));
        }
        done.extend(out);
        done
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

/// Flushes the file system holding `dir` (every file written to it so far) to disk.
fn sync_fs(dir: &Path) -> std::io::Result<()> {
    let d = std::fs::File::open(dir)?;
    // SAFETY: `syncfs` on an open descriptor; no memory is passed.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
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
    fn a_group_is_written_whole_in_order_up_to_the_bound() {
        let d = tempfile::tempdir().expect("tempdir");
        let (mut s, _) = Spool::open(d.path(), 1 << 20).expect("open");
        let one = s.push(&batch(9)).expect("push");
        let per = s.bytes();
        let group: Vec<RecordBatch> = (1..=4).map(batch).collect();
        let seqs: Vec<u64> = s
            .push_all(&group)
            .into_iter()
            .map(|r| r.expect("written"))
            .collect();
        assert_eq!(seqs, vec![one + 1, one + 2, one + 3, one + 4]);
        for (seq, b) in seqs.iter().zip(&group) {
            assert_eq!(&s.read(*seq).expect("read"), b);
        }
        assert_eq!(s.len(), 5);
        // A bound that takes two more of the group: two written, then Full, nothing after.
        let d2 = tempfile::tempdir().expect("tempdir");
        let (mut t, _) = Spool::open(d2.path(), 2 * per).expect("open");
        let r = t.push_all(&group);
        assert_eq!(r.len(), 3);
        assert!(r[0].is_ok() && r[1].is_ok());
        assert!(matches!(r[2], Err(SpoolError::Full { .. })));
        assert_eq!(t.len(), 2);
        // Reopened, the directory holds exactly what was written (no temporary files).
        drop(s);
        let (s, w) = Spool::open(d.path(), 1 << 20).expect("reopen");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(s.pending(), vec![one, one + 1, one + 2, one + 3, one + 4]);
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
