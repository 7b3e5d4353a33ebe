//! Chroma upsampling and YCbCr to RGB, one output row at a time.
//!
//! Upsampling is the triangle ("fancy") filter: an output sample between two chroma
//! samples takes 3/4 of the nearer and 1/4 of the farther, vertically first (rounded), then
//! horizontally, with the edge sample repeated past the image's padded edge; four-to-one
//! horizontal subsampling repeats each sample. The rounding is zune-jpeg's, so that a
//! full-scale decode is within a unit or two of the whole-image decoder's.

use super::interleave::{interleave16, Ssse3};

/// One component's decoded samples and where they sit in the output.
pub(super) struct Plane<'a> {
    pub(super) data: &'a [u8],
    pub(super) width: usize,
    pub(super) height: usize,
    /// Output pixels per sample, across and down: 1, 2 or 4, and 1 or 2.
    pub(super) fh: usize,
    pub(super) fv: usize,
    /// Whether the horizontal upsampling is the triangle filter (else each sample repeats:
    /// a component subsampled four to one, at every scale, as at full scale).
    pub(super) fancy: bool,
    /// Output pixels from the plane's first sample to the output's first pixel.
    pub(super) dx: usize,
    pub(super) dy: usize,
}

/// Rows reused from image to image.
#[derive(Default)]
pub(super) struct Rows {
    vertical: Vec<i16>,
    cb: Vec<i16>,
    cr: Vec<i16>,
}

/// Full-range BT.601 (JFIF) at 2^14.
const CR_R: i32 = 22970;
const CB_B: i32 = 29032;
const CR_G: i32 = -11700;
const CB_G: i32 = -5638;
const ROUND: i32 = (1 << 13) - 1;

/// Writes `width` x `height` RGB pixels into `out` from the luma plane and, for colour, the
/// two chroma planes.
#[inline(always)]
pub(super) fn convert(
    luma: &Plane<'_>,
    chroma: Option<(&Plane<'_>, &Plane<'_>)>,
    rows: &mut Rows,
    width: usize,
    height: usize,
    out: &mut [u8],
) {
    let Some((cb, cr)) = chroma else {
        for (y, line) in out.chunks_exact_mut(width * 3).take(height).enumerate() {
            let src = &luma.data[y * luma.width..y * luma.width + width];
            for (p, &l) in line.chunks_exact_mut(3).zip(src) {
                p.fill(l);
            }
        }
        return;
    };
    rows.cb.resize(width, 0);
    rows.cr.resize(width, 0);
    let ssse3 = Ssse3::detect();
    for (y, line) in out.chunks_exact_mut(width * 3).take(height).enumerate() {
        upsample_row(cb, y, width, &mut rows.vertical, &mut rows.cb);
        upsample_row(cr, y, width, &mut rows.vertical, &mut rows.cr);
        let src = &luma.data[y * luma.width..y * luma.width + width];
        rgb_row(src, &rows.cb, &rows.cr, line, ssse3);
    }
}

/// Pixels converted a run at a time: the arithmetic over the run in lanes, then the
/// three channels interleaved.
const RUN: usize = 16;

#[inline(always)]
fn rgb_row(luma: &[u8], cb: &[i16], cr: &[i16], out: &mut [u8], ssse3: Option<Ssse3>) {
    let full = luma.len() / RUN * RUN;
    let runs = out[..full * 3]
        .chunks_exact_mut(RUN * 3)
        .zip(luma.chunks_exact(RUN))
        .zip(cb.chunks_exact(RUN))
        .zip(cr.chunks_exact(RUN));
    for (((o, l), b), r) in runs {
        let (mut red, mut green, mut blue) = ([0u8; RUN], [0u8; RUN], [0u8; RUN]);
        for i in 0..RUN {
            [red[i], green[i], blue[i]] = pixel(l[i], b[i], r[i]);
        }
        let o: &mut [u8; RUN * 3] = o.try_into().expect("runs are RUN pixels");
        match ssse3 {
            Some(ssse3) => interleave16(ssse3, &red, &green, &blue, o),
            None => {
                for i in 0..RUN {
                    o[3 * i] = red[i];
                    o[3 * i + 1] = green[i];
                    o[3 * i + 2] = blue[i];
                }
            }
        }
    }
    let rest = out[full * 3..]
        .chunks_exact_mut(3)
        .zip(&luma[full..])
        .zip(&cb[full..])
        .zip(&cr[full..]);
    for (((o, &l), &b), &r) in rest {
        o.copy_from_slice(&pixel(l, b, r));
    }
}

