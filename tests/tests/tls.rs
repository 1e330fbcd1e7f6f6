//! TLS between the agent and the collector, with certificates made by `openssl` for the test:
//! a collector whose listeners speak TLS and require agents' certificates from its CA records a
//! job through an agent that has one; an agent whose certificate another CA signed, and one
//! without a certificate, are refused, and both sides log it; the HTTP API answers over
//! `https://` only. `up` does the same with one certificate.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use commscope_tests::services::{Service, Services, addr_after, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, commscope, launch, wait};

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A self-signed certificate `NAME.pem` with its key `NAME.key`, `extra` added to the request.
fn self_signed(dir: &Path, name: &str, extra: &[&str]) {
    let (subj, key, pem) = (
        format!("/CN={name}"),
        format!("{name}.key"),
        format!("{name}.pem"),
    );
    let mut args = vec![
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &subj,
        "-keyout",
        &key,
        "-out",
        &pem,
    ];
    args.extend_from_slice(extra);
    openssl(dir, &args);
}

/// A CA (`NAME-ca.pem`) and, signed by it, `NAME-LEAF.pem` with its key for each leaf:
/// (leaf, extensions).
fn pki(dir: &Path, name: &str, leaves: &[(&str, &str)]) {
    let ca = format!("{name}-ca");
    self_signed(dir, &ca, &[]);
    for (leaf, ext) in leaves {
        let base = format!("{name}-{leaf}");
        std::fs::write(dir.join(format!("{base}.ext")), ext).expect("ext");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={base}"),
                "-keyout",
                &format!("{base}.key"),
                "-out",
                &format!("{base}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{base}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{base}.ext"),
                "-out",
                &format!("{base}.pem"),
            ],
        );
    }
}

fn path(dir: &Path, f: &str) -> String {
    dir.join(f).to_str().expect("utf-8").to_owned()
}

/// `curl` on the collector's HTTP side: (exit code, body).
fn curl(args: &[&str]) -> (i32, String) {
    let o = Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .args(args)
        .output()
        .expect("curl");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// An extra agent on its own socket and spool, with `tls` flags.
fn agent(svc: &Services, name: &str, tls: &[String]) -> (Service, PathBuf) {
    let socket = svc.dir.path().join(format!("{name}.sock"));
    let mut c = commscope();
    c.arg("agent")
        .arg("--collector")
        .arg(format!("https://{}", svc.grpc))
        .arg("--socket")
        .arg(&socket)
        .arg("--node")
        .arg(name)
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--spool-dir")
        .arg(svc.dir.path().join(format!("{name}-spool")))
        .arg("--no-ebpf")
        .args(tls);
    let s = Service::spawn(c, "agent");
    s.wait_log("registrations on", Duration::from_secs(30));
    (s, socket)
}

#[test]
fn agents_reach_a_tls_collector_only_with_a_certificate_its_ca_signed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    pki(
        d,
        "site",
        &[
            (
                "collector",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            ("agent", "extendedKeyUsage=clientAuth\n"),
        ],
    );
    pki(d, "rogue", &[("agent", "extendedKeyUsage=clientAuth\n")]);
    let ca = path(d, "site-ca.pem");
    let client = |who: &str| {
        vec![
            "--tls-ca".to_owned(),
            ca.clone(),
            "--tls-cert".to_owned(),
            path(d, &format!("{who}-agent.pem")),
            "--tls-key".to_owned(),
            path(d, &format!("{who}-agent.key")),
        ]
    };
    let site = client("site");
    let mut agent_args: Vec<&str> = site.iter().map(String::as_str).collect();
    agent_args.push("--no-ebpf");
    let svc = Services::start(
        "node-tls",
        &[
            "--tls-cert",
            &path(d, "site-collector.pem"),
            "--tls-key",
            &path(d, "site-collector.key"),
            "--tls-ca",
            &ca,
        ],
        &agent_args,
    );
    let log = svc.collector.as_ref().expect("collector").log();
    assert!(log.contains("TLS on both (https://)"), "{log}");

    // The site's agent: its job is recorded.
    let prog = build(Flavour::Mpich, "basic");
    let out = run_with_agent(
        &svc.socket,
        "tls-job",
        &launch(Flavour::Mpich, 2, &prog, &["50"]),
        &[],
    );
    assert_ok(&out, "job");
    let api = format!("https://127.0.0.1:{}/api/v1/jobs/tls-job", svc.http.port());
    let job = wait("the job over TLS", Duration::from_secs(60), || {
        let (code, body) = curl(&["--cacert", &ca, &api]);
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 0 && v["state"] == "ended").then_some(v)
    });
    assert_eq!(job["ranks"], 2, "{job}");
    // Plaintext HTTP on the TLS port gets nothing; a client that does not trust the CA neither.
    let plain = format!("http://127.0.0.1:{}/api/v1/jobs", svc.http.port());
    assert_ne!(curl(&[&plain]).0, 0);
    assert_ne!(
        curl(&[&api]).0,
        0,
        "curl without the site's CA must not trust it"
    );

    // An agent whose certificate another CA signed, and one with none: refused, and logged on
    // both sides; their jobs are not stored.
    for (name, tls) in [
        ("rogue", client("rogue")),
        ("anonymous", vec!["--tls-ca".to_owned(), ca.clone()]),
    ] {
        let (a, socket) = agent(&svc, name, &tls);
        let job = format!("{name}-job");
        let out = run_with_agent(
            &socket,
            &job,
            &launch(Flavour::Mpich, 2, &prog, &["50"]),
            &[],
        );
        assert_ok(&out, "a job under a refused agent still runs");
        let alog = wait("the agent's refusal", Duration::from_secs(30), || {
            let l = a.log();
            l.contains("the collector refused this agent's credentials")
                .then_some(l)
        });
        // rustls' alert: UnknownCA for the rogue, CertificateRequired for the anonymous.
        let l = alog.to_ascii_lowercase();
        assert!(
            l.contains("unknownca") || l.contains("certificaterequired"),
            "{alog}"
        );
        svc.collector.as_ref().expect("collector").wait_log(
            "refused a gRPC connection from 127.0.0.1:",
            Duration::from_secs(10),
        );
        let (code, body) = curl(&[
            "--cacert",
            &ca,
            &format!("https://127.0.0.1:{}/api/v1/jobs", svc.http.port()),
        ]);
        assert_eq!(code, 0);
        assert!(!body.contains(&job), "{body}");
    }
    let (_, m) = curl(&[
        "--cacert",
        &ca,
        &format!("https://127.0.0.1:{}/metrics", svc.http.port()),
    ]);
    assert!(
        m.lines()
            .any(|l| l.starts_with("commscope_collector_refused_total{reason=\"tls\"}")),
        "{m}"
    );
}

