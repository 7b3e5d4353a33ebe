"""lobster_io from Python: the order PyTorch's sampler gives, pixels as Pillow decodes them,
batches as views of the loader's buffers, and errors that name what failed."""

import json
import os
import pathlib

import numpy as np
import pytest
from PIL import Image

import lobster_io

VECTORS = (
    pathlib.Path(__file__).resolve().parents[3]
    / "crates"
    / "lobster"
    / "tests"
    / "data"
    / "torch_sampler.json"
)


def make_folder(root, n, classes, size=(40, 30), seed=0):
    """An ImageFolder of `n` JPEGs written by Pillow, spread over `classes` class folders.

    Returns the files in torchvision's ImageFolder order (classes sorted, files sorted within
    each) with their labels: sample id i is entry i."""
    rng = np.random.default_rng(seed)
    names = [f"class_{c:02d}" for c in range(classes)]
    files = []
    for i in range(n):
        d = root / names[i % classes]
        d.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        path = d / f"img_{i:04d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        files.append(path)
    order = sorted(files, key=lambda p: (p.parent.name, p.name))
    labels = [names.index(p.parent.name) for p in order]
    return order, labels


def test_ids_and_labels_follow_torch_distributed_sampler(tmp_path):
    vectors = json.loads(VECTORS.read_text())
    case = next(v for v in vectors["randperm"] if v["n"] == 100 and v["seed"] == 42)
    files, labels = make_folder(tmp_path / "data", 100, 4)
    loader = lobster_io.Loader(str(tmp_path / "data"), 10, seed=42, image_size=16)
    assert len(loader) == 10
    ids, got_labels = [], []
    for batch in loader:
        assert batch.epoch == 0
        ids.extend(batch.ids.tolist())
        got_labels.extend(batch.labels.tolist())
    # One replica: DistributedSampler(shuffle=True, seed=42) at epoch 0 is randperm(100)
    # drawn from a generator seeded 42, as torch printed it.
    assert ids == case["perm"]
    assert got_labels == [labels[i] for i in ids]
    assert list(loader) == [], "one epoch was asked for"


def test_decoded_pixels_agree_with_pillow(tmp_path):
    files, _ = make_folder(tmp_path / "data", 6, 2, size=(97, 61))
    for path in files:
        ours = lobster_io.decode_image(path.read_bytes())
        pillow = np.asarray(Image.open(path).convert("RGB"))
        assert ours.shape == pillow.shape == (61, 97, 3)
        diff = np.abs(ours.astype(np.int16) - pillow.astype(np.int16)).mean()
        assert diff < 1.5, f"{path.name}: mean absolute difference {diff:.2f} levels"


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_batches_are_views_of_a_bounded_set_of_buffers_and_memory_stays_flat(tmp_path):
    make_folder(tmp_path / "data", 40, 2)
    loader = lobster_io.Loader(
        str(tmp_path / "data"), 8, epochs=40, image_size=64,
        budgets=lobster_io.Budgets(slots=2, decode_threads=2),
    )
    addresses = set()
    seen = 0
    for epoch in range(40):
        loader.set_epoch(epoch)
        for batch in loader:
            images = batch.images
            assert images.shape == (8, 64, 64, 3) and images.dtype == np.uint8
            assert images.__array_interface__["data"][0] == batch.buffer_address
            assert images.base is batch and images.flags.writeable
            addresses.add(batch.buffer_address)
            seen += 1
            if seen == 20:
                settled = rss_bytes()
            del images, batch
    assert seen == 200
    # Buffers are reused: the caller's slots plus the ones the feeder fills ahead.
    assert len(addresses) <= 4, addresses
    grown = rss_bytes() - settled
    assert grown < 16 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB over 180 batches"


def test_a_held_view_keeps_its_batch_and_channels_first_is_a_view_too(tmp_path):
    make_folder(tmp_path / "data", 16, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, image_size=8, channels_first=True)
    batch = next(iter(loader))
    images = batch.images
    assert images.shape == (4, 3, 8, 8)
    first = images.copy()
    address = batch.buffer_address
    del batch
    # The view still holds the batch: its buffer is not reused while the view lives.
    for other in loader:
        assert other.buffer_address != address
    assert np.array_equal(images, first)


