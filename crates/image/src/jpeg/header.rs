//! The markers before the scan: tables, frame and scan headers.

use super::huffman::Table;

/// A component of the frame.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Component {
    pub(super) id: u8,
    /// Sampling factors.
    pub(super) h: usize,
    pub(super) v: usize,
    /// Quantization and Huffman tables.
    pub(super) quant: usize,
    pub(super) dc: usize,
    pub(super) ac: usize,
}

/// What the headers say, up to the scan's first byte.
#[derive(Default, Debug)]
pub(super) struct Frame {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) count: usize,
    /// In the scan's order.
    pub(super) components: [Component; 3],
    pub(super) restart_interval: usize,
    pub(super) scan_start: usize,
}
/// The tables the headers define, rebuilt in place from image to image.
pub(super) struct Tables {
    pub(super) dc: [Table; 4],
    pub(super) ac: [Table; 4],
    /// Zigzag order.
    pub(super) quant: [[i32; 64]; 4],
    pub(super) quant_defined: [bool; 4],
}

impl Default for Tables {
    fn default() -> Self {
        Tables {
            dc: Default::default(),
            ac: Default::default(),
            quant: [[0; 64]; 4],
            quant_defined: [false; 4],
        }
    }
}

fn be16(bytes: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes(
        bytes.get(at..at + 2)?.try_into().ok()?,
    )))
}
/// Reads the markers up to the first scan into `scratch`'s tables; `None` for a frame
/// this decoder does not take.
pub(super) fn read_headers(bytes: &[u8], scratch: &mut Tables) -> Result<Option<Frame>, String> {
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
