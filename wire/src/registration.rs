//! The registration handshake between a traced process (the shim) and its node agent, over the
//! agent's Unix socket.
//!
//! The shim connects and sends one [`Request`] (256 bytes) with its memfd attached as
//! `SCM_RIGHTS`; the agent checks the peer's credentials (`SO_PEERCRED`: the pid must match),
//! maps the memfd, validates the layout and answers with one [`Reply`] (32 bytes). The
//! connection then stays open: its closing tells the agent the process is gone (the agent
//! confirms with a pidfd), and tells the shim to register again with a restarted agent.

/// Request magic.
pub const REQUEST_MAGIC: [u8; 8] = *b"CSREGSTR";
/// Reply magic.
pub const REPLY_MAGIC: [u8; 8] = *b"CSREGACK";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// Size of a request on the wire.
pub const REQUEST_SIZE: usize = 256;
/// Size of a reply on the wire.
pub const REPLY_SIZE: usize = 32;
/// Where the node agent listens unless told otherwise (`COMMSCOPE_AGENT_SOCKET`, `--socket`).
pub const DEFAULT_SOCKET: &str = "/run/commscope/agent.sock";

/// A registration request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub version: u16,
    /// The shared-memory layout version of the attached memfd.
    pub layout_version: u16,
    pub pid: u32,
    pub rank: i32,
    pub world_size: i32,
    /// Process start time (clock ticks since boot): with the pid, it names the process uniquely.
    pub start_time: u64,
    /// Size of the memfd in bytes.
    pub shm_size: u64,
    pub job: String,
    pub node: String,
    /// `openmpi`, `mpich` or `nccl`.
    pub flavour: String,
}

/// The agent's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Accepted = 0,
    /// The agent does not speak this protocol or layout version.
    UnsupportedVersion = 1,
    /// The request or the memfd is malformed.
    BadRequest = 2,
    /// The sender's credentials do not match the request.
    CredentialsMismatch = 3,
    /// The agent is at its limit of registered processes.
    Refused = 4,
}

/// A registration reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub version: u16,
    pub status: Status,
}

/// Why a message could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than a message.
    Short(usize),
    /// Wrong magic: not a commscope peer.
    BadMagic,
    /// A field holds an impossible value.
    BadField(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Short(n) => write!(f, "registration message too short ({n} bytes)"),
            Error::BadMagic => write!(f, "not a commscope registration message (bad magic)"),
            Error::BadField(what) => write!(f, "invalid registration field `{what}`"),
        }
    }
}

impl std::error::Error for Error {}

fn put_str(b: &mut [u8], s: &str) {
    let n = s.len().min(b.len() - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl Request {
    /// Encodes the request.
    pub fn encode(&self) -> [u8; REQUEST_SIZE] {
        let mut b = [0u8; REQUEST_SIZE];
        b[0..8].copy_from_slice(&REQUEST_MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&self.layout_version.to_le_bytes());
        b[16..20].copy_from_slice(&self.pid.to_le_bytes());
        b[20..24].copy_from_slice(&self.rank.to_le_bytes());
        b[24..28].copy_from_slice(&self.world_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.start_time.to_le_bytes());
        b[40..48].copy_from_slice(&self.shm_size.to_le_bytes());
        put_str(&mut b[48..112], &self.job);
        put_str(&mut b[112..176], &self.node);
        put_str(&mut b[176..192], &self.flavour);
        b
    }

    /// Decodes a request. A request of a newer protocol version decodes as far as this
    /// version's fields go; the caller decides whether to accept the version.
    pub fn decode(b: &[u8]) -> Result<Request, Error> {
        if b.len() < REQUEST_SIZE {
            return Err(Error::Short(b.len()));
        }
        if b[0..8] != REQUEST_MAGIC {
            return Err(Error::BadMagic);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let req = Request {
            version: u16_at(8),
            layout_version: u16_at(10),
            pid: u32_at(16),
            rank: u32_at(20) as i32,
            world_size: u32_at(24) as i32,
            start_time: u64_at(32),
            shm_size: u64_at(40),
            job: get_str(&b[48..112]),
            node: get_str(&b[112..176]),
            flavour: get_str(&b[176..192]),
        };
        if req.pid == 0 {
            return Err(Error::BadField("pid"));
        }
        Ok(req)
    }
}

impl Reply {
    /// Encodes the reply.
    pub fn encode(&self) -> [u8; REPLY_SIZE] {
        let mut b = [0u8; REPLY_SIZE];
        b[0..8].copy_from_slice(&REPLY_MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&(self.status as u16).to_le_bytes());
        b
    }

    /// Decodes a reply.
    pub fn decode(b: &[u8]) -> Result<Reply, Error> {
        if b.len() < REPLY_SIZE {
            return Err(Error::Short(b.len()));
        }
        if b[0..8] != REPLY_MAGIC {
            return Err(Error::BadMagic);
        }
        let status = match u16::from_le_bytes([b[10], b[11]]) {
            0 => Status::Accepted,
            1 => Status::UnsupportedVersion,
            2 => Status::BadRequest,
            3 => Status::CredentialsMismatch,
            4 => Status::Refused,
            _ => return Err(Error::BadField("status")),
        };
        Ok(Reply {
            version: u16::from_le_bytes([b[8], b[9]]),
            status,
        })
    }
}

/// The process start time in clock ticks since boot (`/proc/self/stat` field 22), or 0.
pub fn process_start_time() -> u64 {
    start_time_at(std::path::Path::new("/proc/self/stat"))
}

/// Another process's start time (`<proc_root>/<pid>/stat` field 22), or 0.
pub fn start_time_of(proc_root: &std::path::Path, pid: u32) -> u64 {
    start_time_at(&proc_root.join(pid.to_string()).join("stat"))
}

fn start_time_at(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|stat| stat_fields(&stat)?.get(19)?.parse().ok())
        .unwrap_or(0)
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which is in parentheses and
/// may itself contain spaces and parentheses): `[0]` is field 3 (the state), `[17]` field 20
/// (`num_threads`), `[19]` field 22 (the start time).
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_reply_round_trip() {
        let r = Request {
            version: PROTOCOL_VERSION,
            layout_version: 1,
            pid: 77,
            rank: 5,
            world_size: 8,
            start_time: 1234,
            shm_size: 8 << 20,
            job: "job-x".into(),
            node: "gpu-12".into(),
            flavour: "openmpi".into(),
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let a = Reply {
            version: PROTOCOL_VERSION,
            status: Status::Accepted,
        };
        assert_eq!(Reply::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn garbage_is_rejected() {
        assert_eq!(Request::decode(b"short"), Err(Error::Short(5)));
        assert_eq!(Request::decode(&[7u8; REQUEST_SIZE]), Err(Error::BadMagic));
        let mut b = Reply {
            version: 1,
            status: Status::Refused,
        }
        .encode();
        b[10] = 77;
        assert_eq!(Reply::decode(&b), Err(Error::BadField("status")));
    }
}
