//! The decoded tier: an image decoder in two stages, so that the cache can keep a sample's
//! decoded image (the first stage's whole output, before any random transform) and its hits
//! run only the second; what the tier counts; and what the planner needs to price it (each
//! sample's decoded size, read from its header, and the read and decode costs, a pure
//! function of the dataset's headers: see [`form_costs`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lobster_cache::FormCosts;
use lobster_image::{Image, ImageRef};
use lobster_sched::CostParams;

use crate::dataset::{Probe, SampleMeta};
use crate::emulate::StorageEmulation;
use crate::error::Cause;
use crate::metrics::FormCostsReport;
use crate::pipeline::access::AccessLanding;
use crate::pipeline::context::DecodeFn;
use crate::pipeline::landing::DecodedImage;

/// The first stage: a sample's bytes to its full-resolution image, or with a side, to its
/// image with the longer side brought down to it ([`lobster_image::downscaled_shape`]).
pub(crate) type StageDecode =
    Arc<dyn Fn(&[u8], &SampleMeta, Option<u32>) -> Result<Image, Cause> + Send + Sync>;
/// The second: the image, the sample and the epoch (to seed augmentation) to the output.
pub(crate) type StageFinish<T> =
    Arc<dyn for<'a> Fn(ImageRef<'a>, &SampleMeta, u32) -> Result<T, Cause> + Send + Sync>;

/// A decoder in two stages; running both is the whole decode, which `whole` does at once
/// where given: for a sample whose image the cache does not keep, it need not make the
/// whole image (it may decode into a buffer of its own, or only what `finish` keeps).
pub(crate) struct Staged<T> {
    pub(crate) decode: StageDecode,
    pub(crate) finish: StageFinish<T>,
    pub(crate) whole: Option<DecodeFn<T>>,
}

impl<T> Clone for Staged<T> {
    fn clone(&self) -> Self {
        Staged {
            decode: self.decode.clone(),
            finish: self.finish.clone(),
            whole: self.whole.clone(),
        }
    }
}

/// What the decoded tier needs: the decoder in its two stages, and what the planner prices
/// forms with.
pub(crate) struct DecodedTier<T> {
    pub(crate) staged: Staged<T>,
    pub(crate) choice: lobster_cache::FormChoice,
    /// Each sample's decoded size, 0 where it has none.
    pub(crate) decoded_sizes: Arc<[u32]>,
    pub(crate) costs: lobster_cache::FormCosts,
    pub(crate) costs_from: CostsFrom,
    /// Decoded images are kept with their longer side brought down to this (lossy).
    pub(crate) max_side: Option<u32>,
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

/// Where a decoded image is to be kept: its landing, the cache's arena, the longest side it
/// is kept at (lossy; `None`: as decoded), and the bytes the plan gave it.
pub(crate) struct Keep<'a> {
    pub(crate) landing: &'a AccessLanding,
    pub(crate) arena: Option<&'a lobster_uring::Arena>,
    pub(crate) max_side: Option<u32>,
    pub(crate) planned_bytes: u32,
}

/// A planned hit on a decoded image that was not there (not yet made, or its decode
/// failed): it is transformed from the image as the cache keeps it (whole, or brought down
/// to `max_side`), as the hit would have been, so that its pixels do not depend on timing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsKept {
    pub(crate) max_side: Option<u32>,
}

