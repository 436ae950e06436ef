//! `contract-0-2-0`: a test-only plugin built against `floe-plugin:transform@0.2.0` (a
//! copy of its WIT is in `wit/`), the contract of floe-sdk 0.2.0, before the agent
//! offered `sha256`. It reads the batch buffer itself, as floe-sdk 0.2.0 did: it
//! keeps records at even offsets unchanged, drops the others, and logs once per batch.
//! The agent must keep loading plugins of an earlier patch version of its contract.
//! Not shipped.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        world: "transform",
        path: "wit/transform-0.2.0.wit",
    });

    use floe_plugin::transform::host;

    struct Contract020;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    impl exports::floe_plugin::transform::plugin::Guest for Contract020 {
        fn init(_config: String) -> Result<(), String> {
            Ok(())
        }

        fn process(batch: Vec<u8>) -> Vec<u8> {
            let records = u32_at(&batch, 0);
            let mut at = 8;
            for _ in 0..u32_at(&batch, 4) {
                at += 4 + u32_at(&batch, at) as usize;
            }
            let mut out = records.to_le_bytes().to_vec();
            for _ in 0..records {
                let value_len = u32_at(&batch, at) as usize;
                let key_len = match u32_at(&batch, at + 4) {
                    u32::MAX => 0,
                    n => n as usize,
                };
                let offset = i64::from_le_bytes(batch[at + 16..at + 24].try_into().unwrap());
                at += 32 + value_len + key_len;
                if offset % 2 == 0 {
                    out.push(0); // unchanged
                    out.extend_from_slice(&u32::MAX.to_le_bytes()); // no route
                } else {
                    out.push(1); // dropped
                }
            }
            host::log(
                host::Level::Info,
                &format!("contract 0.2.0 plugin: {records} records"),
            );
            out
        }
    }

    export!(Contract020);
}
