//! `commscope analyze` on the traces of real jobs: a job killed while one rank never entered the
//! collective the others wait in names that rank (and only it), also when another rank's file is
//! damaged; a healthy job gives no finding.

use std::process::Command;

use commscope_tests::{Flavour, analyze_json, assert_ok, build, commscope, launch, run_traced};

fn hung_job_names_the_rank_that_never_entered(flavour: Flavour) {
    let prog = build(flavour, "hang");
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = format!("analyze-hang-{}", flavour.name());
    // Rank 2 stops calling; the job is killed 9 s after it started (the others have waited in
    // their all-reduce for well over the 5 s floor by then).
    let mut cmd = vec!["timeout".into(), "-s".into(), "KILL".into(), "9".into()];
    cmd.extend(launch(flavour, 4, &prog, &["2"]));
    let _ = run_traced(tmp.path(), &job, &cmd, &[]);
    let _ = Command::new("pkill")
        .args(["-9", "-f", prog.to_str().expect("utf-8")])
        .status();
    let v = analyze_json(&tmp.path().join(&job));
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "one root cause, one finding: {v:#}");
    let f = &f[0];
    assert_eq!(f["kind"], "hang");
    assert_eq!(f["class"], "non-communication-hang");
    assert_eq!(f["ranks"], serde_json::json!([2]));
    assert_eq!(
        f["seq"], 10,
        "the 11th collective on the world communicator"
    );
    assert_eq!(f["evidence"]["victims"], serde_json::json!([0, 1, 3]));
    let summary = f["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("rank 2 on ") && summary.contains("never entered allreduce #10"),
        "{summary}"
    );
    // The text form says the same sentence.
    let o = commscope()
        .arg("analyze")
        .arg(tmp.path())
        .output()
        .expect("analyze");
    assert!(String::from_utf8_lossy(&o.stdout).contains(summary));
}

#[test]
fn open_mpi_hang_names_the_culprit() {
    hung_job_names_the_rank_that_never_entered(Flavour::OpenMpi);
}

#[test]
fn mpich_hang_names_the_culprit() {
    hung_job_names_the_rank_that_never_entered(Flavour::Mpich);
}

/// Rank 2 blocks in a receive from rank 3, which has gone on into the all-reduce and waits
/// there for rank 2: the two wait on each other. Rank 0's trace file is then cut short, as a
/// full disk or a crash leaves it: its records end long before the hang. Rank 0 must not be
/// taken for a rank that never entered (its records just stop); rank 2 is still the culprit,
/// and the finding says what is unknown about rank 0.
#[test]
fn a_damaged_file_of_a_waiting_rank_does_not_hide_a_deadlock() {
    let flavour = Flavour::OpenMpi;
    let prog = build(flavour, "faults");
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = "analyze-deadlock-damaged";
    let mut cmd = vec!["timeout".into(), "-s".into(), "KILL".into(), "10".into()];
    cmd.extend(launch(flavour, 4, &prog, &["recv", "2", "100000", "100"]));
    let _ = run_traced(tmp.path(), job, &cmd, &[]);
    let _ = Command::new("pkill")
        .args(["-9", "-f", prog.to_str().expect("utf-8")])
        .status();
    let dir = tmp.path().join(job);
    let culprit_of = |v: &serde_json::Value| {
        let f = v["findings"].as_array().expect("findings");
        assert_eq!(f.len(), 1, "one root cause, one finding: {v:#}");
        assert_eq!(
            (&f[0]["kind"], &f[0]["class"], &f[0]["ranks"]),
            (
                &serde_json::json!("hang"),
                &serde_json::json!("communication-hang"),
                &serde_json::json!([2])
            ),
            "{v:#}"
        );
        f[0]["summary"].as_str().expect("summary").to_owned()
    };
    let whole = culprit_of(&analyze_json(&dir));
    assert!(!whole.contains("damaged"), "{whole}");

    let rank0 = std::fs::read_dir(&dir)
        .expect("trace dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-0.cst"))
        .expect("rank 0's trace file");
    let bytes = std::fs::read(&rank0).expect("read");
    std::fs::write(&rank0, &bytes[..bytes.len() / 2]).expect("truncate");
    let summary = culprit_of(&analyze_json(&dir));
    assert!(
        summary.starts_with("rank 2 on ")
            && summary.contains("it is blocked inside recv from rank 3 (tag 999)")
            && summary.contains("rank 3 waits for it in turn, so the two wait on each other")
            && summary.contains("rank 0's records end ")
            && summary.ends_with("where its trace is damaged, so whether it took part is unknown"),
        "{summary}"
    );
}

#[test]
fn a_healthy_job_has_no_findings() {
    let prog = build(Flavour::OpenMpi, "coverage");
    let tmp = tempfile::tempdir().expect("tempdir");
    let expect = tmp.path().join("expect");
    std::fs::create_dir_all(&expect).expect("mkdir");
    let out = run_traced(
        &tmp.path().join("t"),
        "healthy",
        &launch(
            Flavour::OpenMpi,
            8,
            &prog,
            &[expect.to_str().expect("utf-8")],
        ),
        &[],
    );
    assert_ok(&out, "coverage job");
    let v = analyze_json(&tmp.path().join("t"));
    assert_eq!(v["findings"], serde_json::json!([]), "{v:#}");
}
