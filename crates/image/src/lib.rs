//! Image samples for lobster-io, with no I/O: decoding (JPEG and PNG, to 8-bit RGB), the
//! transforms training expects (RandomResizedCrop with a horizontal flip, seeded per seed,
//! epoch and sample so a run repeats; Resize and CenterCrop for evaluation), and batches
//! collated into one `[B, H, W, 3]` buffer reused from batch to batch. Decoding refuses an
//! image whose header claims more than a pixel bound ([`PIXELS_MAX_DEFAULT`], or
//! [`decode_within`]'s) before allocating anything of its size.
//!
//! ```
//! use lobster_image::{Collator, Transform, Transformer};
//!
//! // A 4x2 RGB image, as decode would give it.
//! let image = lobster_image::Image::new(4, 2, vec![7u8; 4 * 2 * 3]).unwrap();
//! let mut t = Transformer::new(Transform::Train { size: 3 });
//! let mut pixels = vec![0u8; t.output_bytes(&image)];
//! t.apply(&image, (42, 0, 9), &mut pixels).unwrap();
//! let mut batch = Collator::new(2, 3, 3);
//! batch.push(&pixels, 1).unwrap();
//! batch.push(&pixels, 0).unwrap();
//! assert_eq!((batch.images().len(), batch.labels()), (2 * 3 * 3 * 3, &[1, 0][..]));
//! ```

#![deny(unsafe_code)]

#[cfg(any(test, fuzzing))]
mod check;
mod collate;
mod decode;
mod error;
mod jpeg;
mod region;
mod transform;

pub use collate::Collator;
pub use decode::{
    check_pixels, decode, decode_into, decode_region_into, decode_within, dimensions, Image,
    ImageRef, PIXELS_MAX_DEFAULT, PIXELS_MAX_LIMIT,
};
pub use error::ImageError;
pub use region::{Region, Window, SCALES};
pub use transform::{
    decode_downscaled, downscale, downscaled_scale, downscaled_shape, Transform, Transformer,
};

/// Checker run by the image header fuzz target: arbitrary bytes (or a decode fixture with
/// arbitrary edits) through the header probe and both decoders under a low pixel bound;
/// panics if either panics, if an image decodes past the bound or to other than its size,
/// or if the decoder lets through what the probe found too large.
#[cfg(fuzzing)]
pub fn fuzz_check_header(data: &[u8]) {
    check::check_bytes(data);
}

/// Checker run by the JPEG region fuzz target: arbitrary bytes (or a baseline fixture with
/// arbitrary edits), a region and a scale through the region decoder; panics if it panics,
/// if its output is not the size of the window it returns, if the window does not hold the
/// region, or if the window's pixels differ from the whole image decoded at that scale.
#[cfg(fuzzing)]
pub fn fuzz_check_jpeg_region(data: &[u8]) {
    jpeg::check::check_region(data);
}
