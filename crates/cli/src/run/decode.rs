//! The CLI's decoders: real JPEG, none, or a CPU cost per KiB.

use std::fmt;
use std::time::{Duration, Instant};

use lobster_io::SampleMeta;
use serde::Serialize;

/// How samples are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decoder {
    /// Real JPEG decoding (zune-jpeg).
    Jpeg,
    /// No decoding: the bytes are the sample.
    Raw,
    /// A CPU cost per KiB (`--decode-us-per-kb`), checksumming the bytes.
    Synthetic,
}

/// An error of the CLI's decoders.
#[derive(Debug)]
pub(crate) struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Whether a JPEG's end-of-image marker follows its last start-of-scan: inside the entropy-
/// coded data every 0xFF is stuffed (FF 00), so the two bytes of either marker appear only as
/// markers. zune-jpeg decodes a file cut short in a scan without a word (a grey tail).
fn ends_after_last_scan(bytes: &[u8]) -> bool {
    let last = |marker: [u8; 2]| bytes.windows(2).rposition(|w| w == marker);
    matches!((last([0xFF, 0xDA]), last([0xFF, 0xD9])), (Some(sos), Some(eoi)) if eoi > sos)
}

/// Decodes one sample; the value is a small digest so nothing is optimised away.
pub(crate) fn decode(
    decoder: Decoder,
    us_per_kb: f64,
    bytes: &[u8],
    meta: &SampleMeta,
) -> Result<u64, DecodeError> {
    match decoder {
        Decoder::Raw => Ok(bytes.len() as u64),
        Decoder::Jpeg => {
            if !ends_after_last_scan(bytes) {
                return Err(DecodeError(format!(
                    "JPEG of {}: truncated (no end-of-image marker after its last scan)",
                    meta.path.display()
                )));
            }
            let mut d = zune_jpeg::JpegDecoder::new(bytes);
            let pixels = d
                .decode()
                .map_err(|e| DecodeError(format!("JPEG of {}: {e:?}", meta.path.display())))?;
            Ok(pixels.iter().step_by(4099).map(|&b| u64::from(b)).sum())
        }
        Decoder::Synthetic => {
            let budget = Duration::from_secs_f64(us_per_kb * bytes.len() as f64 / 1024.0 / 1e6);
            let started = Instant::now();
            let mut digest = 0u64;
            // Spin on the bytes until the CPU cost is paid: a stand-in for decode + augment.
            while started.elapsed() < budget {
                for chunk in bytes.chunks(4096) {
                    digest = digest.wrapping_mul(31).wrapping_add(u64::from(chunk[0]));
                }
            }
            Ok(digest)
        }
    }
}
