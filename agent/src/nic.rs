//! NIC counters from sysfs: RDMA ports (`class/infiniband/<dev>/ports/<port>/{counters,
//! hw_counters}`, the device-level `hw_counters`, the legacy `counters_ext`) and network
//! interfaces (`class/net/<iface>/statistics`, physical ones: those with a `device`).
//!
//! Each counter is read as a raw value and turned into a delta between two reads: PMA counters
//! are narrower than 64 bits (`symbol_error` 16, `link_downed` 8, …) and *saturate* at their
//! maximum, mlx5 Q-counters are 32-bit and *wrap*; data counters count 4-byte words. Every
//! counter is put in a class (congestion, loss, link error, fatal, …) for the diagnosis
//! (`reference/rdma-ebpf.md` §6). The sysfs root is a parameter, so tests read fixture trees.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a counter says about the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Bytes and packets moved.
    Traffic,
    /// Data queued but not sent, ECN marks, CNPs, pauses: the path is congested.
    Congestion,
    /// Sequence errors, retransmissions, ack timeouts: packets were lost.
    Loss,
    /// Symbol errors, retrains, link down, corrupt packets: the physical link is bad.
    LinkError,
    /// No receive buffer posted: the receiver is too slow.
    Receiver,
    /// Retries exhausted, completions in error: connections failed.
    Fatal,
    /// Configuration or management drops.
    Other,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Traffic => "traffic",
            Class::Congestion => "congestion",
            Class::Loss => "loss",
            Class::LinkError => "link-error",
            Class::Receiver => "receiver",
            Class::Fatal => "fatal",
            Class::Other => "other",
        }
    }
}

/// How a counter is read: its width in bits, what one count is worth, and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub bits: u32,
    /// A count is this many units (4 bytes for `port_*_data`).
    pub scale: u64,
    pub class: Class,
    /// It stops at its maximum instead of wrapping (PMA error counters).
    pub saturates: bool,
}

const fn k(bits: u32, scale: u64, class: Class, saturates: bool) -> Kind {
    Kind {
        bits,
        scale,
        class,
        saturates,
    }
}

/// The kind of the counter in `file` of a `counters` (PMA, `pma`) or `hw_counters` directory,
/// or of an interface's `statistics`; `None` for files that are not counters.
pub fn kind(dir: Dir, file: &str) -> Option<Kind> {
    use Class::*;
    Some(match dir {
        Dir::Pma => match file {
            "symbol_error" | "port_rcv_errors" | "port_rcv_remote_physical_errors" => {
                k(16, 1, LinkError, true)
            }
            "link_error_recovery" | "link_downed" => k(8, 1, LinkError, true),
            "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => {
                k(4, 1, LinkError, true)
            }
            "port_rcv_switch_relay_errors" | "VL15_dropped" => k(16, 1, Other, true),
            "port_xmit_constraint_errors" | "port_rcv_constraint_errors" => k(8, 1, Other, true),
            "port_xmit_discards" => k(16, 1, Congestion, true),
            "port_xmit_wait" => k(32, 1, Congestion, true),
            "port_xmit_data" | "port_rcv_data" => k(32, 4, Traffic, false),
            "port_xmit_data_64" | "port_rcv_data_64" => k(64, 4, Traffic, false),
            "port_xmit_packets" | "port_rcv_packets" => k(32, 1, Traffic, false),
            "port_xmit_packets_64"
            | "port_rcv_packets_64"
            | "unicast_xmit_packets"
            | "unicast_rcv_packets"
            | "multicast_xmit_packets"
            | "multicast_rcv_packets" => k(64, 1, Traffic, false),
            _ => return None,
        },
        Dir::Hw => match file {
            "np_ecn_marked_roce_packets" | "np_cnp_sent" | "rp_cnp_handled" => {
                k(64, 1, Congestion, false)
            }
            "rp_cnp_ignored" => k(64, 1, Other, false),
            "out_of_sequence"
            | "packet_seq_err"
            | "implied_nak_seq_err"
            | "duplicate_request"
            | "local_ack_timeout_err"
            | "roce_adp_retrans"
            | "roce_adp_retrans_to"
            | "roce_slow_restart"
            | "roce_slow_restart_cnps"
            | "roce_slow_restart_trans" => k(32, 1, Loss, false),
            "rnr_nak_retry_err" | "out_of_buffer" => k(32, 1, Receiver, false),
            "req_transport_retries_exceeded"
            | "req_rnr_retries_exceeded"
            | "req_cqe_error"
            | "resp_cqe_error"
            | "req_cqe_flush_error"
            | "resp_cqe_flush_error"
            | "req_remote_access_errors"
            | "resp_remote_access_errors"
            | "req_remote_invalid_request"
            | "resp_local_length_error" => k(32, 1, Fatal, false),
            "rx_icrc_encapsulated" => k(32, 1, LinkError, false),
            "rx_write_requests" | "rx_read_requests" | "rx_atomic_requests" | "rx_dct_connect" => {
                k(32, 1, Traffic, false)
            }
            "cc_rx_ce_pkts" | "cc_rx_cnp_pkts" | "cc_tx_cnp_pkts" => k(64, 1, Congestion, false),
            "rdma_tx_packets" | "rdma_tx_bytes" | "rdma_rx_packets" | "rdma_rx_bytes" => {
                k(64, 1, Traffic, false)
            }
            _ => return None,
        },
        Dir::Net => match file {
            "rx_bytes" | "tx_bytes" | "rx_packets" | "tx_packets" | "multicast" => {
                k(64, 1, Traffic, false)
            }
            "rx_dropped" | "tx_dropped" | "rx_fifo_errors" | "tx_fifo_errors"
            | "rx_missed_errors" => k(64, 1, Congestion, false),
            "rx_errors"
            | "tx_errors"
            | "rx_crc_errors"
            | "rx_frame_errors"
            | "rx_length_errors"
            | "rx_over_errors"
            | "tx_aborted_errors"
            | "tx_carrier_errors"
            | "tx_heartbeat_errors"
            | "tx_window_errors"
            | "collisions" => k(64, 1, LinkError, false),
            "rx_nohandler" | "rx_compressed" | "tx_compressed" => k(64, 1, Other, false),
            _ => return None,
        },
    })
}

