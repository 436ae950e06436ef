//! A split-block Bloom filter over key digests: 256-bit blocks, eight bits set per key,
//! so a probe touches one cache line (the layout Parquet's filters use).
//!
//! Keys are already uniform 128-bit digests, so no hashing is done here: the high 64
//! bits pick the block and the low 32 bits the eight bits within it.

/// Multipliers that spread the low 32 bits of a key over the eight words of a block.
const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

/// Bytes of one block.
pub const BLOCK_BYTES: usize = 32;

/// A Bloom filter (see the module docs).
#[derive(Debug, Clone)]
pub struct Bloom {
    blocks: Vec<[u32; 8]>,
}

impl Bloom {
    /// A filter for `keys` keys with `bits_per_key` bits each (about 1 % false positives
    /// at 10 bits per key, 2 % at 8).
    pub fn new(keys: u64, bits_per_key: u32) -> Bloom {
        let bits = keys.saturating_mul(u64::from(bits_per_key)).max(256);
        let blocks = bits.div_ceil(256) as usize;
        Bloom {
            blocks: vec![[0; 8]; blocks],
        }
    }

    /// Bytes of memory the filter holds.
    pub fn bytes(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }

    fn locate(&self, key: u128) -> (usize, [u32; 8]) {
        let hi = (key >> 64) as u64;
        let block = ((u128::from(hi) * self.blocks.len() as u128) >> 64) as usize;
        let lo = key as u32;
        let mut mask = [0u32; 8];
        for (m, salt) in mask.iter_mut().zip(SALT) {
            *m = 1 << (lo.wrapping_mul(salt) >> 27);
        }
        (block, mask)
    }

    /// Adds `key`.
    pub fn insert(&mut self, key: u128) {
        let (block, mask) = self.locate(key);
        for (word, m) in self.blocks[block].iter_mut().zip(mask) {
            *word |= m;
        }
    }

    /// False when `key` was certainly never added.
    pub fn may_contain(&self, key: u128) -> bool {
        let (block, mask) = self.locate(key);
        self.blocks[block]
            .iter()
            .zip(mask)
            .all(|(word, m)| word & m != 0)
    }

    /// The filter as bytes (little-endian words).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes());
        for block in &self.blocks {
            for word in block {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        out
    }

    /// A filter read back from [`Bloom::to_bytes`]; `None` if the length is not whole
    /// blocks.
    pub fn from_bytes(bytes: &[u8]) -> Option<Bloom> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(BLOCK_BYTES) {
            return None;
        }
        let blocks = bytes
            .chunks_exact(BLOCK_BYTES)
            .map(|b| {
                let mut block = [0u32; 8];
                for (word, w) in block.iter_mut().zip(b.chunks_exact(4)) {
                    *word = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                }
                block
            })
            .collect();
        Some(Bloom { blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(i: u64) -> u128 {
        twox_hash::XxHash3_128::oneshot(&i.to_le_bytes())
    }

    #[test]
    fn added_keys_are_found_and_few_others_are() {
        let mut bloom = Bloom::new(100_000, 10);
        for i in 0..100_000 {
            bloom.insert(digest(i));
        }
        assert!((0..100_000).all(|i| bloom.may_contain(digest(i))));
        let false_positives = (100_000..200_000)
            .filter(|i| bloom.may_contain(digest(*i)))
            .count();
        // About 1 % at 10 bits per key.
        assert!(false_positives < 2_000, "{false_positives} false positives");
        let back = Bloom::from_bytes(&bloom.to_bytes()).unwrap();
        assert!((0..1_000).all(|i| back.may_contain(digest(i))));
        assert_eq!(back.bytes(), bloom.bytes());
        assert!(Bloom::from_bytes(&[0; 31]).is_none());
    }
}
