//! Process exits: a pidfd per traced process says *that* it ended (any process, no parent
//! relation needed); the kernel's process-events connector (netlink, needs CAP_NET_ADMIN) says
//! *how* — the exit status or the terminating signal.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by a signal, and by whom when that was seen ([`crate::kills`]).
    Signaled(i32, Option<Sender>),
}

/// Who sent the signal that ended a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    /// The sending process; 0: the kernel, on its own behalf (the OOM killer, a terminal).
    pub pid: u32,
    /// The sender was an ancestor of the process: its launcher taking the job down.
    pub launcher: bool,
    /// The sending task's name (NUL-padded).
    pub comm: [u8; 16],
}

impl Sender {
    /// The sending task's name.
    pub fn name(&self) -> String {
        let end = self.comm.iter().position(|b| *b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }

    /// For a log line: "the kernel", "itself", "its launcher hydra_pmi_proxy (pid 12)".
    pub fn describe(&self, killed: u32) -> String {
        match (self.pid, self.launcher) {
            (0, _) => "the kernel".into(),
            (p, _) if p == killed => "itself".into(),
            (p, true) => format!("its launcher {} (pid {p})", self.name()),
            (p, false) => format!("{} (pid {p})", self.name()),
        }
    }
}

/// Opens a pidfd for `pid` (readable once the process has exited).
pub fn pidfd(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// pid → (when it was seen here, how it ended, the kernel's CLOCK_MONOTONIC time of the exit
/// in ns).
type Seen = Arc<Mutex<HashMap<u32, (Instant, Ending, u64)>>>;

/// Exit statuses reported by the kernel, by pid, kept for a minute; with the senders of the
/// signals that ended them where the eBPF watch loaded.
#[derive(Clone, Debug, Default)]
pub struct ExitWatcher {
    seen: Seen,
    /// Whether the connector is listening (else statuses are unknown).
    pub active: bool,
    kills: Option<Arc<crate::kills::Kills>>,
}

const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;

impl ExitWatcher {
    /// Starts listening; without the privilege (or the connector) it stays inactive, and every
    /// status is unknown — a warning says so. Likewise who sent a fatal signal.
    pub fn start() -> (ExitWatcher, Option<String>) {
        let (mut w, warn) = ExitWatcher::listen();
        match crate::kills::Kills::start() {
            Ok(k) => w.kills = Some(Arc::new(k)),
            Err(e) => {
                let also = format!(
                    "who sent the signal that killed a process is unknown ({e}); endings are ordered by time"
                );
                return (
                    w,
                    Some(warn.map_or(also.clone(), |w| format!("{w}; {also}"))),
                );
            }
        }
        (w, warn)
    }

    /// Watches `pid` from now on (who may send it a fatal signal).
    pub fn watch(&self, pid: u32) {
        if let Some(k) = &self.kills {
            k.watch(pid);
        }
    }

    fn listen() -> (ExitWatcher, Option<String>) {
        let mut w = ExitWatcher::default();
        match open_connector() {
            Ok(fd) => {
                w.active = true;
                let seen = w.seen.clone();
                let spawned = std::thread::Builder::new()
                    .name("exit-events".into())
                    .spawn(move || listen(fd, seen));
                if let Err(e) = spawned {
                    w.active = false;
                    return (w, Some(format!("cannot start the exit-event thread: {e}")));
                }
                (w, None)
            }
            Err(e) => (
                w,
                Some(format!(
                    "process exit statuses are unavailable (the kernel's process-events connector refused: {e}); exits are still detected"
                )),
            ),
        }
    }

    /// How `pid` ended, if the kernel said so (waits up to `wait` for the event to arrive).
    pub async fn ending(&self, pid: u32, wait: Duration) -> Option<(Ending, u64)> {
        if !self.active {
            return None;
        }
        let deadline = Instant::now() + wait;
        loop {
            if let Some(seen) = self.seen(pid) {
                return Some(seen);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl ExitWatcher {
    /// How `pid` ended and the kernel's time of it, if the event came.
    fn seen(&self, pid: u32) -> Option<(Ending, u64)> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (_, e, at) = seen.get_mut(&pid)?;
        if let (Ending::Signaled(sig, by @ None), Some(k)) = (&mut *e, &self.kills) {
            *by = k.sender(pid, *sig);
        }
        Some((*e, *at))
    }

    /// [`ExitWatcher::ending`] for a caller outside the runtime (the trace keeper's threads).
    pub fn ending_blocking(&self, pid: u32, wait: Duration) -> Option<(Ending, u64)> {
        if !self.active {
            return None;
        }
        let deadline = Instant::now() + wait;
        loop {
            if let Some(seen) = self.seen(pid) {
                return Some(seen);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn open_connector() -> std::io::Result<OwnedFd> {
    // SAFETY: creating a netlink socket.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero sockaddr_nl is valid before we fill it.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = CN_IDX_PROC;
    addr.nl_pid = 0;
    // SAFETY: binding a netlink socket to a valid address of the stated size.
    let rc = unsafe {
        libc::bind(
            fd,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Subscribe: nlmsghdr + cn_msg + op.
    let total = NLMSG_HDR + CN_MSG_HDR + 4;
    let mut msg = vec![0u8; total];
    msg[0..4].copy_from_slice(&(total as u32).to_ne_bytes());
    msg[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    msg[12..16].copy_from_slice(&me.to_ne_bytes());
    let cn = NLMSG_HDR;
    msg[cn..cn + 4].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
    msg[cn + 4..cn + 8].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
    msg[cn + 16..cn + 18].copy_from_slice(&4u16.to_ne_bytes());
    msg[cn + 20..cn + 24].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: sending a buffer of `total` bytes on a bound socket.
    let n = unsafe { libc::send(fd, msg.as_ptr().cast(), total, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

fn listen(fd: OwnedFd, seen: Seen) {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 8192];
    let mut last_prune = Instant::now();
    loop {
        // SAFETY: receiving into a buffer we own.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOBUFS) => continue,
                _ => return,
            }
        }
        let n = n as usize;
        let mut at = 0;
        while at + NLMSG_HDR <= n {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
            if len < NLMSG_HDR || at + len > n {
                break;
            }
            if let Some((pid, ending, t)) = parse_exit(&buf[at + NLMSG_HDR..at + len]) {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(pid, (Instant::now(), ending, t));
            }
            at += (len + 3) & !3;
        }
        if last_prune.elapsed() > Duration::from_secs(10) {
            last_prune = Instant::now();
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|_, (t, _, _)| t.elapsed() < Duration::from_secs(60));
        }
    }
}

/// Parses a connector message; an exit of a thread-group leader gives its pid, its ending and
/// the kernel's time of it (CLOCK_MONOTONIC, ns: `ktime_get_ns`).
fn parse_exit(cn: &[u8]) -> Option<(u32, Ending, u64)> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(cn.get(at..at + 4)?.try_into().ok()?))
    };
    if word(0)? != CN_IDX_PROC || word(4)? != CN_VAL_PROC {
        return None;
    }
    let ev = CN_MSG_HDR;
    if word(ev)? != PROC_EVENT_EXIT {
        return None;
    }
    // proc_event: what, cpu, timestamp (8), then exit_proc_event: pid, tgid, code, signal.
    let at = u64::from_ne_bytes(cn.get(ev + 8..ev + 16)?.try_into().ok()?);
    let data = ev + 16;
    let (pid, tgid, code) = (word(data)?, word(data + 4)?, word(data + 8)?);
    if pid != tgid {
        return None;
    }
    // `code` is a wait status.
    let sig = code & 0x7f;
    Some((
        pid,
        if sig == 0 {
            Ending::Exited(((code >> 8) & 0xff) as i32)
        } else {
            Ending::Signaled(sig as i32, None)
        },
        at,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kernel_reports_exit_codes_and_signals() {
        let (w, warn) = ExitWatcher::start();
        // The agent runs privileged, as this test must.
        assert!(w.active, "the process-events connector: {warn:?}");
        assert!(w.kills.is_some(), "the signal tracepoint: {warn:?}");
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .expect("spawn");
        let pid = child.id();
        let out = child.wait_with_output().expect("wait");
        let after = crate::daemon::now_mono();
        assert_eq!(out.status.code(), Some(7));
        let (ending, at) = w.ending(pid, Duration::from_secs(2)).await.expect("seen");
        assert_eq!(ending, Ending::Exited(7));
        // The kernel's time of the exit, on CLOCK_MONOTONIC: just before we saw it end.
        assert!(
            at > 0 && at <= after && after - at < 1_000_000_000,
            "{at} vs {after}"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn");
        let pid = child.id();
        let fd = pidfd(pid).expect("pidfd");
        child.kill().expect("kill");
        let _ = child.wait();
        drop(fd);
        assert_eq!(
            w.ending(pid, Duration::from_secs(2))
                .await
                .map(|e| matches!(e.0, Ending::Signaled(9, _))),
            Some(true)
        );
    }
}
