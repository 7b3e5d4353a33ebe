//! The scan: the region's MCUs entropy-decoded, transformed, upsampled and converted.

use super::color;
use super::header::{Frame, Tables};
use super::huffman::Bits;
use super::idct;

/// A rectangle of an image in its pixels: what to decode, and what was decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) left: u32,
    pub(crate) top: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
}
/// Where a component's samples are, at the scale decoded.
#[derive(Clone, Copy, Default)]
struct Geometry {
    /// Samples of a block, across and down.
    block: (usize, usize),
    /// Output pixels a sample stands for, across and down.
    up: (usize, usize),
    /// MCU columns and rows decoded, ends excluded.
    cols: (usize, usize),
    rows: (usize, usize),
    /// The plane's samples across and down.
    width: usize,
    height: usize,
}
/// Tables and buffers one thread reuses from image to image.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) tables: Tables,
    planes: [Vec<u8>; 3],
    rows: color::Rows,
}

impl Scratch {
    /// Frees each plane that grew past `bytes_max`.
    pub(super) fn shrink(&mut self, bytes_max: usize) {
        for plane in &mut self.planes {
            if plane.capacity() > bytes_max {
                *plane = Vec::new();
            }
        }
    }
}

/// The region's blocks, decoded, upsampled and converted into `out[at..]`.
#[inline(always)]
pub(super) fn decode_scan(
    bytes: &[u8],
    frame: &Frame,
    region: Rect,
    scale: usize,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Rect, String> {
    let comps = &frame.components[..frame.count];
    let (h_max, v_max) = (comps[0].h, comps[0].v);
    let (mcu_w, mcu_h) = (8 * h_max, 8 * v_max);
    let mcus_x = frame.width.div_ceil(mcu_w);
    let mcus_y = frame.height.div_ceil(mcu_h);
    let (left, top) = (region.left as usize, region.top as usize);
    let right = left + region.width as usize;
    let bottom = top + region.height as usize;
    let (mx0, mx1) = (left / mcu_w, right.div_ceil(mcu_w));
    let (my0, my1) = (top / mcu_h, bottom.div_ceil(mcu_h));

    // Each component's geometry at this scale: its blocks' samples across and down (a
    // subsampled component is scaled less, down to 1/1, so that it needs less upsampling),
    // the output pixels each of its samples stands for, and the MCU columns and rows it
    // needs: the region's, and one more each side where it is upsampled that way.
    let mut geometry = [Geometry::default(); 3];
    for (g, c) in geometry.iter_mut().zip(comps) {
        let (fh, fv) = (h_max / c.h, v_max / c.v);
        let (sx, sy) = ((scale / fh).max(1), (scale / fv).max(1));
        g.block = (8 / sx, 8 / sy);
        g.up = (fh * sx / scale, fv * sy / scale);
        g.cols = if g.up.0 > 1 {
            (mx0.saturating_sub(1), (mx1 + 1).min(mcus_x))
        } else {
            (mx0, mx1)
        };
        g.rows = if g.up.1 > 1 {
            (my0.saturating_sub(1), (my1 + 1).min(mcus_y))
        } else {
            (my0, my1)
        };
        g.width = (g.cols.1 - g.cols.0) * c.h * g.block.0;
        g.height = (g.rows.1 - g.rows.0) * c.v * g.block.1;
    }
    let geometry = &geometry[..comps.len()];
    let first_row = geometry.iter().map(|g| g.rows.0).min().unwrap_or(0);
    let last_row = geometry.iter().map(|g| g.rows.1).max().unwrap_or(0);
    for (plane, g) in scratch.planes.iter_mut().zip(geometry) {
        plane.resize(g.width * g.height, 0);
    }

    let mut bits = Bits::new(bytes, frame.scan_start);
    let mut dc = [0i32; 3];
    let mut coefs = [0i32; 80];
    let interval = frame.restart_interval;
    let (total, first_needed) = (last_row * mcus_x, first_row * mcus_x);
    let mut restart = 0u8;
    let mut i = 0;
    while i < total {
        if interval > 0 && i % interval == 0 {
            if i > 0 {
                if bits.overran() {
                    return Err(format!("the scan's data ends before MCU {i}"));
                }
                bits.restart(restart)?;
                restart = (restart + 1) & 7;
                dc = [0; 3];
            }
            if i + interval <= first_needed {
                // The whole interval is above the region: its data is passed over.
                i += interval;
                continue;
            }
        }
        let (my, mx) = (i / mcus_x, i % mcus_x);
        for (k, (c, g)) in comps.iter().zip(geometry).enumerate() {
            let (dc_table, ac_table) = (&scratch.tables.dc[c.dc], &scratch.tables.ac[c.ac]);
            let wanted = (g.rows.0..g.rows.1).contains(&my) && (g.cols.0..g.cols.1).contains(&mx);
            if !wanted {
                for _ in 0..c.h * c.v {
                    bits.skip_block(dc_table, ac_table, &mut dc[k])?;
                }
                continue;
            }
            let quant = &scratch.tables.quant[c.quant];
            let (bw, bh) = g.block;
            let (x0, y0) = ((mx - g.cols.0) * c.h * bw, (my - g.rows.0) * c.v * bh);
            for by in 0..c.v {
                for bx in 0..c.h {
                    let last = bits.block(dc_table, ac_table, quant, &mut dc[k], &mut coefs)?;
                    let start = (y0 + by * bh) * g.width + x0 + bx * bw;
                    let plane = &mut scratch.planes[k][start..];
                    idct::idct(&coefs, last, bw, bh, plane, g.width);
                    coefs = [0; 80];
                }
            }
        }
        i += 1;
    }
    if bits.overran() {
        return Err(format!(
            "the scan's data ends before its last MCU (at byte {})",
            bits.position()
        ));
    }

    let (x0, y0) = (mx0 * mcu_w, my0 * mcu_h);
    let covered_w = (mx1 * mcu_w).min(frame.width) - x0;
    let covered_h = (my1 * mcu_h).min(frame.height) - y0;
    let (width, height) = (covered_w.div_ceil(scale), covered_h.div_ceil(scale));
    out.resize(at + width * height * 3, 0);
    let (mcu_out_w, mcu_out_h) = (mcu_w / scale, mcu_h / scale);
    let plane = |k: usize| {
        let g = &geometry[k];
        color::Plane {
            data: &scratch.planes[k],
            width: g.width,
            height: g.height,
            fh: g.up.0,
            fv: g.up.1,
            fancy: comps[k].h * 4 != h_max,
            dx: (mx0 - g.cols.0) * mcu_out_w,
            dy: (my0 - g.rows.0) * mcu_out_h,
        }
    };
    let luma = plane(0);
    let chroma = (comps.len() == 3).then(|| (plane(1), plane(2)));
    let mut rows_scratch = std::mem::take(&mut scratch.rows);
    color::convert(
        &luma,
        chroma.as_ref().map(|(b, r)| (b, r)),
        &mut rows_scratch,
        width,
        height,
        &mut out[at..],
    );
    scratch.rows = rows_scratch;
    Ok(Rect {
        width: width as u32,
        height: height as u32,
        left: x0 as u32,
        top: y0 as u32,
    })
}
