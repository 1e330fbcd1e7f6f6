//! Member offsets of kernel structs from the kernel's BTF (`/sys/kernel/btf/vmlinux`): where
//! `struct tcp_sock` keeps its exact byte counters on the running kernel, so the TCP program
//! reads `bytes_received`/`bytes_acked` instead of summing segment lengths (a coalesced
//! segment's length does not fit the tracepoint's 16-bit field).
//!
//! Only what that needs is parsed: the type section's records, to find one struct by name and
//! read its members' names and bit offsets.

use std::collections::HashMap;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// Byte offsets of `members` in the struct `name`, for those that are whole-byte members.
pub fn member_offsets(
    btf: &[u8],
    name: &str,
    members: &[&str],
) -> Result<HashMap<String, u32>, String> {
    let u16_at = |o: usize| -> Result<u16, String> {
        btf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or_else(|| "BTF is truncated".to_owned())
    };
    let u32_at = |o: usize| -> Result<u32, String> {
        btf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| "BTF is truncated".to_owned())
    };
    if u16_at(0)? != MAGIC {
        return Err("not little-endian BTF".into());
    }
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let str_off = u32_at(16)? as usize;
    let (types, strings) = (hdr_len + type_off, hdr_len + str_off);
    let string = |off: u32| -> &str {
        let start = strings + off as usize;
        let bytes = btf.get(start..).unwrap_or_default();
        let end = bytes.iter().position(|&c| c == 0).unwrap_or(0);
        std::str::from_utf8(&bytes[..end]).unwrap_or("")
    };
    let mut at = types;
    let end = types + type_len;
    while at + 12 <= end {
        let name_off = u32_at(at)?;
        let info = u32_at(at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let extra = match kind {
            1 => 4,                    // INT
            3 => 12,                   // ARRAY
            4 | 5 => 12 * vlen,        // STRUCT, UNION
            6 => 8 * vlen,             // ENUM
            13 => 8 * vlen,            // FUNC_PROTO
            14 => 4,                   // VAR
            15 => 12 * vlen,           // DATASEC
            17 => 4,                   // DECL_TAG
            19 => 12 * vlen,           // ENUM64
            2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
            k => return Err(format!("BTF kind {k} is not understood")),
        };
        if kind == KIND_STRUCT && string(name_off) == name {
            let mut out = HashMap::new();
            for i in 0..vlen {
                let m = at + 12 + i * 12;
                let m_name = string(u32_at(m)?);
                let raw = u32_at(m + 8)?;
                let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                if members.contains(&m_name) && bits % 8 == 0 {
                    out.insert(m_name.to_owned(), bits / 8);
                }
            }
            return Ok(out);
        }
        at += 12 + extra;
    }
    Err(format!("no struct {name} in the kernel's BTF"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with one INT and one struct `s { a @0; b @64 bits; c: bitfield @ 65 }`.
    fn blob(kind_flag: bool) -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0c\0".to_vec();
        let mut types = Vec::new();
        let mut put = |v: u32| types.extend_from_slice(&v.to_le_bytes());
        // [1] int: name "int", kind INT, size 4, encoding.
        put(1);
        put(1 << 24);
        put(4);
        put(32);
        // [2] struct s with 3 members.
        put(5);
        put((KIND_STRUCT << 24) | 3 | (u32::from(kind_flag) << 31));
        put(16);
        for (name, off) in [(7u32, 0u32), (9, 64), (11, 65)] {
            put(name);
            put(1);
            put(off);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(1);
        b.push(0);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn struct_member_offsets_are_read_and_bitfields_left_out() {
        for flag in [false, true] {
            let m = member_offsets(&blob(flag), "s", &["a", "b", "c"]).expect("parse");
            assert_eq!(m.len(), 2);
            assert_eq!((m["a"], m["b"]), (0, 8));
        }
        assert!(member_offsets(&blob(false), "t", &["a"]).is_err());
        assert!(member_offsets(&blob(false)[..30], "s", &["a"]).is_err());
        assert!(member_offsets(b"garbage", "s", &["a"]).is_err());
    }

    #[test]
    fn the_running_kernel_has_tcp_socks_counters() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: this kernel has no BTF");
            return;
        };
        let m =
            member_offsets(&btf, "tcp_sock", &["bytes_received", "bytes_acked"]).expect("tcp_sock");
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m["bytes_received"] > 0 && m["bytes_acked"] > 0);
    }
}
