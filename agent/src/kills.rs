//! Who ended a process from outside: the sender of the signal that killed it, kept by the
//! `signal:signal_generate` tracepoint (`ebpf/programs`, map `KILLS`) and read once the process
//! has ended. It tells the rank the OOM killer, an operator or the process itself killed from
//! the ranks its launcher (`mpirun`, Hydra's proxy, `torchrun`, `slurmstepd`: an ancestor of the
//! process) took down after it — which exit times alone cannot when a loaded node spreads a
//! teardown's kills over milliseconds.
//!
//! Only the programs this needs are loaded (the rest of the object's maps are sized down to
//! nothing); without the privilege to load them, senders are unknown and the analyzer orders
//! endings by time and record order as before.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use aya::programs::TracePoint;
use aya::{Ebpf, EbpfLoader};
use commscope_ebpf_common::{KILL_SIGNALS, Kill, SI_KERNEL, SigLayout, kill_key};

use crate::exits::Sender;
use crate::transport::{OBJECT, chain, raise_memlock, tracefs};

/// The object's maps the sender watch does not use, sized down when it loads its own copy.
const UNUSED_MAPS: [&str; 11] = [
    "TCP_FLOWS",
    "NET_CONNS",
    "QP_PENDING",
    "MR_PENDING",
    "ASYNC_PENDING",
    "CONN_PENDING",
    "NCCL_INIT_PENDING",
    "NCCL_CALL_PENDING",
    "NCCL_SKIP",
    "LAYOUT",
    "STATS",
];

/// The loaded tracepoint and what is known of the processes watched.
pub struct Kills {
    /// Keeps the programs attached.
    _bpf: Ebpf,
    kills: Mutex<BpfHashMap<MapData, u64, Kill>>,
    /// Per process watched: its ancestors when it registered (parent first).
    ancestors: Mutex<HashMap<u32, Vec<u32>>>,
}

impl std::fmt::Debug for Kills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kills").finish_non_exhaustive()
    }
}

impl Kills {
    /// Loads and attaches `signal:signal_generate`; the error says why not.
    pub fn start() -> Result<Kills, String> {
        raise_memlock();
        let root = tracefs::root()?;
        let format = root.join("events/signal/signal_generate/format");
        let text =
            std::fs::read_to_string(&format).map_err(|e| format!("{}: {e}", format.display()))?;
        let layout = sig_layout(&tracefs::fields(&text))
            .ok_or_else(|| format!("{}: lacks sig, code, pid or result", format.display()))?;
        let mut loader = EbpfLoader::new();
        for m in UNUSED_MAPS {
            loader.map_max_entries(m, 1);
        }
        // The ring buffer's size must be a power-of-two number of pages.
        loader.map_max_entries("EVENTS", 4096);
        let mut bpf = loader
            .load(OBJECT)
            .map_err(|e| format!("the eBPF programs could not be loaded: {}", chain(&e)))?;
        bpf.map_mut("SIG_LAYOUT")
            .ok_or_else(|| "the object has no SIG_LAYOUT map".to_owned())
            .and_then(|m| Array::<&mut MapData, SigLayout>::try_from(m).map_err(|e| chain(&e)))
            .and_then(|mut a| a.set(0, layout, 0).map_err(|e| chain(&e)))?;
        let prog: &mut TracePoint = bpf
            .program_mut("signal_generate")
            .ok_or("the object has no signal_generate program")?
            .try_into()
            .map_err(|e| chain(&e))?;
        prog.load().map_err(|e| chain(&e))?;
        prog.attach("signal", "signal_generate")
            .map_err(|e| format!("signal:signal_generate not attached: {}", chain(&e)))?;
        let kills = bpf
            .take_map("KILLS")
            .ok_or("the object has no KILLS map")?
            .try_into()
            .map_err(|e| chain(&e))?;
        Ok(Kills {
            _bpf: bpf,
            kills: Mutex::new(kills),
            ancestors: Mutex::new(HashMap::new()),
        })
    }

    /// Starts watching `pid`: notes its ancestors (its launcher among them) and forgets senders
    /// kept for an earlier process of that pid.
    pub fn watch(&self, pid: u32) {
        let chain = ancestors(Path::new("/proc"), pid);
        self.ancestors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid, chain);
        forget(
            &mut self.kills.lock().unwrap_or_else(|p| p.into_inner()),
            pid,
        );
    }

    /// Who sent `pid` the signal `sig` that ended it, if it was seen; forgets the process.
    pub fn sender(&self, pid: u32, sig: i32) -> Option<Sender> {
        let ancestors = self
            .ancestors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pid)?;
        let mut kills = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        let kill = kills.get(&kill_key(pid, sig), 0).ok()?;
        forget(&mut kills, pid);
        Some(sender(&kill, pid, &ancestors))
    }
}

