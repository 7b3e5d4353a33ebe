//! The fuzz checker of the header probe and the decoders: bytes from outside never panic
//! either, the probe and the decoders agree on what is too large, and an image that decodes
//! is within the bound and the size its header gave.

use crate::decode::{decode_within, dimensions};
use crate::error::ImageError;

/// The bound the checker decodes under: the fixtures' 384 pixels pass, and an image past it
/// is small enough to decode fast if the bound were not applied.
pub(crate) const CHECK_PIXELS_MAX: u64 = 1024;

/// The decode fixtures: mutated, they reach the decoders' insides far more often than
/// arbitrary bytes do.
const FIXTURES: [&[u8]; 8] = [
    include_bytes!("../tests/data/rgb.jpg"),
    include_bytes!("../tests/data/progressive.jpg"),
    include_bytes!("../tests/data/gray.jpg"),
    include_bytes!("../tests/data/cmyk.jpg"),
    include_bytes!("../tests/data/rgb.png"),
    include_bytes!("../tests/data/rgba.png"),
    include_bytes!("../tests/data/gray16.png"),
    include_bytes!("../tests/data/palette.png"),
];

/// Checks one input: an even first byte takes the rest as a file; an odd one takes a
/// fixture (the second byte's choice) and applies the rest as (offset u16, xor u8)
/// mutations, so that headers claiming other sizes and corrupt scans both come.
pub(crate) fn check_bytes(data: &[u8]) {
    let file = match data {
        [mode, pick, edits @ ..] if mode % 2 == 1 => {
            let mut file = FIXTURES[usize::from(*pick) % FIXTURES.len()].to_vec();
            for e in edits.chunks_exact(3) {
                let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % file.len();
                file[at] ^= e[2];
            }
            file
        }
        [_, rest @ ..] => rest.to_vec(),
        [] => Vec::new(),
    };
    check_file(&file);
}

fn check_file(file: &[u8]) {
    let probed = dimensions(file);
    if let Some((w, h)) = probed {
        assert!(w > 0 && h > 0, "the probe gave {w}x{h}");
    }
    // The probe reads a prefix: a longer file never changes what a whole header gave.
    if let Some(dims) = probed {
        let mut longer = file.to_vec();
        longer.extend_from_slice(&[0; 16]);
        assert_eq!(
            dimensions(&longer),
            Some(dims),
            "a suffix changed the probe"
        );
    }
    match decode_within(file, CHECK_PIXELS_MAX) {
        Ok(image) => {
            let pixels = u64::from(image.width()) * u64::from(image.height());
            assert!(
                pixels <= CHECK_PIXELS_MAX,
                "decoded {}x{} past the bound",
                image.width(),
                image.height()
            );
            assert_eq!(image.pixels().len() as u64, pixels * 3);
        }
        Err(ImageError::TooManyPixels {
            width,
            height,
            pixels_max,
        }) => {
            assert_eq!(pixels_max, CHECK_PIXELS_MAX);
            assert!(u64::from(width) * u64::from(height) > pixels_max);
        }
        Err(_) => {}
    }
    // What the probe finds too large, the decoder refuses by its size, whatever else is
    // wrong after the header.
    if let Some((w, h)) = probed.filter(|&(w, h)| u64::from(w) * u64::from(h) > CHECK_PIXELS_MAX) {
        let is_image = matches!(file, [0xFF, 0xD8, 0xFF, ..] | [0x89, b'P', b'N', b'G', ..]);
        if is_image {
            assert_eq!(
                decode_within(file, CHECK_PIXELS_MAX),
                Err(ImageError::TooManyPixels {
                    width: w,
                    height: h,
                    pixels_max: CHECK_PIXELS_MAX
                })
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: seeded inputs with no dependency.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn seeded_random_files_and_mutated_fixtures_never_panic_or_pass_the_bound() {
        let mut s = 0x5EED_1A6E_u64;
        for i in 0..4000 {
            let len = (next(&mut s) % 96) as usize;
            let mut data: Vec<u8> = (0..len).map(|_| next(&mut s) as u8).collect();
            // Half mutate a fixture; of the rest, some start as a JPEG or a PNG.
            match i % 4 {
                0 | 1 => data.insert(0, 1),
                2 => {
                    data.splice(0..0, [0, 0xFF, 0xD8, 0xFF]);
                }
                _ => {
                    data.splice(0..0, [0, 0x89, b'P', b'N', b'G', 13, 10, 26, 10]);
                }
            }
            check_bytes(&data);
        }
    }

    #[test]
    fn every_fixture_decodes_within_the_checker_bound() {
        for (k, f) in FIXTURES.iter().enumerate() {
            let image = decode_within(f, CHECK_PIXELS_MAX).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert_eq!((image.width(), image.height()), (24, 16));
            check_bytes(&[1, k as u8]);
        }
    }
}
