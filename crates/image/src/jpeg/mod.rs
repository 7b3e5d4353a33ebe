//! A baseline JPEG decoder that decodes only a region, at 1/1 to 1/8 of the resolution.
//!
//! It takes 8-bit Huffman sequential frames (SOF0, SOF1) of one component (grey) or three
//! (YCbCr, the first component's sampling the largest, each other's a half or a quarter
//! across and a half or a whole down), with or without restart markers, and says `None`
//! to anything else so that the caller decodes it another way. Rows of blocks below the
//! region are never read; those above are entropy-decoded only (or skipped to their next
//! restart marker), and only the block columns the region touches, plus one each side
//! where chroma upsampling reads its neighbours, are transformed and converted.

#[cfg(any(test, fuzzing))]
pub(crate) mod check;
mod color;
mod huffman;
mod idct;
mod simd;

use std::cell::RefCell;

use crate::error::ImageError;

use huffman::{Bits, Table};

/// A component of the frame.
#[derive(Clone, Copy, Default, Debug)]
struct Component {
    id: u8,
    /// Sampling factors.
    h: usize,
    v: usize,
    /// Quantization and Huffman tables.
    quant: usize,
    dc: usize,
    ac: usize,
}

/// What the headers say, up to the scan's first byte.
#[derive(Default, Debug)]
struct Frame {
    width: usize,
    height: usize,
    count: usize,
    /// In the scan's order.
    components: [Component; 3],
    restart_interval: usize,
    scan_start: usize,
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
struct Scratch {
    dc: [Table; 4],
    ac: [Table; 4],
    /// Zigzag order.
    quant: [[i32; 64]; 4],
    quant_defined: [bool; 4],
    planes: [Vec<u8>; 3],
    rows: color::Rows,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            dc: Default::default(),
            ac: Default::default(),
            quant: [[0; 64]; 4],
            quant_defined: [false; 4],
            planes: Default::default(),
            rows: color::Rows::default(),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Box<Scratch>> = RefCell::new(Box::default());
}

fn fail(reason: String) -> ImageError {
    ImageError::Jpeg { reason }
}

/// A rectangle of an image in its pixels: what to decode, and what was decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) left: u32,
    pub(crate) top: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// Decodes the part of a baseline JPEG that covers `region` at 1/`scale` (1, 2, 4 or 8)
/// into `out` from byte `at` on (exactly `at + width * height * 3` bytes then), or says
/// `Ok(None)` for a JPEG this decoder does not take (or bytes that are no JPEG). `accept`
/// is given the image's width and height from its header before anything of their size
/// is allocated: its error (a bound passed, a region outside, a file cut short) is
/// returned. Returns the rectangle of the source decoded (at the left and top of the MCU
/// holding the region's) and the window's width and height at the scale, in a [`Rect`],
/// and the scale.
///
/// # Errors
/// `accept`'s; a corrupt JPEG, naming what is wrong.
pub(crate) fn decode_region(
    bytes: &[u8],
    region: Rect,
    scale: u32,
    accept: impl FnOnce(u32, u32) -> Result<(), ImageError>,
    out: &mut Vec<u8>,
    at: usize,
) -> Result<Option<(Rect, u32)>, ImageError> {
    if !matches!(bytes, [0xFF, 0xD8, 0xFF, ..]) || !matches!(scale, 1 | 2 | 4 | 8) {
        return Ok(None);
    }
    if out.len() < at {
        return Err(ImageError::Buffer {
            expected: at,
            actual: out.len(),
        });
    }
    SCRATCH.with(|scratch| {
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            return Ok(None);
        };
        let scratch = &mut **scratch;
        let Some(frame) = read_headers(bytes, scratch).map_err(fail)? else {
            return Ok(None);
        };
        let (width, height) = (frame.width as u32, frame.height as u32);
        accept(width, height)?;
        // The caller's check, made again: the decode relies on it.
        let inside = u64::from(region.left) + u64::from(region.width) <= u64::from(width)
            && u64::from(region.top) + u64::from(region.height) <= u64::from(height);
        if !inside || region.width == 0 || region.height == 0 {
            return Err(fail(format!(
                "the region {region:?} is not inside the {width} x {height} image"
            )));
        }
        simd::decode(bytes, &frame, region, scale as usize, scratch, out, at)
            .map(|window| Some((window, scale)))
            .map_err(fail)
    })
}

fn be16(bytes: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes(
        bytes.get(at..at + 2)?.try_into().ok()?,
    )))
}