def test_errors_name_the_sample_the_file_and_the_parameter(tmp_path):
    files, _ = make_folder(tmp_path / "data", 12, 2)
    bad = files[5]
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all" * 4)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, image_size=8)
    with pytest.raises(lobster_io.DecodeError) as e:
        for _ in loader:
            pass
    assert bad.name in str(e.value) and "sample 5" in str(e.value), str(e.value)
    assert isinstance(e.value, lobster_io.Error)

    with pytest.raises(ValueError, match="cache.frac"):
        lobster_io.Loader(str(tmp_path / "data"), 4, cache=lobster_io.Cache(frac=2.0))
    with pytest.raises(ValueError, match="transform"):
        lobster_io.Loader(str(tmp_path / "data"), 4, transform="sideways")
    with pytest.raises(lobster_io.DatasetError, match="missing"):
        lobster_io.Loader(str(tmp_path / "missing"), 4)


def test_settings_are_grouped_and_a_moved_keyword_says_where_it_went(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    data = str(tmp_path / "data")
    with pytest.raises(TypeError, match=r"cache_frac= is now cache=lobster_io\.Cache\(frac="):
        lobster_io.Loader(data, 4, cache_frac=0.5)
    with pytest.raises(TypeError, match=r"io_depth= is now budgets=lobster_io\.Budgets"):
        lobster_io.Loader(data, 4, io_depth=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        lobster_io.Loader(data, 4, nonsense=1)
    with pytest.raises(TypeError, match=r"cache= takes a lobster_io\.Cache"):
        lobster_io.Loader(data, 4, cache={"frac": 0.5})
    with pytest.raises(ValueError, match="budgets.io_depth = 'deep'"):
        lobster_io.Loader(data, 4, budgets=lobster_io.Budgets(io_depth="deep"))
    with pytest.raises(ValueError, match="budgets.slots = 0"):
        lobster_io.Loader(data, 4, budgets=lobster_io.Budgets(slots=0))
    with pytest.raises(ValueError, match='cache.policy = "belady"'):
        lobster_io.Loader(data, 4, cache=lobster_io.Cache(policy="belady"))
    with pytest.raises(ValueError, match="give both or neither"):
        lobster_io.Loader(data, 4, cache=lobster_io.Cache(storage_bytes_per_s=10**9))
    with pytest.raises(ValueError, match="cache.net_bytes_per_s = 0"):
        lobster_io.Loader(data, 4, cache=lobster_io.Cache(storage_bytes_per_s=10**9,
                                                          net_bytes_per_s=0))
    with pytest.raises(ValueError, match='assign = "nearest"'):
        lobster_io.Loader(data, 4, assign="nearest")
    # Locality needs the peers' caches planned as one: alone, the sampler's split, and why.
    alone = lobster_io.Loader(data, 4, assign="locality", image_size=8)
    assert sum(len(b) for b in alone) == 8
    assign = alone.metrics()["assign"]
    assert assign["mode"] == "sampler" and "no peers" in assign["reason"], assign
    assert alone.metrics()["cluster_plan"] is None
    alone.close()
    # The groups' defaults are the loader's: both loaders give the same batches.
    plain = lobster_io.Loader(data, 4, seed=5, image_size=8)
    grouped = lobster_io.Loader(data, 4, seed=5, image_size=8, cache=lobster_io.Cache(),
                                budgets=lobster_io.Budgets(), launch=lobster_io.Launch())
    for a, b in zip(plain, grouped):
        assert a.ids.tolist() == b.ids.tolist()
        assert (a.images == b.images).all()
    plain.close()
    grouped.close()


def test_skip_reports_the_skipped_sample_on_its_batch(tmp_path):
    files, _ = make_folder(tmp_path / "data", 12, 2)
    files[3].write_bytes(b"garbage")
    loader = lobster_io.Loader(
        str(tmp_path / "data"), 4, image_size=8, on_error="skip", max_failures=1
    )
    batches = list(loader)
    skipped = [s for b in batches for s in b.skipped]
    assert skipped == [3]
    delivered = sorted(i for b in batches for i in b.ids.tolist())
    assert delivered == [i for i in range(12) if i != 3]


def test_epochs_come_in_order(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, epochs=2, image_size=8)
    with pytest.raises(ValueError, match="epoch = 1"):
        loader.set_epoch(1)
    loader.set_epoch(0)
    assert [b.epoch for b in loader] == [0, 0]
    loader.set_epoch(1)
    assert [b.epoch for b in loader] == [1, 1]


def test_a_forked_child_is_told_to_build_its_own_loader(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, image_size=8)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            next(iter(loader))
        except lobster_io.Error as e:
            code = 0 if "another process" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(list(loader)) == 2, "the parent's loader is unaffected"


def test_ctrl_c_interrupts_a_waiting_iteration_without_losing_its_batch(tmp_path):
    import io
    import signal
    import threading

    # The decode function holds every sample until the interrupt has been raised, so the
    # first batch cannot arrive before it, however the machine schedules the threads.
    make_folder(tmp_path / "data", 8, 1)
    interrupted = threading.Event()

    def held_decode(data):
        interrupted.wait(60)
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    loader = lobster_io.Loader(
        str(tmp_path / "data"), 8, epochs=2, transform="none", decode=held_decode,
        budgets=lobster_io.Budgets(decode_threads=1), cache=lobster_io.Cache(frac=0.0),
    )
    it = iter(loader)
    # Python leaves SIGINT ignored when it starts ignored (a job started in the background
    # by a script): install the handler an interactive session has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
    finally:
        interrupted.set()
        timer.join()
        signal.signal(signal.SIGINT, previous)
    # The interrupted call took no batch: the first one is still the next.
    first = next(it)
    assert (first.epoch, first.iteration) == (0, 0)


def make_sized_folder(root, sizes):
    """JPEGs of the given (width, height) sizes in one class folder, in sample-id order."""
    rng = np.random.default_rng(1)
    d = root / "only"
    d.mkdir(parents=True)
    files = []
    for i, (w, h) in enumerate(sizes):
        path = d / f"img_{i:04d}.jpg"
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, quality=90)
        files.append(path)
    return files


def test_transform_none_gives_each_image_at_its_own_size_as_pillow_decodes_it(tmp_path):
    sizes = [(33, 20), (64, 64), (17, 90), (50, 41), (24, 16)]
    files = make_sized_folder(tmp_path / "data", sizes)
    loader = lobster_io.Loader(str(tmp_path / "data"), 2, transform="none", seed=3)
    seen = []
    for batch in loader:
        images = batch.images
        assert isinstance(images, list) and len(images) == len(batch)
        for i, image in zip(batch.ids.tolist(), images):
            w, h = sizes[i]
            assert image.shape == (h, w, 3) and image.dtype == np.uint8
            assert image.base is batch and image.flags.writeable
            pillow = np.asarray(Image.open(files[i]).convert("RGB"))
            diff = np.abs(image.astype(np.int16) - pillow.astype(np.int16)).mean()
            assert diff < 1.5, f"sample {i}: mean absolute difference {diff:.2f}"
            seen.append(i)
    # One rank, five samples in batches of two: the last batch has one.
    assert sorted(seen) == list(range(5)) and len(batch) == 1
    with pytest.raises(ValueError, match="transform"):
        lobster_io.Loader(str(tmp_path / "data"), 2, decode=lambda b: b)


def test_a_decode_callable_gets_each_sample_and_its_errors_name_the_sample(tmp_path):
    import io

    files, labels = make_folder(tmp_path / "data", 10, 2)

    def pillow_decode(data):
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    loader = lobster_io.Loader(str(tmp_path / "data"), 4, transform="none", decode=pillow_decode)
    ids = []
    for batch in loader:
        for i, image in zip(batch.ids.tolist(), batch.images):
            assert np.array_equal(image, np.asarray(Image.open(files[i]).convert("RGB")))
            ids.append(i)
        assert batch.labels.tolist() == [labels[i] for i in batch.ids.tolist()]
    # Ten samples in batches of four: the last batch has two.
    assert len(ids) == 10 and len(set(ids)) == 10 and len(batch) == 2

    def failing(data):
        if data == files[7].read_bytes():
            raise RuntimeError("this one is bad")
        return pillow_decode(data)

    loader = lobster_io.Loader(str(tmp_path / "data"), 5, transform="none", decode=failing)
    with pytest.raises(lobster_io.DecodeError) as e:
        list(loader)
    text = str(e.value)
    assert "sample 7" in text and files[7].name in text and "this one is bad" in text, text
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match="decode"):
        lobster_io.Loader(str(tmp_path / "data"), 5, transform="none", decode=42)


