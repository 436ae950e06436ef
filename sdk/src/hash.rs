//! Hashing done by the agent in native code.
//!
//! SHA-256 compiled to WebAssembly runs without the CPU's SHA instructions and takes
//! thousands of WebAssembly instructions per hashed value, more than the rest of a
//! typical plugin's work on a record. So the agent offers it as a host call (since
//! contract 0.2.1) and hashes in native code. Natively (in tests) the same digest comes
//! from the `sha2` crate.
//!
//! ```
//! let digest = floe_sdk::hash::sha256(b"abc");
//! assert_eq!(floe_sdk::hash::hex(&digest)[..8], *"ba7816bf");
//! let mut quoted = [b'"'; 66];
//! floe_sdk::hash::hex_into(&digest, (&mut quoted[1..65]).try_into().unwrap());
//! assert_eq!(&quoted[..9], b"\"ba7816bf");
//! assert_eq!(floe_sdk::hash::sha256_parts(&[b"a", b"bc"]), digest);
//! ```

/// Parts up to this many bytes in all are joined on the stack before the host call.
const STACK_BYTES: usize = 256;

/// The SHA-256 digest of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    digest(data)
}

/// The SHA-256 digest of `parts` one after the other, as if they were one slice (a
/// salt and a value, say).
pub fn sha256_parts(parts: &[&[u8]]) -> [u8; 32] {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len <= STACK_BYTES {
        let mut joined = [0u8; STACK_BYTES];
        let mut at = 0;
        for part in parts {
            joined[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        digest(&joined[..len])
    } else {
        digest(&parts.concat())
    }
}

/// `digest` as lowercase hexadecimal.
pub fn hex(digest: &[u8; 32]) -> String {
    let mut out = [0u8; 64];
    hex_into(digest, &mut out);
    out.iter().map(|&b| char::from(b)).collect()
}

/// Writes `digest` as lowercase hexadecimal ASCII into `out`, without allocating (for
/// code that hashes every record).
pub fn hex_into(digest: &[u8; 32], out: &mut [u8; 64]) {
    // Four bytes to eight digits at a time in one 64-bit word, with no table lookup
    // per digit: this runs for every hashed value, inside WebAssembly.
    for (eight, four) in out.chunks_exact_mut(8).zip(digest.chunks_exact(4)) {
        let four = u32::from_le_bytes(four.try_into().expect("four bytes"));
        eight.copy_from_slice(&hex_word(four).to_le_bytes());
    }
}

/// The eight hexadecimal digits of the bytes of `word` (little-endian: its first byte
/// first), as ASCII in a little-endian word.
fn hex_word(word: u32) -> u64 {
    const LOW: u64 = 0x0f0f_0f0f_0f0f_0f0f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Byte i of the word to bits 16i..16i+8, then its high nibble to byte 2i and its
    // low nibble to byte 2i + 1.
    let w = u64::from(word);
    let w = (w | (w << 16)) & 0x0000_ffff_0000_ffff;
    let w = (w | (w << 8)) & 0x00ff_00ff_00ff_00ff;
    let nibbles = ((w >> 4) | (w << 8)) & LOW;
    // '0' + n, and 39 more for the letters (n + 6 carries into bit 4 when n > 9).
    let letters = ((nibbles + 6 * ONES) >> 4) & ONES;
    nibbles + 0x30 * ONES + letters * 39
}

#[cfg(target_arch = "wasm32")]
fn digest(data: &[u8]) -> [u8; 32] {
    let (a, b, c, d) = crate::__export::bindings::floe_plugin::transform::host::sha256(data);
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(8).zip([a, b, c, d]) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(not(target_arch = "wasm32"))]
fn digest(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_the_standard_vectors() {
        // FIPS 180-2 examples: one block, two blocks, and the empty message.
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn hex_digits_match_a_table_for_every_byte() {
        for b in 0..=255u8 {
            let digest: [u8; 32] =
                std::array::from_fn(|i| b.wrapping_add((i as u8).wrapping_mul(37)));
            let mut out = [0u8; 64];
            hex_into(&digest, &mut out);
            let expected: String = digest.iter().map(|d| format!("{d:02x}")).collect();
            assert_eq!(std::str::from_utf8(&out).unwrap(), expected);
        }
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        let long = vec![b'x'; STACK_BYTES + 7];
        for parts in [
            vec![&b"pepper"[..], b"user-1"],
            vec![&b""[..], b""],
            vec![&long[..10], &long[10..]],
            vec![&long[..]],
        ] {
            assert_eq!(sha256_parts(&parts), sha256(&parts.concat()));
        }
    }
}
