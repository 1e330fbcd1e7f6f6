//! Post-mortem on the files people arrive with: real PyTorch Flight Recorder dumps and Kineto
//! traces from public repositories (`tests/data/samples`), an NCCL Inspector log written from
//! its documented format, and a trace directory with a damaged file in it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use commscope_tests::{Flavour, build, commscope, launch, run_traced};
use serde_json::Value;

fn samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/samples")
}

fn analyze(paths: &[&Path]) -> (Value, Output) {
    let o = commscope()
        .arg("analyze")
        .args(paths)
        .args(["--format", "json"])
        .output()
        .expect("analyze");
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "analyze printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (v, o)
}

fn summary(path: &Path) -> Value {
    let o = commscope()
        .args(["trace", "summary", "--format", "json"])
        .arg(path)
        .output()
        .expect("trace summary");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("summary JSON")
}

/// One row of an NVRx reference table: group name, description, op, missing ranks.
#[derive(Debug)]
struct Reference {
    pg: String,
    desc: String,
    op: String,
    missing: BTreeSet<i64>,
}

fn references(scenario: &str) -> Vec<Reference> {
    let path = samples().join(format!(
        "nvrx_fr_traces/reference_outputs/{scenario}_reference.txt"
    ));
    let text = std::fs::read_to_string(&path).expect("reference");
    text.lines()
        .skip(1)
        .filter(|l| l.contains('|'))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            Reference {
                pg: cols[0].to_owned(),
                // "EXPERT_MODEL_PARALLEL_GROUP,0": the description, then the group's index.
                desc: cols[1].split(',').next().unwrap_or("").to_owned(),
                op: cols[2].trim_start_matches("nccl:").to_owned(),
                missing: cols[5]
                    .split(',')
                    .map(|r| r.trim().parse().expect("a rank"))
                    .collect(),
            }
        })
        .collect()
}

fn injected(scenario: &str) -> BTreeSet<i64> {
    let text = std::fs::read_to_string(
        samples().join(format!("nvrx_fr_traces/{scenario}/fault_injection.log")),
    )
    .expect("fault log");
    let line = text
        .lines()
        .find(|l| l.starts_with("Fault ranks:"))
        .expect("fault ranks");
    line.trim_start_matches("Fault ranks:")
        .trim()
        .trim_matches(['[', ']'])
        .split(',')
        .map(|r| r.trim().parse().expect("rank"))
        .collect()
}

