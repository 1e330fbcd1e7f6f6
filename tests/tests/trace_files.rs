//! Trace files as users meet them: damaged, foreign, from a newer version, or converted to
//! Parquet and read by other engines.

use std::path::Path;
use std::process::Command;

use commscope_tests::{
    Flavour, assert_ok, build, commscope, launch, load_job, run_traced, summary_json,
};

/// A real two-rank trace directory (`<tmp>/trace/<job>/`).
fn real_trace(tmp: &Path, job: &str, iterations: &str) -> std::path::PathBuf {
    let prog = build(Flavour::Mpich, "basic");
    let out = run_traced(
        &tmp.join("trace"),
        job,
        &launch(Flavour::Mpich, 2, &prog, &[iterations]),
        &[],
    );
    assert_ok(&out, "basic job");
    tmp.join("trace").join(job)
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

#[test]
fn damaged_foreign_and_newer_files_are_reported_and_the_rest_is_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = real_trace(tmp.path(), "damaged", "20000");
    let f = files(&dir);
    assert_eq!(f.len(), 2);
    let intact = load_job(&dir);
    let per_file: Vec<usize> = intact.processes.iter().map(|p| p.records.len()).collect();

    // Truncate the first file in the middle of its last block; flip a byte inside the second.
    let bytes = std::fs::read(&f[0]).expect("read");
    std::fs::write(&f[0], &bytes[..bytes.len() - 300]).expect("truncate");
    let mut bytes = std::fs::read(&f[1]).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&f[1], &bytes).expect("corrupt");
    // A file from a newer commscope, and garbage with the right extension.
    let mut newer = std::fs::read(&f[1]).expect("read");
    newer[8] = 200;
    std::fs::write(dir.join("future-1-9.cst"), &newer).expect("write");
    std::fs::write(
        dir.join("garbage-1-10.cst"),
        b"this is not a trace file at all",
    )
    .expect("write");

    let (s, o) = summary_json(&[&dir]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(0),
        "a job was read, so the command succeeds despite the damage: {err}"
    );
    // One warning line per damaged, newer or unknown file, naming it.
    for name in ["future-1-9.cst", "garbage-1-10.cst"] {
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("commscope: warning: ") && l.contains(name))
                .count(),
            1,
            "{name}: {err}"
        );
    }
    assert!(
        err.contains(
            "trace format version 200, newer than the supported version 2; upgrade commscope"
        ),
        "{err}"
    );
    assert!(
        err.contains("garbage-1-10.cst: not a trace commscope can read"),
        "{err}"
    );
    let warnings = s["warnings"].as_array().expect("warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap_or("").contains("truncated")),
        "{s}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap_or("").contains("checksum mismatch")),
        "{s}"
    );
    let records = s["records"].as_u64().expect("records") as usize;
    let total: usize = per_file.iter().sum();
    // Only the damaged block of each file is lost; the rest is read.
    assert!(
        records < total,
        "damage must cost something ({records} of {total})"
    );
    assert!(
        records > total / 3,
        "most records survive ({records} of {total})"
    );
    assert_eq!(s["ranks"], 2);

    // The text report says the same in sentences.
    let o = commscope()
        .arg("trace")
        .arg("summary")
        .arg(&dir)
        .output()
        .expect("summary");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("job damaged: 2 ranks"), "{text}");
    assert!(
        text.contains("warning:") && text.contains("truncated"),
        "{text}"
    );
}

/// A collector stopped while it was turning a log into a segment leaves the unfinished segment
/// (`seg-….parquet.partial`) beside the log it came from: reading the directory takes the log
/// and skips the unfinished file without a warning. Named on its own, it is still reported.
#[test]
fn unfinished_files_in_a_trace_directory_are_skipped_quietly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = real_trace(tmp.path(), "unfinished", "2000");
    let (before, o) = summary_json(&[&dir]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let seg = dir.join("seg-00000002.parquet.partial");
    // What a writer cut off mid-way holds: Parquet's head magic and some of its pages.
    std::fs::write(&seg, b"PAR1\x15\x00\x15\x80").expect("write");
    std::fs::write(dir.join("job.json.partial"), b"{\"job\": \"unfin").expect("write");

    let (after, o) = summary_json(&[&dir]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");
    assert_eq!(after["warnings"], serde_json::json!([]), "{after}");
    assert_eq!(after["records"], before["records"], "{after}");
    assert!(after["records"].as_u64().unwrap_or(0) > 0, "{after}");

    let (_, o) = summary_json(&[&dir, &seg]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("commscope: warning: ") && l.contains("parquet.partial"))
            .count(),
        1,
        "{err}"
    );
}

#[test]
fn missing_paths_and_empty_directories_are_clear_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = commscope()
        .arg("trace")
        .arg("summary")
        .arg(tmp.path().join("nope"))
        .output()
        .expect("summary");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("failed to access"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = commscope()
        .arg("trace")
        .arg("summary")
        .arg(tmp.path())
        .output()
        .expect("summary");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no trace files found"));
}

#[test]
fn parquet_is_readable_by_polars_pandas_and_duckdb() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = real_trace(tmp.path(), "parquet", "300");
    let pq = tmp.path().join("job.parquet");
    let o = commscope()
        .arg("trace")
        .arg("merge")
        .arg(&dir)
        .arg("-o")
        .arg(&pq)
        .output()
        .expect("merge");
    assert_ok(&o, "trace merge");

    // commscope reads its own Parquet back to the same summary.
    let (from_cst, _) = summary_json(&[&dir]);
    let (from_pq, o) = summary_json(&[&pq]);
    assert_ok(&o, "summary of parquet");
    for key in ["records", "ranks", "comms", "p2p", "in_flight"] {
        assert_eq!(
            from_cst[key], from_pq[key],
            "{key} differs between .cst and .parquet"
        );
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/check_parquet.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&pq)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "the Python engines failed to read the trace (run scripts/setup.sh to install polars, pandas, duckdb):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let records = from_cst["records"].as_u64().expect("records");
    for engine in ["polars", "pandas", "duckdb"] {
        assert_eq!(v[engine]["rows"], records, "{engine}: {v}");
        assert_eq!(v[engine]["allreduce_calls"], 600, "{engine}: {v}");
        assert_eq!(v[engine]["allreduce_bytes"], 600 * 8, "{engine}: {v}");
        assert_eq!(
            v[engine]["kinds"], v["polars"]["kinds"],
            "{engine} disagrees on kinds: {v}"
        );
    }
    assert_eq!(v["polars"]["ranks"], serde_json::json!([0, 1]));
    assert_eq!(v["polars"]["comm_id_dtype"], "UInt64");
    assert_eq!(v["pandas"]["comm_hex_ok"], true);
    assert_eq!(v["duckdb"]["duplicate_instances"], 0);
}
