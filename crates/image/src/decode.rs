//! JPEG and PNG to 8-bit RGB.

use zune_jpeg::zune_core::colorspace::ColorSpace as JpegColor;
use zune_png::zune_core::colorspace::ColorSpace as PngColor;
use zune_png::zune_core::result::DecodingResult;

use crate::error::ImageError;
use crate::region::{Region, Window, SCALES};

/// An 8-bit RGB image, rows top to bottom, `width * height * 3` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

impl Image {
    /// An image of `pixels` (RGB, row-major).
    ///
    /// # Errors
    /// [`ImageError::Shape`] when `pixels` is not `width * height * 3` bytes or a side is 0.
    pub fn new(width: u32, height: u32, pixels: Vec<u8>) -> Result<Self, ImageError> {
        ImageRef::new(width, height, &pixels)?;
        Ok(Image {
            width,
            height,
            pixels,
        })
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// RGB bytes, row-major.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// The RGB bytes, row-major, without a copy.
    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }
}

/// An RGB image held elsewhere (a cache's pages, a decoded image lent out): what the
/// transforms read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRef<'a> {
    width: u32,
    height: u32,
    pixels: &'a [u8],
}

impl<'a> ImageRef<'a> {
    /// A view of `pixels` (RGB, row-major) as a `width` x `height` image.
    ///
    /// # Errors
    /// [`ImageError::Shape`] when `pixels` is not `width * height * 3` bytes or a side is 0.
    pub fn new(width: u32, height: u32, pixels: &'a [u8]) -> Result<Self, ImageError> {
        if width == 0 || height == 0 || pixels.len() != width as usize * height as usize * 3 {
            return Err(ImageError::Shape {
                width,
                height,
                bytes: pixels.len(),
            });
        }
        Ok(ImageRef {
            width,
            height,
            pixels,
        })
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// RGB bytes, row-major.
    pub fn pixels(&self) -> &'a [u8] {
        self.pixels
    }
}

impl<'a> From<&'a Image> for ImageRef<'a> {
    fn from(image: &'a Image) -> Self {
        ImageRef {
            width: image.width,
            height: image.height,
            pixels: &image.pixels,
        }
    }
}

/// Width and height of a JPEG or PNG, read from its header alone (the first bytes of a PNG;
/// a JPEG's markers up to its frame header). `None` if `bytes` is neither, or ends before
/// the header: a caller holding only a prefix may read more.
pub fn dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let be16 = |i: usize| Some(u16::from_be_bytes(bytes.get(i..i + 2)?.try_into().ok()?));
    match bytes {
        [0x89, b'P', b'N', b'G', ..] if bytes.get(12..16) == Some(b"IHDR") => {
            let be32 = |i: usize| Some(u32::from_be_bytes(bytes.get(i..i + 4)?.try_into().ok()?));
            Some((be32(16)?, be32(20)?)).filter(|&(w, h)| w > 0 && h > 0)
        }
        [0xFF, 0xD8, ..] => {
            let mut i = 2;
            loop {
                // Markers may be preceded by fill bytes of 0xFF.
                while *bytes.get(i)? == 0xFF && *bytes.get(i + 1)? == 0xFF {
                    i += 1;
                }
                if *bytes.get(i)? != 0xFF {
                    return None;
                }
                let marker = *bytes.get(i + 1)?;
                match marker {
                    // Standalone markers: no length.
                    0x01 | 0xD0..=0xD7 => i += 2,
                    // A scan before any frame header: not a JPEG we can size.
                    0xDA | 0xD9 => return None,
                    // Frame headers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
                    0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                        let (h, w) = (be16(i + 5)?, be16(i + 7)?);
                        return Some((u32::from(w), u32::from(h))).filter(|&(w, h)| w > 0 && h > 0);
                    }
                    _ => i += 2 + usize::from(be16(i + 2)?),
                }
            }
        }
        _ => None,
    }
}

