"""Writes the numpy fixtures of crates/array (tests/numpy_files.rs and the fuzz checker) with
numpy itself: arrays of every supported dtype whose values Rust recomputes (aranges), in C and
Fortran order, big-endian, 0-d and empty, headers of format versions 2.0 and 3.0, dtypes the
crate refuses, and archives by np.savez (stored, zip64 local headers) and
np.savez_compressed (deflated, refused). Run with numpy installed:
    python3 crates/array/tests/data/make.py
"""

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name):
    return os.path.join(HERE, name)


def save(name, a):
    np.save(path(name), a)


def write(name, a, version):
    with open(path(name), "wb") as f:
        np.lib.format.write_array(f, a, version=version)


save("f4_3x4.npy", np.arange(12, dtype="<f4").reshape(3, 4))
save("i8_big_endian.npy", np.arange(6, dtype=">i8").reshape(2, 3))
# [[0, 1, 2], [3, 4, 5]] in column-major order: 0 3 1 4 2 5.
save("i2_fortran.npy", np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3)))
save("u1_0d.npy", np.array(7, dtype=np.uint8))
save("f8_empty.npy", np.zeros((0, 5), dtype="<f8"))
save("bool.npy", np.array([True, False, True]))
save("c8.npy", (np.arange(4) + 1j * np.arange(4, 8)).astype("<c8"))
save("f2.npy", np.arange(5, dtype="<f2"))
save("u8_3d.npy", np.arange(24, dtype="<u8").reshape(2, 3, 4))
write("u4_v2.npy", np.arange(10, dtype="<u4"), (2, 0))
write("i4_v3.npy", np.arange(3, dtype=">i4"), (3, 0))
save("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")]))
save("unicode.npy", np.array(["ab", "c"]))
save("datetime.npy", np.array(["2026-01-01"], dtype="datetime64[D]"))

np.savez(
    path("arrays.npz"),
    image=np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
    label=np.int64(3),
    mask=np.array([True, False]),
)
# One sample each: stacked they are np.arange(18, dtype='<f4').reshape(3, 2, 3).
samples = [np.arange(6 * i, 6 * i + 6, dtype="<f4").reshape(2, 3) for i in range(3)]
np.savez(path("samples.npz"), *samples)
np.savez_compressed(path("compressed.npz"), a=np.arange(10))
print("numpy", np.__version__)