#[test]
fn flight_recorder_dumps_name_the_missing_ranks_per_process_group() {
    let mut scenarios: Vec<String> = std::fs::read_dir(samples().join("nvrx_fr_traces"))
        .expect("samples")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "reference_outputs")
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 2, "{scenarios:?}");
    for s in &scenarios {
        let dir = samples().join("nvrx_fr_traces").join(s);
        let (v, o) = analyze(&[&dir]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{s}: {err}");
        assert!(!err.contains("warning"), "{s}: the dumps are whole: {err}");
        check_missing_ranks(s, &v);
        // The same dumps with a healthy rank's cut inside its ring's entries (a dump written
        // while the node went down): its lost tail must not make it read as missing.
        let missing: BTreeSet<i64> = references(s)
            .iter()
            .flat_map(|r| r.missing.clone())
            .collect();
        let healthy = [12, 8, 4]
            .into_iter()
            .find(|r| !missing.contains(r))
            .expect("a healthy rank");
        let tmp = tempfile::tempdir().expect("tempdir");
        for e in std::fs::read_dir(&dir).expect("scenario").flatten() {
            std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("copy");
        }
        let name = format!("_dump_{healthy}");
        let cut = tmp.path().join(&name);
        let bytes = std::fs::read(&cut).expect("dump");
        let at = bytes
            .windows(b"entries".len())
            .position(|w| w == b"entries")
            .expect("entries")
            + 500;
        std::fs::write(&cut, &bytes[..at]).expect("cut");
        let (v, o) = analyze(&[tmp.path()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{s} cut: {err}");
        assert_eq!(err.matches("warning").count(), 1, "{s} cut: {err}");
        assert!(err.contains(&name), "{s} cut: {err}");
        check_missing_ranks(s, &v);
    }
}

/// `v` (analyze's JSON) holds exactly one hang finding per row of the scenario's reference,
/// naming its missing ranks, its group and the hang front.
fn check_missing_ranks(s: &str, v: &Value) {
    {
        let found = v["findings"].as_array().expect("findings");
        let refs = references(s);
        // Exactly the reference's rows: an extra finding is an error.
        assert_eq!(found.len(), refs.len(), "{s}: {v:#}");
        for r in &refs {
            let f = found
                .iter()
                .find(|f| {
                    f["ranks"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_i64).collect::<BTreeSet<_>>())
                        == Some(r.missing.clone())
                })
                .unwrap_or_else(|| panic!("{s}: no finding names {:?}: {v:#}", r.missing));
            assert_eq!(f["kind"], "hang", "{s}: {f:#}");
            let summary = f["summary"].as_str().expect("summary");
            let group = format!("{}:{}", r.pg, r.desc);
            assert!(summary.contains(&group), "{s}: {group} in {summary}");
            assert!(
                summary.contains("never entered alltoallv") && r.op == "all_to_all",
                "{s}: {summary}"
            );
            // The hang front names the group and who is missing from it.
            let front = f["evidence"]["front"].as_array().expect("front");
            let row = front
                .iter()
                .find(|x| x["name"] == group.as_str())
                .unwrap_or_else(|| panic!("{s}: {group} not in the front: {front:#?}"));
            let missing: BTreeSet<i64> = row["missing"]
                .as_array()
                .expect("missing")
                .iter()
                .filter_map(Value::as_i64)
                .collect();
            assert_eq!(missing, r.missing, "{s}: {row:#}");
            // Culprits are injected faults; an injected rank the dumps cannot show is not invented.
            assert!(r.missing.is_subset(&injected(s)), "{s}");
        }
    }
}

#[test]
fn kineto_traces_import_with_their_collectives() {
    let hta = samples().join("hta");
    // Rank 0 of a 2-rank job, kernels carrying collective metadata.
    let s = summary(&hta.join("nccl_parser_config"));
    assert_eq!(s["ranks"], 1, "{s:#}");
    let comms = s["comms"].as_array().expect("comms");
    assert_eq!(comms.len(), 1, "{s:#}");
    assert_eq!(comms[0]["size"], 2);
    assert_eq!(
        comms[0]["ops"],
        serde_json::json!({"allreduce": 15, "broadcast": 6})
    );
    // Two ranks of a 128-rank job, old format: the op from the kernel name.
    let s = summary(&hta.join("trace_filter"));
    assert_eq!(s["ranks"], 2, "{s:#}");
    let comms = s["comms"].as_array().expect("comms");
    assert_eq!(comms.len(), 1, "{s:#}");
    assert_eq!(comms[0]["size"], 128);
    assert_eq!(comms[0]["ops"], serde_json::json!({"sendrecv": 20}));
    // CPU only: no collective, and all 11 listed groups of 300 ranks.
    let s = summary(&hta.join("cpu_only"));
    let comms = s["comms"].as_array().expect("comms");
    assert_eq!(comms.len(), 11, "{s:#}");
    assert!(comms.iter().all(|c| c["size"] == 300), "{s:#}");
    // None of them is a failure.
    let (v, o) = analyze(&[&hta]);
    assert!(o.status.success());
    assert_eq!(v["findings"], serde_json::json!([]), "{v:#}");
}

/// An Inspector log of `ranks` processes in one communicator: `steps` all-reduces and
/// broadcasts each. The v4.3 layout writes the header once per dump.
fn inspector_log(dir: &Path, ranks: i32, steps: u64, v43: bool) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for r in 0..ranks {
        let mut out = String::new();
        let header = serde_json::json!({"id":"0x7f8c496ae9f661","comm_name":"world","rank":r,"n_ranks":ranks,"nnodes":1});
        let meta = serde_json::json!({"inspector_output_format_version": if v43 {"v4.3"} else {"v4.0"},
            "git_rev":"","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1_748_030_377_748_202u64,
            "hostname":"node-a","pid":1000 + r});
        if v43 {
            out += &format!(
                "{}\n",
                serde_json::json!({"header": header, "metadata": meta})
            );
        }
        for s in 0..steps {
            for (coll, sn, bytes) in [("AllReduce", s, 1u64 << 24), ("Broadcast", s, 1u64 << 16)] {
                let perf = serde_json::json!({"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": bytes,
                    "coll_exec_time_us": 1500.0, "coll_timing_source": "kernel_gpu",
                    "coll_algobw_gbs": 11.2, "coll_busbw_gbs": 19.6});
                let rec = if v43 {
                    serde_json::json!({"coll_perf": perf})
                } else {
                    serde_json::json!({"header": header, "metadata": meta, "coll_perf": perf})
                };
                out += &format!("{rec}\n");
            }
        }
        if v43 {
            out += &format!(
                "{}\n",
                serde_json::json!({"dump_stats": {"coll_records": 2 * steps, "coll_dropped_total": 0,
                "coll_dropped_since_last_dump": 0, "p2p_records": 0}})
            );
        }
        std::fs::write(dir.join(format!("node-a-pid{}.log", 1000 + r)), out).expect("write");
    }
}

