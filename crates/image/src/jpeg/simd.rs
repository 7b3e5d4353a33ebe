//! The one place the decoder is built twice: for CPUs with AVX2 (found at run time) and
//! for any x86-64 or other CPU. Both run the same code, so they give the same bytes.
#![allow(unsafe_code)]

use super::header::Frame;
use super::scan::{decode_scan, Rect, Scratch};

/// [`decode_scan`], with AVX2 where the CPU has it.
pub(super) fn decode(
    bytes: &[u8],
    frame: &Frame,
    region: Rect,
    scale: usize,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Rect, String> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just found to have AVX2, the one thing `decode_avx2` needs.
        return unsafe { decode_avx2(bytes, frame, region, scale, scratch, out, at) };
    }
    decode_scan(bytes, frame, region, scale, scratch, out, at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn decode_avx2(
    bytes: &[u8],
    frame: &Frame,
    region: Rect,
    scale: usize,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Rect, String> {
    decode_scan(bytes, frame, region, scale, scratch, out, at)
}