#[inline(always)]
fn pixel(l: u8, b: i16, r: i16) -> [u8; 3] {
    let (b, r) = (i32::from(b) - 128, i32::from(r) - 128);
    let l = (i32::from(l) << 14) + ROUND;
    [
        ((l + r * CR_R) >> 14).clamp(0, 255) as u8,
        ((l + r * CR_G + b * CB_G) >> 14).clamp(0, 255) as u8,
        ((l + b * CB_B) >> 14).clamp(0, 255) as u8,
    ]
}

/// Output row `y` of `plane`'s samples, `width` of them, into `out`.
#[inline(always)]
fn upsample_row(
    plane: &Plane<'_>,
    y: usize,
    width: usize,
    vertical: &mut Vec<i16>,
    out: &mut [i16],
) {
    let w = plane.width;
    let at = y + plane.dy;
    let j = (at / plane.fv).min(plane.height - 1);
    let row = &plane.data[j * w..j * w + w];
    // The row with its edge samples repeated one further each side.
    vertical.resize(w + 2, 0);
    let inner = &mut vertical[1..w + 1];
    if plane.fv == 2 {
        let other = if at % 2 == 0 {
            j.saturating_sub(1)
        } else {
            (j + 1).min(plane.height - 1)
        };
        let far = &plane.data[other * w..other * w + w];
        for ((v, &n), &f) in inner.iter_mut().zip(row).zip(far) {
            *v = (3 * i16::from(n) + i16::from(f) + 2) >> 2;
        }
    } else {
        for (v, &n) in inner.iter_mut().zip(row) {
            *v = i16::from(n);
        }
    }
    vertical[0] = vertical[1];
    vertical[w + 1] = vertical[w];
    let v = &vertical[..];
    let out = &mut out[..width];
    match plane.fh {
        1 => out.copy_from_slice(&v[1 + plane.dx..1 + plane.dx + width]),
        2 if plane.fancy => {
            // Output pixels 2i and 2i+1 from sample i (dx is even here) and its neighbours.
            let base = plane.dx / 2;
            let (before, here, after) = (&v[base..], &v[base + 1..], &v[base + 2..]);
            let pairs = out.chunks_exact_mut(2).zip(before).zip(here).zip(after);
            for (((o, &b), &h), &a) in pairs {
                let near = 3 * h + 2;
                o[0] = (near + b) >> 2;
                o[1] = (near + a) >> 2;
            }
            if width % 2 == 1 {
                let i = width / 2;
                out[width - 1] = (3 * here[i] + before[i] + 2) >> 2;
            }
        }
        _ => {
            for (x, o) in out.iter_mut().enumerate() {
                *o = v[1 + ((x + plane.dx) / plane.fh).min(w - 1)];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_converts_to_the_same_bytes_with_or_without_shuffles() {
        // Two whole runs and a part one.
        let width = 2 * RUN + 5;
        let luma: Vec<u8> = (0..width).map(|i| (i * 7) as u8).collect();
        let cb: Vec<i16> = (0..width).map(|i| (i * 13 % 256) as i16).collect();
        let cr: Vec<i16> = (0..width).map(|i| (255 - i * 11 % 256) as i16).collect();
        let mut plain = vec![0u8; width * 3];
        rgb_row(&luma, &cb, &cr, &mut plain, None);
        let expected: Vec<u8> = (0..width)
            .flat_map(|i| pixel(luma[i], cb[i], cr[i]))
            .collect();
        assert_eq!(plain, expected);
        if let Some(ssse3) = Ssse3::detect() {
            let mut shuffled = vec![0u8; width * 3];
            rgb_row(&luma, &cb, &cr, &mut shuffled, Some(ssse3));
            assert_eq!(shuffled, plain);
        }
    }
}