/// Which kind of counter directory a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dir {
    /// `ports/<p>/counters` (and the legacy `counters_ext`): IB PerfMgt PortCounters.
    Pma,
    /// `hw_counters`, per port or per device (mlx5 Q-counters and congestion counters).
    Hw,
    /// `class/net/<iface>/statistics`.
    Net,
}

/// Where a counter lives: an RDMA device and port (port 0: the device-level `hw_counters`),
/// or a network interface (`port` 0).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Where {
    pub device: String,
    pub port: u32,
    pub counter: String,
}

/// One read of every counter under a sysfs root, with the ports' state and rate.
#[derive(Debug, Default)]
pub struct Read {
    pub values: BTreeMap<Where, (Kind, u64)>,
    /// RDMA ports: (device, port) → (up, rate in bytes per second when known).
    pub ports: BTreeMap<(String, u32), (bool, Option<u64>)>,
    /// Files that could not be read or did not hold a number (`N/A (no PMA)`, EINVAL, …):
    /// skipped, counted.
    pub unreadable: usize,
}

/// Reads every counter under `root` (normally `/sys`). Missing directories are no error: a
/// node without RDMA devices has none.
/// A port's GID at `index` of its table (`ports/<port>/gids/<index>`), or `None`.
pub fn port_gid(root: &Path, device: &str, port: u8, index: u8) -> Option<[u8; 16]> {
    let p = root
        .join("class/infiniband")
        .join(device)
        .join(format!("ports/{port}/gids/{index}"));
    let text = std::fs::read_to_string(p).ok()?;
    let v6: std::net::Ipv6Addr = text.trim().parse().ok()?;
    let gid = v6.octets();
    (gid != [0; 16]).then_some(gid)
}

/// A port's LID (`ports/<port>/lid`, hexadecimal), or `None`.
pub fn port_lid(root: &Path, device: &str, port: u8) -> Option<u16> {
    let p = root
        .join("class/infiniband")
        .join(device)
        .join(format!("ports/{port}/lid"));
    let text = std::fs::read_to_string(p).ok()?;
    let t = text.trim();
    u16::from_str_radix(t.trim_start_matches("0x"), 16).ok()
}

