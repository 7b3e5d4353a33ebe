//! Image batches: samples decoded and transformed by lobster-image on the decode threads
//! ([`LoaderBuilder::decode_images`]), then collated per rank into `[B, H, W, 3]` buffers
//! ([`ImageBatches`]) taken from a fixed number of slots, each allocated once and reused.
//!
//! ```no_run
//! use lobster_io::images::{ImageBatches, Pixels, Transform};
//! use lobster_io::{Dataset, LoaderBuilder};
//! use std::sync::Arc;
//!
//! let ds = Arc::new(Dataset::open("/data/imagenet/train")?);
//! let mut loader = LoaderBuilder::<Pixels>::new(ds.clone())
//!     .world(1, 1, 0)
//!     .batch_size(64)
//!     .seed(7)
//!     .decode_images(Transform::Train { size: 224 })
//!     .build()?;
//! let rank = loader.ranks().unwrap().remove(0);
//! for batch in ImageBatches::new(rank, ds, 2) {
//!     let batch = batch?;
//!     let [b, h, w, c] = batch.shape();
//!     // batch.images(): b * h * w * c bytes, contiguous; batch.labels(): b labels.
//!     # let _ = (b, h, w, c);
//! }
//! # Ok::<(), lobster_io::Error>(())
//! ```

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

pub use lobster_image::{
    decode, decode_into, decode_within, dimensions, downscaled_shape, Image, ImageError, ImageRef,
    Transform, PIXELS_MAX_DEFAULT, PIXELS_MAX_LIMIT,
};
use lobster_image::{Collator, Transformer};

use crate::batch::Batch;
use crate::dataset::{Dataset, SampleMeta};
use crate::error::{Cause, Error};
use crate::loader::LoaderBuilder;
use crate::pipeline::Staged;
use crate::recycle::Recycler;

/// A decoded, transformed image: `height` x `width` RGB, 8 bits a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pixels {
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// `height * width * 3` bytes, row-major.
    pub data: Vec<u8>,
}

impl AsRef<[u8]> for Pixels {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

thread_local! {
    /// Each decode thread keeps its resizer's buffers from sample to sample.
    static TRANSFORMER: RefCell<Option<Transformer>> = const { RefCell::new(None) };
    /// And the image it decodes before a transform, reused unless it grew past
    /// [`SCRATCH_KEPT_BYTES_MAX`].
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Transformed images' buffers, given back once collated into their batch and taken by the
/// decode threads for the next: up to 1024 of them and 256 MiB (at 224 x 224, 1024 images
/// are 147 MiB).
static OUTPUTS: Recycler = Recycler::new(1024, 256 << 20);

/// Largest decode buffer a thread keeps between samples: a 16 MiB image is 5.6 megapixels,
/// above ImageNet's photographs; a larger one's buffer is freed after its sample.
const SCRATCH_KEPT_BYTES_MAX: usize = 16 << 20;

/// Decodes a JPEG or PNG sample to RGB and applies `transform`, seeded by (`seed`,
/// `epoch`, the sample's id) so that a run repeats exactly, decoding only what the
/// transform keeps ([`Decoding::Region`]).
///
/// # Errors
/// A format other than JPEG or PNG, a truncated or corrupt image, or one of more than
/// [`lobster_image::PIXELS_MAX_DEFAULT`] pixels.
pub fn decode_pixels(
    transform: Transform,
    seed: u64,
    epoch: u32,
    bytes: &[u8],
    meta: &SampleMeta,
) -> Result<Pixels, lobster_image::ImageError> {
    decode_pixels_within(
        transform,
        (seed, epoch, meta),
        bytes,
        PIXELS_MAX_DEFAULT,
        false,
    )
}

/// [`decode_pixels`] under a pixel bound. With a transform, decodes only the part of the
/// image it keeps, at the coarsest scale that keeps the output size
/// ([`Transformer::decode_apply`]), unless `whole_image`, into the thread's buffer, kept
/// from sample to sample; with none, into the output itself.
fn decode_pixels_within(
    transform: Transform,
    (seed, epoch, meta): (u64, u32, &SampleMeta),
    bytes: &[u8],
    pixels_max: u64,
    whole_image: bool,
) -> Result<Pixels, lobster_image::ImageError> {
    if transform == Transform::None {
        let mut data = Vec::new();
        let (width, height) = decode_into(bytes, pixels_max, &mut data, 0)?;
        return Ok(Pixels {
            width,
            height,
            data,
        });
    }
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let made = if whole_image {
            decode_into(bytes, pixels_max, &mut scratch, 0).and_then(|(w, h)| {
                transform_pixels(transform, seed, epoch, ImageRef::new(w, h, &scratch)?, meta)
            })
        } else {
            with_transformer(transform, |t| {
                let mut data = OUTPUTS.take(output_bytes(transform));
                let key = (seed, epoch, meta.id);
                let (width, height) =
                    t.decode_apply(bytes, pixels_max, key, &mut scratch, &mut data)?;
                Ok(Pixels {
                    width,
                    height,
                    data,
                })
            })
        };
        if scratch.capacity() > SCRATCH_KEPT_BYTES_MAX {
            *scratch = Vec::new();
        }
        made
    })
}

