//! Tracepoint record layouts from tracefs: where each field of `tcp:tcp_probe`,
//! `tcp:tcp_retransmit_skb` and `sock:inet_sock_set_state` sits on the running kernel. The
//! programs read fields at these offsets, so they need no kernel headers and survive fields
//! moving between kernel versions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use commscope_ebpf_common::TpLayout;

/// The tracefs mount, mounting it at `/sys/kernel/tracing` when nothing is mounted (root only).
pub fn root() -> Result<PathBuf, String> {
    for p in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(p).join("events").is_dir() {
            return Ok(PathBuf::from(p));
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: constant NUL-terminated strings; a failed mount changes nothing.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    let err = std::io::Error::last_os_error();
    // Mounted now, by this call or by another one at the same moment (whose mount made this
    // one fail with EBUSY).
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(PathBuf::from("/sys/kernel/tracing"));
    }
    Err(format!(
        "tracefs is not mounted and could not be mounted at /sys/kernel/tracing ({})",
        if rc == 0 {
            "mounted, but it has no events directory".to_owned()
        } else {
            err.to_string()
        }
    ))
}

/// Field name → (offset, size), from one event's `format` file.
pub fn fields(format: &str) -> HashMap<String, (u16, u16)> {
    let mut out = HashMap::new();
    for line in format.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let (mut offset, mut size) = (None, None);
        for part in rest.split(';').map(str::trim) {
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse::<u16>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<u16>().ok();
            } else if decl.is_none() && !part.is_empty() {
                decl = Some(part);
            }
        }
        // `__u8 saddr[28]` → `saddr`; `const void * skaddr` → `skaddr`.
        let name = decl
            .and_then(|d| d.rsplit([' ', '*']).next())
            .map(|n| n.split('[').next().unwrap_or(n));
        if let (Some(n), Some(o), Some(s)) = (name, offset, size) {
            out.insert(n.to_owned(), (o, s));
        }
    }
    out
}

/// Which of the three tracepoints this kernel can feed, and where their fields are.
#[derive(Clone, Debug)]
pub struct Layout {
    pub layout: TpLayout,
    /// The tracepoints whose required fields are all present (`tcp/tcp_probe`, …).
    pub usable: Vec<&'static str>,
    /// Why the others are not.
    pub missing: Vec<String>,
}

/// Each tracepoint, its required fields (name, size) and optional ones.
const EVENTS: [(&str, &[(&str, u16)]); 3] = [
    (
        "tcp/tcp_probe",
        &[
            ("skaddr", 8),
            ("snd_una", 4),
            ("data_len", 2),
            ("srtt", 4),
            ("family", 2),
        ],
    ),
    ("tcp/tcp_retransmit_skb", &[("skaddr", 8)]),
    (
        "sock/inet_sock_set_state",
        &[
            ("skaddr", 8),
            ("oldstate", 4),
            ("newstate", 4),
            ("protocol", 2),
            ("family", 2),
        ],
    ),
];

