//! The default dataset of `lobster run`: generated once into the cache directory, reused.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Mean size of the generated default dataset's files, KiB.
const DEFAULT_MEAN_KB: f64 = 110.0;
const DEFAULT_CLASSES: u32 = 10;
const DEFAULT_GEN_SEED: u64 = 0;

/// The generated default dataset of `samples` files, made once and reused.
pub fn default_dataset(samples: u32, quiet: bool) -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("lobster-io");
    let dir = base.join(format!(
        "imagefolder-{samples}-{DEFAULT_CLASSES}-{DEFAULT_MEAN_KB}kb-seed{DEFAULT_GEN_SEED}"
    ));
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(dir);
    }
    if dir.exists() {
        // A generation that did not finish: start over.
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    if !quiet {
        println!(
            "generating the default dataset once into {} ...",
            dir.display()
        );
    }
    crate::gen::generate(
        &dir,
        samples,
        DEFAULT_CLASSES,
        DEFAULT_MEAN_KB,
        DEFAULT_GEN_SEED,
    )?;
    std::fs::write(&done, b"").with_context(|| format!("writing {}", done.display()))?;
    Ok(dir)
}
