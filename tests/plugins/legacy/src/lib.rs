//! `legacy`: a test-only passthrough plugin built against the previous plugin contract,
//! `floe-plugin:transform@0.1.0` (a copy of its WIT is in `wit/`), the way `floe-sdk`
//! 0.1 built plugins: a list of records in, one outcome with whole JSON objects per
//! record out. The agent refuses this contract; the tests check that it does so with a
//! message saying how to rebuild the plugin. It prints to stdout on every batch, which
//! made an agent of that contract panic under `floe run` ("Cannot start a runtime from
//! within a runtime"). Not shipped.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        world: "transform",
        path: "wit/transform-0.1.0.wit",
    });

    use floe_plugin::transform::types::Output;

    struct Legacy;

    impl Guest for Legacy {
        fn init(_config: String) -> Result<(), String> {
            floe_plugin::transform::host::log(
                floe_plugin::transform::types::Level::Info,
                "legacy plugin initialised",
            );
            Ok(())
        }

        fn process(batch: Vec<Input>) -> Vec<Outcome> {
            // What made an agent running this contract panic under `floe run`.
            println!("legacy plugin got {} records", batch.len());
            batch
                .into_iter()
                .map(|input| {
                    Outcome::Emit(vec![Output {
                        value: input.value,
                        route: None,
                    }])
                })
                .collect()
        }
    }

    export!(Legacy);
}
