//! Test data: the bytes of generated samples, folders of them, JPEGs and ustar archives.

use std::path::Path;
#[cfg(feature = "loader")]
use std::sync::Arc;

#[cfg(feature = "loader")]
use lobster_io::Dataset;

/// The bytes of generated sample `i`: its id, then a length that varies with it, so a sample
/// delivered in the wrong place or with the wrong bytes is caught.
pub fn content(i: u32) -> Vec<u8> {
    let len = 100 + (i as usize * 7919) % 3000;
    let mut v = format!("sample {i};").into_bytes();
    v.extend((0..len).map(|k| (k as u32 ^ i) as u8));
    v
}

/// Writes an ImageFolder of `samples` files under `dir`, sample `i` of `content(i)` bytes,
/// spread round-robin over `classes` classes (`c0`, `c1`, ...); file names carry the
/// generator index.
pub fn write_image_folder(
    dir: &Path,
    samples: u32,
    classes: u32,
    content: impl Fn(u32) -> Vec<u8>,
) {
    for i in 0..samples {
        let class = dir.join(format!("c{}", i % classes));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join(format!("{i:06}.jpg")), content(i)).unwrap();
    }
}

/// An ImageFolder of `samples` files of [`content`] spread round-robin over `classes`
/// classes ([`write_image_folder`]), opened.
#[cfg(feature = "loader")]
pub fn make_dataset(dir: &Path, samples: u32, classes: u32) -> Arc<Dataset> {
    write_image_folder(dir, samples, classes, content);
    Arc::new(Dataset::open_image_folder(dir).unwrap())
}

/// A folder of `count` JPEGs spread round-robin over `classes` classes, image `i` a gradient of
/// `size(i)` pixels (so that crops and flips differ between images), opened without a kept
/// table.
#[cfg(feature = "loader")]
pub fn gradient_jpegs(
    dir: &Path,
    count: u16,
    classes: u16,
    size: impl Fn(u16) -> (u16, u16),
    quality: u8,
) -> Arc<Dataset> {
    for i in 0..count {
        let class = dir.join(format!("c{}", i % classes));
        std::fs::create_dir_all(&class).unwrap();
        let (w, h) = size(i);
        let mut rgb = Vec::with_capacity(usize::from(w) * usize::from(h) * 3);
        for y in 0..h {
            for x in 0..w {
                rgb.extend_from_slice(&[(x * 9) as u8, (y * 13) as u8, ((x + y) * 5 + i) as u8]);
            }
        }
        jpeg_encoder::Encoder::new_file(class.join(format!("{i:02}.jpg")), quality)
            .unwrap()
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
    }
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(dir, &options).unwrap())
}

/// A ustar archive of `members` (name, bytes), in order, with its end blocks.
pub fn ustar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(name, bytes) in members {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", bytes.len()).as_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(bytes);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}