pub fn read(root: &Path) -> Read {
    let mut out = Read::default();
    let ib = root.join("class/infiniband");
    for dev in entries(&ib) {
        let device = name_of(&dev);
        read_dir(&mut out, &dev.join("hw_counters"), Dir::Hw, &device, 0);
        for port in entries(&dev.join("ports")) {
            let Ok(p) = name_of(&port).parse::<u32>() else {
                continue;
            };
            read_dir(&mut out, &port.join("counters"), Dir::Pma, &device, p);
            read_dir(&mut out, &port.join("counters_ext"), Dir::Pma, &device, p);
            read_dir(&mut out, &port.join("hw_counters"), Dir::Hw, &device, p);
            let up =
                std::fs::read_to_string(port.join("state")).is_ok_and(|s| s.contains("ACTIVE"));
            let rate = std::fs::read_to_string(port.join("rate"))
                .ok()
                .and_then(|s| rate_bytes(&s));
            out.ports.insert((device.clone(), p), (up, rate));
        }
    }
    // Physical interfaces only (those with a `device`): a Kubernetes node has a veth per pod.
    for iface in entries(&root.join("class/net")) {
        if !iface.join("device").exists() {
            continue;
        }
        let device = name_of(&iface);
        read_dir(&mut out, &iface.join("statistics"), Dir::Net, &device, 0);
    }
    out
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn read_dir(out: &mut Read, dir: &Path, d: Dir, device: &str, port: u32) {
    for f in entries(dir) {
        let counter = name_of(&f);
        let Some(kind) = kind(d, &counter) else {
            continue;
        };
        match std::fs::read_to_string(&f)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            Some(v) => {
                out.values.insert(
                    Where {
                        device: device.to_owned(),
                        port,
                        counter,
                    },
                    (kind, v),
                );
            }
            None => out.unreadable += 1,
        }
    }
}

/// A port's `rate` file (`"100 Gb/sec (4X EDR)"`, `"25 Gb/sec (1X EDR)"`) in bytes per second.
fn rate_bytes(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let n: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let bits = match unit {
        "Gb/sec" => n * 1e9,
        "Mb/sec" => n * 1e6,
        _ => return None,
    };
    Some((bits / 8.0) as u64)
}

/// What changed between two reads of one counter, in units (bytes for data counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delta {
    pub units: u64,
    /// The counter is stuck at its maximum: at least this much happened.
    pub at_least: bool,
}

/// The change from `prev` to `now` of a counter of `kind`: a narrow counter that went down
/// wrapped (or, saturating, was cleared); a 64-bit one that went down was reset.
pub fn delta(kind: Kind, prev: u64, now: u64) -> Delta {
    let max = if kind.bits >= 64 {
        u64::MAX
    } else {
        (1u64 << kind.bits) - 1
    };
    let (prev, now) = (prev.min(max), now.min(max));
    let counts = if now >= prev {
        now - prev
    } else if kind.saturates || kind.bits >= 64 {
        // Cleared (perfquery -x -r, a driver reset): what it counts now is new.
        now
    } else {
        max - prev + 1 + now
    };
    Delta {
        units: counts.saturating_mul(kind.scale),
        at_least: kind.saturates && now == max,
    }
}

/// One counter as the agent exports it ([`crate::metrics`]).
#[derive(Clone, Copy, Debug)]
pub struct Total {
    pub class: Class,
    /// Units since the agent started (from the deltas between reads).
    pub units: u64,
    /// Stuck at its maximum at the last read: `units` is a lower bound.
    pub saturated: bool,
    kind: Kind,
    /// Its raw value at the last read.
    last: u64,
}

impl PartialEq for Total {
    fn eq(&self, o: &Total) -> bool {
        (self.class, self.units, self.saturated) == (o.class, o.units, o.saturated)
    }
}

impl Total {
    /// A counter with these figures, as [`Totals::update`] leaves it (compared on them only).
    pub fn new(class: Class, units: u64, saturated: bool) -> Total {
        Total {
            class,
            units,
            saturated,
            kind: k(64, 1, class, false),
            last: 0,
        }
    }
}

/// Every counter's total since the agent started, the RDMA ports' state and rate, and the
/// files unreadable at the last read.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub counters: BTreeMap<Where, Total>,
    pub ports: BTreeMap<(String, u32), (bool, Option<u64>)>,
    pub unreadable: usize,
}

/// What a read changed that says something about a link: link-error and fatal counters that
/// went up (it is failing), congestion and loss counters that went up (it is slow), RDMA ports
/// that went down or came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Counter { at: Where, class: Class, units: u64 },
    Port { device: String, port: u32, up: bool },
}

