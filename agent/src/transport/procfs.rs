//! What `/proc` says about processes, for the probes: which libraries to probe (every process
//! that maps libibverbs or libnccl, containers included through `/proc/<pid>/root`), and which
//! process owns a TCP socket (its `/proc/<pid>/fd` links and its network namespace's
//! `/proc/<pid>/net/tcp{,6}`).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A library file to probe, once per file (device, inode) whatever the path it was seen by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// A path that reaches it from here (`/proc/<pid>/root/...` for another mount namespace).
    pub path: PathBuf,
    pub id: (u64, u64),
    /// A process that maps it.
    pub pid: u32,
}

/// Whether a mapped file is one of the libraries the probes cover.
pub fn is_probed_library(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libibverbs.so") || is_nccl_library(path)
}

/// Whether a mapped file is NCCL (`libnccl.so*`).
pub fn is_nccl_library(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .unwrap_or(path)
        .starts_with("libnccl.so")
}

/// The probed libraries mapped by any process under `proc_root` (`/proc`), skipping files in
/// `known`.
pub fn libraries(proc_root: &Path, known: &HashSet<(u64, u64)>) -> Vec<Library> {
    let mut out: Vec<Library> = Vec::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    let own_ns = std::fs::read_link(proc_root.join("self/ns/mnt")).ok();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(maps) = std::fs::read_to_string(entry.path().join("maps")) else {
            continue;
        };
        let mut seen = HashSet::new();
        for line in maps.lines() {
            // address perms offset dev inode path
            let Some(path) = line.split_whitespace().nth(5) else {
                continue;
            };
            if !path.starts_with('/') || !is_probed_library(path) || !seen.insert(path) {
                continue;
            }
            // Reach the file through the process's root when it lives in another mount
            // namespace (a container, `unshare -m`).
            let same_ns =
                own_ns.is_some() && std::fs::read_link(entry.path().join("ns/mnt")).ok() == own_ns;
            let reach = if same_ns {
                PathBuf::from(path)
            } else {
                entry.path().join("root").join(path.trim_start_matches('/'))
            };
            let Ok(meta) = std::fs::metadata(&reach) else {
                continue;
            };
            let id = (meta.dev(), meta.ino());
            if known.contains(&id) || out.iter().any(|l| l.id == id) {
                continue;
            }
            out.push(Library {
                path: reach,
                id,
                pid,
            });
        }
    }
    out
}

/// (local, remote) → owning pid, for the TCP sockets of `pids`.
/// This network namespace's interface addresses: address → interface name (`getifaddrs`).
/// Empty when the call fails.
pub fn interface_addresses() -> HashMap<IpAddr, String> {
    let mut out = HashMap::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list this function frees below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name from getifaddrs.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` points to a sockaddr of the family it names.
        let ip = match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out.insert(ip, name);
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

pub fn socket_owners(proc_root: &Path, pids: &[u32]) -> HashMap<(SocketAddr, SocketAddr), u32> {
    let mut out = HashMap::new();
    // Socket tables are per network namespace: read each namespace's once.
    let mut tables: HashMap<PathBuf, HashMap<u64, (SocketAddr, SocketAddr)>> = HashMap::new();
    for &pid in pids {
        let base = proc_root.join(pid.to_string());
        let Ok(fds) = std::fs::read_dir(base.join("fd")) else {
            continue;
        };
        let inodes: Vec<u64> = fds
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| {
                l.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect();
        if inodes.is_empty() {
            continue;
        }
        let ns = std::fs::read_link(base.join("ns/net")).unwrap_or_else(|_| base.clone());
        let table = tables.entry(ns).or_insert_with(|| {
            let mut t = HashMap::new();
            for f in ["net/tcp", "net/tcp6"] {
                if let Ok(text) = std::fs::read_to_string(base.join(f)) {
                    t.extend(parse_tcp_table(&text));
                }
            }
            t
        });
        for ino in inodes {
            if let Some(&(l, r)) = table.get(&ino) {
                out.insert((l, r), pid);
            }
        }
    }
    out
}

/// inode → (local, remote), from `/proc/net/tcp` or `tcp6` text.
pub fn parse_tcp_table(text: &str) -> HashMap<u64, (SocketAddr, SocketAddr)> {
    let mut out = HashMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(l), Some(r), Some(ino)) = (f.get(1), f.get(2), f.get(9)) else {
            continue;
        };
        let (Some(l), Some(r), Ok(ino)) = (hex_addr(l), hex_addr(r), ino.parse::<u64>()) else {
            continue;
        };
        if ino != 0 {
            out.insert(ino, (l, r));
        }
    }
    out
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel prints each 32-bit
/// word of the address in host order.
fn hex_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(a.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_le_bytes(),
        )
    };
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_loopback_address_is_on_the_loopback_interface() {
        let a = super::interface_addresses();
        assert_eq!(
            a.get(&"127.0.0.1".parse().expect("ip")).map(String::as_str),
            Some("lo"),
            "{a:?}"
        );
    }

    use super::*;

    #[test]
    fn tcp_tables_parse_in_both_families() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 0200090A:C350 01 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 20 4 30 10 -1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1";
        let t = parse_tcp_table(v4);
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[&12345],
            (
                "127.0.0.1:8080".parse().expect("addr"),
                "10.9.0.2:50000".parse().expect("addr")
            )
        );
        let v6 = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F90 0000000000000000FFFF00000100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 777 1";
        let t = parse_tcp_table(v6);
        assert_eq!(t[&777].0, "[::1]:8080".parse().expect("addr"));
        assert_eq!(t[&777].1, "[::ffff:127.0.0.1]:80".parse().expect("addr"));
    }

    #[test]
    fn only_verbs_and_nccl_libraries_are_probed() {
        assert!(is_probed_library(
            "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"
        ));
        assert!(is_probed_library("/opt/venv/nvidia/nccl/lib/libnccl.so.2"));
        assert!(!is_probed_library("/usr/lib/libnccl-net.so"));
        assert!(!is_probed_library("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    }

    #[test]
    fn this_process_owns_its_own_sockets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let (_server, _) = listener.accept().expect("accept");
        let owners = socket_owners(Path::new("/proc"), &[std::process::id()]);
        let local = client.local_addr().expect("local");
        assert_eq!(owners.get(&(local, addr)), Some(&std::process::id()));
        assert_eq!(owners.get(&(addr, local)), Some(&std::process::id()));
    }
}
