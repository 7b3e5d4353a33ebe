//! The decoded tier: an image decoder in two stages, so that the cache can keep a sample's
//! decoded image (the first stage's whole output, before any random transform) and its hits
//! run only the second; what the tier counts; and what the planner needs to price it (each
//! sample's decoded size, read from its header, and the read and decode costs).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_cache::FormCosts;
use lobster_image::{Image, ImageRef};
use lobster_sched::CostParams;

use crate::dataset::{Dataset, SampleMeta};
use crate::emulate::StorageEmulation;
use crate::error::Cause;
use crate::pipeline::access::AccessLanding;
use crate::pipeline::io::landing::DecodedImage;

/// The first stage: a sample's bytes to its full-resolution image.
pub(crate) type StageDecode = Arc<dyn Fn(&[u8], &SampleMeta) -> Result<Image, Cause> + Send + Sync>;
/// The second: the image, the sample and the epoch (to seed augmentation) to the output.
pub(crate) type StageFinish<T> =
    Arc<dyn for<'a> Fn(ImageRef<'a>, &SampleMeta, u32) -> Result<T, Cause> + Send + Sync>;

/// A decoder in two stages; running both is the whole decode.
pub(crate) struct Staged<T> {
    pub(crate) decode: StageDecode,
    pub(crate) finish: StageFinish<T>,
}

impl<T> Clone for Staged<T> {
    fn clone(&self) -> Self {
        Staged {
            decode: self.decode.clone(),
            finish: self.finish.clone(),
        }
    }
}

/// What the tier did, counted by the decode workers.
#[derive(Debug, Default)]
pub(crate) struct FormCounters {
    /// Hits that found their sample's decoded image and skipped the decode.
    pub(crate) decoded_hits: AtomicU64,
    /// The decode time those hits skipped: each image's own decode, as timed when it was made.
    pub(crate) decode_saved_ns: AtomicU64,
    /// Decoded images put in the cache.
    pub(crate) images_kept: AtomicU64,
    /// Hits planned on a decoded image that decoded the bytes again, because the image was
    /// not yet made (its admitting access still decoding) or its decode had failed.
    pub(crate) decoded_again: AtomicU64,
}

/// Where a decoded image is to be kept: its landing, the cache's arena, and the longest side
/// it is kept at (lossy; `None`: as decoded).
pub(crate) struct Keep<'a> {
    pub(crate) landing: &'a AccessLanding,
    pub(crate) arena: Option<&'a lobster_uring::Arena>,
    pub(crate) max_side: Option<u32>,
}

