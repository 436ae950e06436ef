//! `floe check`'s plugin step: loads every configured plugin and runs its `init` with
//! its `with` table, one line per plugin.

use super::{PluginsConfig, TransformChain, TransformConfig, TransformEngine};
use crate::probe::{Outcome, Steps};

/// Loads and initialises each of a pipeline's plugins (nothing when it has none).
pub fn probe(
    plugins: &PluginsConfig,
    pipeline: &str,
    transforms: &[TransformConfig],
    steps: &mut Steps,
) {
    if transforms.is_empty() {
        return;
    }
    let engine = match TransformEngine::for_transforms(plugins, transforms.len() as u32, transforms)
    {
        Ok(e) => e,
        Err(e) => return steps.report("plugin", Outcome::Fail, e.to_string()),
    };
    for t in transforms {
        let started = std::time::Instant::now();
        match TransformChain::new(pipeline, &engine, std::slice::from_ref(t)) {
            Ok(_) => steps.report(
                "plugin",
                Outcome::Pass,
                format!(
                    "{}: loaded and initialised with its `with` table ({} ms)",
                    t.display_name(),
                    started.elapsed().as_millis()
                ),
            ),
            Err(e) => steps.report("plugin", Outcome::Fail, e.to_string()),
        }
    }
}
