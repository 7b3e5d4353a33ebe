//! Helpers shared by the integration tests.

use std::path::Path;
use std::sync::Arc;

use lobster_io::Dataset;

/// The bytes of generated sample `i`: its id, then a length that varies with it, so a sample
/// delivered in the wrong place or with the wrong bytes is caught.
pub fn content(i: u32) -> Vec<u8> {
    let len = 100 + (i as usize * 7919) % 3000;
    let mut v = format!("sample {i};").into_bytes();
    v.extend((0..len).map(|k| (k as u32 ^ i) as u8));
    v
}

/// An ImageFolder of `samples` files of [`content`] spread round-robin over `classes`
/// classes; file names carry the generator index.
pub fn make_dataset(dir: &Path, samples: u32, classes: u32) -> Arc<Dataset> {
    for i in 0..samples {
        let class = dir.join(format!("c{}", i % classes));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join(format!("{i:06}.bin")), content(i)).unwrap();
    }
    Arc::new(Dataset::open_image_folder(dir).unwrap())
}
