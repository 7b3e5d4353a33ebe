//! Inverse DCTs of one block to 8, 4, 2 or 1 samples a side.
//!
//! The 8-point one runs down the columns as the Loeffler-Ligtenberg-Moschytz factorisation
//! libjpeg's "islow" uses, in 12-bit fixed point with two extra bits kept, eight columns
//! in lanes; then along each row as a sum of the basis rows at the same scale, eight
//! samples in lanes, so that the compiler vectorises both without a transpose. A scaled block of N samples a side holds each the
//! mean of the 8/N x 8/N source samples it stands for, taken in the transform. Arithmetic wraps:
//! a corrupt block gives wrong pixels, never a panic.

use std::num::Wrapping as W;

use super::huffman::ZIGZAG;

type Lanes = [[W<i32>; 8]; 8];

/// Pass 2's rounding and the +128 level shift, at its scale (2^17). The rounding carries
/// pass 1's (512) too, as zune-jpeg's does: the same bytes where it matters most.
const PASS2_BIAS: i32 = 512 + (1 << 16) + (128 << 17);

#[inline(always)]
fn pass(v: &Lanes, bias: i32, shift: usize) -> Lanes {
    let mut o = [[W(0); 8]; 8];
    let (c, b) = (W, W(bias));
    for l in 0..8 {
        let (s0, s1, s2, s3) = (v[0][l], v[1][l], v[2][l], v[3][l]);
        let (s4, s5, s6, s7) = (v[4][l], v[5][l], v[6][l], v[7][l]);
        // Even part.
        let p1 = (s2 + s6) * c(2217);
        let t2 = p1 + s6 * c(-7567);
        let t3 = p1 + s2 * c(3135);
        let t0 = (s0 + s4) << 12;
        let t1 = (s0 - s4) << 12;
        let (x0, x3) = (t0 + t3 + b, t0 - t3 + b);
        let (x1, x2) = (t1 + t2 + b, t1 - t2 + b);
        // Odd part.
        let (z1, z2, z3, z4) = (s7 + s1, s5 + s3, s7 + s3, s5 + s1);
        let z5 = (z3 + z4) * c(4816);
        let (z1, z2) = (z1 * c(-3685), z2 * c(-10497));
        let (z3, z4) = (z3 * c(-8034) + z5, z4 * c(-1597) + z5);
        let a0 = s7 * c(1223) + z1 + z3;
        let a1 = s5 * c(8410) + z2 + z4;
        let a2 = s3 * c(12586) + z2 + z3;
        let a3 = s1 * c(6149) + z1 + z4;
        o[0][l] = (x0 + a3) >> shift;
        o[7][l] = (x0 - a3) >> shift;
        o[1][l] = (x1 + a2) >> shift;
        o[6][l] = (x1 - a2) >> shift;
        o[2][l] = (x2 + a1) >> shift;
        o[5][l] = (x2 - a1) >> shift;
        o[3][l] = (x3 + a0) >> shift;
        o[4][l] = (x3 - a0) >> shift;
    }
    o
}

#[inline(always)]
fn pixel(x: W<i32>) -> u8 {
    x.0.clamp(0, 255) as u8
}

/// The rows and the columns of a block (natural order) that its first k coefficients in
/// zigzag order reach, 4 or 8 each: `REACH[k]`, k up to 64.
const REACH: [(u8, u8); 65] = {
    let mut reach = [(4u8, 4u8); 65];
    let (mut k, mut rows, mut cols) = (0, 0, 0);
    while k < 64 {
        let at = ZIGZAG[k] as usize;
        if at / 8 >= 4 {
            rows = 4;
        }
        if at % 8 >= 4 {
            cols = 4;
        }
        reach[k + 1] = (4 + rows, 4 + cols);
        k += 1;
    }
    reach
};

/// 8 x 8 samples of `coefs` (natural order, dequantized) into `out`, rows `stride` apart;
/// `last` is the zigzag index past the last coefficient that may be non-zero. A block whose
/// coefficients lie in the first four rows or columns (most of a photograph's) takes a
/// transform that leaves out the others' zero terms: the same integers, fewer products.
#[inline(always)]
pub(super) fn idct8(coefs: &[i32; 80], last: usize, out: &mut [u8], stride: usize) {
    match REACH[last.min(64)] {
        (4, 4) => idct8_within::<4, 4>(coefs, out, stride),
        (4, _) => idct8_within::<4, 8>(coefs, out, stride),
        (_, 4) => idct8_within::<8, 4>(coefs, out, stride),
        _ => idct8_within::<8, 8>(coefs, out, stride),
    }
}

/// [`idct8`] of a block whose non-zero coefficients lie in its first `R` rows and `C`
/// columns.
#[inline(always)]
fn idct8_within<const R: usize, const C: usize>(coefs: &[i32; 80], out: &mut [u8], stride: usize) {
    let mut v = [[W(0); 8]; 8];
    for (r, row) in v.iter_mut().enumerate().take(R) {
        for (x, c) in row.iter_mut().zip(&coefs[r * 8..r * 8 + 8]) {
            *x = W(*c);
        }
    }
    let columns = pass(&v, 512, 10);
    // Pass 2 along each row as a sum of basis rows (sample x of frequency u is
    // `ROWS[u][x]`), eight lanes across x: no transpose, the compiler keeps it in
    // registers.
    for (row, line) in columns.iter().zip(out.chunks_mut(stride)) {
        let mut acc = [W(PASS2_BIAS); 8];
        for (&t, basis) in row.iter().zip(&ROWS).take(C) {
            for (a, &k) in acc.iter_mut().zip(basis) {
                *a += t * W(k);
            }
        }
        for (p, a) in line[..8].iter_mut().zip(acc) {
            *p = pixel(a >> 17);
        }
    }
}

