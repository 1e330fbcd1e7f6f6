//! CRC-32C (Castagnoli), table-driven, dependency-free: guards trace-file blocks.

const fn make_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82f6_3b78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static TABLE: [u32; 256] = make_table();

/// CRC-32C of `data` (the SSE 4.2 instruction where the processor has it: the shim's writer
/// checksums every block it writes).
pub fn crc32c(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the feature was detected at run time.
            return !unsafe { crc32c_sse42(!0, data) };
        }
    }
    !crc32c_table(!0, data)
}

fn crc32c_table(mut c: u32, data: &[u8]) -> u32 {
    for &b in data {
        c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(c: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let mut c = u64::from(c);
    let mut chunks = data.chunks_exact(8);
    for w in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    let mut c = c as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_standard_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(super::crc32c(b""), 0);
    }

    #[test]
    fn hardware_and_table_agree() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 1000] {
            assert_eq!(
                super::crc32c(&data[..len]),
                !super::crc32c_table(!0, &data[..len]),
                "len {len}"
            );
        }
    }
}