#[test]
fn inspector_logs_of_both_layouts_import() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for v43 in [false, true] {
        let dir = tmp.path().join(if v43 { "v43" } else { "v40" });
        inspector_log(&dir, 4, 25, v43);
        let s = summary(&dir);
        assert_eq!(s["ranks"], 4, "{s:#}");
        let comms = s["comms"].as_array().expect("comms");
        assert_eq!(comms.len(), 1, "{s:#}");
        assert_eq!(comms[0]["comm_id"], "0x7f8c496ae9f661");
        assert_eq!(
            comms[0]["ops"],
            serde_json::json!({"allreduce": 100, "broadcast": 100})
        );
        let (v, o) = analyze(&[&dir]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(v["findings"], serde_json::json!([]), "{v:#}");
    }
}

#[test]
fn a_damaged_file_is_one_warning_and_the_other_ranks_still_give_their_findings() {
    // A real hang: rank 2 of 4 stops calling; the job is killed after 9 s.
    let prog = build(Flavour::OpenMpi, "hang");
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = "postmortem-damaged";
    let mut cmd = vec!["timeout".into(), "-s".into(), "KILL".into(), "9".into()];
    cmd.extend(launch(Flavour::OpenMpi, 4, &prog, &["2"]));
    let _ = run_traced(tmp.path(), job, &cmd, &[]);
    let _ = Command::new("pkill")
        .args(["-9", "-f", prog.to_str().expect("utf-8")])
        .status();
    let dir = tmp.path().join(job);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("trace dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    // Rank 0's file loses its header; a stray file sits beside them.
    let rank0 = files
        .iter()
        .find(|f| f.to_string_lossy().ends_with("-0.cst"))
        .expect("rank 0's file")
        .clone();
    let mut bytes = std::fs::read(&rank0).expect("read");
    for b in &mut bytes[8..40] {
        *b = 0xff;
    }
    std::fs::write(&rank0, &bytes).expect("damage");
    std::fs::write(
        dir.join("_dump_9"),
        b"\x80\x02}q\x00(X\x07\x00\x00\x00version",
    )
    .expect("write");
    let (v, o) = analyze(&[&dir]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "a job was read: {err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("commscope: warning: "))
        .collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(&*rank0.to_string_lossy())),
        "{err}"
    );
    assert!(warnings.iter().any(|w| w.contains("_dump_9")), "{err}");
    let found = v["findings"].as_array().expect("findings");
    let hangs: Vec<&Value> = found.iter().filter(|f| f["kind"] == "hang").collect();
    assert_eq!(found.len(), 1, "{v:#}");
    assert_eq!(hangs[0]["ranks"], serde_json::json!([2]), "{v:#}");
    // Nothing readable at all: a non-zero exit.
    let empty = tmp.path().join("nothing");
    std::fs::create_dir_all(&empty).expect("mkdir");
    std::fs::write(empty.join("x.cst"), b"garbage").expect("write");
    let o = commscope()
        .arg("analyze")
        .arg(&empty)
        .output()
        .expect("analyze");
    assert!(!o.status.success());
}

/// A real 4-rank job whose rank 2 computes four times as long from step 30 on.
fn slow_rank_trace(tmp: &Path) -> PathBuf {
    let prog = build(Flavour::OpenMpi, "faults");
    let out = run_traced(
        tmp,
        "postmortem-slow",
        &launch(
            Flavour::OpenMpi,
            4,
            &prog,
            &["compute", "2", "200", "30", "200000"],
        ),
        &[],
    );
    commscope_tests::assert_ok(&out, "faults job");
    tmp.join("postmortem-slow")
}

fn chromium(args: &[&str], page: &Path) -> Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium (scripts/setup.sh installs it)")
}

