//! Helpers shared by the integration tests.

/// The bytes of generated sample `i`: its id, then a length that varies with it, so a sample
/// delivered in the wrong place or with the wrong bytes is caught.
pub fn content(i: u32) -> Vec<u8> {
    let len = 100 + (i as usize * 7919) % 3000;
    let mut v = format!("sample {i};").into_bytes();
    v.extend((0..len).map(|k| (k as u32 ^ i) as u8));
    v
}