/// The 8-point inverse DCT's basis at the butterfly's scale (about 4096 sqrt 2
/// cos((2x+1) u pi / 16), 4096 for u = 0): `ROWS[u]` is what the factorisation in `pass`
/// makes of frequency u alone, products of its 12-bit constants, so that the sums give
/// the same integers as the factorisation would.
const ROWS: [[i32; 8]; 8] = [
    [4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096],
    [5683, 4816, 3219, 1131, -1131, -3219, -4816, -5683],
    [5352, 2217, -2217, -5352, -5352, -2217, 2217, 5352],
    [4816, -1129, -5681, -3218, 3218, 5681, 1129, -4816],
    [4096, -4096, -4096, 4096, 4096, -4096, -4096, 4096],
    [3219, -5681, 1132, 4816, -4816, -1132, 5681, -3219],
    [2217, -5350, 5350, -2217, -2217, 5350, -5350, 2217],
    [1131, -3218, 4816, -5680, 5680, -4816, 3218, -1131],
];

/// The kernels at 2^12, by output samples a side: output sample y of a block at 1/s is the
/// mean of source samples s*y .. s*y+s-1 of the 8-point inverse DCT, so `K[y][u]` is
/// C(u)/2 times the mean of cos((2x+1) u pi / 16) over those x, C(0) = 1/sqrt 2 (at 1/1,
/// the plain inverse DCT; at 1/8, the DC alone). Exact but for rounding and clamping, where
/// libjpeg's N-point scaled transforms drop the frequencies above N and sample the series
/// at each box's centre: closer to what a resizer makes of a full decode.
const K8: [[i32; 8]; 8] = [
    [1448, 2009, 1892, 1703, 1448, 1138, 784, 400],
    [1448, 1703, 784, -400, -1448, -2009, -1892, -1138],
    [1448, 1138, -784, -2009, -1448, 400, 1892, 1703],
    [1448, 400, -1892, -1138, 1448, 1703, -784, -2009],
    [1448, -400, -1892, 1138, 1448, -1703, -784, 2009],
    [1448, -1138, -784, 2009, -1448, -400, 1892, -1703],
    [1448, -1703, 784, 400, -1448, 2009, -1892, 1138],
    [1448, -2009, 1892, -1703, 1448, -1138, 784, -400],
];
const K4: [[i32; 8]; 4] = [
    [1448, 1856, 1338, 652, 0, -435, -554, -369],
    [1448, 769, -1338, -1573, 0, 1051, 554, -153],
    [1448, -769, -1338, 1573, 0, -1051, 554, 153],
    [1448, -1856, 1338, -652, 0, 435, -554, 369],
];
const K2: [[i32; 8]; 2] = [
    [1448, 1312, 0, -461, 0, 308, 0, -261],
    [1448, -1312, 0, 461, 0, -308, 0, 261],
];
const K1: [[i32; 8]; 1] = [[1448, 0, 0, 0, 0, 0, 0, 0]];

fn kernel(side: usize) -> &'static [[i32; 8]] {
    match side {
        8 => &K8,
        4 => &K4,
        2 => &K2,
        _ => &K1,
    }
}

/// `across` x `down` samples, each the mean of a box of the full transform, by the
/// kernels' matrix products (the scaled and the unevenly scaled blocks).
#[inline(always)]
fn idct_box(coefs: &[i32; 80], across: usize, down: usize, out: &mut [u8], stride: usize) {
    let (kx, ky) = (kernel(across), kernel(down));
    // Pass 1, down the columns: tmp[y][u], at 2^2.
    let mut tmp = [[W(0i32); 8]; 8];
    for (row, k) in tmp.iter_mut().zip(ky) {
        for (u, t) in row.iter_mut().enumerate() {
            let mut sum = W(512);
            for (v, k) in k.iter().enumerate() {
                sum += W(coefs[v * 8 + u]) * W(*k);
            }
            *t = sum >> 10;
        }
    }
    // Pass 2, along the rows.
    for (y, row) in tmp.iter().take(ky.len()).enumerate() {
        for (x, k) in kx.iter().enumerate() {
            let mut sum = W((1 << 13) + (128 << 14));
            for (t, k) in row.iter().zip(k) {
                sum += *t * W(*k);
            }
            out[y * stride + x] = pixel(sum >> 14);
        }
    }
}

/// A block's `across` x `down` samples (8, 4, 2 or 1 each way) into `out`, rows `stride`
/// apart; `last` is the zigzag index past its last coefficient that may be non-zero (1:
/// the DC alone).
#[inline(always)]
pub(super) fn idct(
    coefs: &[i32; 80],
    last: usize,
    across: usize,
    down: usize,
    out: &mut [u8],
    stride: usize,
) {
    if last <= 1 || across * down == 1 {
        let v = pixel(W((coefs[0].wrapping_add(4 + 1024)) >> 3));
        for y in 0..down {
            out[y * stride..y * stride + across].fill(v);
        }
        return;
    }
    if across == 8 && down == 8 {
        idct8(coefs, last, out, stride);
    } else {
        idct_box(coefs, across, down, out, stride);
    }
}
