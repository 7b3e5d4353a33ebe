//! Datasets: an ImageFolder directory, opened once with every sample's size recorded.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Error;

/// What the loader knows of one sample before reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    /// Stable id: the index in (class name, file name) order.
    pub id: u32,
    /// The class index: classes sorted by name.
    pub label: u32,
    /// The file holding the sample.
    pub path: Arc<Path>,
    /// The file's size when the dataset was opened.
    pub size_bytes: u64,
}

/// An ImageFolder dataset: `root/<class>/<file>`, like torchvision's `ImageFolder`.
///
/// Classes are the sub-directories of `root` sorted by name, and their indices are the
/// labels; files within a class are sorted by name. Regular files directly under `root` are
/// not samples (as in torchvision). Every entry inside a class directory must be a readable
/// regular file (symlinks to one are fine): anything else is an error at open, so that a bad
/// entry is found before training rather than mid-epoch.
#[derive(Clone, Debug)]
pub struct Dataset {
    root: PathBuf,
    classes: Vec<String>,
    samples: Vec<SampleMeta>,
}

impl Dataset {
    /// Opens an ImageFolder directory and records every sample's size.
    pub fn open_image_folder(root: impl AsRef<Path>) -> Result<Self, Error> {
        let root = root.as_ref().to_path_buf();
        let entries = fs::read_dir(&root).map_err(|e| Error::dataset(&root, e))?;
        let mut class_dirs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::dataset(&root, e))?;
            let path = entry.path();
            let meta = fs::metadata(&path).map_err(|e| Error::dataset(&path, e))?;
            if meta.is_dir() {
                let name = entry.file_name().into_string().map_err(|name| {
                    Error::dataset(&path, format!("class name {name:?} is not valid UTF-8"))
                })?;
                class_dirs.push((name, path));
            }
        }
        class_dirs.sort();
        if class_dirs.is_empty() {
            return Err(Error::dataset(
                &root,
                "no class directories (expected root/<class>/<file>)",
            ));
        }
        let mut samples = Vec::new();
        let mut classes = Vec::with_capacity(class_dirs.len());
        for (label, (name, dir)) in class_dirs.into_iter().enumerate() {
            let mut files = Vec::new();
            for entry in fs::read_dir(&dir).map_err(|e| Error::dataset(&dir, e))? {
                let path = entry.map_err(|e| Error::dataset(&dir, e))?.path();
                let meta = fs::metadata(&path).map_err(|e| Error::dataset(&path, e))?;
                if !meta.is_file() {
                    return Err(Error::dataset(&path, "not a regular file"));
                }
                // Opening proves the entry is readable now rather than mid-epoch.
                fs::File::open(&path).map_err(|e| Error::dataset(&path, e))?;
                files.push((path, meta.len()));
            }
            if files.is_empty() {
                return Err(Error::dataset(&dir, format!("class {name:?} has no files")));
            }
            files.sort();
            for (path, size_bytes) in files {
                let id = u32::try_from(samples.len())
                    .map_err(|_| Error::dataset(&root, "more than 2^32 samples"))?;
                samples.push(SampleMeta {
                    id,
                    label: label as u32,
                    path: Arc::from(path),
                    size_bytes,
                });
            }
            classes.push(name);
        }
        Ok(Self {
            root,
            classes,
            samples,
        })
    }

    /// The directory the dataset was opened from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Class names; a sample's label indexes this.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every sample, indexed by id.
    pub fn samples(&self) -> &[SampleMeta] {
        &self.samples
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the dataset has no samples (never true for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The largest sample's size (0 for an empty dataset).
    pub fn max_sample_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size_bytes).max().unwrap_or(0)
    }

    /// The sum of all sample sizes.
    pub fn total_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn ids_follow_sorted_classes_then_sorted_files() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("b/2.jpg"), b"xx");
        write(&dir.path().join("b/1.jpg"), b"x");
        write(&dir.path().join("a/9.jpg"), b"xxx");
        write(&dir.path().join("README"), b"not a sample");
        let ds = Dataset::open_image_folder(dir.path()).unwrap();
        assert_eq!(ds.classes(), ["a", "b"]);
        let got: Vec<_> = ds
            .samples()
            .iter()
            .map(|s| {
                (
                    s.id,
                    s.label,
                    s.path.file_name().unwrap().to_str().unwrap().to_owned(),
                    s.size_bytes,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, "9.jpg".into(), 3),
                (1, 1, "1.jpg".into(), 1),
                (2, 1, "2.jpg".into(), 2)
            ]
        );
        assert_eq!(ds.total_bytes(), 6);
    }

    #[test]
    fn an_empty_class_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/1.jpg"), b"x");
        fs::create_dir_all(dir.path().join("empty")).unwrap();
        let err = Dataset::open_image_folder(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty") && err.contains("no files"), "{err}");
    }

    #[test]
    fn a_nested_directory_is_not_a_sample() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/sub/1.jpg"), b"x");
        let err = Dataset::open_image_folder(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sub") && err.contains("not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_root_is_named() {
        let err = Dataset::open_image_folder("/nonexistent/lobster-root")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/lobster-root"), "{err}");
    }
}