def test_a_position_is_given_whole_or_not_at_all(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    with pytest.raises(ValueError, match="all four"):
        lobster_io.Loader(str(tmp_path / "data"), 4, launch=lobster_io.Launch(rank=0, world_size=2))
    with pytest.raises(ValueError, match="local_world_size"):
        lobster_io.Loader(
            str(tmp_path / "data"), 4,
            launch=lobster_io.Launch(rank=0, world_size=3, local_rank=0, local_world_size=2),
        )
    with pytest.raises(ValueError, match="job_id"):
        lobster_io.Loader(
            str(tmp_path / "data"), 4,
            launch=lobster_io.Launch(rank=0, world_size=2, local_rank=0, local_world_size=2),
        )
    # One rank a node: rank 1 of 2 loads in this process, the second half of the shuffle.
    loader = lobster_io.Loader(
        str(tmp_path / "data"), 4, image_size=8,
        launch=lobster_io.Launch(rank=1, world_size=2, local_rank=0, local_world_size=1),
    )
    assert (loader.rank, loader.world_size, loader.local_world_size) == (1, 2, 1)
    assert loader.arena is None and len(loader) == 1


def test_decoded_images_in_the_cache_give_the_same_batches(tmp_path):
    make_folder(tmp_path / "data", 40, 4, size=(48, 36))

    def run(forms, decoding="whole"):
        loader = lobster_io.Loader(
            str(tmp_path / "data"), 8, epochs=3, seed=3, image_size=16, decoding=decoding,
            cache=lobster_io.Cache(frac=1.0, forms=forms),
        )
        out = []
        for epoch in range(loader.epochs):
            loader.set_epoch(epoch)
            out.extend((b.epoch, b.ids.tolist(), np.array(b.images)) for b in loader)
        m = loader.metrics()
        loader.close()
        return out, m

    # Decoding every image whole, the forms the cache keeps give the same bits.
    encoded, m_enc = run("encoded")
    for forms in ("decoded", "auto"):
        batches, m = run(forms)
        assert m["cache_forms"] == {"mode": forms, "reason": None}
        # The costs are a model of the images' pixels, never a timing.
        assert m["form_costs"]["decode_source"] == "model", m["form_costs"]
        assert m["form_costs"]["model_pixels"] == 40 * 48 * 36, m["form_costs"]
        assert len(batches) == len(encoded) == 15
        for (e1, ids1, img1), (e2, ids2, img2) in zip(encoded, batches):
            assert (e1, ids1) == (e2, ids2)
            assert np.array_equal(img1, img2)
        assert m["hits_encoded"] + m["hits_decoded"] == m["hits"] > 0
        if forms == "decoded":
            # Decoded images are kept, and their hits skip the decode.
            assert m["hits_encoded"] == 0
            assert m["decoded_hits_served"] > 0
            # A hit whose image was still being made decodes again, and says so.
            assert m["decoded_hits_served"] + m["decoded_again"] == m["hits_decoded"]
    assert m_enc["hits_decoded"] == 0 and m_enc["hits_encoded"] > 0
    # Decoding only what the crop keeps (the default): the same every run, and within the
    # region decode's stated tolerance for scaled decodes (a mean of 8 a byte, lobster-image's
    # tests/region.rs) of the whole decode whatever the cache keeps.
    for forms in ("encoded", "decoded"):
        first, _ = run(forms, "region")
        second, _ = run(forms, "region")
        for (e1, ids1, img1), (e2, ids2, img2), (_, ids0, img0) in zip(first, second, encoded):
            assert (e1, ids1) == (e2, ids2) and ids1 == ids0
            assert np.array_equal(img1, img2)
            mean = np.abs(img1.astype(np.int16) - img0.astype(np.int16)).mean()
            assert mean <= 8.0, (forms, e1, mean)
    with pytest.raises(ValueError, match="cache.forms"):
        lobster_io.Loader(str(tmp_path / "data"), 8, cache=lobster_io.Cache(forms="pixels"))
    with pytest.raises(ValueError, match="decoding"):
        lobster_io.Loader(str(tmp_path / "data"), 8, decoding="partial")


def test_older_policy_spellings_name_the_same_policies(tmp_path):
    make_folder(tmp_path / "data", 24, 2, size=(20, 16))

    def hits(policy):
        loader = lobster_io.Loader(
            str(tmp_path / "data"), 4, epochs=3, seed=1, image_size=8,
            cache=lobster_io.Cache(frac=0.3, policy=policy),
        )
        for epoch in range(loader.epochs):
            loader.set_epoch(epoch)
            ids = [b.ids.tolist() for b in loader]
        m = loader.metrics()
        loader.close()
        return m["hits"], ids

    for old, new in (("nopfs", "static"), ("lobster", "reuse")):
        assert hits(old) == hits(new)
    assert hits("reuse")[0] > 0


def test_an_image_over_the_pixel_bound_is_a_bad_sample_naming_its_file(tmp_path):
    files, _ = make_folder(tmp_path / "data", 8, 2)
    big = files[3]
    Image.fromarray(np.zeros((200, 300, 3), dtype=np.uint8)).save(big, quality=90)
    data = str(tmp_path / "data")
    # 40 x 30 = 1,200 pixels pass a bound of 10,000; 300 x 200 do not.
    limits = lobster_io.Limits(image_pixels_max=10_000)
    loader = lobster_io.Loader(data, 4, image_size=8, on_error="skip", max_failures=1,
                               limits=limits)
    skipped = [i for b in loader for i in b.skipped]
    assert skipped == [3], skipped
    loader = lobster_io.Loader(data, 4, transform="none", limits=limits)
    with pytest.raises(lobster_io.DecodeError) as e:
        for _ in loader:
            pass
    assert big.name in str(e.value) and "300x200" in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="limits.image_pixels_max = 0"):
        lobster_io.Loader(data, 4, limits=lobster_io.Limits(image_pixels_max=0))