/// Pixels an image may have unless told otherwise: 2^26 (64 Mi, 8192 x 8192). Above every
/// photo of ImageNet and Open Images and any camera's up to 61 megapixels, and far below a
/// decompression bomb's 16384 x 16384 or 65535 x 65535 claims. What a pixel costs while it
/// decodes, per decode thread: 3 bytes of RGB out, plus the decoder's own buffers, about
/// 4 to 8 bytes for a JPEG (its component planes, 4 channels for CMYK) and up to 16 for a
/// PNG (its inflated rows and samples at 8 bytes a pixel for 16-bit RGBA), so at most
/// about 1.2 GiB for the largest image let through.
pub const PIXELS_MAX_DEFAULT: u64 = 1 << 26;

/// Decodes a JPEG (any of its colour spaces: YCbCr, grayscale, CMYK, YCCK) or a PNG (any
/// colour type and depth; alpha dropped, 16 bits to 8) to RGB, refusing an image of more
/// than [`PIXELS_MAX_DEFAULT`] pixels. The format is told by the bytes, not a name.
///
/// # Errors
/// Neither format, a file the decoder refuses, a JPEG cut short (no end-of-image marker
/// after its last scan: the decoder would fill the missing rows with grey), or
/// [`ImageError::TooManyPixels`].
pub fn decode(bytes: &[u8]) -> Result<Image, ImageError> {
    decode_within(bytes, PIXELS_MAX_DEFAULT)
}

/// The most pixels any bound lets through, 2^32: about a 65535 x 65535 JPEG, the largest
/// its header can claim. A bound above it is taken as it, so that no header can ask the
/// decoders for a buffer past what a `usize` of a 64-bit machine holds.
pub const PIXELS_MAX_LIMIT: u64 = 1 << 32;

/// [`decode`], refusing an image whose header claims more than `pixels_max` pixels (at most
/// [`PIXELS_MAX_LIMIT`]) before the decoder allocates anything of its size.
///
/// # Errors
/// As [`decode`]; [`ImageError::TooManyPixels`] names the header's dimensions and the bound.
pub fn decode_within(bytes: &[u8], pixels_max: u64) -> Result<Image, ImageError> {
    let mut pixels = Vec::new();
    let (width, height) = decode_into(bytes, pixels_max, &mut pixels, 0)?;
    Image::new(width, height, pixels)
}

/// [`decode_within`] into `out` from byte `at` on: `out` ends with the image's RGB bytes and
/// has exactly `at + width * height * 3` of them, its first `at` kept. A buffer reused from
/// image to image is neither allocated nor cleared again where it is long enough already,
/// and a JPEG is decoded in place, not copied (the decode threads' cost beside the decoder
/// is mostly these two). Returns the width and height.
///
/// # Errors
/// As [`decode_within`]; `out` is then left at `at` bytes or more, its contents unspecified
/// past `at`.
pub fn decode_into(
    bytes: &[u8],
    pixels_max: u64,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<(u32, u32), ImageError> {
    let pixels_max = pixels_max.min(PIXELS_MAX_LIMIT);
    if out.len() < at {
        return Err(ImageError::Buffer {
            expected: at,
            actual: out.len(),
        });
    }
    // The probe refuses before any decoder exists; each decoder checks its own reading of
    // the header again before it decodes, in case the two read it differently.
    let probed = dimensions(bytes);
    if let Some((width, height)) = probed {
        check_pixels(width, height, pixels_max)?;
    }
    match bytes {
        [0xFF, 0xD8, 0xFF, ..] => jpeg(bytes, probed, pixels_max, out, at),
        [0x89, b'P', b'N', b'G', ..] => png(bytes, pixels_max, out, at),
        _ => Err(ImageError::UnknownFormat {
            magic: bytes
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" "),
        }),
    }
}

