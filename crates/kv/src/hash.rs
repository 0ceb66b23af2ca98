//! Chained content hashes of full KV blocks.
//!
//! `h_0 = xxh3_128(root ‖ salt ‖ tokens_0)`, `h_i = xxh3_128(h_{i-1} ‖ tokens_i)`:
//! a block's hash identifies its tokens *and* everything before it, so equal
//! hashes mean equal K/V. xxh3-128 is fast and stable across runs and platforms
//! (unlike `DefaultHasher`), and 128 bits make an accidental collision negligible
//! over the life of a server.
//!
//! The salt enters the first block only, as vLLM's `cache_salt` does: the chain
//! then differs from block 0 on, so two salts never share any block, while a
//! child's hash stays a function of its parent and tokens alone (a KV-event
//! subscriber can check every non-root block without knowing the salt).

use xxhash_rust::xxh3::Xxh3;

/// Content hash of a full block, chained on its parent's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// The hash of one full block given its parent's hash (None for the first block).
/// The salt separates caches that must never share blocks (per tenant, per
/// request `cache_salt`); use 0 when everything may be shared. It only counts for
/// the first block (`parent` None): later blocks inherit it through the chain.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
    let mut h = Xxh3::new();
    match parent {
        Some(p) => h.update(&p.0.to_le_bytes()),
        // A distinct marker for "no parent" so a root block never equals a child
        // whose parent hash happens to be zero.
        None => {
            h.update(b"agentd-root");
            h.update(&salt.to_le_bytes());
        }
    }
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(buf.len() / 4) {
        for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    BlockHash(h.digest128())
}

/// Hashes of every full block of `tokens`, chained from `parent`.
pub fn hash_blocks(
    parent: Option<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    salt: u64,
) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut prev = parent;
    for block in tokens.chunks_exact(block_size) {
        let h = hash_block(prev, block, salt);
        out.push(h);
        prev = Some(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_tokens_and_salt() {
        let a = hash_block(None, &[1, 2, 3, 4], 0);
        assert_eq!(a, hash_block(None, &[1, 2, 3, 4], 0), "stable");
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5], 0));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 4], 7), "salt separates");
        let child = hash_block(Some(a), &[5, 6, 7, 8], 0);
        let other_parent = hash_block(Some(hash_block(None, &[9, 9, 9, 9], 0)), &[5, 6, 7, 8], 0);
        assert_ne!(child, other_parent, "same tokens, different prefix");
    }

    #[test]
    fn salt_enters_the_first_block_and_separates_the_whole_chain() {
        let toks: Vec<u32> = (0..64).collect();
        let a = hash_blocks(None, &toks, 16, 1);
        let b = hash_blocks(None, &toks, 16, 2);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y), "no block shared");
        assert_eq!(a, hash_blocks(None, &toks, 16, 1), "same salt, same chain");
        // A child depends on its parent and tokens only (vLLM: salt in block 0).
        assert_eq!(hash_block(Some(a[0]), &toks[16..32], 9), a[1]);
    }

    #[test]
    fn hash_blocks_ignores_partial_tail() {
        let toks: Vec<u32> = (0..37).collect();
        let hs = hash_blocks(None, &toks, 16, 0);
        assert_eq!(hs.len(), 2);
        assert_eq!(hs[1], hash_block(Some(hs[0]), &toks[16..32], 0));
    }

    const PINNED: u128 = 0xd792fe6a1803e35d2255ec07325fc673;

    #[test]
    fn known_value_is_stable_across_builds() {
        // Pinned so a change of hash function (which would silently invalidate any
        // persisted cache index) is a deliberate decision.
        let h = hash_block(None, &[0, 1, 2, 3], 0);
        assert_eq!(h.0, PINNED);
    }
}
