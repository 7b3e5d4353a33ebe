//! Decoding against images Pillow wrote (tests/data/make_images.py): every JPEG colour
//! space (YCbCr, grayscale, CMYK, progressive) and PNG colour type comes out as 24x16 RGB of
//! the colour it was made from.

use lobster_image::{decode, ImageError};

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

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
