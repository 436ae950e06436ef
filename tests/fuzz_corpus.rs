//! Replays the fuzz inputs through the fuzz targets in `floe_tests::fuzzing`:
//! `fuzz/seeds/<target>/*` (hand-written seeds and every crash input, committed) and,
//! when present locally, `fuzz/corpus/<target>/*` (what `scripts/fuzz.sh` kept;
//! git-ignored). Each must run clean. Quick: no fuzzing here, only the stored inputs.

use std::path::Path;

use floe_tests::fuzzing::TARGETS;
use floe_tests::repo_root;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn stored_fuzz_inputs_run_clean() {
    let mut total = 0;
    for (name, target) in TARGETS {
        let mut n = 0;
        for kind in ["seeds", "corpus"] {
            for file in inputs(&repo_root().join("fuzz").join(kind).join(name)) {
                let data = std::fs::read(&file).expect("corpus file");
                target(&data);
                n += 1;
            }
        }
        assert!(n > 0, "no stored inputs for fuzz target {name}");
        total += n;
    }
    eprintln!("{total} stored fuzz inputs replayed");
}