#[test]
fn the_report_opens_in_a_browser_with_its_plots_drawn() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = slow_rank_trace(&tmp.path().join("t"));
    let page = tmp.path().join("report.html");
    let o = commscope()
        .arg("report")
        .arg(&dir)
        .arg("-o")
        .arg(&page)
        .output()
        .expect("report");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&page).expect("the report");
    // Self-contained: nothing is fetched.
    for needle in ["<script src", "<link ", "@import", "url(http"] {
        assert!(!html.contains(needle), "the page loads {needle}");
    }
    assert!(html.contains("slow-rank"), "the finding is in the page");
    assert!(html.contains("rank 2"), "the finding names rank 2");

    // The DOM after the scripts ran: no error, and each chart drew SVG with marks in it.
    let o = chromium(&["--dump-dom"], &page);
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(
        dom.contains("id=\"errors\" hidden"),
        "script errors: {dom:.2000}"
    );
    let drawn: usize = dom
        .split("data-charts=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the script ran to its end");
    // Timeline, what-if, heatmap, progress, durations, bandwidth (no link records from MPI).
    assert!(drawn >= 6, "{drawn} charts drawn");
    for class in [
        "heatmap",
        "progress",
        "durations",
        "busbw",
        "whatif",
        "timeline",
    ] {
        let at = dom
            .find(&format!("class=\"chart {class}\""))
            .unwrap_or_else(|| panic!("no {class} chart"));
        let chart = &dom[at..];
        let end = chart[1..]
            .find("class=\"chart ")
            .map_or(chart.len(), |e| e + 1);
        let chart = &chart[..end];
        assert!(
            chart.contains("data-drawn=\"chart\""),
            "{class}: {chart:.500}"
        );
        let marks = chart.matches("<path").count() + chart.matches("<rect").count();
        assert!(marks >= 5, "{class}: {marks} marks");
    }

    // A screenshot shows the plots: many colours, not a blank page.
    let shot = tmp.path().join("report.png");
    let o = chromium(
        &[
            "--window-size=1280,2400",
            &format!("--screenshot={}", shot.display()),
        ],
        &page,
    );
    assert!(shot.exists(), "{}", String::from_utf8_lossy(&o.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&shot).expect("png"),
    ));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("png frame");
    let px = info.color_type.samples();
    let colours: BTreeSet<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    assert!(colours.len() > 200, "{} colours", colours.len());
}

#[test]
fn the_perfetto_export_is_a_chrome_trace_with_a_track_per_rank() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = slow_rank_trace(&tmp.path().join("t"));
    let out = tmp.path().join("trace.json");
    let o = commscope()
        .args(["export", "perfetto"])
        .arg(&dir)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("export");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&std::fs::read(&out).expect("json")).expect("JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let pids: BTreeSet<i64> = slices.iter().filter_map(|e| e["pid"].as_i64()).collect();
    assert_eq!(pids.len(), 4, "one track per rank");
    for e in &slices {
        assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
        assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
        assert!(e["args"]["communicator"].is_string(), "{e}");
    }
    // Every rank's track is named, and ranks' calls of one instance line up (one clock).
    let names: BTreeSet<String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str().map(str::to_owned))
        .collect();
    for r in 0..4 {
        assert!(
            names.iter().any(|n| n.contains(&format!("rank {r} on "))),
            "{names:?}"
        );
    }
    let ends: Vec<f64> = slices
        .iter()
        .filter(|e| e["name"] == "allreduce" && e["args"]["seq"] == 100)
        .map(|e| e["ts"].as_f64().unwrap_or(0.0) + e["dur"].as_f64().unwrap_or(0.0))
        .collect();
    assert_eq!(ends.len(), 4, "allreduce #100 on each rank");
    let spread = ends.iter().copied().fold(f64::MIN, f64::max)
        - ends.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        spread < 50_000.0,
        "one instance ends within 50 ms everywhere: {ends:?}"
    );
    // The slow-rank finding sits on rank 2's track.
    let instants: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "slow-rank")
        .collect();
    assert_eq!(instants.len(), 1, "{instants:#?}");
    let rank2 = events
        .iter()
        .find(|e| {
            e["name"] == "process_name"
                && e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("rank 2 "))
        })
        .expect("rank 2's track");
    assert_eq!(instants[0]["pid"], rank2["pid"]);
}

