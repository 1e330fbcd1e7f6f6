//! What the kernel says about a traced process: its state letter, the kernel function it sleeps
//! in (wait channel) and the CPU time it has used — read from `/proc/<pid>/stat` and
//! `/proc/<pid>/wchan`. The collector puts them in a hang's evidence (is the culprit computing,
//! sleeping, stuck in the kernel?).

/// One reading.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// "R", "S", "D", "T", "Z", … (empty when unknown).
    pub state: String,
    /// Empty when running or unknown.
    pub wchan: String,
    /// User + system CPU time, ns.
    pub cpu_ns: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`sysconf(_SC_CLK_TCK)`).
fn ticks_per_s() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Parses the text of `/proc/<pid>/stat` (the command name may contain spaces and parentheses).
pub fn parse_stat(stat: &str, ticks: u64) -> Option<(String, u64)> {
    let f = commscope_wire::registration::stat_fields(stat)?;
    let state = (*f.first()?).to_owned();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((
        state,
        (utime + stime).saturating_mul(1_000_000_000) / ticks.max(1),
    ))
}

/// Reads the process (its main thread) now; None when it is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    // The main thread's (the process's own threads, such as commscope's shim thread, would
    // otherwise make a sleeping program look busy).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat"))
        .or_else(|_| std::fs::read_to_string(format!("/proc/{pid}/stat")))
        .ok()?;
    let (state, cpu_ns) = parse_stat(&stat, ticks_per_s())?;
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan"))
        .map(|w| w.trim().to_owned())
        .ok()
        .filter(|w| w != "0")
        .unwrap_or_default();
    Some(Sample {
        state,
        wchan,
        cpu_ns,
    })
}

/// Stacks of a process, taken with the tools installed here: every thread's native stack with
/// `eu-stack`, else `gdb` (both attach for a moment: the process pauses while it is read) and, for CPython, the
/// Python stack with `py-spy dump`. Each is cut to `max` bytes; errors say what was missing.
pub fn stacks(pid: u32, max: usize, timeout: std::time::Duration) -> (String, String, String) {
    let mut errors = Vec::new();
    // eu-stack (elfutils) reads the stacks in milliseconds; gdb, when it is all there is, can
    // take seconds on a busy machine (the process stays paused meanwhile).
    let native = run_tool("eu-stack", &["-p", &pid.to_string()], timeout)
        .map(|out| {
            out.lines()
                .filter(|l| l.starts_with('#') || l.starts_with("TID "))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .or_else(|e1| {
            run_tool(
                "gdb",
                &[
                    "-p",
                    &pid.to_string(),
                    "-batch",
                    "-nx",
                    "-iex",
                    "set debuginfod enabled off",
                    "-ex",
                    "set pagination off",
                    "-ex",
                    "thread apply all bt 40",
                ],
                timeout,
            )
            .map(|out| {
                // Keep the stack lines, not gdb's chatter.
                out.lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .map_err(|e2| format!("{e1}; {e2}"))
        })
        .unwrap_or_else(|e| {
            errors.push(format!("native stack: {e}"));
            String::new()
        });
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let python = if exe.starts_with("python") {
        run_tool("py-spy", &["dump", "--pid", &pid.to_string()], timeout).unwrap_or_else(|e| {
            errors.push(format!("Python stack: {e}"));
            String::new()
        })
    } else {
        String::new()
    };
    let cut = |s: String| {
        if s.len() <= max {
            s
        } else {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}\n… ({} more bytes)", &s[..end], s.len() - end)
        }
    };
    (cut(native), cut(python), errors.join("; "))
}

/// Runs a tool with a deadline; its stdout, or why not.
fn run_tool(tool: &str, args: &[&str], timeout: std::time::Duration) -> Result<String, String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{tool} is not installed"),
            _ => format!("cannot run {tool}: {e}"),
        })?;
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{tool} took longer than {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => return Err(format!("{tool}: {e}")),
        }
    }
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        use std::io::Read;
        let _ = o.read_to_string(&mut out);
    }
    if out.trim().is_empty() {
        return Err(format!("{tool} printed nothing (no permission to attach?)"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_names() {
        let line =
            "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0";
        let (state, cpu) = parse_stat(line, 100).expect("parse");
        assert_eq!(state, "S");
        assert_eq!(cpu, 3_000_000_000);
        assert!(parse_stat("garbage", 100).is_none());
        let me = sample(std::process::id()).expect("self");
        assert!(me.state == "R" || me.state == "S", "{me:?}");
    }
}
