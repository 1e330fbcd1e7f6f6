//! Which program goes on which function of a library: the probe plan, resolved against one
//! file's symbols. Pure (no kernel), so the plan for the real libibverbs and libnccl is
//! tested wherever the files are.

use commscope_ebpf_common::{nccl_api, net, verbs_fn};

use super::symbols::{Symbols, first_out_pointer};

/// What a library is, by the functions it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// libibverbs: the control path's exported functions.
    Verbs,
    /// NCCL: its API (exported functions) and its network layer's internal functions.
    Nccl,
}

/// One attachment: a program at a function's entry (a uprobe) or return (a uretprobe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The function as written in the source (`ibv_modify_qp`, `ncclIbIsend`).
    pub function: &'static str,
    /// The symbol it was found as, and its version where the file versions symbols.
    pub symbol: String,
    pub version: Option<String>,
    pub offset: u64,
    /// The program (its name in the object), and whether it is a return probe.
    pub program: &'static str,
    pub ret: bool,
    pub cookie: Option<u64>,
}

/// A library's plan: the targets found, and the functions that were not (a normal condition:
/// a build without a transport, an older library).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub library: Option<Library>,
    pub targets: Vec<Target>,
    pub missing: Vec<String>,
}

/// A verbs target: (function, entry program, return program, cookie).
type VerbsTarget = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<u32>,
);

const VERBS: [VerbsTarget; 8] = [
    ("ibv_create_qp", None, Some("ibv_create_qp_ret"), None),
    (
        "ibv_modify_qp",
        Some("ibv_modify_qp"),
        Some("ibv_modify_qp_ret"),
        None,
    ),
    ("ibv_destroy_qp", Some("ibv_destroy_qp"), None, None),
    (
        "ibv_reg_mr",
        Some("ibv_reg_mr"),
        Some("ibv_mr_ret"),
        Some(verbs_fn::REG_MR),
    ),
    (
        "ibv_reg_mr_iova2",
        Some("ibv_reg_mr"),
        Some("ibv_mr_ret"),
        Some(verbs_fn::REG_MR_IOVA2),
    ),
    (
        "ibv_reg_dmabuf_mr",
        Some("ibv_reg_mr"),
        Some("ibv_mr_ret"),
        Some(verbs_fn::REG_DMABUF_MR),
    ),
    (
        "ibv_dereg_mr",
        Some("ibv_dereg_mr"),
        Some("ibv_mr_ret"),
        None,
    ),
    (
        "ibv_get_async_event",
        Some("ibv_get_async_event"),
        Some("ibv_get_async_event_ret"),
        None,
    ),
];

/// NCCL's network layer: (function, transport, side, kind). Never the `*Test` pollers.
const NCCL: [(&str, u32, u32, NetKind); 8] = [
    ("ncclIbIsend", net::IB, net::SEND, NetKind::Isend),
    ("ncclIbIrecv", net::IB, net::RECV, NetKind::Irecv),
    ("ncclIbConnect", net::IB, net::SEND, NetKind::Connect),
    ("ncclIbAccept", net::IB, net::RECV, NetKind::Connect),
    ("ncclNetSocketIsend", net::SOCKET, net::SEND, NetKind::Isend),
    ("ncclNetSocketIrecv", net::SOCKET, net::RECV, NetKind::Irecv),
    (
        "ncclNetSocketConnect",
        net::SOCKET,
        net::SEND,
        NetKind::Connect,
    ),
    (
        "ncclNetSocketAccept",
        net::SOCKET,
        net::RECV,
        NetKind::Connect,
    ),
];

/// NCCL's API, for processes without the preload: (function, cookie). The cookie holds the
/// operation and its arguments' indexes ([`nccl_api::cookie`]: count, datatype, communicator,
/// root or peer, reduction).
const NCCL_API: [(&str, u64); 11] = {
    use nccl_api::*;
    [
        ("ncclAllReduce", cookie(ALL_REDUCE, 2, 3, 5, NONE, 4)),
        ("ncclBroadcast", cookie(BROADCAST, 2, 3, 5, 4, NONE)),
        // Its own function in NCCL; where it calls `ncclBroadcast`, the nested call is skipped.
        ("ncclBcast", cookie(BROADCAST, 1, 2, 4, 3, NONE)),
        ("ncclReduce", cookie(REDUCE, 2, 3, 6, 5, 4)),
        ("ncclAllGather", cookie(ALL_GATHER, 2, 3, 4, NONE, NONE)),
        (
            "ncclReduceScatter",
            cookie(REDUCE_SCATTER, 2, 3, 5, NONE, 4),
        ),
        ("ncclAlltoAll", cookie(ALL_TO_ALL, 2, 3, 4, NONE, NONE)),
        ("ncclGather", cookie(GATHER, 2, 3, 5, 4, NONE)),
        ("ncclScatter", cookie(SCATTER, 2, 3, 5, 4, NONE)),
        ("ncclSend", cookie(SEND, 1, 2, 4, 3, NONE)),
        ("ncclRecv", cookie(RECV, 1, 2, 4, 3, NONE)),
    ]
};

