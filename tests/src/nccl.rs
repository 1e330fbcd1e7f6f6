//! The NCCL side of the tests: the CUDA driver and NCCL test doubles (`tests/doubles/`) with the
//! job written against them, and the real `libnccl.so.2` from PyPI's `nvidia-nccl-cu12`, which
//! `scripts/setup.sh` fetches once into a cache outside the clone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::bin_dir;

/// The version of the real NCCL the tests use (and `scripts/setup.sh` fetches).
pub const REAL_NCCL_VERSION: &str = "2.32.3";

fn doubles_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("doubles")
}

pub(crate) fn newer(src: &[&Path], out: &Path) -> bool {
    let Ok(o) = std::fs::metadata(out).and_then(|m| m.modified()) else {
        return true;
    };
    src.iter().any(|s| {
        std::fs::metadata(s)
            .and_then(|m| m.modified())
            .map_or(true, |t| t > o)
    })
}

/// Compiles with the system C compiler into `out`.
pub(crate) fn cc(args: &[&str], src: &Path, out: &Path, libs: &[&str]) {
    compile(Path::new("cc"), args, src, out, libs);
}

/// Compiles with `compiler` into `out` (through a temporary name and a rename, so parallel tests
/// never see half a file).
fn compile(compiler: &Path, args: &[&str], src: &Path, out: &Path, libs: &[&str]) {
    let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
    let o = Command::new(compiler)
        .args(["-O1", "-Wall", "-Werror"])
        .args(args)
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .args(libs)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "run {}: {e} (scripts/setup.sh installs it)",
                compiler.display()
            )
        });
    assert!(
        o.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, out).expect("rename build output");
}

static BUILD: Mutex<()> = Mutex::new(());

