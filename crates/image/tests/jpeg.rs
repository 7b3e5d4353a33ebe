//! The region decoder of baseline JPEGs against the whole-image decoder (zune-jpeg):
//! full-scale decodes of every chroma subsampling jpeg-encoder writes, restart markers and
//! grey within +-2 of it (mean at most 0.3); regions at every edge and corner equal to the
//! same pixels of a full decode; each scale against a box average of the full decode;
//! what it does not take falls back to the whole decode; corrupt and cut bytes are errors.

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use lobster_image::{decode, decode_region_into, Image, ImageError, Region, Window, SCALES};

mod common;
use common::data;
use common::difference;
use common::zune_decode;

/// A 203 x 157 part of a photograph (odd sides: partial blocks and MCUs at the right and
/// bottom), small enough for debug builds.
fn photo() -> Image {
    let whole = zune_decode(&data("photo-astronaut-420.jpg"));
    let (w, h) = (203u32, 157u32);
    let row = whole.width() as usize * 3;
    let pixels = (0..h as usize)
        .flat_map(|y| {
            let start = (y + 150) * row + 120 * 3;
            whole.pixels()[start..start + w as usize * 3].to_vec()
        })
        .collect();
    Image::new(w, h, pixels).unwrap()
}

fn encode(image: &Image, sampling: SamplingFactor, restart: Option<u16>, grey: bool) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = Encoder::new(&mut bytes, 88);
    encoder.set_sampling_factor(sampling);
    if let Some(interval) = restart {
        encoder.set_restart_interval(interval);
    }
    let (w, h) = (image.width() as u16, image.height() as u16);
    if grey {
        let luma: Vec<u8> = image.pixels().chunks_exact(3).map(|p| p[1]).collect();
        encoder.encode(&luma, w, h, ColorType::Luma).unwrap();
    } else {
        encoder
            .encode(image.pixels(), w, h, ColorType::Rgb)
            .unwrap();
    }
    bytes
}

/// The subsamplings the region decoder takes, and those it leaves to the whole decode
/// (jpeg-encoder writes those with a factor of 4 one scan per component; an interleaved
/// 4:1:1 is the fixture photo-coffee-411.jpg, written by libjpeg-turbo's cjpeg).
const TAKEN: [SamplingFactor; 4] = [
    SamplingFactor::R_4_4_4,
    SamplingFactor::R_4_2_2,
    SamplingFactor::R_4_2_0,
    SamplingFactor::R_4_4_0,
];
const LEFT: [SamplingFactor; 4] = [
    SamplingFactor::R_4_1_1,
    SamplingFactor::R_4_1_0,
    SamplingFactor::R_4_4_1,
    SamplingFactor::R_4_2_1,
];

/// The whole image but its first column: the window is still the whole image.
fn whole_region(image: &Image) -> Region {
    Region {
        left: 1,
        top: 0,
        width: image.width() - 1,
        height: image.height(),
    }
}

fn region_decode(bytes: &[u8], region: Region, scale: u32) -> (Window, Vec<u8>) {
    let mut out = Vec::new();
    let window = decode_region_into(bytes, 1 << 26, region, scale, &mut out, 0)
        .unwrap_or_else(|e| panic!("{region:?} 1/{scale}: {e}"));
    assert_eq!(
        out.len(),
        window.width as usize * window.height as usize * 3
    );
    (window, out)
}

/// The full-scale decode of the whole image by the region decoder, within +-2 (mean 0.3)
/// of zune-jpeg's, and a proof that the region decoder made it: a part at 1/2 comes back
/// at 1/2 (zune-jpeg only gives scale 1). `decode`, which runs the region decoder on the
/// whole image, gives the same bytes.
fn matches_whole_decode(bytes: &[u8], what: &str) {
    let whole = zune_decode(bytes);
    let (window, out) = region_decode(bytes, whole_region(&whole), 1);
    assert_eq!(decode(bytes).unwrap().pixels(), out, "{what}");
    assert_eq!(
        (
            window.width,
            window.height,
            window.left,
            window.top,
            window.scale
        ),
        (whole.width(), whole.height(), 0, 0, 1),
        "{what}"
    );
    let (mean, max) = difference(&out, whole.pixels());
    assert!(mean <= 0.3 && max <= 2, "{what}: mean {mean:.3}, max {max}");
    let part = Region {
        left: 1,
        top: 1,
        width: 8,
        height: 8,
    };
    assert_eq!(
        region_decode(bytes, part, 2).0.scale,
        2,
        "{what}: not taken"
    );
}

