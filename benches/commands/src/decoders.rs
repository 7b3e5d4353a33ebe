//! `lobster-bench decoders`: the CPU each JPEG decode path costs per image, on a folder's
//! JPEGs held in memory, on one thread: zune-jpeg's whole decode (its `decode_into`, the
//! buffer reused), lobster-image's whole decode (`decode_into`: its own decoder on a
//! baseline JPEG), its region decoder on the whole image at 1/2 and 1/4 (asked for all
//! but its first column, which it decodes whole), and the
//! training transform's crops decoded by region (`Transformer::decode_apply`) against the
//! whole decode followed by the same transform. Each round runs every path once over every
//! image, in turn, so that load drift falls on all; each figure is the median of the rounds.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lobster_image::{
    decode_into, decode_region_into, dimensions, Region, Transform, Transformer, PIXELS_MAX_DEFAULT,
};
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

#[derive(Debug, clap::Args)]
pub(crate) struct DecodersArgs {
    /// A folder of JPEGs (its subfolders too), e.g. the photo set.
    #[arg(long)]
    data: PathBuf,
    /// Rounds of every path over every image.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// At most this many images (the first in name order).
    #[arg(long)]
    limit: Option<usize>,
    /// The training transform's output side.
    #[arg(long, default_value_t = 224)]
    size: u32,
    /// The seed of the training crops.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The paths measured, in the order each round runs them.
const PATHS: [&str; 6] = [
    "zune-jpeg full",
    "lobster-image full (decode_into)",
    "region decoder full 1/2",
    "region decoder full 1/4",
    "train crop: decode_apply (region)",
    "train crop: decode_into + apply",
];

pub(crate) fn run(args: &DecodersArgs) -> Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let mut names = Vec::new();
    collect(&args.data, &mut names)?;
    names.sort();
    names.truncate(args.limit.unwrap_or(usize::MAX));
    anyhow::ensure!(!names.is_empty(), "no JPEG under {}", args.data.display());
    let files: Vec<(Vec<u8>, u32, u32)> = names
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).with_context(|| p.display().to_string())?;
            let (w, h) =
                dimensions(&bytes).with_context(|| format!("{}: no JPEG header", p.display()))?;
            Ok((bytes, w, h))
        })
        .collect::<Result<_>>()?;
    let n = files.len();
    println!(
        "{n} images from {}, one thread, {} interleaved rounds; load average at the start: {}",
        args.data.display(),
        args.rounds,
        load_average()
    );
    let mut bench = Bench::new(args);
    // Warm-up: a tenth of the images through every path (buffers grown, tables built).
    for path in 0..PATHS.len() {
        bench.pass(path, &files[..n.div_ceil(10)])?;
    }
    let mut ns = vec![Vec::new(); PATHS.len()];
    for _ in 0..args.rounds {
        for (path, runs) in ns.iter_mut().enumerate() {
            runs.push(bench.pass(path, &files)? as f64 / n as f64);
        }
    }
    println!("load average at the end: {}", load_average());
    println!("| path | CPU ms/image median (min-max) | vs zune-jpeg full |");
    println!("|---|---|---|");
    let medians: Vec<f64> = ns
        .iter_mut()
        .map(|runs| {
            runs.sort_by(f64::total_cmp);
            runs[runs.len() / 2]
        })
        .collect();
    for ((name, runs), median) in PATHS.iter().zip(&ns).zip(&medians) {
        println!(
            "| {name} | {:.3} ({:.3}-{:.3}) | {:.2} |",
            median / 1e6,
            runs[0] / 1e6,
            runs[runs.len() - 1] / 1e6,
            median / medians[0]
        );
    }
    println!(
        "train crop by region over train crop by whole decode: {:.2}",
        medians[4] / medians[5]
    );
    Ok(())
}

/// The paths' reused buffers.
struct Bench {
    transformer: Transformer,
    seed: u64,
    pixels: Vec<u8>,
    out: Vec<u8>,
}

impl Bench {
    fn new(args: &DecodersArgs) -> Self {
        Bench {
            transformer: Transformer::new(Transform::Train { size: args.size }),
            seed: args.seed,
            pixels: Vec::new(),
            out: Vec::new(),
        }
    }

    /// One pass of `path` over `files`: the thread's CPU nanoseconds.
    fn pass(&mut self, path: usize, files: &[(Vec<u8>, u32, u32)]) -> Result<u64> {
        let started = thread_cpu_ns();
        for (id, (bytes, width, height)) in files.iter().enumerate() {
            let whole = Region {
                left: 0,
                top: 0,
                width: *width,
                height: *height,
            };
            let key = (self.seed, 0, id as u32);
            match path {
                0 => {
                    let options = DecoderOptions::default()
                        .jpeg_set_out_colorspace(ColorSpace::RGB)
                        .set_max_width(1 << 16)
                        .set_max_height(1 << 16);
                    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(bytes, options);
                    decoder
                        .decode_headers()
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    let size = decoder.output_buffer_size().unwrap_or(0);
                    self.pixels.resize(size, 0);
                    decoder
                        .decode_into(&mut self.pixels)
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                }
                1 => {
                    decode_into(bytes, PIXELS_MAX_DEFAULT, &mut self.pixels, 0)?;
                }
                2 | 3 => {
                    // A region one pixel in from the left has the region decoder decode the
                    // whole image all the same, at the scale asked.
                    let region = Region {
                        left: u32::from(*width > 1),
                        width: *width - u32::from(*width > 1),
                        ..whole
                    };
                    let scale = 1 << (path - 1);
                    decode_region_into(
                        bytes,
                        PIXELS_MAX_DEFAULT,
                        region,
                        scale,
                        &mut self.pixels,
                        0,
                    )?;
                }
                4 => {
                    self.transformer.decode_apply(
                        bytes,
                        PIXELS_MAX_DEFAULT,
                        key,
                        &mut self.pixels,
                        &mut self.out,
                    )?;
                }
                _ => {
                    let (w, h) = decode_into(bytes, PIXELS_MAX_DEFAULT, &mut self.pixels, 0)?;
                    let image = lobster_image::ImageRef::new(w, h, &self.pixels)?;
                    self.out.resize(self.transformer.output_bytes(image), 0);
                    self.transformer.apply(image, key, &mut self.out)?;
                }
            }
            std::hint::black_box(&self.pixels);
            std::hint::black_box(&self.out);
        }
        Ok(thread_cpu_ns() - started)
    }
}

fn collect(dir: &Path, names: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, names)?;
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
        {
            names.push(path);
        }
    }
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The calling thread's CPU time in nanoseconds.
#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes; the clock id is a constant Linux
    // has had since 2.6.12.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