impl Totals {
    /// Adds a read: each counter's change since the last read ([`delta`]); a counter seen for
    /// the first time starts at 0, one gone (a device removed) is forgotten. Returns the
    /// [`Change`]s that say a link is failing (none on the first read: no before to compare).
    pub fn update(&mut self, read: &Read) -> Vec<Change> {
        let mut changes = Vec::new();
        for (w, (kind, v)) in &read.values {
            match self.counters.get_mut(w) {
                Some(t) => {
                    let d = delta(t.kind, t.last, *v);
                    t.units = t.units.saturating_add(d.units);
                    t.saturated = d.at_least;
                    t.last = *v;
                    if d.units > 0
                        && matches!(
                            t.class,
                            Class::LinkError | Class::Fatal | Class::Congestion | Class::Loss
                        )
                    {
                        changes.push(Change::Counter {
                            at: w.clone(),
                            class: t.class,
                            units: d.units,
                        });
                    }
                }
                None => {
                    self.counters.insert(
                        w.clone(),
                        Total {
                            class: kind.class,
                            units: 0,
                            saturated: false,
                            kind: *kind,
                            last: *v,
                        },
                    );
                }
            }
        }
        self.counters.retain(|w, _| read.values.contains_key(w));
        for ((device, port), (up, _)) in &read.ports {
            if let Some((was, _)) = self.ports.get(&(device.clone(), *port))
                && was != up
            {
                changes.push(Change::Port {
                    device: device.clone(),
                    port: *port,
                    up: *up,
                });
            }
        }
        self.ports = read.ports.clone();
        self.unreadable = read.unreadable;
        changes
    }
}

