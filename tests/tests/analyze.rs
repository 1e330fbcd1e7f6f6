//! `commscope analyze` on the traces of real jobs: a job killed while one rank never entered the
//! collective the others wait in names that rank (and only it); a healthy job gives no finding.

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
