//! Decoding against images Pillow wrote (tests/data/make_images.py): every JPEG colour
//! space (YCbCr, grayscale, CMYK, progressive) and PNG colour type comes out as 24x16 RGB of
//! the colour it was made from.

use lobster_image::{decode, ImageError};

mod common;
use common::data;

/// Every pixel of `name` within `tolerance` of `rgb` (JPEG is lossy).
fn flat(name: &str, rgb: [u8; 3], tolerance: u8) {
    let image = decode(&data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!((image.width(), image.height()), (24, 16), "{name}");
    for p in image.pixels().chunks_exact(3) {
        for c in 0..3 {
            assert!(
                p[c].abs_diff(rgb[c]) <= tolerance,
                "{name}: {p:?} against {rgb:?}"
            );
        }
    }
}

#[test]
fn jpegs_of_every_colour_space_decode_to_rgb() {
    flat("rgb.jpg", [200, 100, 50], 6);
    flat("progressive.jpg", [200, 100, 50], 6);
    flat("cmyk.jpg", [200, 100, 50], 6);
    flat("gray.jpg", [124, 124, 124], 3);
}

#[test]
fn pngs_of_every_colour_type_decode_to_rgb() {
    flat("rgb.png", [200, 100, 50], 0);
    flat("rgba.png", [200, 100, 50], 0);
    flat("palette.png", [200, 100, 50], 0);
    flat("gray.png", [124, 124, 124], 0);
    flat("gray16.png", [124, 124, 124], 0);
}

#[test]
fn a_truncated_jpeg_and_a_damaged_png_are_errors() {
    let jpeg = data("rgb.jpg");
    let e = decode(&jpeg[..jpeg.len() / 2]).unwrap_err();
    assert!(
        matches!(e, ImageError::Jpeg { .. }) && e.to_string().contains("truncated"),
        "{e}"
    );
    let mut png = data("rgb.png");
    let n = png.len();
    png[n - 20] ^= 0xFF;
    assert!(
        matches!(decode(&png), Err(ImageError::Png { .. })),
        "{:?}",
        decode(&png)
    );
}

#[test]
fn a_scan_that_breaks_the_jpeg_bit_reader_is_an_error_not_a_panic() {
    // Found by the image_header fuzz target: one byte of the progressive fixture's scan
    // flipped makes zune-jpeg's bit reader assert (with debug assertions, as tests build).
    let mut bytes = data("progressive.jpg");
    let at = 0xFF75 % bytes.len();
    bytes[at] ^= 0xFF;
    let e = decode(&bytes).unwrap_err();
    assert!(matches!(e, ImageError::Jpeg { .. }), "{e}");
}

#[test]
fn decoding_into_a_reused_buffer_gives_the_same_pixels_after_its_prefix() {
    let names = [
        "rgb.jpg",
        "progressive.jpg",
        "cmyk.jpg",
        "gray.jpg",
        "rgba.png",
        "gray16.png",
    ];
    // One buffer through every image: longer than needed (cut), then shorter (grown).
    let mut out = vec![0xAB; 4000];
    for name in names {
        let bytes = data(name);
        let whole = decode(&bytes).unwrap();
        out.truncate(5);
        out.extend_from_slice(&[0xEE; 300]);
        out[..5].copy_from_slice(b"head:");
        let shape = lobster_image::decode_into(&bytes, 1 << 20, &mut out, 5)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(shape, (whole.width(), whole.height()), "{name}");
        assert_eq!(&out[..5], b"head:", "{name}: the prefix is kept");
        assert_eq!(&out[5..], whole.pixels(), "{name}");
    }
    // A start past the buffer's end is refused, naming both lengths.
    let e = lobster_image::decode_into(&data("rgb.jpg"), 1 << 20, &mut vec![0; 3], 4).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::Buffer {
                expected: 4,
                actual: 3
            }
        ),
        "{e}"
    );
    // The pixel bound holds as for decode.
    let e = lobster_image::decode_into(&data("rgb.jpg"), 100, &mut Vec::new(), 0).unwrap_err();
    assert!(matches!(e, ImageError::TooManyPixels { .. }), "{e}");
}
