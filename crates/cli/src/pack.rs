//! `lobster pack`: an ImageFolder written as WebDataset tar shards, and `lobster ls`: a
//! dataset's sample table.
//!
//! Shards are plain ustar archives, the same bytes for the same folder: per sample, in id
//! order, `<id:08>.<ext>` (the image, its extension lower-cased) and `<id:08>.cls` (the
//! label), mode 0644, owner 0, time 0.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lobster_io::Dataset;
use serde::Serialize;

const BLOCK: usize = 512;

#[derive(Debug, clap::Args)]
pub(crate) struct PackArgs {
    /// The ImageFolder to pack.
    #[arg(long)]
    data: PathBuf,
    /// The directory the shards go to (shard-000000.tar, ...); it must hold no shard yet.
    #[arg(long)]
    out: PathBuf,
    /// A shard is closed before it would pass this many bytes (each holds at least one
    /// sample).
    #[arg(long, default_value_t = 64 << 20)]
    shard_bytes: u64,
}

pub(crate) fn run(args: &PackArgs) -> Result<()> {
    let ds = Dataset::open_image_folder(&args.data)
        .with_context(|| format!("opening {}", args.data.display()))?;
    let shards = pack(&ds, &args.out, args.shard_bytes)?;
    println!(
        "{} samples in {} shards: {}/shard-{{000000..{:06}}}.tar",
        ds.len(),
        shards,
        args.out.display(),
        shards - 1
    );
    Ok(())
}

/// Writes `ds` as shards into `out`; returns how many.
pub(crate) fn pack(ds: &Dataset, out: &Path, shard_bytes: u64) -> Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let first = out.join("shard-000000.tar");
    if first.exists() {
        bail!(
            "{} exists: pack into a directory without shards",
            first.display()
        );
    }
    let mut shards = 0;
    let mut shard: Option<(BufWriter<File>, u64, PathBuf)> = None;
    for s in ds.samples() {
        let ext = s
            .path
            .extension()
            .map(|e| e.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        // Read at most its size and one byte more: a sample that changed while packing (or
        // a symlink to a device) is refused, not read on.
        let image = ds
            .sample_bytes(s)
            .with_context(|| format!("packing {}", s.path.display()))?;
        let key = format!("{:08}", s.id);
        let label = s.label.to_string();
        let bytes = member_bytes(image.len()) + member_bytes(label.len());
        let full = shard
            .as_ref()
            .is_some_and(|(_, used, _)| *used + bytes + 2 * BLOCK as u64 > shard_bytes);
        if full {
            finish(shard.take().expect("checked"))?;
        }
        let (w, used, path) = match &mut shard {
            Some(open) => open,
            None => {
                let path = out.join(format!("shard-{shards:06}.tar"));
                let file =
                    File::create(&path).with_context(|| format!("creating {}", path.display()))?;
                shards += 1;
                shard.insert((BufWriter::new(file), 0, path))
            }
        };
        let named = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
        write_member(w, &format!("{key}.{ext}"), &image).map_err(named)?;
        write_member(w, &format!("{key}.cls"), label.as_bytes()).map_err(named)?;
        *used += bytes;
    }
    if let Some(open) = shard {
        finish(open)?;
    }
    Ok(shards)
}

fn member_bytes(len: usize) -> u64 {
    (BLOCK + len.next_multiple_of(BLOCK)) as u64
}

/// Ends an archive with its two zero blocks.
fn finish((mut w, _, path): (BufWriter<File>, u64, PathBuf)) -> Result<()> {
    w.write_all(&[0u8; 2 * BLOCK])
        .and_then(|()| w.flush())
        .with_context(|| format!("writing {}", path.display()))
}

fn write_member(w: &mut impl Write, name: &str, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&header(name, data.len() as u64))?;
    w.write_all(data)?;
    w.write_all(&[0u8; BLOCK][..data.len().next_multiple_of(BLOCK) - data.len()])
}

/// A ustar header of a regular file (names here are short: an id and an extension).
fn header(name: &str, size: u64) -> [u8; BLOCK] {
    assert!(name.len() <= 100, "member names are an id and an extension");
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// `value` in octal, zero-padded, NUL-terminated, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    field[..width].copy_from_slice(format!("{value:0width$o}").as_bytes());
    field[width] = 0;
}

#[derive(Debug, clap::Args)]
pub(crate) struct LsArgs {
    /// The dataset: an ImageFolder or tar shards, as `lobster run --data` takes it.
    #[arg(long)]
    data: String,
    /// Print the table as JSON (a list of samples) instead of tab-separated lines.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row<'a> {
    id: u32,
    file: &'a Path,
    offset: u64,
    length: u64,
    label: u32,
    key: std::borrow::Cow<'a, str>,
}