#[test]
fn every_subsampling_decodes_within_two_of_the_whole_decoder() {
    let image = photo();
    for sampling in TAKEN {
        matches_whole_decode(
            &encode(&image, sampling, None, false),
            &format!("{sampling:?}"),
        );
    }
    for name in [
        "photo-astronaut-420.jpg",
        "photo-coffee-420.jpg",
        "photo-chelsea-444.jpg",
        "photo-coffee-422.jpg",
        "photo-astronaut-restart.jpg",
        "photo-coffee-411.jpg",
        "rgb.jpg",
        "gray.jpg",
    ] {
        matches_whole_decode(&data(name), name);
    }
}

#[test]
fn restart_markers_and_grey_decode_within_two_of_the_whole_decoder() {
    let image = photo();
    for interval in [1, 2, 5] {
        for sampling in [SamplingFactor::R_4_2_0, SamplingFactor::R_4_4_4] {
            let bytes = encode(&image, sampling, Some(interval), false);
            matches_whole_decode(&bytes, &format!("{sampling:?} every {interval} MCUs"));
        }
    }
    matches_whole_decode(&encode(&image, SamplingFactor::R_4_4_4, None, true), "grey");
    matches_whole_decode(
        &encode(&image, SamplingFactor::R_4_4_4, Some(3), true),
        "grey, restarts",
    );
}

/// `width` x `height` pixels of `pixels` (`row` of them a row) from (`left`, `top`).
fn crop(pixels: &[u8], row: u32, (left, top, width, height): (u32, u32, u32, u32)) -> Vec<u8> {
    (top..top + height)
        .flat_map(|y| {
            let start = (y * row + left) as usize * 3;
            pixels[start..start + width as usize * 3].to_vec()
        })
        .collect()
}

/// Regions at each corner, each edge's middle and inside: each window at each scale holds
/// its region and is exactly the same pixels of the whole image decoded at that scale by
/// the same decoder (the rows above, the chroma margin and the restart intervals passed
/// over change nothing).
#[test]
fn a_region_at_every_edge_and_corner_is_the_full_decode_there() {
    let image = photo();
    let (w, h) = (image.width(), image.height());
    let mut files: Vec<(String, Vec<u8>)> = TAKEN
        .iter()
        .map(|&s| (format!("{s:?}"), encode(&image, s, None, false)))
        .collect();
    files.push((
        "restarts 4:2:0".into(),
        encode(&image, SamplingFactor::R_4_2_0, Some(2), false),
    ));
    files.push((
        "grey".into(),
        encode(&image, SamplingFactor::R_4_4_4, Some(1), true),
    ));
    files.push(("4:1:1".into(), data("photo-coffee-411.jpg")));
    let side = 21;
    let mut regions = Vec::new();
    for left in [0, (w - side) / 2, w - side] {
        for top in [0, (h - side) / 2, h - side] {
            regions.push(Region {
                left,
                top,
                width: side,
                height: side,
            });
        }
    }
    regions.push(Region {
        left: w - 1,
        top: h - 1,
        width: 1,
        height: 1,
    });
    for (what, bytes) in &files {
        for scale in SCALES {
            let (all, full) = region_decode(bytes, whole_region(&image), scale);
            assert_eq!(all.scale, scale, "{what}");
            assert_eq!(
                (all.width, all.height),
                (w.div_ceil(scale), h.div_ceil(scale))
            );
            for &region in &regions {
                let (window, out) = region_decode(bytes, region, scale);
                let s = window.scale;
                assert_eq!(s, scale, "{what}");
                assert!(window.left <= region.left && window.top <= region.top);
                assert_eq!((window.left % s, window.top % s), (0, 0));
                assert!(window.left + window.width * s >= region.left + region.width);
                assert!(window.top + window.height * s >= region.top + region.height);
                assert!(window.left + window.width * s < w + s, "{what} {window:?}");
                assert!(window.top + window.height * s < h + s, "{what} {window:?}");
                let expected = crop(
                    &full,
                    all.width,
                    (window.left / s, window.top / s, window.width, window.height),
                );
                assert!(out == expected, "{what} {region:?} 1/{scale}: {window:?}");
            }
        }
    }
}