/// Bytes of an image `transform` makes: 0 where it keeps the image's own size.
fn output_bytes(transform: Transform) -> usize {
    match transform {
        Transform::Train { size } | Transform::Eval { size } => size as usize * size as usize * 3,
        Transform::None => 0,
    }
}

/// Runs `f` with this thread's transformer for `transform`.
fn with_transformer<R>(transform: Transform, f: impl FnOnce(&mut Transformer) -> R) -> R {
    TRANSFORMER.with(|t| {
        let mut t = t.borrow_mut();
        let t = match &mut *t {
            Some(t) if t.transform() == transform => t,
            slot => slot.insert(Transformer::new(transform)),
        };
        f(t)
    })
}

/// Applies `transform` to a decoded image, seeded as [`decode_pixels`] seeds it: the second
/// half of [`decode_pixels`], which a cached decoded image runs alone.
///
/// # Errors
/// The resizer's failure.
pub fn transform_pixels(
    transform: Transform,
    seed: u64,
    epoch: u32,
    image: ImageRef<'_>,
    meta: &SampleMeta,
) -> Result<Pixels, lobster_image::ImageError> {
    if transform == Transform::None {
        return Ok(Pixels {
            width: image.width(),
            height: image.height(),
            data: image.pixels().to_vec(),
        });
    }
    with_transformer(transform, |t| {
        let (width, height) = t.output_shape(image);
        let mut data = OUTPUTS.take(t.output_bytes(image));
        data.resize(t.output_bytes(image), 0);
        t.apply(image, (seed, epoch, meta.id), &mut data)?;
        Ok(Pixels {
            width,
            height,
            data,
        })
    })
}

/// An image error as a decode's cause, naming the sample's key.
fn image_cause(meta: &SampleMeta, e: lobster_image::ImageError) -> Cause {
    Cause::from(Box::<dyn std::error::Error + Send + Sync>::from(format!(
        "image {:?}: {e}",
        meta.key()
    )))
}

/// How much of each image a transform decodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Decoding {
    /// Every image whole, then transformed: the same pixels whichever forms the cache keeps
    /// and across a resume (the default).
    #[default]
    Whole,
    /// Only the part of the image the crop keeps, at the coarsest DCT scale that still
    /// gives the output size over it ([`lobster_image::Transformer::decode_apply`]): the
    /// pixels are within a stated tolerance of a whole decode's (see lobster-image's region
    /// tests) and the same from run to run; where the cache keeps decoded images, a sample
    /// it serves decoded (transformed from its whole image) differs within that tolerance
    /// from the same sample decoded by region, so a resume, whose cache starts empty, may
    /// serve it otherwise and give other pixels within it.
    Region,
}

impl LoaderBuilder<Pixels> {
    /// Decodes samples as images, `transform` seeded by the run's shuffle seed (0 for
    /// other orders), the epoch and the sample id, each image whole ([`Decoding::Whole`]).
    /// The cache may keep decoded images ([`LoaderBuilder::cache_forms`]; auto by default):
    /// a hit on one runs only the transform, and the pixels are the same either way. An
    /// image whose header claims more than [`LoaderBuilder::image_pixels_max`] pixels
    /// fails, naming its size and the bound, before it is decoded.
    pub fn decode_images(self, transform: Transform) -> Self {
        self.decode_images_as(transform, Decoding::Whole)
    }

    /// [`LoaderBuilder::decode_images`], decoding as `decoding` says.
    pub fn decode_images_as(self, transform: Transform, decoding: Decoding) -> Self {
        self.decode_staged_seeded(move |seed, config| {
            let pixels_max = config.limits.image_pixels_max;
            let whole_image = decoding == Decoding::Whole;
            Staged {
                decode: Arc::new(move |bytes: &[u8], meta: &SampleMeta, side: Option<u32>| {
                    match side {
                        Some(side) => lobster_image::decode_downscaled(bytes, pixels_max, side),
                        None => lobster_image::decode_within(bytes, pixels_max),
                    }
                    .map_err(|e| image_cause(meta, e))
                }),
                finish: Arc::new(move |image: ImageRef<'_>, meta: &SampleMeta, epoch: u32| {
                    transform_pixels(transform, seed, epoch, image, meta)
                        .map_err(|e| image_cause(meta, e))
                }),
                whole: Some(Arc::new(
                    move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
                        let key = (seed, epoch, meta);
                        decode_pixels_within(transform, key, bytes, pixels_max, whole_image)
                            .map_err(|e| image_cause(meta, e))
                    },
                )),
            }
        })
    }
}

/// The collators of one rank's batches, shared with the batches lent out.
type Slots = Arc<Mutex<Vec<Collator>>>;

