//! The pixel bound: an image whose header claims more pixels than the bound is refused, by
//! its dimensions, before the decoder allocates anything of its size. Every allocation this
//! test binary makes is recorded per thread, so that a refusal can be shown not to allocate.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use lobster_image::{decode, decode_within, ImageError, PIXELS_MAX_DEFAULT, PIXELS_MAX_LIMIT};

struct Recording;

thread_local! {
    /// The largest allocation this thread asked for since it was reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(bytes)));
}

// SAFETY: every call is passed to the system allocator unchanged; only sizes are noted.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static RECORDING: Recording = Recording;

/// `f`'s result and the largest allocation it made.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|c| c.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get))
}

/// What a refusal may allocate: its error's text, nothing of the image's size.
const REFUSAL_BYTES_MAX: usize = 64 << 10;

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `name` (a JPEG) with its frame header claiming `width` x `height`.
fn jpeg_claiming(name: &str, width: u16, height: u16) -> Vec<u8> {
    let mut b = data(name);
    let sof = b
        .windows(2)
        .position(|w| w == [0xFF, 0xC0] || w == [0xFF, 0xC2])
        .expect("a frame header");
    b[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    b[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    b
}

/// CRC-32 (ISO-HDLC, as PNG chunks carry it).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `name` (a PNG) with its IHDR claiming `width` x `height`, optionally another depth and
/// colour type, its CRC made right so that only the size is wrong.
fn png_claiming(name: &str, width: u32, height: u32, depth_color: Option<(u8, u8)>) -> Vec<u8> {
    let mut b = data(name);
    assert_eq!(&b[12..16], b"IHDR");
    b[16..20].copy_from_slice(&width.to_be_bytes());
    b[20..24].copy_from_slice(&height.to_be_bytes());
    if let Some((depth, color)) = depth_color {
        (b[24], b[25]) = (depth, color);
    }
    let crc = crc32(&b[12..29]);
    b[29..33].copy_from_slice(&crc.to_be_bytes());
    b
}

fn assert_refused(name: &str, bytes: &[u8], pixels_max: u64, (width, height): (u32, u32)) {
    let (result, largest) = largest_allocation(|| decode_within(bytes, pixels_max));
    let e = result.expect_err(name);
    assert_eq!(
        e,
        ImageError::TooManyPixels {
            width,
            height,
            pixels_max
        },
        "{name}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("{width}x{height}")) && text.contains(&pixels_max.to_string()),
        "{name}: {text}"
    );
    assert!(
        largest <= REFUSAL_BYTES_MAX,
        "{name}: refusing allocated {largest} bytes at once"
    );
}

#[test]
fn a_16384_square_claim_is_refused_by_default_without_allocating() {
    let side = 16384;
    // Each file is whole but for its header's claim.
    let cases = [
        ("baseline JPEG", jpeg_claiming("rgb.jpg", side, side)),
        (
            "progressive JPEG",
            jpeg_claiming("progressive.jpg", side, side),
        ),
        ("8-bit RGB PNG", png_claiming("rgb.png", 16384, 16384, None)),
        (
            "16-bit grey PNG",
            png_claiming("gray16.png", 16384, 16384, None),
        ),
        (
            "16-bit RGBA PNG",
            png_claiming("gray16.png", 16384, 16384, Some((16, 6))),
        ),
    ];
    for (name, bytes) in &cases {
        let (result, largest) = largest_allocation(|| decode(bytes));
        let text = result.map(|_| ()).expect_err(name).to_string();
        assert!(text.contains("16384x16384"), "{name}: {text}");
        assert!(
            largest <= REFUSAL_BYTES_MAX,
            "{name}: refusing allocated {largest} bytes at once"
        );
        assert_refused(
            name,
            bytes,
            PIXELS_MAX_DEFAULT,
            (u32::from(side), u32::from(side)),
        );
    }
}

#[test]
fn the_largest_claims_are_refused_within_any_bound_below_them() {
    // The largest a JPEG can claim, and a PNG's beyond what u32 pixels hold.
    assert_refused(
        "65535 square JPEG",
        &jpeg_claiming("rgb.jpg", u16::MAX, u16::MAX),
        PIXELS_MAX_DEFAULT,
        (65535, 65535),
    );
    // A bound past the limit is the limit.
    let huge = png_claiming("rgb.png", 1 << 31, 1 << 31, None);
    let e = decode_within(&huge, u64::MAX).unwrap_err();
    assert!(e.to_string().contains(&PIXELS_MAX_LIMIT.to_string()), "{e}");
    assert_refused(
        "2^31 square PNG",
        &huge,
        PIXELS_MAX_LIMIT,
        (1 << 31, 1 << 31),
    );
}

#[test]
fn a_bound_set_lower_refuses_a_normal_image_and_its_equal_passes() {
    for name in ["rgb.jpg", "progressive.jpg", "rgb.png", "gray16.png"] {
        let bytes = data(name);
        // The fixtures are 24x16: 384 pixels.
        assert_refused(name, &bytes, 383, (24, 16));
        let image = decode_within(&bytes, 384).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((image.width(), image.height()), (24, 16), "{name}");
    }
}

#[test]
fn a_tall_thin_image_within_the_bound_is_not_refused_for_its_side() {
    // A side past the decoders' default limit of 16384, in fewer pixels than the bound: the
    // header is read and the refusal is the decoder's (no pixels), not the bound's.
    let bytes = png_claiming("rgb.png", 20000, 1, None);
    let e = decode_within(&bytes, 1 << 20).unwrap_err();
    assert!(
        !matches!(e, ImageError::TooManyPixels { .. }) && !e.to_string().contains("limit"),
        "{e}"
    );
}