/// Each output pixel at 1/s against the mean of its s x s pixels in the full decode (fewer
/// at the right and bottom edges). The tolerance: mean absolute difference at most 1.0 and
/// at most 40 anywhere. The scaled transform averages exactly but for rounding; the rest is
/// subsampled chroma, upsampled at full scale before the average in the one and after it in
/// the other, which differs most at sharp colour edges.
#[test]
fn every_scale_is_within_the_tolerance_of_a_box_average_of_the_full_decode() {
    let image = photo();
    let mut files: Vec<(String, Vec<u8>)> = TAKEN
        .iter()
        .map(|&s| (format!("{s:?}"), encode(&image, s, None, false)))
        .collect();
    files.push((
        "grey".into(),
        encode(&image, SamplingFactor::R_4_4_4, None, true),
    ));
    for name in [
        "photo-coffee-411.jpg",
        "photo-coffee-422.jpg",
        "photo-astronaut-restart.jpg",
    ] {
        files.push((name.into(), data(name)));
    }
    for (what, bytes) in &files {
        let (_, full) = region_decode(bytes, whole_region(&image_of(bytes)), 1);
        let source = image_of(bytes);
        for scale in [2, 4, 8] {
            let (window, out) = region_decode(bytes, whole_region(&source), scale);
            let expected = box_average(&source, &full, scale);
            assert_eq!(out.len(), expected.len());
            let (mean, max) = difference(&out, &expected);
            eprintln!("{what} 1/{scale}: mean {mean:.3}, max {max}");
            assert!(
                mean <= 1.0 && max <= 40,
                "{what} {window:?}: mean {mean:.3}, max {max}"
            );
        }
    }
}

fn image_of(bytes: &[u8]) -> Image {
    let (w, h) = lobster_image::dimensions(bytes).unwrap();
    Image::new(w, h, vec![0; w as usize * h as usize * 3]).unwrap()
}

fn box_average(shape: &Image, pixels: &[u8], s: u32) -> Vec<u8> {
    let (w, h) = (shape.width(), shape.height());
    let mut out = Vec::new();
    for y in 0..h.div_ceil(s) {
        for x in 0..w.div_ceil(s) {
            for c in 0..3 {
                let (mut sum, mut n) = (0u32, 0u32);
                for yy in y * s..((y + 1) * s).min(h) {
                    for xx in x * s..((x + 1) * s).min(w) {
                        sum += u32::from(pixels[((yy * w + xx) * 3 + c) as usize]);
                        n += 1;
                    }
                }
                out.push(((sum + n / 2) / n) as u8);
            }
        }
    }
    out
}

/// Progressive, CMYK and the subsamplings not taken decode whole, at scale 1, as before.
#[test]
fn what_the_region_decoder_does_not_take_decodes_whole() {
    let image = photo();
    let mut files: Vec<(String, Vec<u8>)> = LEFT
        .iter()
        .map(|&s| (format!("{s:?}"), encode(&image, s, None, false)))
        .collect();
    for name in [
        "photo-chelsea-progressive.jpg",
        "progressive.jpg",
        "cmyk.jpg",
    ] {
        files.push((name.into(), data(name)));
    }
    for (what, bytes) in &files {
        let whole = decode(bytes).unwrap();
        let part = Region {
            left: 3,
            top: 2,
            width: 9,
            height: 5,
        };
        let (window, out) = region_decode(bytes, part, 2);
        assert_eq!(
            (
                window.width,
                window.height,
                window.left,
                window.top,
                window.scale
            ),
            (whole.width(), whole.height(), 0, 0, 1),
            "{what}"
        );
        assert!(out == whole.pixels(), "{what}");
    }
}

/// Bytes flipped at many offsets, and every cut: each decode is Ok or an error, never a
/// panic; a cut one is an error naming the JPEG.
#[test]
fn corrupt_and_cut_jpegs_are_errors_never_panics() {
    let image = photo();
    let small = Image::new(
        40,
        24,
        crop(image.pixels(), image.width(), (50, 50, 40, 24)),
    )
    .unwrap();
    let mut files = vec![
        encode(&small, SamplingFactor::R_4_2_0, None, false),
        encode(&small, SamplingFactor::R_4_2_2, Some(1), false),
        encode(&small, SamplingFactor::R_4_4_4, None, true),
    ];
    files.push(data("rgb.jpg"));
    let region = Region {
        left: 11,
        top: 5,
        width: 9,
        height: 10,
    };
    let mut out = Vec::new();
    let (mut ok, mut errors) = (0, 0);
    for bytes in &files {
        for at in 2..bytes.len() {
            for flip in [0xFF, 0x01, 0x80] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                for scale in [1, 8] {
                    match decode_region_into(&bad, 1 << 20, region, scale, &mut out, 0) {
                        Ok(w) => {
                            assert_eq!(out.len(), w.width as usize * w.height as usize * 3);
                            ok += 1;
                        }
                        Err(_) => errors += 1,
                    }
                }
            }
        }
        for len in 0..bytes.len() - 2 {
            let e = decode_region_into(&bytes[..len], 1 << 20, region, 1, &mut out, 0);
            assert!(e.is_err(), "cut at {len} of {}", bytes.len());
        }
        let e = decode_region_into(&bytes[..bytes.len() - 2], 1 << 20, region, 1, &mut out, 0)
            .unwrap_err();
        assert!(matches!(e, ImageError::Jpeg { .. }), "{e}");
    }
    eprintln!("flipped: {ok} decoded, {errors} refused");
    assert!(errors > 0 && ok > 0);
}

