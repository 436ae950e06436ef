//! Hashing done by the agent.
//!
//! Inside WebAssembly a hash runs without the CPU's SHA instructions and costs about a
//! microsecond for a short value; the agent computes it natively for a fraction of that
//! (the `sha256` function of the contract's `host` interface). Natively, in the test
//! harness, the SDK computes the same digest itself.
//!
//! ```
//! let digest = floe_sdk::hash::sha256(&[b"pepper", b"u-42"]);
//! assert_eq!(
//!     floe_sdk::hash::to_hex(&digest),
//!     "d5edbbd3f8a9c935546d328a403d50aff769f7a8dcabe236880002f7fa7730ab"
//! );
//! ```

/// The SHA-256 digest of `parts` one after the other (a salt and a value, say).
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::__export::bindings::floe_plugin::transform::host;
        let digest = match parts {
            [one] => host::sha256(one),
            _ => host::sha256(&parts.concat()),
        };
        let mut out = [0u8; 32];
        // The host always answers 32 bytes; anything else would be a host bug.
        out.copy_from_slice(&digest[..32]);
        out
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        hasher.finalize().into()
    }
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hex: Vec<u8> = bytes
        .iter()
        .flat_map(|b| [HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]])
        .collect();
    String::from_utf8(hex).expect("hex digits are ASCII")
}