/// Decodes at least the part of an image that covers `region` (clipped to the image), at
/// 1/`scale` of its resolution where the format allows it, into `out` from byte `at` on as
/// [`decode_into`] does. Returns the window it made, which holds the region: a baseline
/// JPEG decodes only the blocks the region touches (and the rows above it, which its
/// entropy coding passes through) at the scale asked; any other image decodes whole, at
/// scale 1, and the window is the whole image.
///
/// # Errors
/// As [`decode_within`]; a region outside the image or empty, or a scale not in
/// [`SCALES`], is [`ImageError::Region`].
pub fn decode_region_into(
    bytes: &[u8],
    pixels_max: u64,
    region: Region,
    scale: u32,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Window, ImageError> {
    let bad = |reason: &str| ImageError::Region {
        region,
        scale,
        reason: reason.into(),
    };
    if !SCALES.contains(&scale) {
        return Err(bad("a scale of 1, 2, 4 or 8"));
    }
    if region.width == 0 || region.height == 0 {
        return Err(bad("an empty region"));
    }
    let inside = |width: u32, height: u32| {
        let inside = u64::from(region.left) + u64::from(region.width) <= u64::from(width)
            && u64::from(region.top) + u64::from(region.height) <= u64::from(height);
        if inside {
            Ok(())
        } else {
            Err(bad(&format!("outside the {width} x {height} image")))
        }
    };
    // A baseline JPEG: the region decoder, its checks made once the header is read.
    let accept = |width: u32, height: u32| {
        check_pixels(width, height, pixels_max.min(PIXELS_MAX_LIMIT))?;
        inside(width, height)?;
        if !jpeg_is_whole(bytes) {
            return Err(ImageError::Jpeg {
                reason: "truncated (no end-of-image marker after its last scan)".into(),
            });
        }
        Ok(())
    };
    let part = crate::jpeg::Rect {
        left: region.left,
        top: region.top,
        width: region.width,
        height: region.height,
    };
    if let Some((w, s)) = crate::jpeg::decode_region(bytes, part, scale, accept, out, at)? {
        return Ok(Window {
            width: w.width,
            height: w.height,
            left: w.left,
            top: w.top,
            scale: s,
        });
    }
    let (width, height) = decode_into(bytes, pixels_max, out, at)?;
    inside(width, height)?;
    Ok(Window {
        width,
        height,
        left: 0,
        top: 0,
        scale: 1,
    })
}

/// `out` at exactly `at + len` bytes: cut, or grown with zeros only past its old length.
fn fit(out: &mut Vec<u8>, at: usize, len: usize) -> &mut [u8] {
    out.resize(at + len, 0);
    &mut out[at..]
}

/// Whether a `width` x `height` image is within `pixels_max` pixels.
///
/// # Errors
/// [`ImageError::TooManyPixels`] naming both.
pub fn check_pixels(width: u32, height: u32, pixels_max: u64) -> Result<(), ImageError> {
    if u64::from(width) * u64::from(height) > pixels_max {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            pixels_max,
        });
    }
    Ok(())
}

/// A side no image within `pixels_max` can exceed: the decoders' own limit, a second guard.
fn side_max(pixels_max: u64) -> usize {
    usize::try_from(pixels_max).unwrap_or(usize::MAX)
}

/// Whether a JPEG's end-of-image marker follows its last start-of-scan: inside entropy-
/// coded data every 0xFF is stuffed (FF 00), so either marker's two bytes appear only as
/// markers. Read without crossing the scan data: the last end is near the file's end, and
/// a first scan near its start.
pub(crate) fn jpeg_is_whole(bytes: &[u8]) -> bool {
    const SOS: [u8; 2] = [0xFF, 0xDA];
    let Some(eoi) = bytes.windows(2).rposition(|w| w == [0xFF, 0xD9]) else {
        return false;
    };
    let has = |part: &[u8]| part.windows(2).any(|w| w == SOS);
    has(&bytes[..eoi]) && !has(&bytes[eoi..])
}

