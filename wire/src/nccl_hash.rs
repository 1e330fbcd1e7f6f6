//! NCCL's own communicator id, `commHash` — the value NCCL prints in its logs, RAS reports and
//! Inspector files and passes to profiler plugins — computed the way the loaded NCCL computes it,
//! so that commscope's id for an NCCL communicator is that value (ARCHITECTURE.md, Identity).
//!
//! Two algorithms: NCCL 2.26 and later hash with a two-word accumulator (`eatHash`/`digestHash`
//! in `src/include/bitops.h`); 2.25 and earlier use DJB2a over signed bytes
//! (`src/misc/utils.cc: getHash`), and derive split communicators from a printed string.

/// NCCL's unique id: 128 opaque bytes.
pub type UniqueId = [u8; 128];

/// NCCL's version as `ncclGetVersion` reports it (e.g. 22605 for 2.26.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub i32);

impl Version {
    /// Whether this NCCL hashes with the two-word accumulator (2.26 and later).
    pub fn new_hash(self) -> bool {
        self.0 >= 22600
    }

    /// Whether a split's legacy hash string carries the split counter (2.24 and 2.25).
    fn legacy_split_counts(self) -> bool {
        self.0 >= 22400
    }
}

/// The two-word accumulator of NCCL ≥ 2.26.
#[derive(Clone, Copy, Debug)]
pub struct Acc([u64; 2]);

impl Default for Acc {
    fn default() -> Self {
        Acc([1, 1])
    }
}

impl Acc {
    /// Feeds one field (`eatHash`): its length, then its bytes in little-endian 8-byte words,
    /// the last one zero-padded.
    pub fn eat(&mut self, bytes: &[u8]) -> &mut Self {
        let a = &mut self.0;
        a[0] ^= bytes.len() as u64;
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            let x = u64::from_le_bytes(w);
            a[0] = a[0].wrapping_add(a[1]);
            a[1] ^= a[0];
            a[0] ^= a[0] >> 31;
            a[0] = a[0].wrapping_mul(0x9de6_2bbc_8cef_3ce3);
            a[1] ^= a[1] >> 32;
            a[1] = a[1].wrapping_mul(0x485c_d631_1b59_9e79);
            a[0] = a[0].wrapping_add(x);
        }
        self
    }

    /// The hash (`digestHash`).
    pub fn digest(&self) -> u64 {
        let mut h = self.0[0];
        h ^= h >> 31;
        h = h.wrapping_mul(0xbac3_bd56_2846_de6b);
        h = h.wrapping_add(self.0[1]);
        h ^= h >> 32;
        h.wrapping_mul(0x995a_187a_14e7_b445)
    }
}

/// `getHash` of NCCL ≥ 2.26 over one field.
pub fn get_hash(bytes: &[u8]) -> u64 {
    Acc::default().eat(bytes).digest()
}

/// `getHash` of NCCL ≤ 2.25: DJB2a with each byte sign-extended (C `char` is signed there).
pub fn get_hash_legacy(bytes: &[u8]) -> u64 {
    bytes.iter().fold(5381u64, |r, &c| {
        r.wrapping_mul(33) ^ (c as i8 as i64 as u64)
    })
}

/// What NCCL ≤ 2.25 logs as `commId` at init (`hashUniqueId`) — not its `commHash`.
pub fn hash_unique_id_legacy(id: &UniqueId) -> u64 {
    id.iter().fold(0xdead_beefu64, |mut h, &b| {
        h ^= h >> 32;
        h = h.wrapping_mul(0x8db3_db47_fa29_94ad);
        h.wrapping_add(b as i8 as i64 as u64)
    })
}

/// `commHash` of a communicator made by `ncclCommInitRank[Config]` (or `InitRankScalable`
/// with its first id) from `id`.
pub fn init_comm_hash(version: Version, id: &UniqueId) -> u64 {
    if version.new_hash() {
        get_hash(id)
    } else {
        get_hash_legacy(id)
    }
}

