//! What network a node offers: the summed line rate of its active ports, read from sysfs.
//!
//! Counted: InfiniBand/RoCE ports in state `ACTIVE` (`/sys/class/infiniband/*/ports/*/rate`,
//! e.g. `400 Gb/sec (4X NDR)`), and Ethernet interfaces backed by a device (`device` present:
//! not loopback, veth, bridges or other virtual ones) that are `up` with a known `speed`
//! (Mbit/s). IPoIB interfaces (type 32) are left out: their port is counted already.
//! Read once, off any hot path; anything unreadable is skipped.

use std::path::Path;

/// The summed line rate of the node's active network ports, Mbit/s; `None` when none is
/// known. `sys` is the sysfs root (`/sys`).
pub fn line_rate_mbps(sys: &Path) -> Option<u64> {
    let total = infiniband_mbps(sys) + ethernet_mbps(sys);
    (total > 0).then_some(total)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

fn infiniband_mbps(sys: &Path) -> u64 {
    let Ok(devices) = std::fs::read_dir(sys.join("class/infiniband")) else {
        return 0;
    };
    let mut total = 0;
    for dev in devices.flatten() {
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let p = port.path();
            let active = read(&p.join("state")).is_some_and(|s| s.ends_with("ACTIVE"));
            if let (true, Some(rate)) = (active, read(&p.join("rate"))) {
                total += parse_ib_rate(&rate).unwrap_or(0);
            }
        }
    }
    total
}

/// `400 Gb/sec (4X NDR)` → 400000; `56 Gb/sec (4X FDR)` → 56000; `2.5 Gb/sec (1X SDR)` → 2500.
fn parse_ib_rate(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let value: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let per = if unit.starts_with("Gb") {
        1000.0
    } else if unit.starts_with("Mb") {
        1.0
    } else {
        return None;
    };
    (value.is_finite() && value > 0.0).then_some((value * per) as u64)
}

fn ethernet_mbps(sys: &Path) -> u64 {
    let Ok(ifaces) = std::fs::read_dir(sys.join("class/net")) else {
        return 0;
    };
    let mut total = 0;
    for i in ifaces.flatten() {
        let p = i.path();
        let physical = p.join("device").exists();
        let up = read(&p.join("operstate")).is_some_and(|s| s == "up");
        let ipoib = read(&p.join("type")).is_some_and(|t| t == "32");
        if !physical || !up || ipoib {
            continue;
        }
        if let Some(speed) = read(&p.join("speed")).and_then(|s| s.parse::<i64>().ok())
            && speed > 0
        {
            total += speed as u64;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn active_ports_and_physical_links_that_are_up_count() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = d.path();
        // Two NDR ports, one of them down; a 100 GbE NIC up; IPoIB on the first port; a veth
        // and the loopback (no device); a NIC whose speed is unknown.
        write(s, "class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
        write(
            s,
            "class/infiniband/mlx5_0/ports/1/rate",
            "400 Gb/sec (4X NDR)\n",
        );
        write(s, "class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n");
        write(
            s,
            "class/infiniband/mlx5_1/ports/1/rate",
            "400 Gb/sec (4X NDR)\n",
        );
        for (name, device, state, speed, kind) in [
            ("eth0", true, "up", "100000", "1"),
            ("ib0", true, "up", "400000", "32"),
            ("veth1", false, "up", "10000", "1"),
            ("lo", false, "unknown", "", "772"),
            ("eth1", true, "up", "-1", "1"),
            ("eth2", true, "down", "25000", "1"),
        ] {
            if device {
                write(s, &format!("class/net/{name}/device/vendor"), "0x15b3\n");
            }
            write(s, &format!("class/net/{name}/operstate"), state);
            write(s, &format!("class/net/{name}/speed"), speed);
            write(s, &format!("class/net/{name}/type"), kind);
        }
        assert_eq!(line_rate_mbps(s), Some(400_000 + 100_000));
    }

    #[test]
    fn nothing_known_is_none() {
        let d = tempfile::tempdir().expect("tempdir");
        assert_eq!(line_rate_mbps(d.path()), None);
        assert_eq!(line_rate_mbps(Path::new("/nonexistent/sys")), None);
    }

    #[test]
    fn ib_rates_parse() {
        assert_eq!(parse_ib_rate("56 Gb/sec (4X FDR)"), Some(56_000));
        assert_eq!(parse_ib_rate("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_ib_rate("garbage"), None);
        assert_eq!(parse_ib_rate(""), None);
    }
}
