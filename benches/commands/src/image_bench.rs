//! `lobster-bench image-bench`: what the image stage costs per image, decode alone against
//! decode with a transform and collation, on a dataset's files held in memory (no I/O in the
//! figures). Both run on the same threads in the same process, alternating, and each
//! figure is the median of its runs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use lobster_image::{Collator, Transform, Transformer};
use lobster_io::Dataset;
use serde::Serialize;

use lobster_cli::process;
use lobster_cli::run::TransformArg;

#[derive(Debug, clap::Args)]
pub(crate) struct ImageBenchArgs {
    /// The dataset (an ImageFolder or shards, as `lobster run --data`); without it, the
    /// main job's generated set.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Threads decoding, each its own share of the images.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, value_enum, default_value_t = TransformArg::Train)]
    transform: TransformArg,
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Images per collated batch.
    #[arg(long, visible_alias = "batch", default_value_t = 32)]
    batch_size: usize,
    /// Alternating runs of each.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Figures {
    images: usize,
    threads: usize,
    transform: TransformArg,
    image_size: u32,
    decode_images_per_s: f64,
    decode_cpu_ms_per_image: f64,
    transformed_images_per_s: f64,
    transformed_cpu_ms_per_image: f64,
    /// CPU per image with the transform and collation over decode alone, minus 1.
    transform_adds: f64,
}

pub(crate) fn run(args: &ImageBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.threads >= 1 && args.batch_size >= 1 && args.runs >= 1,
        "--threads, --batch and --runs must be at least 1"
    );
    let data = match &args.data {
        Some(d) => d.clone(),
        None => lobster_cli::run::default_dataset(4000, true)?,
    };
    let ds = Dataset::open(&data.to_string_lossy())
        .with_context(|| format!("opening {}", data.display()))?;
    let files: Vec<(Vec<u8>, u32, u32)> = ds
        .samples()
        .iter()
        .map(|s| {
            let mut bytes = vec![0u8; s.size_bytes as usize];
            let f = std::fs::File::open(&*s.path)?;
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut bytes, s.offset)?;
            Ok((bytes, s.id, s.label))
        })
        .collect::<std::io::Result<_>>()
        .context("reading the samples into memory")?;
    let transform = args.transform.transform(args.image_size);
    let (mut decode, mut transformed) =
        (Vec::with_capacity(args.runs), Vec::with_capacity(args.runs));
    for _ in 0..args.runs {
        decode.push(pass(&files, args, None)?);
        transformed.push(pass(&files, args, Some(transform))?);
    }
    // Medians of wall and CPU seconds, each on its own.
    let medians = |runs: &[(f64, f64)]| {
        let median = |mut xs: Vec<f64>| {
            xs.sort_by(f64::total_cmp);
            xs[xs.len() / 2]
        };
        (
            median(runs.iter().map(|r| r.0).collect()),
            median(runs.iter().map(|r| r.1).collect()),
        )
    };
    let ((decode_s, decode_cpu_s), (transformed_s, transformed_cpu_s)) =
        (medians(&decode), medians(&transformed));
    let n = files.len() as f64;
    let f = Figures {
        images: files.len(),
        threads: args.threads,
        transform: args.transform,
        image_size: args.image_size,
        decode_images_per_s: n / decode_s,
        decode_cpu_ms_per_image: 1e3 * decode_cpu_s / n,
        transformed_images_per_s: n / transformed_s,
        transformed_cpu_ms_per_image: 1e3 * transformed_cpu_s / n,
        transform_adds: transformed_cpu_s / decode_cpu_s - 1.0,
    };
    if args.json {
        println!("{}", serde_json::to_string(&f)?);
    } else {
        println!(
            "{} images, {} threads, medians of {}: decode {:.0} images/s, {:.3} CPU ms each; \
             decode + {:?} {} + collate {:.0} images/s, {:.3} CPU ms each (+{:.1}%)",
            f.images,
            f.threads,
            args.runs,
            f.decode_images_per_s,
            f.decode_cpu_ms_per_image,
            args.transform,
            args.image_size,
            f.transformed_images_per_s,
            f.transformed_cpu_ms_per_image,
            100.0 * f.transform_adds
        );
    }
    Ok(())
}

/// One pass over every image on `args.threads` threads: wall and CPU seconds.
fn pass(
    files: &[(Vec<u8>, u32, u32)],
    args: &ImageBenchArgs,
    transform: Option<Transform>,
) -> Result<(f64, f64)> {
    let cpu = process::cpu_seconds();
    let started = Instant::now();
    let share = files.len().div_ceil(args.threads);
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = files
            .chunks(share.max(1))
            .map(|part| {
                s.spawn(move || -> Result<()> {
                    let mut t = transform.map(Transformer::new);
                    let mut collator =
                        Collator::new(args.batch_size, args.image_size, args.image_size);
                    let mut pixels = Vec::new();
                    for (bytes, id, label) in part {
                        let image = lobster_image::decode(bytes)
                            .with_context(|| format!("decoding sample {id}"))?;
                        let Some(t) = &mut t else {
                            std::hint::black_box(image.pixels());
                            continue;
                        };
                        pixels.resize(t.output_bytes(&image), 0);
                        t.apply(&image, (0, 0, *id), &mut pixels)?;
                        if collator.len() == collator.capacity() {
                            std::hint::black_box(collator.images());
                            collator.clear();
                        }
                        collator.push(&pixels, *label)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a bench thread panicked")?;
        }
        Ok(())
    })?;
    Ok((
        started.elapsed().as_secs_f64(),
        process::cpu_seconds() - cpu,
    ))
}
