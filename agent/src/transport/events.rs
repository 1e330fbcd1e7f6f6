//! Ring-buffer events, decoded from the bytes the programs wrote.

use commscope_ebpf_common::{
    AsyncEvent, ConnEvent, MrEvent, NcclCallEvent, NcclInitEvent, QpEvent, TcpStateEvent, kind,
};

/// One event from the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    TcpState(TcpStateEvent),
    Qp(QpEvent),
    Mr(MrEvent),
    Async(AsyncEvent),
    Conn(ConnEvent),
    /// NCCL API events, for the zero-touch recorder ([`crate::zerotouch`]).
    NcclInit(NcclInitEvent),
    NcclCall(NcclCallEvent),
}

/// `T` from the start of `b`, if `b` holds one.
fn read<T: Copy>(b: &[u8]) -> Option<T> {
    (b.len() >= size_of::<T>()).then(|| {
        // SAFETY: `b` holds at least `size_of::<T>()` bytes, and `T` is one of the `repr(C)`
        // event structs of integers and byte arrays, for which every bit pattern is valid.
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) }
    })
}

/// Decodes one event; `None` for an unknown kind or a short record (counted by the caller).
pub fn decode(b: &[u8]) -> Option<Event> {
    let k = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?);
    match k {
        kind::TCP_STATE => read(b).map(Event::TcpState),
        kind::QP_CREATE | kind::QP_MODIFY | kind::QP_DESTROY => read(b).map(Event::Qp),
        kind::MR_REG | kind::MR_DEREG => read(b).map(Event::Mr),
        kind::ASYNC_EVENT => read(b).map(Event::Async),
        kind::NET_CONN => read(b).map(Event::Conn),
        kind::NCCL_INIT => read(b).map(Event::NcclInit),
        kind::NCCL_CALL => read(b).map(Event::NcclCall),
        _ => None,
    }
}

/// A NUL-padded name from the kernel side.
pub use commscope_wire::record::nul_text as name;

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_ebpf_common::Head;

    fn bytes<T: Copy>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain `repr(C)` value.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn events_decode_by_kind_and_short_or_unknown_ones_do_not() {
        let qp = QpEvent {
            head: Head {
                kind: kind::QP_MODIFY,
                pid: 7,
                ..Head::default()
            },
            qp_num: 0x11,
            state: 3,
            dest_qp_num: 0x22,
            ..QpEvent::default()
        };
        let b = bytes(&qp);
        assert_eq!(decode(&b), Some(Event::Qp(qp)));
        assert_eq!(decode(&b[..b.len() - 1]), None);
        let mut unknown = b.clone();
        unknown[..4].copy_from_slice(&99u32.to_ne_bytes());
        assert_eq!(decode(&unknown), None);
        assert_eq!(decode(&[1, 0]), None);
        assert_eq!(name(b"mlx5_0\0\0\0"), "mlx5_0");
    }
}
