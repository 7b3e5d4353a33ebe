//! What can go wrong with an image.

use std::fmt;

/// An image that cannot be decoded, transformed or collated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageError {
    /// Neither JPEG nor PNG: the first bytes, in hex.
    UnknownFormat { magic: String },
    /// A JPEG the decoder refused, or one cut short.
    Jpeg { reason: String },
    /// A PNG the decoder refused.
    Png { reason: String },
    /// Pixels and dimensions that do not agree.
    Shape {
        width: u32,
        height: u32,
        bytes: usize,
    },
    /// An image whose header claims more pixels than the bound: refused before decoding.
    TooManyPixels {
        width: u32,
        height: u32,
        pixels_max: u64,
    },
    /// A transform's or a batch's buffer of the wrong size.
    Buffer { expected: usize, actual: usize },
    /// A batch already holding all its images.
    BatchFull { capacity: usize },
    /// The resizer's failure.
    Resize { reason: String },
    /// A region to decode that is empty or outside the image, or a scale not offered.
    Region {
        region: crate::region::Region,
        scale: u32,
        reason: String,
    },
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::UnknownFormat { magic } => {
                write!(f, "not a JPEG or PNG (first bytes {magic})")
            }
            ImageError::Jpeg { reason } => write!(f, "JPEG: {reason}"),
            ImageError::Png { reason } => write!(f, "PNG: {reason}"),
            ImageError::Shape {
                width,
                height,
                bytes,
            } => write!(f, "{bytes} bytes are not a {width}x{height} RGB image"),
            ImageError::TooManyPixels {
                width,
                height,
                pixels_max,
            } => write!(
                f,
                "{width}x{height} is {} pixels, more than the bound of {pixels_max} \
                 (pixels_max)",
                u64::from(*width) * u64::from(*height)
            ),
            ImageError::Buffer { expected, actual } => {
                write!(f, "a buffer of {actual} bytes where {expected} are needed")
            }
            ImageError::BatchFull { capacity } => {
                write!(f, "the batch already holds its {capacity} images")
            }
            ImageError::Resize { reason } => write!(f, "resizing: {reason}"),
            ImageError::Region {
                region,
                scale,
                reason,
            } => write!(
                f,
                "the region {}x{} at ({}, {}) at 1/{scale}: {reason}",
                region.width, region.height, region.left, region.top
            ),
        }
    }
}

impl std::error::Error for ImageError {}