/// Communicator lifetimes: (function, entry program, return program, cookie).
const NCCL_COMMS: [(&str, &str, Option<&str>, u64); 5] = [
    ("ncclCommInitRank", "nccl_init", Some("nccl_init_ret"), 0),
    (
        "ncclCommInitRankConfig",
        "nccl_init",
        Some("nccl_init_ret"),
        0,
    ),
    (
        "ncclCommDestroy",
        "nccl_comm_end",
        None,
        nccl_api::DESTROY as u64,
    ),
    (
        "ncclCommAbort",
        "nccl_comm_end",
        None,
        nccl_api::ABORT as u64,
    ),
    (
        "ncclCommFinalize",
        "nccl_comm_end",
        None,
        nccl_api::FINALIZE as u64,
    ),
];

/// The NCCL API functions a file must export for its calls to be recorded.
pub const NCCL_API_REQUIRED: &str = "ncclCommInitRank";

#[derive(Clone, Copy, Debug)]
enum NetKind {
    Isend,
    Irecv,
    Connect,
}

/// The plan for one library file's symbols.
pub fn plan(symbols: &Symbols) -> Plan {
    let mut p = Plan::default();
    if symbols.exported("ibv_modify_qp").is_some() {
        p.library = Some(Library::Verbs);
        let verbs = VERBS
            .iter()
            .map(|(f, entry, ret, cookie)| (*f, *entry, *ret, cookie.map(u64::from)));
        plan_exported(symbols, &mut p, verbs);
        return p;
    }
    let api = symbols.exported(NCCL_API_REQUIRED).is_some();
    let network = symbols.function("ncclIbIsend").is_some()
        || symbols.function("ncclNetSocketIsend").is_some();
    if !api && !network {
        return p;
    }
    p.library = Some(Library::Nccl);
    if api {
        plan_api(symbols, &mut p);
    }
    if !network {
        p.missing
            .push("NCCL's network layer (ncclIbIsend, ncclNetSocketIsend)".to_owned());
        return p;
    }
    for (function, transport, side, kind) in NCCL {
        let Some((found, _)) = symbols.function(function) else {
            p.missing.push(function.to_owned());
            continue;
        };
        let mut add = |program: &'static str, ret: bool, cookie: u64| {
            p.targets.push(Target {
                function,
                symbol: found.symbol.clone(),
                version: None,
                offset: found.offset,
                program,
                ret,
                cookie: Some(cookie),
            })
        };
        match kind {
            NetKind::Isend => add("net_isend", false, net::cookie(transport, side, 0)),
            NetKind::Irecv => add("net_irecv", false, net::cookie(transport, side, 0)),
            NetKind::Connect => {
                let Some(out) = first_out_pointer(&found.symbol, function) else {
                    p.missing.push(format!(
                        "{function} (its parameters, {}, are not understood)",
                        found.symbol
                    ));
                    continue;
                };
                let cookie = net::cookie(transport, side, out);
                add("net_connect", false, cookie);
                add("net_connect_ret", true, cookie);
            }
        }
    }
    p
}

/// NCCL's API targets: every collective and point-to-point function at entry and return, the
/// communicator inits at entry and return, their ends at entry.
fn plan_api(symbols: &Symbols, p: &mut Plan) {
    let calls = NCCL_API
        .iter()
        .map(|(f, c)| (*f, Some("nccl_call"), Some("nccl_call_ret"), Some(*c)));
    let comms = NCCL_COMMS
        .iter()
        .map(|(f, entry, ret, c)| (*f, Some(*entry), *ret, Some(*c)));
    plan_exported(symbols, p, calls.chain(comms));
}

/// Targets on exported functions, each at its default version: (function, entry program,
/// return program, cookie). A function the file lacks is listed as missing.
fn plan_exported(
    symbols: &Symbols,
    p: &mut Plan,
    targets: impl Iterator<
        Item = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Option<u64>,
        ),
    >,
) {
    for (function, entry, ret, cookie) in targets {
        let Some(found) = symbols.exported(function) else {
            p.missing.push(function.to_owned());
            continue;
        };
        for (program, is_ret) in [(entry, false), (ret, true)] {
            let Some(program) = program else { continue };
            p.targets.push(Target {
                function,
                symbol: found.symbol.clone(),
                version: found.version.clone(),
                offset: found.offset,
                program,
                ret: is_ret,
                cookie,
            });
        }
    }
}
