//! commscope's own formats: `.cst` files, Parquet traces and a collector's write-ahead logs.

use std::path::Path;

use commscope_wire::parquet::{self, ClockAlignment, ProcessTrace};
use commscope_wire::record::Record;
use commscope_wire::{cst, wal};

use crate::Format;

/// Reads one file of commscope's formats; damage that was skipped goes to `warn`.
pub(crate) fn read(
    path: &Path,
    format: Format,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<ProcessTrace>, String> {
    match format {
        Format::Cst => {
            let t = cst::read_file(path).map_err(|e| strip_path(&e.to_string(), path))?;
            // Records lost to damage (a truncated or corrupt block): where the file ends says
            // nothing about when the process did.
            let cut_short = !t.warnings.is_empty();
            for w in t.warnings {
                warn(w);
            }
            Ok(vec![ProcessTrace {
                header: t.header,
                records: t.records,
                clock: None,
                cut_short,
            }])
        }
        Format::Parquet => {
            let s = parquet::read_salvaged(path).map_err(|e| strip_path(&e.to_string(), path))?;
            if s.unknown > 0 {
                warn(format!("{} rows of unknown kind were skipped", s.unknown));
            }
            if let Some(e) = s.damage {
                let kept: usize = s.processes.iter().map(|p| p.records.len()).sum();
                let cut: Vec<i32> = s
                    .processes
                    .iter()
                    .filter(|p| p.cut_short)
                    .map(|p| p.header.rank)
                    .collect();
                warn(format!(
                    "{}; {kept} records around it are kept{}",
                    e.reason(),
                    parquet::lost_ranks_phrase(&cut)
                ));
            }
            Ok(s.processes)
        }
        Format::Wal => {
            let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
            let log = wal::parse(&bytes).map_err(|e| e.to_string())?;
            // A torn tail is normal for a live log: never acknowledged, not lost.
            Ok(log
                .entries
                .into_iter()
                .map(|e| ProcessTrace {
                    records: e
                        .records
                        .iter()
                        .filter_map(|r| Record::decode(r).ok())
                        .collect(),
                    header: e.header,
                    clock: e.clock.map(|(offset_ns, error_ns)| ClockAlignment {
                        offset_ns,
                        error_ns,
                    }),
                    cut_short: false,
                })
                .collect())
        }
        _ => Err(format!(
            "{} is not one of commscope's formats",
            format.name()
        )),
    }
}

/// Error messages that start with the path: the caller names the file already.
fn strip_path(msg: &str, path: &Path) -> String {
    let p = path.display().to_string();
    msg.strip_prefix(&p)
        .map(|m| m.trim_start_matches([':', ' ']).to_owned())
        .unwrap_or_else(|| msg.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::record::Heartbeat;

    /// A `.cst` file of 2 blocks of heartbeats, its last `cut` bytes cut off.
    fn cst_file(dir: &Path, cut: usize) -> std::path::PathBuf {
        let header = cst::Header {
            version: cst::FORMAT_VERSION,
            job: "j".into(),
            node: "n".into(),
            pid: 7,
            rank: 1,
            world_size: 2,
            start_time: 1,
            mono_anchor: 1,
            real_anchor: 1,
            library: "MPICH".into(),
            flavour: "mpich".into(),
            writer_version: "0".into(),
        };
        let beats = |from: u64| -> Vec<_> {
            (from..from + 20)
                .map(|i| {
                    Record::Heartbeat(Heartbeat {
                        rec_seq: i + 1,
                        t_mono: i * 1_000_000_000,
                        ..Default::default()
                    })
                    .encode()
                })
                .collect()
        };
        let mut w = cst::Writer::new(Vec::new(), &header).expect("header");
        w.append(&beats(0)).expect("block");
        w.append(&beats(20)).expect("block");
        let bytes = std::mem::take(w.get_mut());
        let path = dir.join(format!("n-7-1-{cut}.cst"));
        std::fs::write(&path, &bytes[..bytes.len() - cut]).expect("write");
        path
    }

    #[test]
    fn a_damaged_cst_file_is_cut_short_and_an_intact_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (cut, damaged) in [(0, false), (40, true)] {
            let mut warnings = Vec::new();
            let p = read(&cst_file(dir.path(), cut), Format::Cst, &mut |w| {
                warnings.push(w)
            })
            .expect("read");
            assert_eq!(p[0].cut_short, damaged, "cut {cut}: {warnings:?}");
            assert_eq!(warnings.is_empty(), !damaged, "{warnings:?}");
        }
    }
}