/// Runs both stages on `bytes`; with `keep`, the image goes into that landing for later hits.
/// `as_kept`: a planned hit on a decoded image that was not there (not yet made, or its
/// decode failed) is transformed from the image as the cache would have kept it, brought
/// down to that side, so that its pixels do not depend on timing.
pub(crate) fn decode_in_stages<T>(
    staged: &Staged<T>,
    bytes: &[u8],
    meta: &SampleMeta,
    epoch: u32,
    keep: Option<Keep<'_>>,
    as_kept: Option<u32>,
    counters: &FormCounters,
) -> Result<T, Cause> {
    let started = Instant::now();
    let mut image = (staged.decode)(bytes, meta)?;
    let decode = started.elapsed();
    if let Some(side) = as_kept {
        image = lobster_image::downscale((&image).into(), side).map_err(|e| {
            Cause::from(Box::<dyn std::error::Error + Send + Sync>::from(format!(
                "image {:?} brought down to {side} px: {e}",
                meta.key()
            )))
        })?;
    }
    let out = (staged.finish)((&image).into(), meta, epoch)?;
    if let Some(k) = keep {
        // An image the resizer refuses is not kept: its hits decode (counted as such).
        let image = match k.max_side {
            Some(side) => lobster_image::downscale((&image).into(), side).ok(),
            None => Some(image),
        };
        if let Some(image) = image {
            if k.landing
                .keep_decoded(DecodedImage::new(image, decode, k.arena))
            {
                counters.images_kept.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(out)
}

/// Runs the second stage on a cached image.
pub(crate) fn finish_cached<T>(
    staged: &Staged<T>,
    image: &DecodedImage,
    meta: &SampleMeta,
    epoch: u32,
    counters: &FormCounters,
) -> Result<T, Cause> {
    counters.decoded_hits.fetch_add(1, Ordering::Relaxed);
    counters
        .decode_saved_ns
        .fetch_add(image.decode_ns(), Ordering::Relaxed);
    (staged.finish)(image.view(), meta, epoch)
}

/// Bytes of a sample read to find its header; more only if the header is not within.
const HEADER_PREFIX_BYTES: u64 = 64 << 10;
/// Threads probing headers at build: enough to overlap a network file system's latency.
const PROBE_THREADS: usize = 8;

/// Each sample's decoded size (`width * height * 3`, from its JPEG or PNG header, after the
/// lossy `max_side`), or 0 where the header cannot be read or parsed: that sample is then
/// only ever kept encoded, and its read or decode fails, naming it, when it is accessed.
pub(crate) fn decoded_sizes(dataset: &Dataset, max_side: Option<u32>) -> Arc<[u32]> {
    let samples = dataset.samples();
    let mut sizes = vec![0u32; samples.len()];
    let chunk = samples.len().div_ceil(PROBE_THREADS).max(1);
    std::thread::scope(|s| {
        for (metas, out) in samples.chunks(chunk).zip(sizes.chunks_mut(chunk)) {
            s.spawn(move || {
                for (meta, size) in metas.iter().zip(out) {
                    *size = decoded_size(meta, max_side).unwrap_or(0);
                }
            });
        }
    });
    sizes.into()
}

/// The first `len` bytes of a sample, or `None` if they cannot be read (its access will
/// say why, naming it).
fn read_start(meta: &SampleMeta, len: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    File::open(&meta.path)
        .and_then(|f| f.read_exact_at(&mut buf, meta.offset))
        .ok()?;
    Some(buf)
}

fn decoded_size(meta: &SampleMeta, max_side: Option<u32>) -> Option<u32> {
    let prefix = read_start(meta, meta.size_bytes.min(HEADER_PREFIX_BYTES))?;
    let (w, h) = lobster_image::dimensions(&prefix).or_else(|| {
        (meta.size_bytes > HEADER_PREFIX_BYTES)
            .then(|| read_start(meta, meta.size_bytes))
            .flatten()
            .and_then(|all| lobster_image::dimensions(&all))
    })?;
    let (w, h) = max_side.map_or((w, h), |side| lobster_image::downscaled_shape(w, h, side));
    u32::try_from(u64::from(w) * u64::from(h) * 3).ok()
}

/// Samples decoded at build to time the first stage.
const CALIBRATION_SAMPLES: usize = 8;

/// The costs the two-form rule prices with when the config gives none: reads from the
/// emulated tier or the cost model's storage prior; decodes per encoded byte, timed on the
/// first samples that decode (the prior's if none does).
pub(crate) fn form_costs<T>(
    dataset: &Dataset,
    staged: &Staged<T>,
    emulation: Option<StorageEmulation>,
) -> FormCosts {
    let prior = CostParams::PRIORS;
    let (read_s, read_per_byte_s) = match emulation {
        Some(e) => (e.latency_us as f64 * 1e-6, 1.0 / e.bandwidth_bytes_per_s),
        None => {
            let s = prior.tier(lobster_sched::Tier::Storage);
            (s.request_s, s.per_byte_s)
        }
    };
    let (mut bytes, mut elapsed, mut decoded) = (0u64, Duration::ZERO, 0);
    for meta in dataset.samples().iter().take(4 * CALIBRATION_SAMPLES) {
        let Some(buf) = read_start(meta, meta.size_bytes) else {
            continue;
        };
        let started = Instant::now();
        if (staged.decode)(&buf, meta).is_ok() {
            elapsed += started.elapsed();
            bytes += meta.size_bytes;
            decoded += 1;
            if decoded == CALIBRATION_SAMPLES {
                break;
            }
        }
    }
    let (decode_s, decode_per_byte_s) = if bytes > 0 && elapsed > Duration::ZERO {
        (0.0, elapsed.as_secs_f64() / bytes as f64)
    } else {
        (prior.decode.sample_s, prior.decode.per_byte_s)
    };
    FormCosts {
        read_s,
        read_per_byte_s,
        decode_s,
        decode_per_byte_s,
    }
}