/// Runs both stages on `bytes`; with `keep`, the image goes into that landing for later hits.
/// Only an access that neither keeps nor stands in for a planned hit ([`AsKept`]) may take
/// the stages' `whole` path, whose pixels may differ from a transform of the kept image.
pub(crate) fn decode_in_stages<T>(
    staged: &Staged<T>,
    bytes: &[u8],
    meta: &SampleMeta,
    epoch: u32,
    keep: Option<Keep<'_>>,
    as_kept: Option<AsKept>,
    counters: &FormCounters,
) -> Result<T, Cause> {
    if let (None, None, Some(whole)) = (&keep, as_kept, &staged.whole) {
        return whole(bytes, meta, epoch);
    }
    let started = Instant::now();
    // A kept image brought down to a side is decoded at it (a DCT-scaled decode where the
    // decoder has one), and so is the image a planned hit on it would have found: the same
    // pixels either way, whatever the timing.
    let side = as_kept
        .and_then(|a| a.max_side)
        .or(keep.as_ref().and_then(|k| k.max_side));
    let image = (staged.decode)(bytes, meta, side)?;
    let decode = started.elapsed();
    let out = (staged.finish)((&image).into(), meta, epoch)?;
    if let Some(k) = keep {
        // Larger than planned (a file rewritten in place since its header was kept): not
        // kept, so the cache stays within its budget; its hits decode again.
        if image.pixels().len() as u64 <= u64::from(k.planned_bytes)
            && k.landing
                .keep_decoded(DecodedImage::new(image, decode, k.arena))
        {
            counters.images_kept.fetch_add(1, Ordering::Relaxed);
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

/// Each sample's decoded size (`width * height * 3`, from its JPEG or PNG header as the
/// dataset's probes keep it, after the lossy `max_side`), or 0 where the header cannot be
/// read or parsed: that sample is then only ever kept encoded, and its read or decode
/// fails, naming it, when it is accessed.
pub(crate) fn decoded_sizes(probes: &[Probe], max_side: Option<u32>) -> Arc<[u32]> {
    probes
        .iter()
        .map(|p| {
            let Some((w, h)) = p.dimensions() else {
                return 0;
            };
            let (w, h) =
                max_side.map_or((w, h), |side| lobster_image::downscaled_shape(w, h, side));
            u32::try_from(u64::from(w) * u64::from(h) * 3).unwrap_or(0)
        })
        .collect()
}

/// Seconds the built-in decoder ([`lobster_image::decode`]) takes per pixel of a JPEG,
/// measured on the development machine (2 shared cores, nothing else running; a release
/// build, 2026-12-07, lobster-image's own baseline decoder) on 400 of 4,000 generated
/// 110 KiB JPEGs: `lobster gen --out /tmp/j --samples 4000 --classes 10 --mean-kb 110` then
/// `lobster-bench plan-bench --decode-constants /tmp/j` (three runs' medians of 5: 10.29,
/// 10.31, 10.77 ns; 20.6 on 2026-12-03, with zune-jpeg decoding, under load). Fixed here,
/// not measured at build, so that the plan does not move with the machine's load.
pub const JPEG_DECODE_S_PER_PIXEL: f64 = JPEG_DECODE_NS_PER_PIXEL * 1e-9;
const JPEG_DECODE_NS_PER_PIXEL: f64 = 10.3;
/// What a JPEG's decode at each DCT scale takes over its decode at full scale (the decoded
/// tier's decode of an image it keeps brought down to a side, at the coarsest scale that
/// reaches it: [`lobster_image::downscaled_scale`]), measured as [`JPEG_DECODE_S_PER_PIXEL`]
/// on the same 400 generated JPEGs (`plan-bench --decode-constants`, 2026-12-07, medians of
/// 5: 0.906, 0.769, 0.709 at 1/2, 1/4, 1/8; on the photo set, 0.856, 0.721, 0.615). The
/// entropy decoding, which no scale shortens, is most of what is left. The resize from the
/// scaled image to the exact side after it is not priced.
const JPEG_DECODE_SHARES: [(u32, f64); 4] = [(1, 1.0), (2, 0.906), (4, 0.769), (8, 0.709)];

/// Which of [`JPEG_DECODE_SHARES`] a `width` x `height` JPEG's decode is priced at: the
/// DCT scale the tier decodes it at when kept images are brought down to `max_side`.
fn jpeg_decode_share(width: u32, height: u32, max_side: Option<u32>) -> usize {
    let scale = max_side.map_or(1, |side| {
        lobster_image::downscaled_scale(width, height, side)
    });
    JPEG_DECODE_SHARES
        .iter()
        .position(|&(s, _)| s == scale)
        .unwrap_or(0)
}

/// As [`JPEG_DECODE_S_PER_PIXEL`] for a PNG, measured the same way on the 51 PNG figures
/// of the Rust toolchain's documentation (`lobster-bench plan-bench --decode-constants
/// ~/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html`: 7.6 ns, runs
/// 7.4 to 7.9).
pub const PNG_DECODE_S_PER_PIXEL: f64 = PNG_DECODE_NS_PER_PIXEL * 1e-9;
const PNG_DECODE_NS_PER_PIXEL: f64 = 7.6;

/// Where the costs the two-form rule priced with came from, as the metrics report it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CostsFrom {
    /// `config` (given), `emulation` (the emulated tier's latency and bandwidth) or
    /// `prior` (the cost model's storage prior).
    pub(crate) read: &'static str,
    /// `config`, `model` (pixels times the decoder's constant per pixel) or `prior` (no
    /// sample has a readable header).
    pub(crate) decode: &'static str,
    /// Pixels of the samples with a header, and their encoded bytes (the model's inputs).
    pub(crate) pixels: u64,
    pub(crate) encoded_bytes: u64,
}

impl CostsFrom {
    /// Costs the config gave.
    pub(crate) const CONFIG: CostsFrom = CostsFrom {
        read: "config",
        decode: "config",
        pixels: 0,
        encoded_bytes: 0,
    };

    /// The metrics' account of `costs`, which came from here.
    pub(crate) fn report(self, costs: FormCosts) -> FormCostsReport {
        let model = |s_per_pixel: f64| {
            if self.decode == "model" {
                s_per_pixel
            } else {
                0.0
            }
        };
        FormCostsReport {
            costs,
            read_source: self.read,
            decode_source: self.decode,
            model_pixels: self.pixels,
            model_encoded_bytes: self.encoded_bytes,
            model_jpeg_s_per_pixel: model(JPEG_DECODE_S_PER_PIXEL),
            model_png_s_per_pixel: model(PNG_DECODE_S_PER_PIXEL),
        }
    }
}

/// The costs the two-form rule prices with when the config gives none, as a pure function
/// of the dataset's headers and the config, so that the same command makes the same plan
/// every time and in every process:
///
/// - reads: from the emulated tier, else the cost model's storage prior;
/// - decodes: each sample's pixels times the built-in decoder's constant per pixel of its
///   format ([`JPEG_DECODE_S_PER_PIXEL`], [`PNG_DECODE_S_PER_PIXEL`]), a JPEG's at the DCT
///   scale the tier decodes it at when kept images are brought down to `max_side`
///   ([`JPEG_DECODE_SHARES`]), spread over the dataset's encoded bytes (the rule
///   prices per encoded byte); the prior's where no sample has a header.
///
/// Decodes were timed on a few samples at build before: the timing moved with the
/// machine's load, and with it the plan (hit ratios 0.146 and 0.336 on two runs of one
/// command). A calibration kept with the dataset would be stable but still machine-bound
/// and one more file format to trust; the model needs only the headers the tier probes
/// anyway. A decoder other than the built-in one is priced as the built-in one would be;
/// its user may give `form_costs` instead.
pub(crate) fn form_costs(
    probes: &[Probe],
    samples: &[crate::dataset::SampleMeta],
    emulation: Option<StorageEmulation>,
    max_side: Option<u32>,
) -> (FormCosts, CostsFrom) {
    let prior = CostParams::PRIORS;
    let (read_s, read_per_byte_s, read) = match emulation {
        Some(e) => (
            e.latency_us as f64 * 1e-6,
            1.0 / e.bandwidth_bytes_per_s,
            "emulation",
        ),
        None => {
            let s = prior.tier(lobster_sched::Tier::Storage);
            (s.request_s, s.per_byte_s, "prior")
        }
    };
    // Integers summed (a JPEG's pixels by the share its decode is priced at): the same
    // whatever the order or the thread.
    let mut jpeg_pixels = [0u128; JPEG_DECODE_SHARES.len()];
    let (mut png_pixels, mut bytes) = (0u128, 0u128);
    for (probe, meta) in probes.iter().zip(samples) {
        let pixels = |w: u32, h: u32| u128::from(w) * u128::from(h);
        match *probe {
            Probe::Jpeg { width, height } => {
                jpeg_pixels[jpeg_decode_share(width, height, max_side)] += pixels(width, height);
            }
            Probe::Png { width, height } => png_pixels += pixels(width, height),
            _ => continue,
        }
        bytes += u128::from(meta.size_bytes);
    }
    let clamp = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
    let (decode_s, decode_per_byte_s, decode) = if bytes > 0 {
        let jpeg: f64 = jpeg_pixels
            .iter()
            .zip(JPEG_DECODE_SHARES)
            .map(|(&p, (_, share))| p as f64 * share)
            .sum();
        let seconds = jpeg * JPEG_DECODE_S_PER_PIXEL + png_pixels as f64 * PNG_DECODE_S_PER_PIXEL;
        (0.0, seconds / bytes as f64, "model")
    } else {
        (prior.decode.sample_s, prior.decode.per_byte_s, "prior")
    };
    let costs = FormCosts {
        read_s,
        read_per_byte_s,
        decode_s,
        decode_per_byte_s,
    };
    let from = CostsFrom {
        read,
        decode,
        pixels: clamp(jpeg_pixels.iter().sum::<u128>() + png_pixels),
        encoded_bytes: clamp(bytes),
    };
    (costs, from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_kept_smaller_is_priced_at_the_scale_it_is_decoded_at() {
        // No smaller than the image, or not small enough for 1/2: a full-scale decode.
        for side in [None, Some(1000), Some(600)] {
            assert_eq!(
                JPEG_DECODE_SHARES[jpeg_decode_share(1000, 800, side)].1,
                1.0
            );
        }
        for (side, share) in [(500, 0.906), (250, 0.769), (125, 0.709), (40, 0.709)] {
            let at = jpeg_decode_share(1000, 800, Some(side));
            assert_eq!(JPEG_DECODE_SHARES[at].1, share, "side {side}");
        }
    }
}