OVERSIZED_RANK = """
import json, sys
import lobster_io
data, out = sys.argv[1], sys.argv[2]
loader = lobster_io.Loader(data, 2, transform="none", on_error="skip", max_failures=1,
                           budgets=lobster_io.Budgets(slot_bytes=2 * 8192))
seen = {"ids": [], "skipped": []}
try:
    for b in loader:
        seen["ids"] += b.ids.tolist()
        seen["skipped"] += b.skipped
    loader.close()
except lobster_io.Error as e:
    seen["error"] = str(e)
json.dump(seen, open(out, "w"))
"""


def test_one_oversized_image_on_a_node_is_one_bad_sample_not_a_stopped_node(tmp_path):
    import subprocess
    import sys

    files, _ = make_folder(tmp_path / "data", 8, 2)
    # 40 x 30 x 3 bytes fit a rank's 8 KiB share of a slot; 100 x 100 x 3 do not.
    Image.fromarray(np.zeros((100, 100, 3), dtype=np.uint8)).save(files[5], quality=90)
    procs = []
    for r in range(2):
        env = dict(os.environ, LOBSTER_RANK=str(r), LOBSTER_WORLD_SIZE="2",
                   LOBSTER_LOCAL_RANK=str(r), LOBSTER_LOCAL_WORLD_SIZE="2",
                   LOBSTER_NODE="0", LOBSTER_NODES="1",
                   LOBSTER_JOB_ID=f"pytest-{os.getpid()}-oversized")
        out = tmp_path / f"rank{r}.json"
        cmd = [sys.executable, "-c", OVERSIZED_RANK, str(tmp_path / "data"), str(out)]
        procs.append((subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), out))
    seen = []
    for p, out in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        seen.append(json.loads(out.read_text()))
    for s in seen:
        assert "error" not in s, s
    assert sorted(i for s in seen for i in s["skipped"]) == [5], seen
    assert sorted(i for s in seen for i in s["ids"]) == [0, 1, 2, 3, 4, 6, 7], seen


