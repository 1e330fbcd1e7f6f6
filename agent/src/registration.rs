//! The agent's side of the registration handshake (see `commscope_wire::registration`).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use commscope_wire::registration::{PROTOCOL_VERSION, REQUEST_SIZE, Reply, Request, Status};
use commscope_wire::shm::LAYOUT_VERSION;

use crate::region::Region;

/// Why a registration was refused.
#[derive(Debug)]
pub enum Error {
    /// Socket I/O failed.
    Io(std::io::Error),
    /// The peer sent something that is not a registration.
    Malformed(String),
    /// The peer's credentials do not match its request.
    Credentials { claimed: u32, actual: i32 },
    /// The peer speaks a newer protocol or layout.
    Version { protocol: u16, layout: u16 },
    /// The memfd could not be mapped or is not a valid region.
    Region(crate::region::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "registration I/O failed: {e}"),
            Error::Malformed(why) => write!(f, "malformed registration: {why}"),
            Error::Credentials { claimed, actual } => {
                write!(
                    f,
                    "registration claims pid {claimed} but comes from pid {actual}"
                )
            }
            Error::Version { protocol, layout } => write!(
                f,
                "registration uses protocol {protocol} / layout {layout}; this agent speaks protocol {PROTOCOL_VERSION} / layout {LAYOUT_VERSION} (the shim and agent come from different commscope versions: deploy matching ones)"
            ),
            Error::Region(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// An accepted registration.
#[derive(Debug)]
pub struct Registered {
    pub request: Request,
    pub region: Region,
    /// The connection: its closing means the process is gone (or restarting its link).
    pub stream: UnixStream,
    /// For a process the agent records itself ([`crate::zerotouch`]): set once its writer has
    /// written the last of its records, after the process ended. The exit batch waits for it
    /// (its records must come before the exit). None for processes with the preload.
    pub writer_done: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Handles one connection: reads the request and its memfd, checks it, maps it, answers.
/// Every refusal is answered with a status before the error is returned.
pub fn handle(stream: UnixStream) -> Result<Registered, Error> {
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(Error::Io)?;
    let (bytes, fd) = recv_with_fd(&stream).map_err(Error::Io)?;
    let refuse = |stream: &UnixStream, status: Status| {
        let mut s = stream;
        let _ = s.write_all(
            &Reply {
                version: PROTOCOL_VERSION,
                status,
            }
            .encode(),
        );
    };
    let request = match Request::decode(&bytes) {
        Ok(r) => r,
        Err(e) => {
            refuse(&stream, Status::BadRequest);
            return Err(Error::Malformed(e.to_string()));
        }
    };
    // Only the current layout is mapped: an older or newer shim's region would be misread.
    if request.version != PROTOCOL_VERSION || u32::from(request.layout_version) != LAYOUT_VERSION {
        refuse(&stream, Status::UnsupportedVersion);
        return Err(Error::Version {
            protocol: request.version,
            layout: request.layout_version,
        });
    }
    let actual = peer_pid(&stream).map_err(Error::Io)?;
    if actual != request.pid as i32 {
        refuse(&stream, Status::CredentialsMismatch);
        return Err(Error::Credentials {
            claimed: request.pid,
            actual,
        });
    }
    let Some(fd) = fd else {
        refuse(&stream, Status::BadRequest);
        return Err(Error::Malformed("no memfd attached".into()));
    };
    let region = match Region::map(fd) {
        Ok(r) => r,
        Err(e) => {
            refuse(&stream, Status::BadRequest);
            return Err(Error::Region(e));
        }
    };
    (&stream)
        .write_all(
            &Reply {
                version: PROTOCOL_VERSION,
                status: Status::Accepted,
            }
            .encode(),
        )
        .map_err(Error::Io)?;
    Ok(Registered {
        request,
        region,
        stream,
        writer_done: None,
    })
}

fn peer_pid(s: &UnixStream) -> std::io::Result<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED into a ucred of the stated length.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.pid)
}

/// Receives one message of up to [`REQUEST_SIZE`] bytes and at most one fd.
fn recv_with_fd(s: &UnixStream) -> std::io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; REQUEST_SIZE];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32 * 4) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: all-zero msghdr is valid before we fill it.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: a valid msghdr with buffers that outlive the call; MSG_CMSG_CLOEXEC for fds.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let got = n as usize;
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<i32>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    // Keep the first; extra fds are closed when dropped.
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // A stream may deliver the request in pieces: read the rest (EOF leaves it short).
    let mut have = got;
    while have > 0 && have < buf.len() {
        match std::io::Read::read(&mut &*s, &mut buf[have..]) {
            Ok(0) => break,
            Ok(k) => have += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(have);
    Ok((buf, fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused_with_a_status() {
        let (a, b) = UnixStream::pair().expect("pair");
        (&a).write_all(b"hello, not a registration").expect("write");
        a.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let err = handle(b).expect_err("garbage");
        assert!(err.to_string().contains("malformed"), "{err}");
        let mut reply = [0u8; commscope_wire::registration::REPLY_SIZE];
        std::io::Read::read_exact(&mut &a, &mut reply).expect("reply");
        assert_eq!(
            Reply::decode(&reply).map(|r| r.status),
            Ok(Status::BadRequest)
        );
    }

    #[test]
    fn a_lie_about_the_pid_is_refused() {
        let (a, b) = UnixStream::pair().expect("pair");
        let req = Request {
            version: PROTOCOL_VERSION,
            layout_version: LAYOUT_VERSION as u16,
            pid: 1,
            rank: 0,
            world_size: 1,
            start_time: 0,
            shm_size: 0,
            job: "j".into(),
            node: "n".into(),
            flavour: "mpich".into(),
        };
        (&a).write_all(&req.encode()).expect("write");
        let err = handle(b).expect_err("pid mismatch");
        assert!(
            matches!(err, Error::Credentials { claimed: 1, .. }),
            "{err}"
        );
    }
}