/// `commHash` of a communicator made by `ncclCommSplit` from a parent whose hash is `parent`:
/// `child_count` is the parent's split counter after this split (1 for its first split; every
/// split call on the parent counts, `NCCL_SPLIT_NOCOLOR` included).
pub fn split_comm_hash(version: Version, parent: u64, child_count: i32, color: i32) -> u64 {
    if version.new_hash() {
        Acc::default()
            .eat(&parent.to_le_bytes())
            .eat(&child_count.to_le_bytes())
            .eat(&color.to_le_bytes())
            .digest()
    } else {
        let s = if version.legacy_split_counts() {
            format!("{parent:016x}-{child_count}-{color}")
        } else {
            format!("{parent:016x}-{color}")
        };
        let mut buf = [0u8; 128];
        let n = s.len().min(127);
        buf[..n].copy_from_slice(&s.as_bytes()[..n]);
        get_hash_legacy(&buf)
    }
}

/// `commHash` of a communicator made by `ncclCommShrink` (NCCL ≥ 2.27): the split formula with
/// the counter left at 0 and color 0.
pub fn shrink_comm_hash(parent: u64) -> u64 {
    split_comm_hash(Version(22700), parent, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(from: u8) -> UniqueId {
        std::array::from_fn(|i| from.wrapping_add(i as u8))
    }

    // Vectors from `reference/nccl.md` §2.4, derived from the NCCL source by two independent
    // implementations.
    const NEW: Version = Version(22605);

    #[test]
    fn nccl_2_26_hash_matches_the_reference_vectors() {
        assert_eq!(init_comm_hash(NEW, &[0; 128]), 0xcc97_6ec6_c24b_b53c);
        assert_eq!(init_comm_hash(NEW, &bytes(0x00)), 0x6afe_1cc1_7717_e1f4);
        assert_eq!(init_comm_hash(NEW, &bytes(0x80)), 0x1379_339b_dc3a_fbdc);
        assert_eq!(
            split_comm_hash(NEW, 0x6afe_1cc1_7717_e1f4, 1, 0),
            0x7903_0d07_3b3c_579f
        );
        assert_eq!(
            split_comm_hash(NEW, 0x6afe_1cc1_7717_e1f4, 2, 7),
            0x1cca_1774_4cde_b630
        );
    }

    #[test]
    fn nccl_2_25_and_earlier_hash_matches_the_reference_vectors() {
        let old = Version(22503);
        assert_eq!(init_comm_hash(old, &[0; 128]), 0x9011_6b2e_aa8b_6505);
        assert_eq!(init_comm_hash(old, &bytes(0x00)), 0xbf47_c767_cbdf_3105);
        // Bytes at and above 0x80 are sign-extended: the result differs from unsigned DJB2a.
        assert_eq!(init_comm_hash(old, &bytes(0x80)), 0x3758_fa77_0a67_3905);
        assert_eq!(
            split_comm_hash(Version(22304), 0xbf47_c767_cbdf_3105, 1, 0),
            0xefac_2000_07bc_618e
        );
        assert_eq!(
            split_comm_hash(Version(22405), 0xbf47_c767_cbdf_3105, 1, 0),
            0x0883_6f85_8668_2632
        );
        assert_eq!(hash_unique_id_legacy(&bytes(0x00)), 0x20b4_8553_2cbd_7f67);
    }

    #[test]
    fn the_split_counter_and_color_change_the_id_and_shrink_has_its_own() {
        let p = init_comm_hash(NEW, &bytes(3));
        let a = split_comm_hash(NEW, p, 1, 0);
        assert_ne!(a, split_comm_hash(NEW, p, 2, 0));
        assert_ne!(a, split_comm_hash(NEW, p, 1, 1));
        assert_eq!(shrink_comm_hash(p), split_comm_hash(NEW, p, 0, 0));
        assert_ne!(shrink_comm_hash(p), a);
    }
}
