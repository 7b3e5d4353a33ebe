//! `lobster gen`: a synthetic ImageFolder of real JPEG files with log-normal sizes.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use jpeg_encoder::{ColorType, Encoder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

/// Arguments of `lobster gen`.
#[derive(Debug, clap::Args)]
pub struct GenArgs {
    /// Directory to create the dataset in (one sub-directory per class, JPEG files inside).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of samples.
    #[arg(long)]
    pub samples: u32,
    /// Number of classes.
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    /// Mean file size in KiB (sizes are log-normal around it).
    #[arg(long, default_value_t = 110.0)]
    pub mean_kb: f64,
    /// Seed of the generator: the same seed gives the same files.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

const QUALITY: u8 = 90;
/// Spread of the log-normal size distribution (sigma of the underlying normal).
const SIZE_SIGMA: f64 = 0.5;

pub fn run(args: &GenArgs) -> Result<()> {
    let summary = generate(
        &args.out,
        args.samples,
        args.classes,
        args.mean_kb,
        args.seed,
    )?;
    println!(
        "wrote {} JPEG files in {} classes to {} ({:.1} MiB, mean {:.1} KiB)",
        summary.files,
        args.classes,
        args.out.display(),
        summary.total_bytes as f64 / (1 << 20) as f64,
        summary.total_bytes as f64 / summary.files.max(1) as f64 / 1024.0
    );
    Ok(())
}

/// What `generate` wrote.
#[derive(Debug)]
pub struct GenSummary {
    pub files: u32,
    pub total_bytes: u64,
}

/// Writes `samples` JPEG files spread round-robin over `classes` class directories.
pub fn generate(
    out: &Path,
    samples: u32,
    classes: u32,
    mean_kb: f64,
    seed: u64,
) -> Result<GenSummary> {
    if samples == 0 {
        bail!("--samples must be at least 1");
    }
    if classes == 0 || classes > samples {
        bail!("--classes = {classes}: allowed 1..={samples} (every class needs a file)");
    }
    if !(mean_kb.is_finite() && (1.0..=65_536.0).contains(&mean_kb)) {
        bail!("--mean-kb = {mean_kb}: allowed 1 to 65536");
    }
    for class in 0..classes {
        let dir = out.join(class_name(class));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let bytes_per_pixel = calibrate(mean_kb * 1024.0)?;
    // Log-normal with the requested mean: mean = exp(mu + sigma^2 / 2).
    let mu = (mean_kb * 1024.0).ln() - SIZE_SIGMA * SIZE_SIGMA / 2.0;
    let sizes = LogNormal::new(mu, SIZE_SIGMA).context("size distribution")?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let totals = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn(move || -> Result<u64> {
                    let mut total = 0u64;
                    for i in (w..samples).step_by(workers as usize) {
                        let mut rng = StdRng::seed_from_u64(seed ^ (u64::from(i) << 20) ^ 0x10b5);
                        let target_bytes: f64 = sizes.sample(&mut rng);
                        let side = ((target_bytes / bytes_per_pixel).sqrt() as u32).clamp(16, 4096);
                        let mut jpeg = encode(side, side, &mut rng)?;
                        let error = target_bytes / jpeg.len() as f64;
                        if !(0.9..=1.1).contains(&error) {
                            // One corrective step: density varies with image size.
                            let side = ((f64::from(side) * error.sqrt()) as u32).clamp(16, 4096);
                            jpeg = encode(side, side, &mut rng)?;
                        }
                        let path = out
                            .join(class_name(i % classes))
                            .join(format!("{i:08}.jpg"));
                        fs::write(&path, &jpeg)
                            .with_context(|| format!("writing {}", path.display()))?;
                        total += jpeg.len() as u64;
                    }
                    Ok(total)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("gen worker panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(GenSummary {
        files: samples,
        total_bytes: totals.iter().sum(),
    })
}

fn class_name(class: u32) -> String {
    format!("class{class:04}")
}

/// Bytes per pixel of the generated content at the fixed quality near the mean size, so
/// sizes can be targeted (two fixed-point steps: density varies a little with image size).
fn calibrate(mean_bytes: f64) -> Result<f64> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut side = 256u32;
    let mut bytes_per_pixel = 0.0;
    for _ in 0..2 {
        let jpeg = encode(side, side, &mut rng)?;
        bytes_per_pixel = jpeg.len() as f64 / f64::from(side * side);
        side = ((mean_bytes / bytes_per_pixel).sqrt() as u32).clamp(16, 4096);
    }
    Ok(bytes_per_pixel)
}

/// An image with smooth colour fields and grain, so it compresses like a photograph.
fn encode(width: u32, height: u32, rng: &mut StdRng) -> Result<Vec<u8>> {
    let (w, h) = (width as usize, height as usize);
    let base: [f32; 3] = [
        rng.gen_range(40.0..215.0),
        rng.gen_range(40.0..215.0),
        rng.gen_range(40.0..215.0),
    ];
    let slope: [f32; 2] = [rng.gen_range(-0.4..0.4), rng.gen_range(-0.4..0.4)];
    let mut pixels = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let wave = ((x as f32 * 0.05).sin() + (y as f32 * 0.07).cos()) * 30.0;
            for (c, b) in base.iter().enumerate() {
                let grain: f32 = rng.gen_range(-24.0..24.0);
                let v =
                    b + wave * (c as f32 - 1.0) + slope[0] * x as f32 + slope[1] * y as f32 + grain;
                pixels.push(v.clamp(0.0, 255.0) as u8);
            }
        }
    }
    let mut out = Vec::new();
    Encoder::new(&mut out, QUALITY)
        .encode(&pixels, width as u16, height as u16, ColorType::Rgb)
        .context("encoding a JPEG")?;
    Ok(out)
}