/// The `link_event` records of `changes`, seen at host-mono `t`.
pub fn link_events(changes: &[Change], t: u64) -> Vec<commscope_wire::record::LinkEvent> {
    use commscope_wire::record::{LinkEvent, link_event};
    changes
        .iter()
        .map(|c| match c {
            Change::Counter { at, units, class } => LinkEvent {
                event: match class {
                    Class::Congestion => link_event::CONGESTION,
                    Class::Loss => link_event::LOSS,
                    _ => link_event::COUNTER,
                },
                t,
                count: *units,
                port: at.port,
                rank: -1,
                device: LinkEvent::name_bytes(&at.device),
                what: LinkEvent::name_bytes(&at.counter),
                ..LinkEvent::default()
            },
            Change::Port { device, port, up } => LinkEvent {
                event: if *up {
                    link_event::PORT_UP
                } else {
                    link_event::PORT_DOWN
                },
                t,
                count: 1,
                port: *port,
                rank: -1,
                device: LinkEvent::name_bytes(device),
                what: LinkEvent::name_bytes(if *up { "ACTIVE" } else { "not ACTIVE" }),
                ..LinkEvent::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture tree modelled on an mlx5 RoCE port and a netdev.
    fn tree(root: &Path, symbol_error: &str, xmit_data: &str, seq_err: &str, rx_bytes: &str) {
        let port = root.join("class/infiniband/mlx5_0/ports/1");
        for (dir, files) in [
            (
                port.join("counters"),
                vec![
                    ("symbol_error", symbol_error),
                    ("port_xmit_data", xmit_data),
                    ("port_xmit_wait", "100"),
                    ("VL15_dropped", "N/A (no PMA)"),
                    ("not_a_counter", "7"),
                ],
            ),
            (
                port.join("hw_counters"),
                vec![
                    ("packet_seq_err", seq_err),
                    ("np_ecn_marked_roce_packets", "5"),
                    ("lifespan", "10"),
                ],
            ),
            (
                root.join("class/infiniband/mlx5_0/hw_counters"),
                vec![("req_transport_retries_exceeded", "0")],
            ),
            (
                root.join("class/net/eth0/statistics"),
                vec![("rx_bytes", rx_bytes), ("rx_crc_errors", "0")],
            ),
        ] {
            std::fs::create_dir_all(&dir).expect("mkdir");
            for (f, v) in files {
                std::fs::write(dir.join(f), format!("{v}\n")).expect("write");
            }
        }
        // eth0 is a NIC (it has a device); veth0 is virtual and left out.
        std::fs::create_dir_all(root.join("class/net/eth0/device")).expect("mkdir");
        std::fs::create_dir_all(root.join("class/net/veth0/statistics")).expect("mkdir");
        std::fs::write(root.join("class/net/veth0/statistics/rx_bytes"), "9\n").expect("write");
        std::fs::write(port.join("state"), "4: ACTIVE\n").expect("state");
        std::fs::write(port.join("rate"), "100 Gb/sec (4X EDR)\n").expect("rate");
    }

    fn at(device: &str, port: u32, counter: &str) -> Where {
        Where {
            device: device.into(),
            port,
            counter: counter.into(),
        }
    }

    #[test]
    fn a_fixture_tree_reads_with_widths_units_and_classes() {
        let dir = tempfile::tempdir().expect("tempdir");
        tree(dir.path(), "3", "4294967290", "4294967295", "1000");
        let mut t = Totals::default();
        let r = read(dir.path());
        // `N/A (no PMA)` is counted, not read; unknown files are not counters.
        assert_eq!(r.unreadable, 1);
        assert_eq!(r.values.len(), 8, "{:?}", r.values.keys());
        assert_eq!(
            r.ports.get(&("mlx5_0".into(), 1)),
            Some(&(true, Some(12_500_000_000)))
        );
        t.update(&r);
        assert!(
            t.counters.values().all(|c| c.units == 0),
            "a first read has no deltas"
        );
        // The 32-bit data counter wraps (×4 bytes), the 16-bit symbol error counter
        // saturates, the 32-bit Q-counter wraps, the 64-bit netdev counter moves on.
        tree(dir.path(), "65535", "10", "2", "5000");
        t.update(&read(dir.path()));
        let d = |w: Where| {
            let c = t.counters[&w];
            Delta {
                units: c.units,
                at_least: c.saturated,
            }
        };
        assert_eq!(
            d(at("mlx5_0", 1, "port_xmit_data")),
            Delta {
                units: (5 + 1 + 10) * 4,
                at_least: false
            }
        );
        assert_eq!(
            d(at("mlx5_0", 1, "symbol_error")),
            Delta {
                units: 65_532,
                at_least: true
            }
        );
        assert_eq!(d(at("mlx5_0", 1, "packet_seq_err")).units, 3);
        assert_eq!(d(at("eth0", 0, "rx_bytes")).units, 4000);
        assert_eq!(
            d(at("mlx5_0", 0, "req_transport_retries_exceeded")).units,
            0
        );
        // What moved, besides traffic: loss and a (saturated) link error.
        let classes: BTreeMap<(String, u32, Class), (u64, bool)> = t
            .counters
            .iter()
            .filter(|(_, c)| c.class != Class::Traffic && c.units > 0)
            .map(|(w, c)| ((w.device.clone(), w.port, c.class), (c.units, c.saturated)))
            .collect();
        assert_eq!(
            classes,
            BTreeMap::from([
                (("mlx5_0".into(), 1, Class::Loss), (3, false)),
                (("mlx5_0".into(), 1, Class::LinkError), (65_532, true)),
            ])
        );
    }

    #[test]
    fn link_error_counters_that_go_up_and_ports_that_go_down_are_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = Totals::default();
        tree(dir.path(), "3", "0", "0", "0");
        assert_eq!(
            t.update(&read(dir.path())),
            [],
            "a first read has no before"
        );
        // Traffic moves: no change; loss, symbol errors and the port going down are.
        tree(dir.path(), "7", "100", "9", "500");
        let port = dir.path().join("class/infiniband/mlx5_0/ports/1/state");
        std::fs::write(&port, "1: DOWN\n").expect("state");
        assert_eq!(
            t.update(&read(dir.path())),
            [
                Change::Counter {
                    at: at("mlx5_0", 1, "packet_seq_err"),
                    class: Class::Loss,
                    units: 9
                },
                Change::Counter {
                    at: at("mlx5_0", 1, "symbol_error"),
                    class: Class::LinkError,
                    units: 4
                },
                Change::Port {
                    device: "mlx5_0".into(),
                    port: 1,
                    up: false
                }
            ]
        );
        // As records: loss, a link-error counter, the port down.
        let events = link_events(&t.update(&read(dir.path())), 7);
        assert!(events.is_empty(), "nothing new");
        let changes = [
            Change::Counter {
                at: at("mlx5_0", 1, "np_cnp_sent"),
                class: Class::Congestion,
                units: 5,
            },
            Change::Counter {
                at: at("mlx5_0", 1, "symbol_error"),
                class: Class::LinkError,
                units: 4,
            },
            Change::Port {
                device: "mlx5_0".into(),
                port: 1,
                up: false,
            },
        ];
        use commscope_wire::record::link_event;
        let e = link_events(&changes, 7);
        assert_eq!(
            e.iter()
                .map(|e| (e.event, e.count, e.port, e.what_name(), e.t))
                .collect::<Vec<_>>(),
            [
                (link_event::CONGESTION, 5, 1, "np_cnp_sent".to_owned(), 7),
                (link_event::COUNTER, 4, 1, "symbol_error".to_owned(), 7),
                (link_event::PORT_DOWN, 1, 1, "not ACTIVE".to_owned(), 7),
            ]
        );
        assert!(
            e.iter()
                .all(|e| e.device_name() == "mlx5_0" && e.rank == -1)
        );
        std::fs::write(&port, "4: ACTIVE\n").expect("state");
        assert_eq!(
            t.update(&read(dir.path())),
            [Change::Port {
                device: "mlx5_0".into(),
                port: 1,
                up: true
            }]
        );
    }

    #[test]
    fn totals_add_up_the_deltas_from_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = Totals::default();
        for (seq, rx) in [("1", "100"), ("4", "150"), ("6", "400")] {
            tree(dir.path(), "0", "0", seq, rx);
            t.update(&read(dir.path()));
        }
        assert_eq!(
            t.counters[&at("mlx5_0", 1, "packet_seq_err")],
            Total::new(Class::Loss, 5, false)
        );
        assert_eq!(
            t.counters[&at("eth0", 0, "rx_bytes")],
            Total::new(Class::Traffic, 300, false)
        );
        assert_eq!(t.unreadable, 1);
        assert_eq!(t.ports.len(), 1);
    }

    #[test]
    fn cleared_and_reset_counters_count_from_zero() {
        let sat = kind(Dir::Pma, "link_downed").expect("kind");
        assert_eq!(sat.bits, 8);
        assert_eq!(delta(sat, 200, 3).units, 3);
        assert!(!delta(sat, 200, 3).at_least);
        assert!(delta(sat, 200, 255).at_least);
        let wide = kind(Dir::Net, "tx_bytes").expect("kind");
        assert_eq!(delta(wide, 1_000, 10).units, 10);
        let q = kind(Dir::Hw, "out_of_sequence").expect("kind");
        assert_eq!(delta(q, u32::MAX as u64, 0).units, 1);
    }

    #[test]
    fn a_node_without_rdma_or_sysfs_reads_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = read(&dir.path().join("missing"));
        assert!(r.values.is_empty() && r.ports.is_empty() && r.unreadable == 0);
    }

    #[test]
    fn a_ports_gid_and_lid_are_read_from_sysfs() {
        let root = tempfile::tempdir().expect("tempdir");
        let p = root.path().join("class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(p.join("gids")).expect("mkdir");
        std::fs::write(
            p.join("gids/3"),
            "0000:0000:0000:0000:0000:ffff:0a00:0007\n",
        )
        .expect("gid");
        std::fs::write(
            p.join("gids/4"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        )
        .expect("gid");
        std::fs::write(p.join("gids/5"), "garbage\n").expect("gid");
        std::fs::write(p.join("lid"), "0x1a\n").expect("lid");
        let gid = port_gid(root.path(), "mlx5_0", 1, 3).expect("gid 3");
        assert_eq!(
            std::net::Ipv6Addr::from(gid).to_canonical().to_string(),
            "10.0.0.7"
        );
        // An empty slot, garbage, a missing index or port: none.
        assert_eq!(port_gid(root.path(), "mlx5_0", 1, 4), None);
        assert_eq!(port_gid(root.path(), "mlx5_0", 1, 5), None);
        assert_eq!(port_gid(root.path(), "mlx5_0", 1, 6), None);
        assert_eq!(port_gid(root.path(), "mlx5_0", 2, 3), None);
        assert_eq!(port_lid(root.path(), "mlx5_0", 1), Some(0x1a));
        assert_eq!(port_lid(root.path(), "mlx5_1", 1), None);
    }
}