/// A rank's batches of [`Pixels`], collated: each batch's images in one `[B, H, W, 3]`
/// buffer and its labels in `[B]`. At most `slots` batches are out at once; a batch's
/// buffer goes back to its slot when the batch is dropped, so memory is `slots` buffers
/// however long the run.
#[derive(Debug)]
pub struct ImageBatches<I> {
    batches: I,
    dataset: Arc<Dataset>,
    slots: usize,
    made: usize,
    free: Slots,
}

impl<I> ImageBatches<I>
where
    I: Iterator<Item = Result<Batch<Pixels>, Error>>,
{
    /// Collates `batches` (a [`crate::RankHandle`], or any iterator of batches) of samples
    /// of `dataset`, with at most `slots` batches held at once.
    pub fn new(batches: I, dataset: Arc<Dataset>, slots: usize) -> Self {
        Self {
            batches,
            dataset,
            slots,
            made: 0,
            free: Arc::new(Mutex::new(Vec::with_capacity(slots))),
        }
    }

    fn collate(&mut self, batch: Batch<Pixels>) -> Result<ImageBatch, Error> {
        let free = self.free.lock().expect("image slots poisoned").pop();
        // The batch as planned, skipped samples included: the longest any batch can be.
        let planned = batch.samples.len() + batch.skipped.len();
        let (h, w) = batch
            .samples
            .first()
            .map_or((0, 0), |s| (s.value.height, s.value.width));
        let mut c = match free {
            Some(c) => c,
            None if self.made < self.slots => {
                self.made += 1;
                Collator::new(planned, h, w)
            }
            None => {
                return Err(Error::invalid(
                    "slots",
                    self.slots,
                    "more than the image batches held at once: drop a batch before \
                     taking the next",
                ))
            }
        };
        // A slot is made at its first batch's size; with a fixed-size transform it is never
        // made again.
        let fits = c.capacity() >= planned && c.shape()[1..3] == [h as usize, w as usize];
        if !fits && !batch.samples.is_empty() {
            c = Collator::new(planned, h, w);
        }
        c.clear();
        let mut ids = Vec::with_capacity(batch.samples.len());
        for s in &batch.samples {
            if let Err(e) = c.push(&s.value.data, s.label) {
                let meta = &self.dataset.samples()[s.id as usize];
                let [_, h, w, _] = c.shape();
                let cause = format!(
                    "image {:?} is {}x{}, its batch's {h}x{w}: collated images need one size \
                     (a Train or Eval transform): {e}",
                    meta.key(),
                    s.value.height,
                    s.value.width
                );
                self.free.lock().expect("image slots poisoned").push(c);
                return Err(Error::Decode {
                    sample: s.id,
                    path: meta.path.to_path_buf(),
                    cause: Cause::from(Box::<dyn std::error::Error + Send + Sync>::from(cause)),
                });
            }
            ids.push(s.id);
        }
        for s in batch.samples {
            OUTPUTS.give(s.value.data);
        }
        Ok(ImageBatch {
            epoch: batch.epoch,
            iteration: batch.iteration,
            ids,
            skipped: batch.skipped,
            collator: Some(c),
            home: Arc::clone(&self.free),
        })
    }
}

impl<I> Iterator for ImageBatches<I>
where
    I: Iterator<Item = Result<Batch<Pixels>, Error>>,
{
    type Item = Result<ImageBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(match self.batches.next()? {
            Ok(batch) => self.collate(batch),
            Err(e) => Err(e),
        })
    }
}

/// One rank's collated batch; its buffer returns to its slot when dropped.
#[derive(Debug)]
pub struct ImageBatch {
    /// The epoch.
    pub epoch: u32,
    /// The iteration within the epoch.
    pub iteration: u32,
    /// The samples' ids, in the batch's order (the images' order).
    pub ids: Vec<u32>,
    /// Samples left out by [`crate::OnError::Skip`].
    pub skipped: Vec<u32>,
    collator: Option<Collator>,
    home: Slots,
}

impl ImageBatch {
    fn collator(&self) -> &Collator {
        self.collator
            .as_ref()
            .expect("a batch holds its buffer until dropped")
    }

    /// The images, `[B, H, W, 3]`, contiguous.
    pub fn images(&self) -> &[u8] {
        self.collator().images()
    }

    /// The images, writable: the batch's buffer is its holder's alone until dropped.
    pub fn images_mut(&mut self) -> &mut [u8] {
        self.collator
            .as_mut()
            .expect("a batch holds its buffer until dropped")
            .images_mut()
    }

    /// The labels, `[B]`.
    pub fn labels(&self) -> &[u32] {
        self.collator().labels()
    }

    /// `[B, H, W, 3]`.
    pub fn shape(&self) -> [usize; 4] {
        self.collator().shape()
    }
}

impl Drop for ImageBatch {
    fn drop(&mut self) {
        if let (Some(c), Ok(mut free)) = (self.collator.take(), self.home.lock()) {
            free.push(c);
        }
    }
}
