//! Hashing done by the agent in native code.
//!
//! SHA-256 compiled to WebAssembly runs without the CPU's SHA instructions: in the
//! `redact` plugin it was half of the WebAssembly instructions run per record (16,077
//! with it, 7,936 through the agent). So the agent offers it as a host call (contract
//! 0.2.1). Natively (in tests) the same digest comes from the `sha2` crate.
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
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
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