pub(crate) fn ls(args: &LsArgs) -> Result<()> {
    let ds = Dataset::open(&args.data).with_context(|| format!("opening {}", args.data))?;
    let rows = ds.samples().iter().map(|s| Row {
        id: s.id,
        file: &s.path,
        offset: s.offset,
        length: s.size_bytes,
        label: s.label,
        key: s.key(),
    });
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if args.json {
        serde_json::to_writer(&mut out, &rows.collect::<Vec<_>>())
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        rows.into_iter().try_for_each(|r| {
            writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}",
                r.id,
                r.file.display(),
                r.offset,
                r.length,
                r.label,
                r.key
            )
        })
    };
    match written.and_then(|()| out.flush()) {
        // A reader that has seen enough (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_shards_hold_the_folders_samples_in_id_order_with_their_labels() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        crate::gen::generate(&data, 30, 3, 4.0, 1).unwrap();
        let folder = Dataset::open_image_folder(&data).unwrap();
        let out = dir.path().join("shards");
        // About 4 samples a shard.
        let shards = pack(&folder, &out, 20_000).unwrap();
        assert!(shards >= 4, "{shards}");
        let spec = format!("{}/shard-{{000000..{:06}}}.tar", out.display(), shards - 1);
        let packed = Dataset::open(&spec).unwrap();
        assert_eq!(packed.len(), folder.len());
        for (f, p) in folder.samples().iter().zip(packed.samples()) {
            assert_eq!((p.id, p.label, p.size_bytes), (f.id, f.label, f.size_bytes));
            let mut bytes = vec![0u8; p.size_bytes as usize];
            std::os::unix::fs::FileExt::read_exact_at(
                &File::open(&*p.path).unwrap(),
                &mut bytes,
                p.offset,
            )
            .unwrap();
            assert_eq!(bytes, std::fs::read(&*f.path).unwrap(), "sample {}", f.id);
        }
        // The directory alone names the same shards.
        assert_eq!(
            Dataset::open(out.to_str().unwrap()).unwrap().len(),
            folder.len()
        );
        // GNU tar, another reader, lists the same members.
        if let Ok(listed) = std::process::Command::new("tar")
            .arg("-tf")
            .arg(out.join("shard-000000.tar"))
            .output()
        {
            let names = String::from_utf8(listed.stdout).unwrap();
            assert!(names.starts_with("00000000.jpg\n00000000.cls\n"), "{names}");
        }
        // Packing again into the same place is refused.
        assert!(pack(&folder, &out, 20_000).is_err());
    }

    #[test]
    fn headers_carry_a_valid_checksum() {
        let h = header("00000001.jpg", 1234);
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let mut blank = h;
        blank[148..156].fill(b' ');
        assert_eq!(stored, blank.iter().map(|&b| u32::from(b)).sum::<u32>());
        assert_eq!(&h[124..136], b"00000002322\0");
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct IndexArgs {
    /// The ImageFolder whose sample table to build, or the shards whose indexes to build
    /// (a brace pattern, a directory of `.tar` files, a `.tar` file or a list file), local or
    /// in a bucket (`s3://...`).
    #[arg(long)]
    data: String,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
    /// Only open the dataset and print the seconds it took (how `index` times a reopen
    /// in a process of its own, as a second job would open it).
    #[arg(long, hide = true)]
    open_only: bool,
}

#[derive(Serialize)]
struct Indexed {
    data: String,
    kind: &'static str,
    samples: usize,
    /// The folder's table, or the directory holding the shards' indexes.
    table: Option<PathBuf>,
    scan_s: f64,
    reopen_s: f64,
}

/// `lobster index`: scans a folder or reads every shard, keeps the table or the shards'
/// indexes, and times a reopen in a fresh process, as the next job's.
pub(crate) fn index(args: &IndexArgs) -> Result<()> {
    let options = lobster_io::FolderOptions::default();
    // A bucket's shards and its folder-shaped prefixes are both indexed by `index_shards`
    // (a folder prefix keeps no table: its listing is its table).
    let objects = args.data.starts_with("s3://");
    let shards = objects || Dataset::names_shards(&args.data)?;
    if args.open_only {
        let started = std::time::Instant::now();
        let ds = Dataset::open(&args.data)?;
        let open_s = started.elapsed().as_secs_f64();
        println!("{open_s}\t{}", ds.len());
        return Ok(());
    }
    let started = std::time::Instant::now();
    let (ds, table) = if shards {
        let ds = Dataset::index_shards(&args.data, None)
            .with_context(|| format!("indexing {}", args.data))?;
        (ds, options.table_dir.clone())
    } else {
        Dataset::index_folder(&args.data, &options)
            .with_context(|| format!("indexing {}", args.data))?
    };
    let scan_s = started.elapsed().as_secs_f64();
    let reopened = std::process::Command::new(std::env::current_exe()?)
        .arg("index")
        .arg("--open-only")
        .arg("--data")
        .arg(&args.data)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("re-running this program to time a reopen")?;
    if !reopened.status.success() {
        bail!("the reopen of {} failed", args.data);
    }
    let line = String::from_utf8_lossy(&reopened.stdout);
    let mut fields = line.trim_end_matches('\n').splitn(2, '\t');
    let (Some(reopen_s), Some(samples)) = (fields.next(), fields.next()) else {
        bail!("the reopen printed {line:?}");
    };
    let reopen_s: f64 = reopen_s.parse().context("the reopen's seconds")?;
    if samples.parse::<usize>().ok() != Some(ds.len()) {
        bail!("the dataset changed while it was indexed: index it again");
    }
    let out = Indexed {
        data: args.data.clone(),
        kind: match (objects, shards) {
            (true, _) => "objects",
            (false, true) => "shards",
            (false, false) => "folder",
        },
        samples: ds.len(),
        table,
        scan_s,
        reopen_s,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    let what = if shards { "shard indexes in" } else { "table" };
    match &out.table {
        Some(t) => println!(
            "{} samples; {what} {}; first open {:.3} s, reopen {:.3} s ({:.0}x)",
            out.samples,
            t.display(),
            scan_s,
            reopen_s,
            scan_s / reopen_s.max(1e-9)
        ),
        None => println!(
            "{} samples; first open {:.3} s; nothing kept (no cache directory, or the data \
             changed in the last 2 s)",
            out.samples, scan_s
        ),
    }
    Ok(())
}
