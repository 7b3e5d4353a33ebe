"""The local disk cache below the memory cache (Cache(disk=..., disk_bytes=...)): the same
batches as without it, entries a later loader of the same dataset finds, and the settings
the loader refuses, each by its name."""

import re

import numpy as np
import pytest

import lobster_io
from test_loader import make_folder

SAMPLES = 240
# A memory cache of a tenth of the dataset and a disk that holds all of it: the plan then
# keeps on the disk what memory cannot.
MEMORY_FRAC = 0.1
DISK_BYTES = 4 << 20


def run(data, epochs, cache, **kw):
    """Every batch's epoch, ids and images of a loader over `data`, and its metrics."""
    loader = lobster_io.Loader(str(data), 16, epochs=epochs, seed=3, cache=cache, **kw)
    batches = []
    for epoch in range(loader.epochs):
        loader.set_epoch(epoch)
        for b in loader:
            images = b.images
            images = [bytes(x) for x in images] if isinstance(images, list) else images.copy()
            batches.append((b.epoch, b.ids.tolist(), images))
    m = loader.metrics()
    loader.close()
    return batches, m


def same(a, b):
    assert len(a) == len(b)
    for (e1, ids1, img1), (e2, ids2, img2) in zip(a, b):
        assert (e1, ids1) == (e2, ids2)
        if isinstance(img1, list):
            assert img1 == img2
        else:
            assert np.array_equal(img1, img2)


@pytest.mark.parametrize("policy", ["reuse", "static"])
def test_a_disk_cache_delivers_the_bytes_of_the_loader_without_one(tmp_path, policy):
    files, _ = make_folder(tmp_path / "data", SAMPLES, 4, size=(20, 16))
    # The samples' own bytes (a decode callable that keeps them): what the disk keeps.
    raw = dict(transform="none", decode=lambda b: b)
    memory = lobster_io.Cache(frac=MEMORY_FRAC, policy=policy)
    disk = lobster_io.Cache(
        frac=MEMORY_FRAC, policy=policy, disk=tmp_path / "disk", disk_bytes=DISK_BYTES
    )
    plain, m_plain = run(tmp_path / "data", 2, memory, **raw)
    tiered, m = run(tmp_path / "data", 2, disk, **raw)
    same(plain, tiered)
    assert sorted(i for _, ids, _ in plain[: len(plain) // 2] for i in ids) == list(range(SAMPLES))
    # Each id's bytes are its file's.
    for _, ids, images in tiered:
        for i, got in zip(ids, images):
            assert got == files[i].read_bytes(), f"sample {i}"
    assert m_plain["disk_cache"] is None
    d = m["disk_cache"]
    assert d["capacity_bytes"] == DISK_BYTES, d
    assert d["writes"] > 0 and d["planned_hits"] > 0, d
    # Every planned disk hit was read from the disk, or from storage and counted.
    assert d["hits"] + d["fallbacks"] == d["planned_hits"], d
    assert d["hits"] > 0 and d["damaged"] == 0 and d["io_errors"] == 0, d
    # What the disk served, storage did not: the second epoch reads less than without it.
    assert m["storage_reads_by_epoch"][1] < m_plain["storage_reads_by_epoch"][1], (m, m_plain)


def test_a_later_loader_starts_with_what_the_last_one_left_on_the_disk(tmp_path):
    make_folder(tmp_path / "data", SAMPLES, 4, size=(20, 16))
    cache = lobster_io.Cache(
        frac=MEMORY_FRAC, disk=str(tmp_path / "disk"), disk_bytes=DISK_BYTES
    )
    first, m1 = run(tmp_path / "data", 2, cache, image_size=8)
    d1 = m1["disk_cache"]
    assert d1["seeds"] == 0 and d1["entries"] > 0, d1
    again, m2 = run(tmp_path / "data", 2, cache, image_size=8)
    same(first, again)
    d2 = m2["disk_cache"]
    assert d2["dir"] == d1["dir"], (d1, d2)
    assert d2["seeds"] > 0 and d2["planned_seed_hits"] > 0, d2
    assert d2["hits"] + d2["fallbacks"] == d2["planned_hits"], d2
    # Its first epoch reads from storage only what neither the disk nor memory held.
    assert m2["storage_reads_by_epoch"][0] < m1["storage_reads_by_epoch"][0], (m1, m2)
    assert m1["storage_reads_by_epoch"][0] == SAMPLES, m1


def test_disk_and_disk_bytes_go_together(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    with pytest.raises(ValueError, match=r"^cache\.disk = .* needs cache\.disk_bytes"):
        lobster_io.Loader(str(tmp_path / "data"), 4, cache=lobster_io.Cache(disk=tmp_path / "d"))
    with pytest.raises(ValueError, match=r"^cache\.disk_bytes = 8192 needs cache\.disk"):
        lobster_io.Loader(str(tmp_path / "data"), 4, cache=lobster_io.Cache(disk_bytes=8192))
    with pytest.raises(ValueError, match=r"^cache\.disk_bytes = -1: "):
        lobster_io.Loader(
            str(tmp_path / "data"), 4, cache=lobster_io.Cache(disk=tmp_path / "d", disk_bytes=-1)
        )
    assert not (tmp_path / "d").exists()


def first_batch(data, cache):
    loader = lobster_io.Loader(str(data), 4, image_size=8, cache=cache)
    try:
        return next(iter(loader))
    finally:
        loader.close()


def test_disks_the_loader_cannot_use_are_refused_by_name(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    disk = tmp_path / "disk"
    with pytest.raises(ValueError, match=r"cache\.disk_bytes = 0: allowed at least one 4096"):
        first_batch(tmp_path / "data", lobster_io.Cache(disk=disk, disk_bytes=0))
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"not a directory")
    with pytest.raises(ValueError, match=rf"cache\.disk = {re.escape(str(a_file))}: allowed a directory"):
        first_batch(tmp_path / "data", lobster_io.Cache(disk=a_file, disk_bytes=1 << 20))
    # LRU has no plan over two levels.
    with pytest.raises(ValueError, match=r"cache\.disk = .*: allowed .*reuse or static, not lru"):
        first_batch(
            tmp_path / "data", lobster_io.Cache(policy="lru", disk=disk, disk_bytes=1 << 20)
        )
    # The disk keeps encoded bytes: a decoded tier with it is refused.
    with pytest.raises(ValueError, match=r"cache\.disk = .*: allowed no disk cache with cache_forms"):
        first_batch(
            tmp_path / "data", lobster_io.Cache(forms="decoded", disk=disk, disk_bytes=1 << 20)
        )
    # A usable disk then works.
    assert first_batch(tmp_path / "data", lobster_io.Cache(disk=disk, disk_bytes=1 << 20)).ids.size == 4
