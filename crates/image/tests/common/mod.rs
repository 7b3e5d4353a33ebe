//! What the image tests share: the fixtures, and how far apart two images are.

pub fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Mean and largest absolute difference.
// Not every test file compares images.
#[allow(dead_code)]
pub fn difference(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0);
    (sum as f64 / a.len().max(1) as f64, max)
}

/// The JPEG as zune-jpeg decodes it, whole, in RGB: the reference the region decoder (which
/// `decode` also runs on a baseline JPEG) is held to.
// Not every test file compares with it.
#[allow(dead_code)]
pub fn zune_decode(bytes: &[u8]) -> lobster_image::Image {
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(bytes, options);
    let pixels = decoder.decode().expect("zune-jpeg decodes the fixture");
    let info = decoder.info().expect("a header");
    let (w, h) = (u32::from(info.width), u32::from(info.height));
    // A grey JPEG comes out as one channel whatever is asked for.
    let rgb = if pixels.len() == w as usize * h as usize {
        pixels.iter().flat_map(|&l| [l, l, l]).collect()
    } else {
        pixels
    };
    lobster_image::Image::new(w, h, rgb).unwrap()
}
