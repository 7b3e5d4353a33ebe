//! Each sample's image header, probed once: the decoded tier sizes a decoded image and
//! prices its decode from it. Probes are kept in the dataset's table or shard indexes, so
//! that a second open reads no image: on a parallel file system a probe of every sample is
//! a read per file, minutes for ImageNet.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::source::Source;
use super::table::{Dataset, Kept, LinesFrom, Probe, SampleMeta};
use super::table_file::{read_sealed_any, seal, split, write_atomically, KEPT_MAX_BYTES};

/// Bytes of a sample read first to find its header: a JPEG's frame header follows its
/// APPn segments, most within the first few KiB.
const FIRST_BYTES: u64 = 4 << 10;
/// Bytes read next where the header was not in the first (an EXIF thumbnail before it);
/// then the whole sample.
const SECOND_BYTES: u64 = 64 << 10;
/// Threads probing: enough to overlap a network file system's latency.
const PROBE_THREADS: usize = 8;

impl Dataset {
    /// Every sample's image header (a JPEG's or PNG's size), in id order: as its table or
    /// shard index keeps it, else probed (a few KiB of each sample read; more only where the
    /// header is further in) and then kept there, unless the table was replaced since it
    /// was read. Asked once per dataset value; a sample that cannot be read is
    /// [`Probe::NoHeader`] (its read fails, naming it, when it is accessed).
    pub fn image_probes(&self) -> Arc<[Probe]> {
        self.probed
            .get_or_init(|| {
                let mut probes = self.probes.clone();
                probes.resize(self.samples.len(), Probe::Unprobed);
                // Only the files holding a sample not yet probed are written again.
                let stale: Vec<&Kept> = self
                    .kept
                    .iter()
                    .filter(|k| {
                        probes
                            .get(k.samples.clone())
                            .is_some_and(|p| p.contains(&Probe::Unprobed))
                    })
                    .collect();
                probe_all(&self.samples, &self.source, &mut probes);
                for kept in stale {
                    if let Err(e) = keep_probes(kept, &probes[kept.samples.clone()]) {
                        log::warn!(
                            "lobster-io: could not keep image sizes in {}: {e}",
                            kept.path.display()
                        );
                    }
                }
                probes.into()
            })
            .clone()
    }
}

/// Probes every [`Probe::Unprobed`] sample of `probes`, on [`PROBE_THREADS`] threads.
fn probe_all(samples: &[SampleMeta], source: &Source, probes: &mut [Probe]) {
    let chunk = samples.len().div_ceil(PROBE_THREADS).max(1);
    std::thread::scope(|s| {
        for (metas, out) in samples.chunks(chunk).zip(probes.chunks_mut(chunk)) {
            s.spawn(move || {
                for (meta, probe) in metas.iter().zip(out) {
                    if *probe == Probe::Unprobed {
                        *probe = probe_one(source, meta);
                    }
                }
            });
        }
    });
}

/// The first `len` bytes of a sample, or `None` if they cannot be read.
fn read_start(source: &Source, meta: &SampleMeta, len: u64) -> Option<Vec<u8>> {
    match source {
        Source::Files => {}
        #[cfg(feature = "s3")]
        Source::Objects(objects) => {
            let read = objects.read(&meta.path, (meta.offset, len, false), 0);
            return objects.store.get(&read).ok().map(|b| b.to_vec());
        }
    }
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    File::open(&meta.path)
        .and_then(|f| f.read_exact_at(&mut buf, meta.offset))
        .ok()?;
    Some(buf)
}

/// One sample's header: the first [`FIRST_BYTES`], then [`SECOND_BYTES`], then all of it,
/// until the header is found.
fn probe_one(source: &Source, meta: &SampleMeta) -> Probe {
    let mut read = 0;
    for len in [FIRST_BYTES, SECOND_BYTES, meta.size_bytes] {
        let len = len.min(meta.size_bytes);
        if len <= read {
            continue;
        }
        let Some(bytes) = read_start(source, meta, len) else {
            return Probe::NoHeader;
        };
        read = len;
        if let Some(probe) = probe_bytes(&bytes) {
            return probe;
        }
    }
    Probe::NoHeader
}

/// The probe of a sample's first bytes, if they hold its header.
pub(crate) fn probe_bytes(bytes: &[u8]) -> Option<Probe> {
    let (width, height) = lobster_image::dimensions(bytes)?;
    Some(match bytes[0] {
        0x89 => Probe::Png { width, height },
        _ => Probe::Jpeg { width, height },
    })
}

/// Rewrites `kept` with `probes` (its samples') in its sample lines' probe field, the
/// fourth, if it is still the file this dataset read or wrote.
fn keep_probes(kept: &Kept, probes: &[Probe]) -> Result<(), String> {
    let (bytes, check) = read_sealed_any(&kept.path, KEPT_MAX_BYTES)?;
    if check != kept.check {
        // Replaced since (another process kept its probes, or the folder changed).
        return Ok(());
    }
    let lines_at = match kept.lines_from {
        LinesFrom::FirstSample => memchr::memmem::find(&bytes, b"\ns\t").map(|i| i + 1),
        LinesFrom::Skip(n) => {
            let mut at = 0;
            for _ in 0..n {
                at += memchr::memchr(b'\n', &bytes[at..]).ok_or("too few lines")? + 1;
            }
            Some(at)
        }
    }
    .ok_or("no sample lines")?;
    let mut out = Vec::with_capacity(bytes.len() + 12 * probes.len());
    out.extend_from_slice(&bytes[..lines_at]);
    let mut probes = probes.iter();
    for line in split(&bytes[lines_at..], b'\n').filter(|l| !l.is_empty()) {
        let probe = probes.next().ok_or("more sample lines than samples")?;
        let mut fields = line.splitn(5, |&b| b == b'\t');
        let head: Vec<&[u8]> = fields.by_ref().take(3).collect();
        let (Some(_), Some(rest)) = (fields.next(), fields.next()) else {
            return Err("a sample line without a probe field".into());
        };
        for f in head {
            out.extend_from_slice(f);
            out.push(b'\t');
        }
        probe.write(&mut out);
        out.push(b'\t');
        out.extend_from_slice(rest);
        out.push(b'\n');
    }
    if probes.next().is_some() {
        return Err("fewer sample lines than samples".into());
    }
    seal(&mut out);
    write_atomically(&kept.path, &out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_written_and_parsed_back() {
        for p in [
            Probe::Unprobed,
            Probe::NoHeader,
            Probe::Jpeg {
                width: 1,
                height: u32::MAX,
            },
            Probe::Png {
                width: 640,
                height: 480,
            },
        ] {
            let mut out = Vec::new();
            p.write(&mut out);
            assert_eq!(
                Probe::parse(&out),
                Some(p),
                "{}",
                String::from_utf8_lossy(&out)
            );
        }
        for bad in [
            &b""[..],
            b"j",
            b"j0x5",
            b"j5x",
            b"jx5",
            b"j4294967296x1",
            b"p1x1x1",
            b"q1x1",
            b"j+1x1",
        ] {
            assert_eq!(Probe::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
