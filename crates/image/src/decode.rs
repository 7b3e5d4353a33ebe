//! JPEG and PNG to 8-bit RGB.

use zune_jpeg::zune_core::colorspace::ColorSpace as JpegColor;
use zune_png::zune_core::colorspace::ColorSpace as PngColor;
use zune_png::zune_core::result::DecodingResult;

use crate::error::ImageError;

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
        if width == 0 || height == 0 || pixels.len() != width as usize * height as usize * 3 {
            return Err(ImageError::Shape {
                width,
                height,
                bytes: pixels.len(),
            });
        }
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
}

/// Decodes a JPEG (any of its colour spaces: YCbCr, grayscale, CMYK, YCCK) or a PNG (any
/// colour type and depth; alpha dropped, 16 bits to 8) to RGB. The format is told by the
/// bytes, not a name.
///
/// # Errors
/// Neither format, a file the decoder refuses, or a JPEG cut short (no end-of-image marker
/// after its last scan: the decoder would fill the missing rows with grey).
pub fn decode(bytes: &[u8]) -> Result<Image, ImageError> {
    match bytes {
        [0xFF, 0xD8, 0xFF, ..] => jpeg(bytes),
        [0x89, b'P', b'N', b'G', ..] => png(bytes),
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

fn jpeg(bytes: &[u8]) -> Result<Image, ImageError> {
    let fail = |reason: String| ImageError::Jpeg { reason };
    if !jpeg_is_whole(bytes) {
        return Err(fail(
            "truncated (no end-of-image marker after its last scan)".into(),
        ));
    }
    let options = zune_jpeg::zune_core::options::DecoderOptions::default()
        .jpeg_set_out_colorspace(JpegColor::RGB);
    let mut d = zune_jpeg::JpegDecoder::new_with_options(bytes, options);
    let pixels = d.decode().map_err(|e| fail(format!("{e:?}")))?;
    let info = d.info().ok_or_else(|| fail("no header".into()))?;
    let (width, height) = (u32::from(info.width), u32::from(info.height));
    // A grayscale JPEG comes out as one channel whatever colour space is asked for.
    let pixels = match pixels.len() / (width as usize * height as usize).max(1) {
        1 => pixels.iter().flat_map(|&l| [l, l, l]).collect(),
        4 => pixels
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        _ => pixels,
    };
    Image::new(width, height, pixels)
}

fn png(bytes: &[u8]) -> Result<Image, ImageError> {
    let fail = |reason: String| ImageError::Png { reason };
    let mut d = zune_png::PngDecoder::new(bytes);
    let decoded = d.decode().map_err(|e| fail(format!("{e:?}")))?;
    let (width, height) = d.get_dimensions().ok_or_else(|| fail("no header".into()))?;
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
    Image::new(width as u32, height as u32, pixels)
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
    fn a_jpeg_is_whole_only_with_its_end_after_its_last_scan() {
        assert!(jpeg_is_whole(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9]));
        assert!(!jpeg_is_whole(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2]));
        // An end before the last scan (a thumbnail's) does not count.
        assert!(!jpeg_is_whole(&[0xFF, 0xD9, 0xFF, 0xDA, 1]));
    }
}
