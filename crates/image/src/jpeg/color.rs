//! Chroma upsampling and YCbCr to RGB, one output row at a time.
//!
//! Upsampling is the triangle ("fancy") filter: an output sample between two chroma
//! samples takes 3/4 of the nearer and 1/4 of the farther, vertically first (rounded), then
//! horizontally, with the edge sample repeated past the image's padded edge; four-to-one
//! horizontal subsampling repeats each sample. The rounding is zune-jpeg's, so that a
//! full-scale decode is within a unit or two of the whole-image decoder's.

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
    for (y, line) in out.chunks_exact_mut(width * 3).take(height).enumerate() {
        upsample_row(cb, y, width, &mut rows.vertical, &mut rows.cb);
        upsample_row(cr, y, width, &mut rows.vertical, &mut rows.cr);
        let src = &luma.data[y * luma.width..y * luma.width + width];
        for (((p, &l), &b), &r) in line
            .chunks_exact_mut(3)
            .zip(src)
            .zip(&rows.cb)
            .zip(&rows.cr)
        {
            let (b, r) = (i32::from(b) - 128, i32::from(r) - 128);
            let l = (i32::from(l) << 14) + ROUND;
            p[0] = ((l + r * CR_R) >> 14).clamp(0, 255) as u8;
            p[1] = ((l + r * CR_G + b * CB_G) >> 14).clamp(0, 255) as u8;
            p[2] = ((l + b * CB_B) >> 14).clamp(0, 255) as u8;
        }
    }
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
    vertical.resize(w, 0);
    if plane.fv == 2 {
        let other = if at % 2 == 0 {
            j.saturating_sub(1)
        } else {
            (j + 1).min(plane.height - 1)
        };
        let far = &plane.data[other * w..other * w + w];
        for ((v, &n), &f) in vertical.iter_mut().zip(row).zip(far) {
            *v = (3 * i16::from(n) + i16::from(f) + 2) >> 2;
        }
    } else {
        for (v, &n) in vertical.iter_mut().zip(row) {
            *v = i16::from(n);
        }
    }
    let v = &vertical[..];
    match plane.fh {
        1 => out[..width].copy_from_slice(&v[plane.dx..plane.dx + width]),
        2 if plane.fancy => {
            for (x, o) in out[..width].iter_mut().enumerate() {
                let at = x + plane.dx;
                let i = at / 2;
                let far = if at % 2 == 0 {
                    i.saturating_sub(1)
                } else {
                    (i + 1).min(w - 1)
                };
                *o = (3 * v[i] + v[far] + 2) >> 2;
            }
        }
        _ => {
            for (x, o) in out[..width].iter_mut().enumerate() {
                *o = v[((x + plane.dx) / plane.fh).min(w - 1)];
            }
        }
    }
}
