//! A baseline JPEG decoder that decodes only a region, at 1/1 to 1/8 of the resolution.
//!
//! It takes 8-bit Huffman sequential frames (SOF0, SOF1) of one component (grey) or three
//! (YCbCr, the first component's sampling the largest, each other's a half or a quarter
//! across and a half or a whole down), with or without restart markers, and says `None`
//! to anything else so that the caller decodes it another way. Rows of blocks below the
//! region are never read; those above are entropy-decoded only (or skipped to their next
//! restart marker), and only the block columns the region touches, plus one each side
//! where chroma upsampling reads its neighbours, are transformed and converted.

#[cfg(any(test, fuzzing))]
pub(crate) mod check;
mod color;
mod header;
mod huffman;
mod idct;
mod interleave;
mod scan;
mod simd;

use std::cell::RefCell;

use crate::error::ImageError;

pub(crate) use scan::Rect;
use scan::Scratch;

thread_local! {
    static SCRATCH: RefCell<Box<Scratch>> = RefCell::new(Box::default());
}

/// Most bytes of component planes a thread keeps between images: a 16 MiB plane is a
/// 16-megapixel component, above ImageNet's photographs; a larger one is freed after its
/// image.
const PLANES_KEPT_BYTES_MAX: usize = 16 << 20;

fn fail(reason: String) -> ImageError {
    ImageError::Jpeg { reason }
}
/// Decodes the part of a baseline JPEG that covers `region` at 1/`scale` (1, 2, 4 or 8)
/// into `out` from byte `at` on (exactly `at + width * height * 3` bytes then), or says
/// `Ok(None)` for a JPEG this decoder does not take (or bytes that are no JPEG). `accept`
/// is given the image's width and height from its header before anything of their size
/// is allocated: its error (a bound passed, a region outside, a file cut short) is
/// returned. Returns the rectangle of the source decoded (at the left and top of the MCU
/// holding the region's) and the window's width and height at the scale, in a [`Rect`],
/// and the scale.
///
/// # Errors
/// `accept`'s; a corrupt JPEG, naming what is wrong.
pub(crate) fn decode_region(
    bytes: &[u8],
    region: Rect,
    scale: u32,
    accept: impl FnOnce(u32, u32) -> Result<(), ImageError>,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Option<(Rect, u32)>, ImageError> {
    if !matches!(bytes, [0xFF, 0xD8, 0xFF, ..]) || !matches!(scale, 1 | 2 | 4 | 8) {
        return Ok(None);
    }
    if out.len() < at {
        return Err(ImageError::Buffer {
            expected: at,
            actual: out.len(),
        });
    }
    SCRATCH.with(|scratch| {
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            return Ok(None);
        };
        let scratch = &mut **scratch;
        let Some(frame) = header::read_headers(bytes, &mut scratch.tables).map_err(fail)? else {
            return Ok(None);
        };
        let (width, height) = (frame.width as u32, frame.height as u32);
        accept(width, height)?;
        // The caller's check, made again: the decode relies on it.
        let inside = u64::from(region.left) + u64::from(region.width) <= u64::from(width)
            && u64::from(region.top) + u64::from(region.height) <= u64::from(height);
        if !inside || region.width == 0 || region.height == 0 {
            return Err(fail(format!(
                "the region {region:?} is not inside the {width} x {height} image"
            )));
        }
        let decoded = simd::decode(bytes, &frame, region, scale as usize, scratch, out, at);
        scratch.shrink(PLANES_KEPT_BYTES_MAX);
        decoded.map(|window| Some((window, scale))).map_err(fail)
    })
}
