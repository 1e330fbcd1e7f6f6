//! A process's job and rank as its launcher's environment says them: read by the preload from
//! its own environment, and by the node agent from `/proc/<pid>/environ` for processes it
//! records without the preload. One rule for both, so that either names the same job.

/// The job id from the environment (commscope's own, then the launcher's), if any; `get` looks
/// a variable up.
pub fn job(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(j) = get("COMMSCOPE_JOB_ID").filter(|s| !s.trim().is_empty()) {
        return Some(j.trim().to_owned());
    }
    if let Some(j) = get("SLURM_JOB_ID") {
        return Some(match get("SLURM_STEP_ID") {
            Some(step) => format!("slurm-{j}.{step}"),
            None => format!("slurm-{j}"),
        });
    }
    if let Some(ns) = get("PMIX_NAMESPACE") {
        return Some(format!("pmix-{ns}"));
    }
    if let Some(id) = get("OMPI_MCA_ess_base_jobid") {
        return Some(format!("ompi-{id}"));
    }
    if let Some(id) = get("TORCHELASTIC_RUN_ID") {
        return Some(format!("torchelastic-{id}"));
    }
    None
}

/// Variables that hold a process's global rank, in the order they are trusted.
pub const RANK_VARS: [&str; 5] = [
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
];

/// Variables that hold the job's number of processes.
pub const SIZE_VARS: [&str; 4] = [
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];

/// The first of `names` that holds an integer.
pub fn int(get: impl Fn(&str) -> Option<String>, names: &[&str]) -> Option<i32> {
    names
        .iter()
        .find_map(|n| get(n).and_then(|v| v.trim().parse::<i32>().ok()))
}

/// The job id of an NCCL process: the launcher's, else its first communicator's `commHash`
/// (every rank's first communicator is normally the job's world one, which they all share),
/// else one of the process's own.
pub fn nccl_job(
    get: impl Fn(&str) -> Option<String>,
    first_comm: u64,
    pid: u32,
    start: u64,
) -> String {
    match job(get) {
        Some(j) => sanitize_job(&j),
        None if first_comm != 0 => format!("nccl-{first_comm:016x}"),
        None => sanitize_job(&format!("nccl-local-{pid}-{start}")),
    }
}

/// A job id safe as a file and directory name: `[A-Za-z0-9._-]`, not starting with a dot, at
/// most 63 bytes (a longer one keeps its start and a hash of the whole).
pub fn sanitize_job(id: &str) -> String {
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let clean = clean.trim_start_matches('.').to_owned();
    if clean.is_empty() {
        return "job".to_owned();
    }
    if clean.len() <= 63 {
        return clean;
    }
    let h = crate::hash::fnv1a64(id.as_bytes());
    format!("{}-{:016x}", &clean[..46], h)
}

/// The variables of a `/proc/<pid>/environ` file (NUL-separated `NAME=value`).
pub fn parse_environ(bytes: &[u8]) -> std::collections::HashMap<String, String> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_launchers_job_wins_over_the_first_communicator() {
        assert_eq!(
            job(env(&[("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "3")])).as_deref(),
            Some("slurm-42.3")
        );
        assert_eq!(
            job(env(&[
                ("COMMSCOPE_JOB_ID", " run7 "),
                ("SLURM_JOB_ID", "1")
            ]))
            .as_deref(),
            Some("run7")
        );
        assert_eq!(
            nccl_job(env(&[("TORCHELASTIC_RUN_ID", "a/b")]), 5, 1, 2),
            "torchelastic-a_b"
        );
        assert_eq!(nccl_job(env(&[]), 0xabc, 1, 2), "nccl-0000000000000abc");
        assert_eq!(nccl_job(env(&[]), 0, 9, 8), "nccl-local-9-8");
    }

    #[test]
    fn ranks_come_from_the_first_variable_holding_an_integer() {
        let e = env(&[
            ("RANK", "x"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("SLURM_PROCID", "7"),
        ]);
        assert_eq!(int(&e, &RANK_VARS), Some(3));
        assert_eq!(int(&e, &SIZE_VARS), None);
    }

    #[test]
    fn environ_files_parse_and_odd_entries_are_skipped() {
        let m = parse_environ(b"RANK=2\0EMPTY=\0NOEQUALS\0A=b=c\0\xff=1\0");
        assert_eq!(m.get("RANK").map(String::as_str), Some("2"));
        assert_eq!(m.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(m.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn job_ids_are_made_safe_and_bounded() {
        assert_eq!(sanitize_job("slurm-123.0"), "slurm-123.0");
        assert_eq!(sanitize_job("../../etc"), "_.._etc");
        assert_eq!(sanitize_job("../x y"), "_x_y");
        assert_eq!(sanitize_job(""), "job");
        let s = sanitize_job(&"x".repeat(200));
        assert_eq!(s.len(), 63);
        assert_ne!(s, sanitize_job(&"x".repeat(201)));
    }
}
