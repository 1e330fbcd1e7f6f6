//! The real `commscope tui` binary in `tmux`, on a real collector fed by `commscope simulate`
//! with a hang: keys are sent as a user would type them and the screen is read back with
//! `tmux capture-pane`. The hang view must name the culprit rank. The screens are kept under
//! `target/tui-session/` (the README's recorded session comes from there).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use commscope_tests::commscope_bin;
use commscope_tests::services::{Service, Services};

/// A tmux server of its own (`-L`), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn start(&self, w: u16, h: u16, command: &str) {
        let st = self
            .cmd()
            .args([
                "new-session",
                "-d",
                "-s",
                "tui",
                "-x",
                &w.to_string(),
                "-y",
                &h.to_string(),
            ])
            .arg(command)
            .status()
            .expect("tmux is installed (scripts/setup.sh)");
        assert!(st.success(), "tmux new-session: {st}");
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let st = self
                .cmd()
                .args(["send-keys", "-t", "tui", k])
                .status()
                .expect("tmux send-keys");
            assert!(st.success());
            // One key at a time: an Esc followed at once by a letter reads as Alt+letter.
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "tui"])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.cmd()
            .args(["has-session", "-t", "tui"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn wait_for(&self, what: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                t.elapsed() < timeout,
                "timed out waiting for {what}; the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .arg("kill-server")
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn keep(name: &str, screen: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("tui-session");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}.txt")), screen);
}

#[test]
fn the_hang_view_names_the_culprit_rank() {
    let svc = Services::start("node-tui", &[], &[]);
    let mut sim = commscope_tests::commscope();
    sim.args(["simulate", "--collector"])
        .arg(format!("http://{}", svc.grpc))
        .arg("--collector-http")
        .arg(svc.http.to_string())
        .args(["--ranks", "32", "--fault", "hang:13:20", "--duration", "90"])
        .args(["--job-id", "tui-hang"]);
    let _sim = Service::spawn(sim, "simulate");

    let tmux = Tmux {
        socket: format!("commscope-test-{}", std::process::id()),
    };
    tmux.start(
        150,
        44,
        &format!(
            "{} tui --collector http://{}",
            commscope_bin().display(),
            svc.grpc
        ),
    );
    let jobs = tmux.wait_for("the job in the list", Duration::from_secs(30), |s| {
        s.contains("tui-hang") && s.contains("running")
    });
    keep("1-jobs", &jobs);
    // The hang opens once the others have waited past the floor (5 s).
    let jobs = tmux.wait_for(
        "the open finding in the list",
        Duration::from_secs(60),
        |s| s.contains("1 open"),
    );
    keep("2-jobs-finding", &jobs);
    tmux.keys(&["Enter"]);
    let job = tmux.wait_for("the job view", Duration::from_secs(10), |s| {
        s.contains("Findings") && s.contains("● hang")
    });
    keep("3-job", &job);
    assert!(job.contains("32 ranks on 4 nodes"), "{job}");
    tmux.keys(&["w"]);
    let hang = tmux.wait_for("the hang view", Duration::from_secs(10), |s| {
        s.contains("Never arrived")
    });
    keep("4-hang", &hang);
    let culprit = hang
        .lines()
        .skip_while(|l| !l.contains("Never arrived"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        culprit.contains("rank 13 on node-"),
        "the line after \"Never arrived\" names the culprit: {culprit:?}\n{hang}"
    );
    assert!(hang.contains("→ rank 13 →"), "the wait chain: {hang}");
    // Help, back, and quit.
    tmux.keys(&["?"]);
    let help = tmux.wait_for("the help", Duration::from_secs(5), |s| s.contains(" Keys "));
    assert!(help.contains("Esc, Backspace"), "{help}");
    tmux.keys(&["Escape", "Escape"]);
    // While the job hangs, the heatmap shows in-flight age; m moves on to blame share.
    tmux.wait_for("the job view again", Duration::from_secs(5), |s| {
        s.contains("Ranks — in-flight age")
    });
    tmux.keys(&["m"]);
    tmux.wait_for("the next metric", Duration::from_secs(5), |s| {
        s.contains("Ranks — blame share")
    });
    tmux.keys(&["q"]);
    let t = Instant::now();
    while tmux.alive() {
        assert!(t.elapsed() < Duration::from_secs(5), "q did not quit");
        std::thread::sleep(Duration::from_millis(100));
    }
}