/// Reads the layouts under `tracefs` (its root).
pub fn layout(tracefs: &Path) -> Layout {
    let mut l = TpLayout {
        probe_saddr: TpLayout::ABSENT,
        probe_daddr: TpLayout::ABSENT,
        probe_sport: TpLayout::ABSENT,
        probe_dport: TpLayout::ABSENT,
        probe_family: TpLayout::ABSENT,
        probe_data_len: TpLayout::ABSENT,
        probe_snd_una: TpLayout::ABSENT,
        probe_snd_nxt: TpLayout::ABSENT,
        probe_snd_cwnd: TpLayout::ABSENT,
        probe_srtt: TpLayout::ABSENT,
        probe_skaddr: TpLayout::ABSENT,
        retrans_skaddr: TpLayout::ABSENT,
        state_skaddr: TpLayout::ABSENT,
        state_oldstate: TpLayout::ABSENT,
        state_newstate: TpLayout::ABSENT,
        state_sport: TpLayout::ABSENT,
        state_dport: TpLayout::ABSENT,
        state_family: TpLayout::ABSENT,
        state_protocol: TpLayout::ABSENT,
        state_saddr: TpLayout::ABSENT,
        state_daddr: TpLayout::ABSENT,
        state_saddr_v6: TpLayout::ABSENT,
        state_daddr_v6: TpLayout::ABSENT,
        sock_bytes_received: TpLayout::ABSENT,
        sock_bytes_acked: TpLayout::ABSENT,
    };
    let (mut usable, mut missing) = (Vec::new(), Vec::new());
    for (event, required) in EVENTS {
        let path = tracefs.join("events").join(event).join("format");
        let f = match std::fs::read_to_string(&path) {
            Ok(text) => fields(&text),
            Err(e) => {
                missing.push(format!("{event}: {} ({e})", path.display()));
                continue;
            }
        };
        let absent: Vec<&str> = required
            .iter()
            .filter(|(n, size)| f.get(*n).is_none_or(|&(_, s)| s != *size))
            .map(|(n, _)| *n)
            .collect();
        if !absent.is_empty() {
            missing.push(format!("{event}: no field {}", absent.join(", ")));
            continue;
        }
        let at = |n: &str, size: u16| {
            f.get(n)
                .filter(|&&(_, s)| s == size)
                .map_or(TpLayout::ABSENT, |&(o, _)| o)
        };
        match event {
            "tcp/tcp_probe" => {
                l.probe_saddr = at("saddr", 28);
                l.probe_daddr = at("daddr", 28);
                l.probe_sport = at("sport", 2);
                l.probe_dport = at("dport", 2);
                l.probe_family = at("family", 2);
                l.probe_data_len = at("data_len", 2);
                l.probe_snd_una = at("snd_una", 4);
                l.probe_snd_nxt = at("snd_nxt", 4);
                l.probe_snd_cwnd = at("snd_cwnd", 4);
                l.probe_srtt = at("srtt", 4);
                l.probe_skaddr = at("skaddr", 8);
            }
            "tcp/tcp_retransmit_skb" => l.retrans_skaddr = at("skaddr", 8),
            _ => {
                l.state_skaddr = at("skaddr", 8);
                l.state_oldstate = at("oldstate", 4);
                l.state_newstate = at("newstate", 4);
                l.state_sport = at("sport", 2);
                l.state_dport = at("dport", 2);
                l.state_family = at("family", 2);
                l.state_protocol = at("protocol", 2);
                l.state_saddr = at("saddr", 4);
                l.state_daddr = at("daddr", 4);
                l.state_saddr_v6 = at("saddr_v6", 16);
                l.state_daddr_v6 = at("daddr_v6", 16);
            }
        }
        usable.push(event);
    }
    Layout {
        layout: l,
        usable,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tcp:tcp_probe`'s format on Linux 6.18.
    const PROBE: &str = "name: tcp_probe
ID: 2273
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__u8 saddr[28];\toffset:8;\tsize:28;\tsigned:0;
\tfield:__u8 daddr[28];\toffset:36;\tsize:28;\tsigned:0;
\tfield:__u16 sport;\toffset:64;\tsize:2;\tsigned:0;
\tfield:__u16 family;\toffset:68;\tsize:2;\tsigned:0;
\tfield:__u16 data_len;\toffset:76;\tsize:2;\tsigned:0;
\tfield:__u32 snd_una;\toffset:84;\tsize:4;\tsigned:0;
\tfield:__u32 srtt;\toffset:100;\tsize:4;\tsigned:0;
\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;

print fmt: \"family=%s\"";

    #[test]
    fn field_offsets_come_from_the_format_file() {
        let f = fields(PROBE);
        assert_eq!(f["saddr"], (8, 28));
        assert_eq!(f["skaddr"], (128, 8));
        assert_eq!(f["common_pid"], (4, 4));
        assert_eq!(f.len(), 10);
    }

    #[test]
    fn a_tracepoint_without_its_fields_is_not_used_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let put = |event: &str, text: &str| {
            let p = dir.path().join("events").join(event);
            std::fs::create_dir_all(&p).expect("mkdir");
            std::fs::write(p.join("format"), text).expect("write");
        };
        put("tcp/tcp_probe", PROBE);
        put(
            "tcp/tcp_retransmit_skb",
            "format:\n\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n",
        );
        let l = layout(dir.path());
        assert_eq!(l.usable, vec!["tcp/tcp_probe"]);
        assert_eq!(l.layout.probe_skaddr, 128);
        assert_eq!(l.layout.probe_dport, TpLayout::ABSENT);
        assert_eq!(l.layout.retrans_skaddr, TpLayout::ABSENT);
        assert_eq!(l.missing.len(), 2, "{:?}", l.missing);
        assert!(l.missing[0].contains("tcp_retransmit_skb: no field skaddr"));
        assert!(l.missing[1].starts_with("sock/inet_sock_set_state: "));
    }
}