/// `probed`: the size [`dimensions`] read from `bytes`.
fn jpeg(
    bytes: &[u8],
    probed: Option<(u32, u32)>,
    pixels_max: u64,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<(u32, u32), ImageError> {
    let fail = |reason: String| ImageError::Jpeg { reason };
    if !jpeg_is_whole(bytes) {
        return Err(fail(
            "truncated (no end-of-image marker after its last scan)".into(),
        ));
    }
    // A baseline JPEG: lobster-image's own decoder, which writes the pixels straight into
    // `out` and, at full scale, is a few per cent faster than zune-jpeg's; anything it does
    // not take (progressive, CMYK, separate scans) is zune-jpeg's.
    let mut size = None;
    let accept = |width: u32, height: u32| {
        check_pixels(width, height, pixels_max)?;
        size = Some((width, height));
        Ok(())
    };
    if let Some((w, h)) = probed {
        let all = crate::jpeg::Rect {
            left: 0,
            top: 0,
            width: w,
            height: h,
        };
        if let Some((window, _)) = crate::jpeg::decode_region(bytes, all, 1, accept, out, at)? {
            if Some((window.width, window.height)) != size || (window.left, window.top) != (0, 0) {
                return Err(fail(format!(
                    "{} x {} decoded of a {w} x {h} image",
                    window.width, window.height
                )));
            }
            return Ok((window.width, window.height));
        }
    }
    let options = zune_jpeg::zune_core::options::DecoderOptions::default()
        .jpeg_set_out_colorspace(JpegColor::RGB)
        .set_max_width(side_max(pixels_max))
        .set_max_height(side_max(pixels_max));
    let mut d = zune_jpeg::JpegDecoder::new_with_options(bytes, options);
    guarded(fail, || {
        d.decode_headers().map_err(|e| fail(format!("{e:?}")))
    })?;
    let info = d.info().ok_or_else(|| fail("no header".into()))?;
    let (width, height) = (u32::from(info.width), u32::from(info.height));
    check_pixels(width, height, pixels_max)?;
    let area = width as usize * height as usize;
    // A grayscale JPEG comes out as one channel whatever colour space is asked for, and a
    // CMYK one as four: those are decoded aside and converted.
    let channels = d.output_buffer_size().map_or(0, |size| size / area.max(1));
    match channels {
        3 => {
            let rgb = fit(out, at, area * 3);
            guarded(fail, || {
                d.decode_into(rgb).map_err(|e| fail(format!("{e:?}")))
            })?;
        }
        1 | 4 => {
            let decoded = guarded(fail, || d.decode().map_err(|e| fail(format!("{e:?}"))))?;
            if decoded.len() != area * channels {
                return Err(fail(format!(
                    "{} bytes decoded for {width} x {height} x {channels}",
                    decoded.len()
                )));
            }
            let rgb = fit(out, at, area * 3);
            for (p, px) in rgb.chunks_exact_mut(3).zip(decoded.chunks_exact(channels)) {
                match *px {
                    [l] => p.fill(l),
                    [r, g, b, _] => p.copy_from_slice(&[r, g, b]),
                    _ => unreachable!("chunks of 1 or 4"),
                }
            }
        }
        other => return Err(fail(format!("{other} channels out of the decoder"))),
    }
    if d.info().map(|i| (u32::from(i.width), u32::from(i.height))) != Some((width, height)) {
        return Err(fail("a second frame header of other dimensions".into()));
    }
    Ok((width, height))
}

fn png(
    bytes: &[u8],
    pixels_max: u64,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<(u32, u32), ImageError> {
    let fail = |reason: String| ImageError::Png { reason };
    let options = zune_png::zune_core::options::DecoderOptions::default()
        .set_max_width(side_max(pixels_max))
        .set_max_height(side_max(pixels_max));
    let mut d = zune_png::PngDecoder::new_with_options(bytes, options);
    guarded(fail, || {
        d.decode_headers().map_err(|e| fail(format!("{e:?}")))
    })?;
    let (width, height) = d.get_dimensions().ok_or_else(|| fail("no header".into()))?;
    let side = |s: usize| u32::try_from(s).map_err(|_| fail(format!("a side of {s} pixels")));
    let (width, height) = (side(width)?, side(height)?);
    check_pixels(width, height, pixels_max)?;
    let decoded = guarded(fail, || d.decode().map_err(|e| fail(format!("{e:?}"))))?;
    let color = d
        .get_colorspace()
        .ok_or_else(|| fail("no colour type".into()))?;
    // 16-bit samples keep their high byte.
    let samples: Vec<u8> = match decoded {
        DecodingResult::U8(v) => v,
        DecodingResult::U16(v) => v.into_iter().map(|s| (s >> 8) as u8).collect(),
        _ => return Err(fail("samples of another type than 8 or 16 bits".into())),
    };
    let pixels = match color {
        PngColor::RGB => samples,
        PngColor::RGBA => samples
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        PngColor::Luma => samples.iter().flat_map(|&l| [l, l, l]).collect(),
        PngColor::LumaA => samples
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        other => return Err(fail(format!("colour space {other:?}"))),
    };
    let expected = width as usize * height as usize * 3;
    if pixels.len() != expected {
        return Err(fail(format!(
            "{} bytes decoded for {width} x {height} x 3",
            pixels.len()
        )));
    }
    fit(out, at, expected).copy_from_slice(&pixels);
    Ok((width, height))
}

/// Runs a decoder's step, a panic in it made `fail`'s error: zune-jpeg's bit reader asserts,
/// in builds with debug assertions, what a hostile scan breaks (in others it saturates).
fn guarded<R>(
    fail: impl Fn(String) -> ImageError,
    step: impl FnOnce() -> Result<R, ImageError>,
) -> Result<R, ImageError> {
    #[cfg(fuzzing)]
    let _guard = fuzz_hook::Guarded::enter();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".into());
        Err(fail(format!("the decoder panicked: {text}")))
    })
}