/// The directory holding the test doubles (`libcuda.so.1`, `libnccl.so.2`), `nccl_job` and
/// `nccl_dlsym_job`,
/// built on first use. Programs there find the doubles through their run path.
pub fn doubles() -> PathBuf {
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let dir = bin_dir().join("test-doubles");
    std::fs::create_dir_all(&dir).expect("create test-doubles dir");
    let src = doubles_src();
    let (cuda_c, nccl_c, job_c) = (
        src.join("cuda_double.c"),
        src.join("nccl_double.c"),
        src.join("nccl_job.c"),
    );
    let (cuda, nccl, job) = (
        dir.join("libcuda.so.1"),
        dir.join("libnccl.so.2"),
        dir.join("nccl_job"),
    );
    let dir_s = dir.to_str().expect("utf-8 path");
    if newer(&[&cuda_c], &cuda) {
        cc(
            &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
            &cuda_c,
            &cuda,
            &["-lpthread"],
        );
    }
    let header = src.join("profiler_v7.h");
    if newer(&[&nccl_c, &header, &cuda], &nccl) {
        cc(
            &["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2"],
            &nccl_c,
            &nccl,
            &[
                &format!("-L{dir_s}"),
                "-l:libcuda.so.1",
                "-lpthread",
                "-lrt",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    let dlsym_c = src.join("nccl_dlsym_job.c");
    let dlsym_job = dir.join("nccl_dlsym_job");
    if newer(&[&dlsym_c, &cuda], &dlsym_job) {
        cc(
            &[],
            &dlsym_c,
            &dlsym_job,
            &[
                &format!("-L{dir_s}"),
                "-l:libcuda.so.1",
                "-ldl",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    if newer(&[&job_c, &nccl, &cuda], &job) {
        cc(
            &[],
            &job_c,
            &job,
            &[
                &format!("-L{dir_s}"),
                "-l:libnccl.so.2",
                "-l:libcuda.so.1",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    dir
}

/// The doubles as AMD's stack: the CUDA double with HIP names as `libamdhip64.so`, the NCCL
/// double as `librccl.so` on top of it (its path names RCCL, which is how the shim tells), and
/// `nccl_job` linked to both. Returns their directory.
pub fn rccl_doubles() -> PathBuf {
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let dir = bin_dir().join("test-doubles-rccl");
    std::fs::create_dir_all(&dir).expect("create test-doubles-rccl dir");
    let src = doubles_src();
    let (cuda_c, nccl_c, job_c, header) = (
        src.join("cuda_double.c"),
        src.join("nccl_double.c"),
        src.join("nccl_job.c"),
        src.join("profiler_v7.h"),
    );
    let (hip, rccl, job) = (
        dir.join("libamdhip64.so"),
        dir.join("librccl.so"),
        dir.join("nccl_job"),
    );
    let dir_s = dir.to_str().expect("utf-8 path");
    if newer(&[&cuda_c], &hip) {
        cc(
            &[
                "-DTESTDOUBLE_HIP",
                "-shared",
                "-fPIC",
                "-Wl,-soname,libamdhip64.so",
            ],
            &cuda_c,
            &hip,
            &["-lpthread"],
        );
    }
    if newer(&[&nccl_c, &header, &hip], &rccl) {
        cc(
            &["-shared", "-fPIC", "-Wl,-soname,librccl.so"],
            &nccl_c,
            &rccl,
            &[
                &format!("-L{dir_s}"),
                "-l:libamdhip64.so",
                "-lpthread",
                "-lrt",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    if newer(&[&job_c, &rccl, &hip], &job) {
        cc(
            &[],
            &job_c,
            &job,
            &[
                &format!("-L{dir_s}"),
                "-l:librccl.so",
                "-l:libamdhip64.so",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    dir
}

/// `tests/doubles/nccl_mpi_job.c` built with a flavour's `mpicc` against the NCCL and CUDA
/// test doubles.
pub fn build_mpi_job(flavour: crate::Flavour) -> PathBuf {
    let dir = doubles();
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let src = doubles_src().join("nccl_mpi_job.c");
    let out = dir.join(format!("nccl_mpi_job-{}", flavour.name()));
    if newer(&[&src, &dir.join("libnccl.so.2")], &out) {
        let d = dir.to_str().expect("utf-8 path");
        compile(
            &flavour.mpi().cc,
            &[],
            &src,
            &out,
            &[
                &format!("-L{d}"),
                "-l:libnccl.so.2",
                "-l:libcuda.so.1",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
    }
    out
}

/// The directory of the real `libnccl.so.2` (`COMMSCOPE_NCCL_LIB_DIR`, else the cache
/// `scripts/setup.sh` fills).
pub fn real_nccl_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("COMMSCOPE_NCCL_LIB_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("COMMSCOPE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/commscope"));
    let d = cache.join("nccl").join(REAL_NCCL_VERSION).join("lib");
    assert!(
        d.join("libnccl.so.2").is_file(),
        "{} is missing: run scripts/setup.sh (it fetches nvidia-nccl-cu12 {REAL_NCCL_VERSION} from PyPI once)",
        d.join("libnccl.so.2").display()
    );
    d
}

/// `tests/c/<name>.c` compiled against the real NCCL (the programs declare what they call, so
/// no NCCL header is needed).
pub fn build_against_real_nccl(name: &str) -> PathBuf {
    build_real(name, name, &[])
}

/// `tests/c/<name>.c` built as a shared library `lib<name>.so` linked against the real
/// `libnccl.so.2` (with `-DNCCL_REAL_LIBRARY`), for a program to load at run time.
pub fn build_library_against_real_nccl(name: &str) -> PathBuf {
    build_real(
        name,
        &format!("lib{name}.so"),
        &["-shared", "-fPIC", "-DNCCL_REAL_LIBRARY"],
    )
}

fn build_real(name: &str, out_name: &str, args: &[&str]) -> PathBuf {
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let lib = real_nccl_dir();
    let src = crate::c_dir().join(format!("{name}.c"));
    let dir = bin_dir().join("c-programs").join("nccl");
    std::fs::create_dir_all(&dir).expect("create build dir");
    let out = dir.join(out_name);
    if newer(&[&src], &out) {
        let l = lib.to_str().expect("utf-8 path");
        cc(
            args,
            &src,
            &out,
            &[
                &format!("-L{l}"),
                "-l:libnccl.so.2",
                &format!("-Wl,-rpath,{l}"),
            ],
        );
    }
    out
}
