//! A mapped shared-memory region of a traced process.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;

use commscope_wire::shm::{LayoutError, Shm};

/// Why a region could not be mapped.
#[derive(Debug)]
pub enum Error {
    /// A system call failed.
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The process has no commscope region.
    NotTraced { pid: u32 },
    /// The region is not usable.
    Layout(LayoutError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { what, source } => write!(f, "failed to {what}: {source}"),
            Error::NotTraced { pid } => write!(
                f,
                "process {pid} has no commscope ring (not traced, or not yet in MPI_Init)"
            ),
            Error::Layout(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Layout(e) => Some(e),
            Error::NotTraced { .. } => None,
        }
    }
}

/// A mapping of a region; unmapped on drop.
#[derive(Debug)]
pub struct Region {
    shm: Shm,
    base: NonNull<u8>,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: the mapping is process-wide memory accessed only through `Shm`'s atomics.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps a region from its memfd (read-write: consumers advance their cursors).
    pub fn map(fd: OwnedFd) -> Result<Region, Error> {
        let mut st: libc::stat = zeroed_stat();
        // SAFETY: fstat on an open fd with a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::Io {
                what: "stat the ring".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let len = st.st_size as usize;
        if len == 0 {
            return Err(Error::Layout(LayoutError::TooSmall {
                have: 0,
                need: commscope_wire::shm::HEADER_SIZE,
            }));
        }
        // SAFETY: mapping `len` bytes of the fd, shared.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Io {
                what: "map the ring".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p as *mut u8).ok_or_else(|| Error::Io {
            what: "map the ring".into(),
            source: std::io::Error::other("null mapping"),
        })?;
        // SAFETY: the mapping is page-aligned, `len` bytes, and lives as long as the Region,
        // which owns the Shm view.
        match unsafe { Shm::attach(base, len) } {
            Ok(shm) => Ok(Region {
                shm,
                base,
                len,
                _fd: fd,
            }),
            Err(e) => {
                // SAFETY: unmapping what we mapped.
                unsafe { libc::munmap(p, len) };
                Err(Error::Layout(e))
            }
        }
    }

    /// Maps the region of a running process by finding its memfd in `/proc/<pid>/fd`.
    pub fn of_process(pid: u32) -> Result<Region, Error> {
        let dir = PathBuf::from(format!("/proc/{pid}/fd"));
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            what: format!("list {}", dir.display()),
            source,
        })?;
        for e in entries.flatten() {
            let Ok(target) = std::fs::read_link(e.path()) else {
                continue;
            };
            if !target
                .to_string_lossy()
                .starts_with("/memfd:commscope-ring")
            {
                continue;
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(e.path())
                .map_err(|source| Error::Io {
                    what: format!("open {}", e.path().display()),
                    source,
                })?;
            return Region::map(file.into());
        }
        Err(Error::NotTraced { pid })
    }

    /// The view.
    pub fn shm(&self) -> &Shm {
        &self.shm
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; the Shm view dies with us.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