/// Reads the markers up to the first scan into `scratch`'s tables; `None` for a frame
/// this decoder does not take.
fn read_headers(bytes: &[u8], scratch: &mut Scratch) -> Result<Option<Frame>, String> {
    for t in scratch.dc.iter_mut().chain(scratch.ac.iter_mut()) {
        t.defined = false;
    }
    scratch.quant_defined = [false; 4];
    let mut frame = Frame::default();
    let mut frame_components = [Component::default(); 3];
    let mut seen_frame = false;
    let mut adobe_rgb = false;
    let mut pos = 2;
    loop {
        if bytes.get(pos) != Some(&0xFF) {
            return Err(format!("no marker at byte {pos} of the headers"));
        }
        while bytes.get(pos + 1) == Some(&0xFF) {
            pos += 1;
        }
        let Some(&marker) = bytes.get(pos + 1) else {
            return Err("the headers end before a scan".into());
        };
        pos += 2;
        match marker {
            0x01 | 0xD0..=0xD7 => continue,
            0xD8 | 0xD9 => {
                return Err(format!(
                    "marker {marker:02X} at byte {} before a scan",
                    pos - 2
                ))
            }
            _ => {}
        }
        let len = be16(bytes, pos).ok_or("the headers end before a scan")?;
        let Some(segment) = bytes.get(pos + 2..pos + len).filter(|_| len >= 2) else {
            return Err(format!(
                "segment {marker:02X} at byte {} of {len} bytes runs past the end",
                pos - 2
            ));
        };
        let bad = |what: &str| format!("{what} in segment {marker:02X} at byte {}", pos - 2);
        match marker {
            0xC4 => {
                let mut s = segment;
                while let [class_id, rest @ ..] = s {
                    let (class, id) = (class_id >> 4, usize::from(class_id & 15));
                    if class > 1 || id > 3 || rest.len() < 16 {
                        return Err(bad("a bad Huffman table"));
                    }
                    let counts: [u8; 16] = rest[..16].try_into().map_err(|_| bad("short"))?;
                    let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
                    let symbols = rest
                        .get(16..16 + total)
                        .ok_or_else(|| bad("a short Huffman table"))?;
                    let table = if class == 0 {
                        &mut scratch.dc[id]
                    } else {
                        &mut scratch.ac[id]
                    };
                    table.build(&counts, symbols).map_err(|e| bad(&e))?;
                    s = &rest[16 + total..];
                }
            }
            0xDB => {
                let mut s = segment;
                while let [precision_id, rest @ ..] = s {
                    let (precision, id) = (precision_id >> 4, usize::from(precision_id & 15));
                    let size = if precision == 0 { 64 } else { 128 };
                    if precision > 1 || id > 3 || rest.len() < size {
                        return Err(bad("a bad quantization table"));
                    }
                    for (k, q) in scratch.quant[id].iter_mut().enumerate() {
                        *q = if precision == 0 {
                            i32::from(rest[k])
                        } else {
                            i32::from(u16::from_be_bytes([rest[2 * k], rest[2 * k + 1]]))
                        };
                    }
                    scratch.quant_defined[id] = true;
                    s = &rest[size..];
                }
            }
            0xDD => {
                frame.restart_interval = be16(segment, 0).ok_or_else(|| bad("a short DRI"))?;
            }
            0xC0 | 0xC1 => {
                if seen_frame {
                    return Err(bad("a second frame header"));
                }
                seen_frame = true;
                if segment.len() < 6 {
                    return Err(bad("a short frame header"));
                }
                let count = usize::from(segment[5]);
                if segment[0] != 8 || !(count == 1 || count == 3) {
                    return Ok(None);
                }
                if segment.len() != 6 + 3 * count {
                    return Err(bad("a frame header of the wrong length"));
                }
                frame.height = be16(segment, 1).unwrap_or(0);
                frame.width = be16(segment, 3).unwrap_or(0);
                if frame.height == 0 {
                    // The height comes after the scan (DNL): not taken.
                    return Ok(None);
                }
                if frame.width == 0 {
                    return Err(bad("a width of 0"));
                }
                frame.count = count;
                for (c, spec) in frame_components
                    .iter_mut()
                    .zip(segment[6..].chunks_exact(3))
                {
                    let (h, v) = (usize::from(spec[1] >> 4), usize::from(spec[1] & 15));
                    if !(1..=4).contains(&h) || !(1..=4).contains(&v) || spec[2] > 3 {
                        return Err(bad("a bad component"));
                    }
                    *c = Component {
                        id: spec[0],
                        h,
                        v,
                        quant: usize::from(spec[2]),
                        ..Component::default()
                    };
                }
            }
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return Ok(None),
            0xEE if segment.len() >= 12 && segment.starts_with(b"Adobe") && segment[11] == 0 => {
                adobe_rgb = true;
            }
            0xDA => {
                if !seen_frame {
                    return Err(bad("a scan before the frame header"));
                }
                let count =
                    usize::from(*segment.first().ok_or_else(|| bad("an empty scan header"))?);
                if count != frame.count {
                    // Components in separate scans: not taken.
                    return Ok(None);
                }
                if segment.len() != 4 + 2 * count {
                    return Err(bad("a scan header of the wrong length"));
                }
                let mut used = [false; 3];
                for (i, spec) in segment[1..1 + 2 * count].chunks_exact(2).enumerate() {
                    let index = frame_components[..count]
                        .iter()
                        .position(|c| c.id == spec[0])
                        .filter(|&k| !used[k])
                        .ok_or_else(|| bad("a scan of an unknown component"))?;
                    used[index] = true;
                    let (dc, ac) = (usize::from(spec[1] >> 4), usize::from(spec[1] & 15));
                    if dc > 3 || ac > 3 {
                        return Err(bad("a bad table number"));
                    }
                    frame.components[i] = Component {
                        dc,
                        ac,
                        ..frame_components[index]
                    };
                }
                let tail = &segment[1 + 2 * count..];
                if tail != [0, 63, 0] {
                    return Err(bad(
                        "spectral selection or approximation in a sequential scan",
                    ));
                }
                for c in &frame.components[..count] {
                    if !scratch.dc[c.dc].defined || !scratch.ac[c.ac].defined {
                        return Err(bad("a Huffman table not defined"));
                    }
                    if !scratch.quant_defined[c.quant] {
                        return Err(bad("a quantization table not defined"));
                    }
                }
                frame.scan_start = pos + len;
                break;
            }
            _ => {}
        }
        pos += len;
    }
    if frame.count == 1 {
        frame.components[0].h = 1;
        frame.components[0].v = 1;
        return Ok(Some(frame));
    }
    // Colour as RGB (Adobe's transform 0, or components named R, G, B): not taken.
    let ids: Vec<u8> = frame_components.iter().map(|c| c.id).collect();
    if adobe_rgb || ids == b"RGB" {
        return Ok(None);
    }
    // The first component's sampling the largest, each other's a divisor it upsamples
    // from: 1, 2 or 4 across, 1 or 2 down, not 4 and 2 at once.
    let (h_max, v_max) = (frame_components[0].h, frame_components[0].v);
    for c in &frame_components[1..] {
        if h_max % c.h != 0 || v_max % c.v != 0 {
            return Ok(None);
        }
        let (fh, fv) = (h_max / c.h, v_max / c.v);
        if !matches!((fh, fv), (1 | 2, 1 | 2) | (4, 1)) {
            return Ok(None);
        }
    }
    if (0..3).any(|i| frame.components[i].id != frame_components[i].id) {
        // The scan's order differs from the frame's: not taken.
        return Ok(None);
    }
    Ok(Some(frame))
}

/// The region's blocks, decoded, upsampled and converted into `out[at..]`.
#[inline(always)]
fn decode_scan(
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
            let (dc_table, ac_table) = (&scratch.dc[c.dc], &scratch.ac[c.ac]);
            let wanted = (g.rows.0..g.rows.1).contains(&my) && (g.cols.0..g.cols.1).contains(&mx);
            if !wanted {
                for _ in 0..c.h * c.v {
                    bits.skip_block(dc_table, ac_table, &mut dc[k])?;
                }
                continue;
            }
            let quant = &scratch.quant[c.quant];
            let (bw, bh) = g.block;
            let (x0, y0) = ((mx - g.cols.0) * c.h * bw, (my - g.rows.0) * c.v * bh);
            for by in 0..c.v {
                for bx in 0..c.h {
                    let last = bits.block(dc_table, ac_table, quant, &mut dc[k], &mut coefs)?;
                    let start = (y0 + by * bh) * g.width + x0 + bx * bw;
                    let plane = &mut scratch.planes[k][start..];
                    idct::idct(&coefs, last <= 1, bw, bh, plane, g.width);
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
