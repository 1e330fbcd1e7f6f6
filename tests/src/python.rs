//! Python programs under MPI: mpi4py (PyPI's binary wheel, which `scripts/setup.sh` installs)
//! loads the MPI library itself, privately (`RTLD_LOCAL`), the way Python extension modules do.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Flavour, bin_dir};

/// The mpi4py version the tests are written against (its object methods' MPI calls).
pub const MPI4PY_VERSION: &str = "4.1.2";

/// `tests/py/<name>`.
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(name)
}

/// Panics with what to do unless `python3` has mpi4py of the tested version.
pub fn require_mpi4py() {
    let o = Command::new("python3")
        .args(["-c", "import mpi4py; print(mpi4py.__version__)"])
        .output()
        .expect("run python3");
    let v = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert!(
        o.status.success() && v == MPI4PY_VERSION,
        "python3 lacks mpi4py {MPI4PY_VERSION} (found {v:?}): run scripts/setup.sh\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The first of `names` found in the system's library directories.
fn system_library(names: &[&str]) -> Option<PathBuf> {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ];
    dirs.iter()
        .flat_map(|d| names.iter().map(move |n| Path::new(d).join(n)))
        .find(|p| p.exists())
}

/// The environment that makes mpi4py's wheel load a flavour's library. The wheel's MPICH-ABI
/// module needs `libmpi.so.12`, which Debian ships as `libmpich.so.12`: a directory with that
/// link goes first on the library path.
pub fn mpi4py_env(flavour: Flavour) -> Vec<(String, String)> {
    match flavour {
        Flavour::OpenMpi => {
            let lib = system_library(&["libmpi.so.40"]).expect("Open MPI's libmpi.so.40");
            vec![("MPI4PY_LIBMPI".into(), lib.display().to_string())]
        }
        Flavour::Mpich => {
            let real = system_library(&["libmpich.so.12", "libmpi.so.12"])
                .expect("MPICH's libmpich.so.12");
            let dir = bin_dir().join("mpich-abi");
            std::fs::create_dir_all(&dir).expect("create mpich-abi dir");
            let link = dir.join("libmpi.so.12");
            if std::fs::read_link(&link).ok().as_deref() != Some(real.as_path()) {
                let tmp = dir.join(format!("libmpi.so.12.{}", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&real, &tmp).expect("symlink libmpi.so.12");
                std::fs::rename(&tmp, &link).expect("rename symlink");
            }
            let path = match std::env::var("LD_LIBRARY_PATH") {
                Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
                _ => dir.display().to_string(),
            };
            vec![
                ("LD_LIBRARY_PATH".into(), path),
                ("MPI4PY_LIBMPI".into(), link.display().to_string()),
            ]
        }
    }
}

/// The interpreter `python3` runs (a version manager's shim resolved: launchers start ranks with
/// their own search path).
pub fn interpreter() -> PathBuf {
    let o = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("run python3");
    assert!(o.status.success(), "python3 failed");
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// The launch command for `ranks` copies of `python3 SCRIPT ARGS…`.
pub fn launch(flavour: Flavour, ranks: u32, script: &Path, args: &[&str]) -> Vec<OsString> {
    let mut v = crate::launch(flavour, ranks, &interpreter(), &[]);
    v.push(script.into());
    v.extend(args.iter().map(OsString::from));
    v
}
