//! The fuzz checker of the region decoder: any bytes, region and scale decode without a
//! panic to a window of the size it says that holds the region, and a window is exactly the
//! same pixels of the whole image decoded at that scale.

use std::cell::Cell;

use super::{decode_region, Rect};
use crate::error::ImageError;

/// A bound low enough to keep each input fast; the fixtures pass it.
const CHECK_PIXELS_MAX: u64 = 1 << 17;

/// Baseline JPEGs of each kind the decoder takes (and one it does not), to mutate.
const FIXTURES: [&[u8]; 6] = [
    include_bytes!("../../tests/data/rgb.jpg"),
    include_bytes!("../../tests/data/gray.jpg"),
    include_bytes!("../../tests/data/progressive.jpg"),
    include_bytes!("../../tests/data/photo-coffee-411.jpg"),
    include_bytes!("../../tests/data/photo-coffee-422.jpg"),
    include_bytes!("../../tests/data/photo-astronaut-restart.jpg"),
];

/// Refuses an image past the bound, and records its size.
fn bound(size: &Cell<(u32, u32)>) -> impl FnOnce(u32, u32) -> Result<(), ImageError> + '_ {
    move |width, height| {
        size.set((width, height));
        if u64::from(width) * u64::from(height) > CHECK_PIXELS_MAX {
            return Err(ImageError::TooManyPixels {
                width,
                height,
                pixels_max: CHECK_PIXELS_MAX,
            });
        }
        Ok(())
    }
}

/// Checks one input: a mode byte (odd: a fixture, picked by the next byte, with the rest as
/// (offset u16, xor u8) edits; even: the rest is the file), then the region as fractions
/// of the image (left, top, width, height: a byte each), the scale and where in the buffer
/// the pixels start.
pub(crate) fn check_region(data: &[u8]) {
    let [mode, pick, l, t, w, h, s, at, rest @ ..] = data else {
        return;
    };
    let file = if mode % 2 == 1 {
        let mut file = FIXTURES[usize::from(*pick) % FIXTURES.len()].to_vec();
        for e in rest.chunks_exact(3) {
            let i = usize::from(u16::from_le_bytes([e[0], e[1]])) % file.len();
            file[i] ^= e[2];
        }
        file
    } else {
        rest.to_vec()
    };
    let scale = 1 << (s % 4);
    let at = usize::from(*at % 8);
    // The image's size, from a decode of its first pixel.
    let size = Cell::new((0, 0));
    let first = Rect {
        left: 0,
        top: 0,
        width: 1,
        height: 1,
    };
    let _ = decode_region(&file, first, 8, bound(&size), &mut Vec::new(), 0);
    let (width, height) = size.get();
    if width == 0 || height == 0 {
        return;
    }
    let part = |f: u8, all: u32| ((u64::from(f) * u64::from(all)) >> 8) as u32;
    let (left, top) = (part(*l, width), part(*t, height));
    let region = Rect {
        left,
        top,
        width: 1 + part(*w, width - left - 1),
        height: 1 + part(*h, height - top - 1),
    };
    let mut out = vec![0xA5; at + 5];
    let Ok(Some((window, ws))) = decode_region(&file, region, scale, bound(&size), &mut out, at)
    else {
        return;
    };
    let (ww, wh) = (u64::from(window.width), u64::from(window.height));
    assert_eq!(out.len() as u64, at as u64 + ww * wh * 3, "{window:?}");
    assert!(
        out[..at].iter().all(|&b| b == 0xA5),
        "the bytes before `at` changed"
    );
    assert_eq!(ws, scale, "{window:?}");
    assert!(
        ww > 0 && wh > 0 && window.left <= left && window.top <= top,
        "{window:?}"
    );
    assert_eq!((window.left % ws, window.top % ws), (0, 0), "{window:?}");
    let (right, bottom) = (
        u64::from(window.left) + ww * u64::from(ws),
        u64::from(window.top) + wh * u64::from(ws),
    );
    assert!(
        right >= u64::from(left + region.width),
        "{window:?} {region:?}"
    );
    assert!(
        bottom >= u64::from(top + region.height),
        "{window:?} {region:?}"
    );
    assert!(
        right < u64::from(width) + u64::from(ws),
        "{window:?} {width}"
    );
    assert!(
        bottom < u64::from(height) + u64::from(ws),
        "{window:?} {height}"
    );
    // The same pixels as the whole image's decode at that scale.
    let whole = Rect {
        left: 0,
        top: 0,
        width,
        height,
    };
    let mut all = Vec::new();
    let Ok(Some((all_window, _))) = decode_region(&file, whole, ws, bound(&size), &mut all, 0)
    else {
        return;
    };
    let row = all_window.width as usize * 3;
    let (x0, y0) = ((window.left / ws) as usize, (window.top / ws) as usize);
    for (y, line) in out[at..]
        .chunks_exact(window.width as usize * 3)
        .enumerate()
    {
        let start = (y0 + y) * row + x0 * 3;
        assert!(
            all.get(start..start + line.len()) == Some(line),
            "{window:?} row {y} differs from the whole decode's"
        );
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn mutated_fixtures_and_random_bytes_keep_the_window_contract() {
        let mut rng = StdRng::seed_from_u64(42);
        for i in 0..300 {
            let mut input: Vec<u8> = (0..8).map(|_| rng.gen()).collect();
            input[0] = (i % 2 == 0) as u8 | (input[0] & !1);
            let edits = rng.gen_range(0..6) * 3;
            input.extend((0..edits).map(|_| rng.gen::<u8>()));
            check_region(&input);
        }
    }
}
