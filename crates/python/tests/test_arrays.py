"""lobster_io.decode_array and decode_npz against np.load on files numpy writes."""

import io

import numpy as np
import pytest

import lobster_io

DTYPES = ["?", "i1", "u1", "<i2", ">i2", "<u4", ">i8", "<f2", "<f4", ">f8", "<c8", ">c16"]


def arrays():
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        for shape in [(), (0,), (7,), (3, 5), (2, 0, 4), (4, 3, 2)]:
            a = (rng.standard_normal(shape) * 100).astype(dtype)
            yield a
    yield np.asfortranarray(np.arange(24, dtype="<f4").reshape(2, 3, 4))
    yield np.arange(30, dtype=">u2").reshape(5, 6).T


def saved(a, version=None):
    f = io.BytesIO()
    if version is None:
        np.save(f, a)
    else:
        np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


def same(got, want):
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.flags.f_contiguous == want.flags.f_contiguous
    assert got.flags.c_contiguous == want.flags.c_contiguous
    assert got.flags.writeable
    assert got.tobytes(order="A") == want.tobytes(order="A")


@pytest.mark.parametrize("version", [None, (2, 0), (3, 0)])
def test_npy_decodes_as_np_load_does(version):
    for a in arrays():
        b = saved(a, version)
        same(lobster_io.decode_array(b), np.load(io.BytesIO(b)))


def test_npz_decodes_as_np_load_does_in_its_order():
    members = dict(zip("abcdefg", list(arrays())[::9]))
    f = io.BytesIO()
    np.savez(f, **members)
    b = f.getvalue()
    got = lobster_io.decode_npz(b)
    want = np.load(io.BytesIO(b))
    assert list(got) == list(want.keys())
    for key in want.keys():
        same(got[key], want[key])


def test_bad_arrays_are_decode_errors_that_say_what():
    b = saved(np.arange(10, dtype="<i4"))
    with pytest.raises(lobster_io.DecodeError, match="bytes"):
        lobster_io.decode_array(b[:-1])
    with pytest.raises(lobster_io.DecodeError):
        lobster_io.decode_array(b, bytes_max=39)
    assert lobster_io.decode_array(b, bytes_max=40).sum() == 45
    with pytest.raises(lobster_io.DecodeError, match="O"):
        lobster_io.decode_array(saved(np.array([1, "x"], dtype=object)))
    f = io.BytesIO()
    np.savez_compressed(f, volume=np.zeros(100))
    with pytest.raises(lobster_io.DecodeError, match="volume"):
        lobster_io.decode_npz(f.getvalue())
    with pytest.raises(lobster_io.DecodeError):
        lobster_io.decode_array(b"\x93NUMPY")


def test_a_view_is_the_same_array_read_only_over_the_bytes():
    for a in arrays():
        b = saved(a)
        view = lobster_io.decode_array(b, copy=False)
        want = np.load(io.BytesIO(b))
        assert (view.dtype, view.shape) == (want.dtype, want.shape)
        assert view.tobytes(order="A") == want.tobytes(order="A")
        assert not view.flags.writeable
    f = io.BytesIO()
    np.savez(f, a=np.arange(5), b=np.ones((2, 2), ">f8"))
    views = lobster_io.decode_npz(f.getvalue(), copy=False)
    assert views["a"].tolist() == list(range(5)) and views["b"].sum() == 4
