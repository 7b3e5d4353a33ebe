//! The loader state file of `--save-state` and `--resume`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lobster_io::LoaderState;

/// The state in `path`, read through its bound whatever the file is; a missing,
/// unreadable, oversized or damaged file is an error naming it.
pub(crate) fn read(path: &Path) -> Result<LoaderState> {
    LoaderState::read_file(path).with_context(|| format!("--resume {}", path.display()))
}

/// Writes `state` to `path` whole or not at all: a temporary file beside it, synced, then
/// renamed over it, so that a crash mid-write leaves the previous state.
pub(crate) fn write(path: &Path, state: &LoaderState) -> Result<()> {
    let named = || format!("--save-state {}", path.display());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("--save-state {}: not a file name", path.display()))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(state.to_json().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(named)
}

#[cfg(test)]
mod tests {
    use lobster_io::{JobFingerprint, RankPosition, STATE_VERSION};

    use super::*;

    fn state(consumed: u64) -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            job: JobFingerprint {
                samples: 10,
                dataset: "00ff".into(),
                order: "shuffle seed 3".into(),
                batch_size: 2,
                drop_last: false,
                world: 1,
                ranks_per_node: 1,
                node: 0,
            },
            ranks: vec![RankPosition {
                rank: 0,
                epoch: 0,
                iteration: 1,
                epoch_world: 1,
                consumed,
            }],
        }
    }

    #[test]
    fn a_written_state_reads_back_and_replaces_the_old_one_leaving_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write(&path, &state(2)).unwrap();
        write(&path, &state(4)).unwrap();
        assert_eq!(read(&path).unwrap(), state(4));
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1, "{files:?}");
    }

    #[test]
    fn a_missing_or_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nothing.json");
        let e = format!("{:#}", read(&path).unwrap_err());
        assert!(e.contains("nothing.json"), "{e}");
        let damaged = dir.path().join("damaged.json");
        let json = state(2).to_json();
        std::fs::write(&damaged, &json[..json.len() - 5]).unwrap();
        let e = format!("{:#}", read(&damaged).unwrap_err());
        assert!(
            e.contains("damaged.json") && e.contains("unreadable loader state"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            write(&dir.path().join("no/dir/s.json"), &state(2)).unwrap_err()
        );
        assert!(e.contains("--save-state") && e.contains("s.json"), "{e}");
    }
}