/// What is wrong is named: a Huffman code the table lacks, a scan that runs into a marker, a
/// restart marker out of order, a table the scan needs and no header gave.
#[test]
fn corrupt_scans_and_headers_are_named() {
    let image = photo();
    let region = whole_region(&image);
    let mut out = Vec::new();
    let bytes = encode(&image, SamplingFactor::R_4_2_0, Some(4), false);
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let scan = sos + 2 + usize::from(u16::from_be_bytes([bytes[sos + 2], bytes[sos + 3]]));
    // An end-of-image marker a third of the way into the scan, and another at the end.
    let mut cut = bytes[..scan + (bytes.len() - scan) / 3].to_vec();
    while cut.last() == Some(&0xFF) {
        cut.pop();
    }
    cut.extend_from_slice(&[0xFF, 0xD9]);
    let e = decode_region_into(&cut, 1 << 26, region, 1, &mut out, 0).unwrap_err();
    assert!(
        e.to_string().contains("RST") || e.to_string().contains("ends before"),
        "{e}"
    );
    // The first restart marker renumbered.
    let mut swapped = bytes.clone();
    let rst = scan
        + swapped[scan..]
            .windows(2)
            .position(|w| w == [0xFF, 0xD0])
            .unwrap();
    swapped[rst + 1] = 0xD3;
    let e = decode_region_into(&swapped, 1 << 26, region, 1, &mut out, 0).unwrap_err();
    assert!(e.to_string().contains("RST0"), "{e}");
    // The scan's DC table id made 3, which no DHT defines.
    let mut undefined = bytes.clone();
    undefined[sos + 6] = 0x30 | (undefined[sos + 6] & 15);
    let e = decode_region_into(&undefined, 1 << 26, region, 1, &mut out, 0).unwrap_err();
    assert!(e.to_string().contains("Huffman table not defined"), "{e}");
    assert!(e.to_string().contains("DA at byte"), "{e}");
    // A Huffman table of three codes of length 1 (its total kept).
    let mut overfull = bytes.clone();
    let dht = overfull.windows(2).position(|w| w == [0xFF, 0xC4]).unwrap();
    let counts = dht + 5;
    let total: u32 = overfull[counts..counts + 16]
        .iter()
        .map(|&c| u32::from(c))
        .sum();
    assert!(total >= 3);
    overfull[counts..counts + 16].fill(0);
    overfull[counts] = 3;
    overfull[counts + 15] = (total - 3) as u8;
    let e = decode_region_into(&overfull, 1 << 26, region, 1, &mut out, 0).unwrap_err();
    assert!(
        e.to_string().contains("overfull Huffman table at length 1"),
        "{e}"
    );
}

/// The pixel bound is checked before anything of the image's size is allocated.
#[test]
fn an_image_past_the_pixel_bound_is_refused() {
    let bytes = encode(&photo(), SamplingFactor::R_4_2_0, None, false);
    let region = Region {
        left: 0,
        top: 0,
        width: 4,
        height: 4,
    };
    let mut out = Vec::new();
    let e = decode_region_into(&bytes, 1000, region, 1, &mut out, 0).unwrap_err();
    assert!(matches!(e, ImageError::TooManyPixels { .. }), "{e}");
}

/// Decoding into a buffer from byte `at` keeps its first `at` bytes and sizes it exactly.
#[test]
fn a_region_lands_after_the_bytes_kept() {
    let bytes = encode(&photo(), SamplingFactor::R_4_2_2, None, false);
    let region = Region {
        left: 40,
        top: 30,
        width: 50,
        height: 20,
    };
    let (window, alone) = region_decode(&bytes, region, 2);
    let mut out = vec![7u8; 5000];
    let again = decode_region_into(&bytes, 1 << 26, region, 2, &mut out, 11).unwrap();
    assert_eq!(again, window);
    assert_eq!(&out[..11], &[7; 11]);
    assert!(out[11..] == alone[..]);
}
