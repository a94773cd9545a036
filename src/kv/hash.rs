//! Stable chained block hash for the prefix cache.
//!
//! 64-bit FNV-1a over (parent hash, token ids), finished with a splitmix64
//! avalanche so that nearby inputs spread over the whole table. The value is
//! stable across runs, processes and platforms (explicit little-endian bytes,
//! no random keys), so cache behaviour is reproducible. A hash match alone is
//! never trusted: the pool also compares the stored parent hash and tokens.

/// Parent hash of the first block of every sequence.
pub const ROOT_HASH: u64 = 0x9e37_79b9_7f4a_7c15;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Hash of one full block given its parent's hash (or [`ROOT_HASH`]).
pub fn hash_block(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = FNV_OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    };
    eat(&parent.to_le_bytes());
    eat(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        eat(&t.to_le_bytes());
    }
    splitmix64(h)
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Chain hash of the full blocks of `tokens` (its length a multiple of
/// `block_size`): the prefix cache's key of its last block, [`ROOT_HASH`]
/// for no tokens.
pub fn prefix_hash(tokens: &[u32], block_size: usize) -> u64 {
    tokens
        .chunks_exact(block_size.max(1))
        .fold(ROOT_HASH, hash_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_chained() {
        let a = hash_block(ROOT_HASH, &[1, 2, 3, 4]);
        assert_eq!(a, hash_block(ROOT_HASH, &[1, 2, 3, 4]));
        assert_ne!(a, hash_block(ROOT_HASH, &[1, 2, 3, 5]));
        assert_ne!(a, hash_block(a, &[1, 2, 3, 4]));
        assert_ne!(hash_block(ROOT_HASH, &[]), hash_block(ROOT_HASH, &[0]));
    }
}
