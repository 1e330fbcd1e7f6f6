//! Registration with the node agent: hands the memfd over the agent's Unix socket and keeps the
//! connection, registering again whenever the agent restarts.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use commscope_wire::registration::{PROTOCOL_VERSION, REPLY_SIZE, Reply, Request, Status};
use commscope_wire::shm::{Consumer, LAYOUT_VERSION};

use crate::state::Shim;
use crate::util::{self, now_mono};

/// How often to try an agent that is not there.
const RETRY_NS: u64 = 1_000_000_000;

/// The connection to the agent.
#[derive(Debug, Default)]
pub struct Link {
    stream: Option<UnixStream>,
    next_try: u64,
    warned: bool,
    ever_registered: bool,
}

impl Link {
    /// Not connected.
    pub fn new() -> Link {
        Link::default()
    }

    /// Keeps the registration alive: notices a closed connection and reconnects.
    pub fn poll(&mut self, shim: &Shim) {
        if let Some(s) = &self.stream {
            if closed(s) {
                self.stream = None;
                self.next_try = 0;
            } else {
                return;
            }
        }
        let now = now_mono();
        if now < self.next_try {
            return;
        }
        self.next_try = now + RETRY_NS;
        let path = &shim.config.agent_socket;
        if !shim.config.agent_socket_explicit && !path.exists() {
            return;
        }
        match register(shim) {
            Ok(s) => {
                shim.shm.attach_consumer(Consumer::Agent);
                self.stream = Some(s);
                self.warned = false;
                self.ever_registered = true;
            }
            Err(e) => {
                // An agent that has never answered must not hold the trace file back: stop
                // keeping records for it until it does (then it starts at the oldest record still
                // in the ring). Once registered, an agent keeps its records across restarts.
                if !self.ever_registered && shim.shm.is_attached(Consumer::Local) {
                    shim.shm.detach_consumer(Consumer::Agent);
                }
                if shim.config.agent_socket_explicit && !self.warned {
                    util::warn(format_args!(
                        "cannot register with the agent at {}: {e}; retrying every second",
                        path.display()
                    ));
                    self.warned = true;
                }
            }
        }
    }

    /// At shutdown: registers now if the agent's cursor is attached but no registration ever
    /// succeeded (its records would otherwise be lost with the process).
    pub fn last_chance(&mut self, shim: &Shim) {
        if self.ever_registered || !shim.shm.is_attached(Consumer::Agent) {
            return;
        }
        self.next_try = 0;
        self.poll(shim);
    }

    /// Closes the connection (the agent sees the process leave).
    pub fn close(&mut self) {
        self.stream = None;
    }

    /// Whether an agent holds the registration now (and so a mapping of the ring).
    fn connected(&mut self) -> bool {
        match &self.stream {
            Some(s) if !closed(s) => true,
            Some(_) => {
                self.stream = None;
                self.next_try = 0;
                false
            }
            None => false,
        }
    }
}

/// The registration with `commscope run`'s trace keeper (`COMMSCOPE_KEEPER_SOCKET`): it holds
/// the ring and reads nothing while the process runs; when the process ends without writing its
/// trace file out (SIGKILL), it appends what the file lacks. Tried at start, and twice more a
/// second apart; kept open for the process's life.
#[derive(Debug, Default)]
pub struct KeeperLink {
    stream: Option<UnixStream>,
    tries: u8,
    next_try: u64,
}

impl KeeperLink {
    pub fn poll(&mut self, shim: &Shim) {
        let Some(path) = &shim.config.keeper_socket else {
            return;
        };
        if self.stream.is_some() || self.tries >= 3 || now_mono() < self.next_try {
            return;
        }
        self.tries += 1;
        self.next_try = now_mono() + RETRY_NS;
        match register_at(shim, path) {
            Ok(s) => self.stream = Some(s),
            Err(e) if self.tries == 3 => util::warn(format_args!(
                "cannot register with commscope run's trace keeper at {}: {e}; a SIGKILL would lose this process's last records",
                path.display()
            )),
            Err(_) => {}
        }
    }
}

/// At exit, after the last records: the ring lives on only in a mapping of it, and this
/// process is about to drop its own. A live agent holds one (it reads the rest after the exit,
/// and copies what is not yet acknowledged into its spool). An agent that served this process
/// and is gone now (killed, restarting) holds none: wait for it, at most
/// `COMMSCOPE_EXIT_WAIT_MS` (5 s), registering again as soon as it answers — or until its
/// cursor has passed the last record. No agent expected (none ever registered, and none named
/// with `COMMSCOPE_AGENT_SOCKET`), or none attached: no wait.
pub fn hand_over(shim: &Shim) {
    let Some(mut link) = shim
        .exit_link
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    let deadline = now_mono() + shim.config.exit_wait_ms * 1_000_000;
    // Expected: an agent served this process, or was named for it (`COMMSCOPE_AGENT_SOCKET`).
    let expected = link.ever_registered || shim.config.agent_socket_explicit;
    while expected && shim.shm.is_attached(Consumer::Agent) {
        if shim.shm.cursor(Consumer::Agent) >= shim.shm.head() || link.connected() {
            break;
        }
        if now_mono() >= deadline {
            util::warn(format_args!(
                "exiting with records the agent has not taken: no agent came back within {} ms (COMMSCOPE_EXIT_WAIT_MS)",
                shim.config.exit_wait_ms
            ));
            break;
        }
        // Try the socket every 20 ms (a restarting agent binds it within a second).
        link.next_try = 0;
        link.poll(shim);
        if link.connected() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    link.close();
}

fn closed(s: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: peeking one byte into a valid buffer, without blocking.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n == 0 {
        return true;
    }
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR));
    }
    false
}

fn register(shim: &Shim) -> std::io::Result<UnixStream> {
    register_at(shim, &shim.config.agent_socket)
}

/// Registers the ring with whoever listens at `path` (the node agent, or the trace keeper of
/// `commscope run`): the same handshake, the memfd attached.
fn register_at(shim: &Shim, path: &std::path::Path) -> std::io::Result<UnixStream> {
    let s = UnixStream::connect(path)?;
    s.set_write_timeout(Some(Duration::from_secs(1)))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let req = Request {
        version: PROTOCOL_VERSION,
        layout_version: LAYOUT_VERSION as u16,
        pid: shim.pid,
        rank: shim.rank,
        world_size: shim.world_size,
        start_time: shim.start_time,
        shm_size: shim.shm.len() as u64,
        job: shim.job.clone(),
        node: shim.node.clone(),
        flavour: shim.abi.flavour.name().to_owned(),
    };
    send_with_fd(&s, &req.encode(), shim.memfd)?;
    let mut reply = [0u8; REPLY_SIZE];
    (&s).read_exact(&mut reply)?;
    let reply = Reply::decode(&reply)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if reply.status != Status::Accepted {
        return Err(std::io::Error::other(format!(
            "the agent refused the registration ({:?})",
            reply.status
        )));
    }
    Ok(s)
}

/// Sends `bytes` with `fd` attached as `SCM_RIGHTS`.
fn send_with_fd(s: &UnixStream, bytes: &[u8], fd: i32) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` bytes, enough for one cmsg carrying one fd.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut i32, fd);
    }
    // SAFETY: a fully initialized msghdr on a connected socket.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short registration write",
        ));
    }
    Ok(())
}
