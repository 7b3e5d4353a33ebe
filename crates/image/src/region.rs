//! Part of an image to decode, and what such a decode made.

/// A rectangle of an image, in its pixels: `left` and `top` of its first pixel, and its
/// width and height.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub left: u32,
    pub top: u32,
    pub width: u32,
    pub height: u32,
}

/// What [`decode_region_into`](crate::decode_region_into) made: a `width` x `height` RGB image of the source's pixels
/// from (`left`, `top`) on at 1/`scale` of its resolution, each output pixel standing for
/// `scale` x `scale` source pixels (fewer at the image's right and bottom edges).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub width: u32,
    pub height: u32,
    pub left: u32,
    pub top: u32,
    /// 1, 2, 4 or 8.
    pub scale: u32,
}

/// The DCT scales a JPEG decodes at: the source's side divided by 1, 2, 4 or 8.
pub const SCALES: [u32; 4] = [1, 2, 4, 8];