@pytest.mark.parametrize("attempt", range(5))
def test_a_caller_may_hold_every_buffer_of_its_rank_and_one_more_is_refused(tmp_path, attempt):
    # Default slots = 2: the caller's two and the rank's two read-ahead buffers. Whatever the
    # feeder did meanwhile, the fifth is refused and nothing is lost.
    make_folder(tmp_path / "data", 32, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, image_size=8, epochs=2)
    it = iter(loader)
    held = [next(it) for _ in range(4)]
    with pytest.raises(ValueError, match=r"^budgets\.slots = 2: the caller holds 4 batches"):
        next(it)
    seen = [i for b in held for i in b.ids.tolist()]
    del held[1]
    held.append(next(it))
    seen += held[-1].ids.tolist()
    held.clear()
    seen += [i for b in it for i in b.ids.tolist()]
    assert sorted(seen) == list(range(32))
    # The epoch's turn with every buffer held, then all of the next epoch held at once but
    # the fifth: the same rule across the turn.
    held = [next(it) for _ in range(4)]
    assert [b.epoch for b in held] == [1] * 4
    with pytest.raises(ValueError, match="budgets.slots"):
        next(it)
    held.clear()
    assert len(list(it)) == 4
    loader.close()


def test_a_decode_callable_s_batches_hold_no_buffer_and_may_all_be_kept(tmp_path):
    make_folder(tmp_path / "data", 32, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, transform="none", decode=len)
    batches = list(loader)
    assert len(batches) == 8 and sorted(i for b in batches for i in b.ids.tolist()) == list(range(32))