/// `commscope ARGS… TRACE`, which must succeed: streamed when `stream` (0 streams every Parquet
/// trace; the default bound is far above a test's), else as by default (loaded).
fn run_on(trace: &Path, stream: bool, args: &[&str]) -> Output {
    let mut c = commscope();
    c.args(args).arg(trace);
    if stream {
        c.env("COMMSCOPE_STREAM_ROWS", "0");
    }
    let o = c.output().expect("commscope");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// A Parquet trace too big to load is streamed through the detectors and aggregated by polars
/// from its file: on the same trace, the streamed analysis and report are the loaded ones.
#[test]
fn a_streamed_parquet_trace_gives_what_the_loaded_one_gives() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = slow_rank_trace(&tmp.path().join("t"));
    let parquet = tmp.path().join("job.parquet");
    let o = commscope()
        .args(["trace", "merge"])
        .arg(&dir)
        .arg("-o")
        .arg(&parquet)
        .output()
        .expect("merge");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = |stream: bool, args: &[&str]| run_on(&parquet, stream, args);
    let loaded: Value =
        serde_json::from_slice(&run(false, &["analyze", "--format", "json"]).stdout).expect("json");
    let streamed: Value =
        serde_json::from_slice(&run(true, &["analyze", "--format", "json"]).stdout).expect("json");
    assert_eq!(loaded, streamed);
    let found = loaded["findings"].as_array().expect("findings");
    assert_eq!(found.len(), 1, "{loaded:#}");
    assert_eq!(found[0]["kind"], "slow-rank", "{loaded:#}");
    assert_eq!(found[0]["ranks"], serde_json::json!([2]), "{loaded:#}");
    let pages: Vec<String> = [false, true]
        .into_iter()
        .map(|stream| {
            let page = tmp.path().join(format!("report-{stream}.html"));
            run(stream, &["report", "-o", page.to_str().expect("utf-8")]);
            std::fs::read_to_string(&page).expect("report")
        })
        .collect();
    assert!(pages[0].contains("slow-rank"));
    assert!(
        pages[0] == pages[1],
        "the streamed report differs from the loaded one"
    );
}

/// A corrupt page in the middle of a Parquet trace costs only the ranks with rows in it: they
/// are named in the file's one warning, their silence after the damage is not taken for a death
/// or a hang, and the job's real finding stands — loaded, streamed and in the report.
#[test]
fn a_corrupt_page_in_a_parquet_trace_costs_only_its_ranks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = tmp.path().join("job.parquet");
    let o = Command::new(commscope_tests::bin_dir().join("gen-trace"))
        .args(["--records", "300000", "--ranks", "16", "--per-node", "4"])
        .args(["--slow-rank", "5"])
        .arg(&trace)
        .output()
        .expect("gen-trace (cargo build at the workspace root builds it)");
    commscope_tests::assert_ok(&o, "gen-trace");
    // Garble the header of the page a fifth of the way through the first row group's
    // `t_exit_ns` column (a corrupt value would read back silently: Parquet pages carry no
    // checksum here): 8,192 rows inside rank 2's or 3's (about 18,900 rows each, written
    // process after process).
    let at = {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::file::serialized_reader::ReadOptionsBuilder;
        let r = SerializedFileReader::new_with_options(
            std::fs::File::open(&trace).expect("open"),
            ReadOptionsBuilder::new().with_page_index().build(),
        )
        .expect("parquet");
        let rg = r.metadata().row_group(0);
        let col = (0..rg.num_columns())
            .find(|i| rg.column(*i).column_path().string() == "t_exit_ns")
            .expect("t_exit_ns");
        let pages = r
            .metadata()
            .page_index()
            .and_then(|pi| pi.offset_index(0, col))
            .expect("offset index")
            .page_locations();
        pages[pages.len() / 5].offset as usize
    };
    let mut bytes = std::fs::read(&trace).expect("read");
    bytes[at..at + 24].fill(0xa5);
    std::fs::write(&trace, &bytes).expect("damage");

    let run = |stream: bool, args: &[&str]| {
        let o = run_on(&trace, stream, args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o, err)
    };
    let mut found = Vec::new();
    for stream in [false, true] {
        let (o, err) = run(stream, &["analyze", "--format", "json"]);
        let warnings: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("commscope: warning: "))
            .collect();
        assert_eq!(warnings.len(), 1, "streamed {stream}: {err}");
        assert!(warnings[0].contains(&*trace.to_string_lossy()), "{err}");
        assert!(
            warnings[0].contains("rank 2 lost records")
                || warnings[0].contains("rank 3 lost records")
                || warnings[0].contains("ranks 2, 3 lost records"),
            "streamed {stream}: {err}"
        );
        let v: Value = serde_json::from_slice(&o.stdout).expect("json");
        let kinds: Vec<(String, Value)> = v["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap_or("").to_owned(),
                    f["ranks"].clone(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![("slow-rank".to_owned(), serde_json::json!([5]))],
            "streamed {stream}: {v:#}"
        );
        found.push(v);
    }
    // The report (streamed: polars cannot read past the damage, so it loads instead) warns
    // about the file once.
    for stream in [false, true] {
        let page = tmp.path().join(format!("report-{stream}.html"));
        let (_, err) = run(stream, &["report", "-o", page.to_str().expect("utf-8")]);
        let about_file = err
            .lines()
            .filter(|l| l.starts_with("commscope: warning: ") && l.contains("lost records"))
            .count();
        assert_eq!(about_file, 1, "streamed {stream}: {err}");
        let html = std::fs::read_to_string(&page).expect("report");
        assert!(html.contains("slow-rank") && !html.contains("dead-rank"));
    }
}