/// Drops every sender kept for `pid`.
fn forget(kills: &mut BpfHashMap<MapData, u64, Kill>, pid: u32) {
    for sig in KILL_SIGNALS {
        let _ = kills.remove(&kill_key(pid, sig));
    }
}

/// What a kept sender is to the process it killed.
fn sender(kill: &Kill, pid: u32, ancestors: &[u32]) -> Sender {
    let comm = kill.comm;
    if kill.code == SI_KERNEL {
        return Sender {
            pid: 0,
            launcher: false,
            comm,
        };
    }
    Sender {
        pid: kill.sender,
        launcher: kill.sender != pid && ancestors.contains(&kill.sender),
        comm,
    }
}

/// The offsets `signal_generate` reads, from the event's fields.
fn sig_layout(f: &HashMap<String, (u16, u16)>) -> Option<SigLayout> {
    let at = |n: &str| f.get(n).filter(|(_, size)| *size == 4).map(|(o, _)| *o);
    Some(SigLayout {
        sig: at("sig")?,
        code: at("code")?,
        pid: at("pid")?,
        result: at("result")?,
    })
}

/// The ancestors of `pid` (parent first), up to the first process, read from `proc`.
pub fn ancestors(proc: &Path, pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut at = pid;
    while out.len() < 64 {
        let Some(parent) = parent(proc, at) else {
            break;
        };
        if parent == 0 || out.contains(&parent) {
            break;
        }
        out.push(parent);
        at = parent;
    }
    out
}

/// The parent of `pid` (`/proc/<pid>/stat` field 4; the name before it may hold anything).
fn parent(proc: &Path, pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_s_ancestors_end_at_the_first_process() {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() } as u32;
        let chain = ancestors(Path::new("/proc"), me);
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        assert_eq!(chain.first(), Some(&parent), "{chain:?}");
        assert_eq!(chain.last(), Some(&1), "{chain:?}");
    }

    /// Real processes killed three ways, seen through the tracepoint (needs the privilege to
    /// load eBPF programs, as the agent's other eBPF tests do).
    #[test]
    fn real_kills_name_their_sender() {
        let k = Kills::start().expect("the signal tracepoint loads");
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() } as u32;
        let watched = |prog: &str, args: &[&str]| {
            let child = std::process::Command::new(prog)
                .args(args)
                .spawn()
                .expect("spawn");
            k.watch(child.id());
            (child.id(), child)
        };
        // Killed by its parent (this test): its launcher.
        let (pid, mut child) = watched("sleep", &["30"]);
        child.kill().expect("kill");
        let _ = child.wait();
        let s = k.sender(pid, 9).expect("the sender of SIGKILL was kept");
        assert_eq!((s.pid, s.launcher), (me, true), "{s:?}");
        // Killed by itself.
        let (pid, mut child) = watched("sh", &["-c", "sleep 0.3; kill -9 $$"]);
        let _ = child.wait();
        let s = k.sender(pid, 9).expect("kept");
        assert_eq!((s.pid, s.launcher), (pid, false), "{s:?}");
        // Killed by another process (`kill`, a sibling): neither.
        let (pid, mut child) = watched("sleep", &["30"]);
        let st = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
        let _ = child.wait();
        let s = k.sender(pid, 15).expect("kept");
        assert!(s.pid != me && s.pid != pid && !s.launcher, "{s:?}");
        assert_eq!(s.name(), "kill");
        // Forgotten once read.
        assert_eq!(k.sender(pid, 15), None);
    }

    #[test]
    fn the_sender_is_the_kernel_the_process_its_launcher_or_another() {
        let kill = |sender, code| Kill {
            ts_ns: 1,
            sender,
            code,
            comm: *b"hydra_pmi_proxy\0",
        };
        let k = sender(&kill(77, SI_KERNEL), 10, &[5, 1]);
        assert_eq!((k.pid, k.launcher), (0, false));
        let itself = sender(&kill(10, 0), 10, &[5, 1]);
        assert_eq!((itself.pid, itself.launcher), (10, false));
        let launcher = sender(&kill(5, 0), 10, &[5, 1]);
        assert_eq!((launcher.pid, launcher.launcher), (5, true));
        assert_eq!(launcher.name(), "hydra_pmi_proxy");
        let other = sender(&kill(99, 0), 10, &[5, 1]);
        assert_eq!((other.pid, other.launcher), (99, false));
    }
}