/// `commscope up` with `tls` flags on its own directory: (the process, its socket, its HTTP
/// address). Its log must say the listeners speak TLS.
fn up(dir: &Path, tls: &[String]) -> (Service, PathBuf, std::net::SocketAddr) {
    let socket = dir.join("up.sock");
    let mut cmd = commscope();
    cmd.arg("up")
        .arg("--dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(&socket)
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--agent-http", "127.0.0.1:0"])
        .args(tls);
    let s = Service::spawn(cmd, "up");
    s.wait_log("Ctrl-C stops", Duration::from_secs(30));
    let log = s.log();
    assert!(log.contains("TLS on both (https://)"), "{log}");
    let http = addr_after(&log, "(HTTP https://").expect("the collector's HTTPS address");
    (s, socket, http)
}

/// A job through `up`'s agent reaches its collector: the API says so over HTTPS (trusting
/// `ca`), and not over plaintext.
fn job_through_up(socket: &Path, http: std::net::SocketAddr, ca: &str, job: &str) {
    let prog = build(Flavour::Mpich, "basic");
    let out = run_with_agent(socket, job, &launch(Flavour::Mpich, 2, &prog, &["20"]), &[]);
    assert_ok(&out, "job");
    let api = format!("https://127.0.0.1:{}/api/v1/jobs/{job}", http.port());
    let v = wait(
        "the job through up over TLS",
        Duration::from_secs(60),
        || {
            let (code, body) = curl(&["--cacert", ca, &api]);
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (code == 0 && v["state"] == "ended").then_some(v)
        },
    );
    assert_eq!(v["ranks"], 2, "{v}");
    let plain = format!("http://127.0.0.1:{}/api/v1/jobs", http.port());
    assert_ne!(curl(&[&plain]).0, 0, "plaintext must get nothing");
}

#[test]
fn up_speaks_tls_with_a_self_signed_certificate_or_a_ca() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    // Self-signed, naming 127.0.0.1: the agent trusts the certificate itself. Not a CA's:
    // rustls refuses a CA's certificate as a server's (CaUsedAsEndEntity).
    self_signed(
        d,
        "up",
        &[
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ],
    );
    let cert = path(d, "up.pem");
    let flags = |cert: &str, key: &str| {
        vec![
            "--tls-cert".to_owned(),
            cert.to_owned(),
            "--tls-key".to_owned(),
            key.to_owned(),
        ]
    };
    let one = d.join("one");
    std::fs::create_dir_all(&one).expect("mkdir");
    let (mut s, socket, http) = up(&one, &flags(&cert, &path(d, "up.key")));
    job_through_up(&socket, http, &cert, "up-self-signed");
    s.stop();

    // A CA: the collector then requires client certificates it signed, and the agent presents
    // the same one (serverAuth and clientAuth).
    pki(
        d,
        "node",
        &[(
            "up",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )],
    );
    let ca = path(d, "node-ca.pem");
    let mut tls = flags(&path(d, "node-up.pem"), &path(d, "node-up.key"));
    tls.extend(["--tls-ca".to_owned(), ca.clone()]);
    let two = d.join("two");
    std::fs::create_dir_all(&two).expect("mkdir");
    let (mut s, socket, http) = up(&two, &tls);
    assert!(
        s.log()
            .contains("agents' certificates checked against the CA"),
        "{}",
        s.log()
    );
    job_through_up(&socket, http, &ca, "up-mutual");
    s.stop();
}
