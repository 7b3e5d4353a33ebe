//! Three channels of a run of pixels interleaved into RGB with byte shuffles, where the CPU
//! has them (found at run time).
#![allow(unsafe_code)]

/// Proof that the CPU has SSSE3 (byte shuffles), found at run time.
#[derive(Clone, Copy)]
pub(super) struct Ssse3(());

impl Ssse3 {
    pub(super) fn detect() -> Option<Ssse3> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ssse3") {
            return Some(Ssse3(()));
        }
        None
    }
}

/// Byte k of each of the three 16-byte stores of 16 interleaved pixels takes byte
/// `SHUFFLE[c][store][k]` of channel c, or nothing (0x80) where another channel's goes.
const SHUFFLE: [[[u8; 16]; 3]; 3] = {
    let mut masks = [[[0x80u8; 16]; 3]; 3];
    let mut i = 0;
    while i < 48 {
        masks[i % 3][i / 16][i % 16] = (i / 3) as u8;
        i += 1;
    }
    masks
};

/// 16 pixels' red, green and blue channels written interleaved (RGB RGB ...) into `out`.
#[inline(always)]
pub(super) fn interleave16(
    ssse3: Ssse3,
    red: &[u8; 16],
    green: &[u8; 16],
    blue: &[u8; 16],
    out: &mut [u8; 48],
) {
    let _ = ssse3;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an `Ssse3` exists only where the CPU was found to have SSSE3.
    unsafe {
        interleave16_ssse3(red, green, blue, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Ssse3 is made off x86-64")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
#[inline]
fn interleave16_ssse3(red: &[u8; 16], green: &[u8; 16], blue: &[u8; 16], out: &mut [u8; 48]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128,
    };
    // SAFETY: each load reads 16 bytes of a 16-byte array; it takes any alignment.
    let (r, g, b) = unsafe {
        (
            _mm_loadu_si128(red.as_ptr().cast::<__m128i>()),
            _mm_loadu_si128(green.as_ptr().cast::<__m128i>()),
            _mm_loadu_si128(blue.as_ptr().cast::<__m128i>()),
        )
    };
    for (store, chunk) in out.chunks_exact_mut(16).enumerate() {
        // SAFETY: as above, 16-byte arrays.
        let (mr, mg, mb) = unsafe {
            (
                _mm_loadu_si128(SHUFFLE[0][store].as_ptr().cast::<__m128i>()),
                _mm_loadu_si128(SHUFFLE[1][store].as_ptr().cast::<__m128i>()),
                _mm_loadu_si128(SHUFFLE[2][store].as_ptr().cast::<__m128i>()),
            )
        };
        let rg = _mm_or_si128(_mm_shuffle_epi8(r, mr), _mm_shuffle_epi8(g, mg));
        let bytes = _mm_or_si128(rg, _mm_shuffle_epi8(b, mb));
        // SAFETY: `chunk` is 16 writable bytes; the store takes any alignment.
        unsafe { _mm_storeu_si128(chunk.as_mut_ptr().cast::<__m128i>(), bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shuffled_interleave_writes_what_the_plain_one_does() {
        let Some(ssse3) = Ssse3::detect() else {
            return;
        };
        let channel = |seed: u8| std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ seed);
        let (red, green, blue): ([u8; 16], [u8; 16], [u8; 16]) =
            (channel(1), channel(0x5A), channel(0xC3));
        let mut out = [0u8; 48];
        interleave16(ssse3, &red, &green, &blue, &mut out);
        let plain: Vec<u8> = (0..16).flat_map(|i| [red[i], green[i], blue[i]]).collect();
        assert_eq!(out[..], plain[..]);
    }
}
