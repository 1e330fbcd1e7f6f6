//! A real Prometheus (the Debian package) on loopback, scraping a collector as job
//! `commscope-collector` and an agent as `commscope-agent` every second, optionally with rule
//! files evaluated every second; killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::services::{free_port, http_get};

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts it with its configuration and data under `dir`.
    pub fn start(dir: &Path, collector: SocketAddr, agent: SocketAddr, rules: &[PathBuf]) -> Self {
        let bin = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("prometheus is not installed: run scripts/setup.sh");
        std::fs::create_dir_all(dir).expect("mkdir");
        let rule_files: Vec<String> = rules.iter().map(|r| format!("'{}'", r.display())).collect();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{}]\nscrape_configs:\n  - job_name: commscope-collector\n    static_configs:\n      - targets: ['{collector}']\n  - job_name: commscope-agent\n    static_configs:\n      - targets: ['{agent}']\n",
                rule_files.join(", ")
            ),
        )
        .expect("config");
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// An instant query's result vector (None: the query failed).
    pub fn query(&self, q: &str) -> Option<Vec<serde_json::Value>> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (st, body) = http_get(self.addr, &format!("/api/v1/query?query={enc}"));
        if st != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"].as_array().cloned()
    }

    /// The sum of an instant query's values (None: failed, or no series).
    pub fn sum(&self, q: &str) -> Option<f64> {
        let r = self.query(q)?;
        let mut sum = 0.0;
        for s in &r {
            sum += s["value"][1].as_str()?.parse::<f64>().ok()?;
        }
        (!r.is_empty()).then_some(sum)
    }
}
