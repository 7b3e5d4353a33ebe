//! The CLI's decoders: real image decoding (lobster-image) with its transforms, none, or a
//! CPU cost per KiB.

use std::fmt;
use std::time::{Duration, Instant};

use lobster_image::{Collator, Transform};
use lobster_io::images::Pixels;
use lobster_io::Batch;

use lobster_io::SampleMeta;
use serde::Serialize;

/// How samples are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decoder {
    /// Real decoding of JPEG and PNG (lobster-image), then `--transform`.
    Jpeg,
    /// No decoding: the bytes are the sample.
    Raw,
    /// A CPU cost per KiB (`--decode-us-per-kb`), checksumming the bytes.
    Synthetic,
}

/// An error of the CLI's decoders.
#[derive(Debug)]
pub struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// What a decoded sample is to the training loop.
#[derive(Debug)]
pub enum Decoded {
    /// A digest of the work, so that nothing is optimised away (little-endian bytes, so a
    /// host can place it in a rank process's arena like any sample).
    Digest([u8; 8]),
    /// A transformed image, collated with its batch.
    Image(Pixels),
}

impl Decoded {
    fn digest(d: u64) -> Self {
        Decoded::Digest(d.to_le_bytes())
    }
}

impl AsRef<[u8]> for Decoded {
    fn as_ref(&self) -> &[u8] {
        match self {
            Decoded::Digest(d) => d,
            Decoded::Image(p) => &p.data,
        }
    }
}

/// How a decoded image is transformed (`--transform`, `--image-size`). Not the library's
/// `Transform` mirrored: its variants carry the side, which `--image-size` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransformArg {
    /// RandomResizedCrop and a horizontal flip, seeded by (seed, epoch, sample id).
    Train,
    /// Resize and CenterCrop.
    Eval,
    /// Decoding only.
    None,
}

impl TransformArg {
    pub fn transform(self, size: u32) -> Transform {
        match self {
            TransformArg::Train => Transform::Train { size },
            TransformArg::Eval => Transform::Eval { size },
            TransformArg::None => Transform::None,
        }
    }
}

/// Decodes one sample of `epoch` (`seed`: the run's, for augmentation).
pub fn decode(
    decoder: Decoder,
    us_per_kb: f64,
    transform: Transform,
    pixels_max: u64,
    (seed, epoch): (u64, u32),
    bytes: &[u8],
    meta: &SampleMeta,
) -> Result<Decoded, DecodeError> {
    match decoder {
        Decoder::Raw => Ok(Decoded::digest(bytes.len() as u64)),
        Decoder::Jpeg => {
            let image = decode_image(bytes, meta, pixels_max)?;
            finish_image(transform, (seed, epoch), (&image).into(), meta)
        }
        Decoder::Synthetic => {
            let budget = Duration::from_secs_f64(us_per_kb * bytes.len() as f64 / 1024.0 / 1e6);
            let started = Instant::now();
            let fold = |seed: u64| {
                bytes.chunks(4096).fold(seed, |d, chunk| {
                    d.wrapping_mul(31).wrapping_add(u64::from(chunk[0]))
                })
            };
            // The sample's value depends on its bytes alone, so runs can be compared batch by
            // batch; the spin on the bytes until the CPU cost is paid stands in for decode and
            // augment.
            let digest = fold(0);
            while started.elapsed() < budget {
                std::hint::black_box(fold(std::hint::black_box(digest)));
            }
            Ok(Decoded::digest(digest))
        }
    }
}

fn image_error(meta: &SampleMeta, e: lobster_image::ImageError) -> DecodeError {
    DecodeError(format!("image of {}: {e}", meta.path.display()))
}

/// The jpeg decoder's first stage: the sample's full-resolution image, refused above
/// `pixels_max` pixels (`--image-pixels-max`).
pub(crate) fn decode_image(
    bytes: &[u8],
    meta: &SampleMeta,
    pixels_max: u64,
) -> Result<lobster_image::Image, DecodeError> {
    lobster_image::decode_within(bytes, pixels_max).map_err(|e| image_error(meta, e))
}

/// The jpeg decoder's second stage: `transform`, or with none a digest of the pixels.
pub(crate) fn finish_image(
    transform: Transform,
    (seed, epoch): (u64, u32),
    image: lobster_image::ImageRef<'_>,
    meta: &SampleMeta,
) -> Result<Decoded, DecodeError> {
    if transform == Transform::None {
        return Ok(Decoded::digest(
            image
                .pixels()
                .iter()
                .step_by(4099)
                .map(|&b| u64::from(b))
                .sum(),
        ));
    }
    lobster_io::images::transform_pixels(transform, seed, epoch, image, meta)
        .map(Decoded::Image)
        .map_err(|e| image_error(meta, e))
}

/// A training thread's use of a batch: transformed images are written into the rank's one
/// `[B, H, W, 3]` buffer (made at the first batch, reused), as a model's input would be.
pub(crate) fn collate(batch: &Batch<Decoded>, collator: &mut Option<Collator>) {
    let mut images = batch.samples.iter().filter_map(|s| match &s.value {
        Decoded::Image(p) => Some((p.height, p.width, &p.data, s.label)),
        Decoded::Digest(d) => {
            std::hint::black_box(d);
            None
        }
    });
    let Some(first) = images.next() else {
        return;
    };
    // The batch as planned (skipped samples included): the first is as long as any.
    let planned = batch.samples.len() + batch.skipped.len();
    let c = match collator {
        Some(c) if c.capacity() >= planned => c,
        slot => slot.insert(Collator::new(planned, first.0, first.1)),
    };
    c.clear();
    for (_, _, pixels, label) in std::iter::once(first).chain(images) {
        // Every image of a run has the transform's size.
        c.push(pixels, label)
            .expect("transformed images are equal in size, and the batch fits");
    }
    std::hint::black_box(c.images());
}