/// The fuzzer aborts on any panic, before unwinding; a panic inside [`guarded`] is the
/// decoder's, which the library turns into an error, so it must unwind to it there too.
#[cfg(fuzzing)]
mod fuzz_hook {
    use std::cell::Cell;

    thread_local! {
        static GUARDED: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) struct Guarded(bool);

    impl Guarded {
        pub(super) fn enter() -> Self {
            static HOOK: std::sync::Once = std::sync::Once::new();
            HOOK.call_once(|| {
                let fuzzer = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    if !GUARDED.with(Cell::get) {
                        fuzzer(info);
                    }
                }));
            });
            Guarded(GUARDED.with(|g| g.replace(true)))
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            GUARDED.with(|g| g.set(self.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_bytes_are_named_by_their_first_bytes() {
        let e = decode(b"GIF89a...").unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a JPEG or PNG (first bytes 47 49 46 38 39 61 2e 2e)"
        );
    }

    #[test]
    fn dimensions_come_from_headers_and_a_short_prefix_gives_none() {
        // A JPEG: SOI, an APP0 segment of 4 bytes, SOF0 of a 3x2 image.
        let jpeg = [
            0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 1, 2, 0xFF, 0xC0, 0, 11, 8, 0, 2, 0, 3, 1, 1, 0x11, 0,
        ];
        assert_eq!(dimensions(&jpeg), Some((3, 2)));
        assert_eq!(dimensions(&jpeg[..14]), None);
        let mut png = vec![0x89, b'P', b'N', b'G', 13, 10, 26, 10, 0, 0, 0, 13];
        png.extend_from_slice(b"IHDR");
        png.extend_from_slice(&640u32.to_be_bytes());
        png.extend_from_slice(&480u32.to_be_bytes());
        assert_eq!(dimensions(&png), Some((640, 480)));
        assert_eq!(dimensions(b"GIF89a"), None);
    }

    #[test]
    fn a_jpeg_is_whole_only_with_its_end_after_its_last_scan() {
        assert!(jpeg_is_whole(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9]));
        assert!(!jpeg_is_whole(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2]));
        // An end before the last scan (a thumbnail's) does not count.
        assert!(!jpeg_is_whole(&[0xFF, 0xD9, 0xFF, 0xDA, 1]));
    }
}
