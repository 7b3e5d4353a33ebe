"""Checkpoint and resume from Python: `state_dict()` after k batches, a new Loader that
`load_state_dict`s it gives the rest of the uninterrupted run bit for bit (ids, labels and
the seeded train transform's pixels, with the decoded tier on), in one process and in a job
of two rank processes under torchrun that is killed after saving."""

import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import lobster_io
from test_loader import make_folder

HERE = pathlib.Path(__file__).resolve().parent
EPOCHS = 3
BATCH = 4


def build(data, seed=5, batch_size=BATCH):
    return lobster_io.Loader(
        str(data), batch_size, epochs=EPOCHS, seed=seed, image_size=16, transform="train",
        cache=lobster_io.Cache(frac=1.0, forms="decoded"),
    )


def batches(loader, start_epoch=0):
    for epoch in range(start_epoch, loader.epochs):
        loader.set_epoch(epoch)
        for b in loader:
            yield b


def record(b):
    return (b.epoch, b.iteration, b.ids.tolist(), b.labels.tolist(), np.array(b.images))


def same(a, b):
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        assert x[:4] == y[:4], (x[:4], y[:4])
        assert x[4].shape == y[4].shape and np.array_equal(x[4], y[4]), (x[:2], "pixels")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume") / "data"
    make_folder(root, 37, 3, size=(48, 36))
    return root


@pytest.fixture(scope="module")
def reference(data):
    loader = build(data)
    out = [record(b) for b in batches(loader)]
    m = loader.metrics()
    loader.close()
    assert len(out) == EPOCHS * len(loader) == EPOCHS * 10
    assert m["hits_decoded"] > 0, m
    return out


def resumed(data, state):
    loader = build(data)
    loader.load_state_dict(state)
    start = state["lobster_loader_state"]["ranks"][0]["epoch"]
    out = [record(b) for b in batches(loader, start)]
    m = loader.metrics()
    loader.close()
    return out, m


# 0: before any batch; 9: before the last of epoch 0; 10: epoch 0 done; 11: one into epoch 1;
# 30: the run done (the resumed loader has nothing left).
@pytest.mark.parametrize("k", [0, 1, 5, 9, 10, 11, 30])
def test_a_resumed_loader_gives_the_rest_of_the_run_bit_for_bit(data, reference, k):
    loader = build(data)
    taken = [record(b) for b in itertools.islice(batches(loader), k)]
    # The feeder has prefetched beyond k: the state is what was returned.
    state = loader.state_dict()
    loader.close()
    same(taken, reference[:k])
    at = state["lobster_loader_state"]["ranks"][0]
    assert (at["epoch"], at["iteration"]) == divmod(k, 10), at
    # Plain data: JSON carries it whole.
    assert json.loads(json.dumps(state)) == state
    rest, m = resumed(data, json.loads(json.dumps(state)))
    same(rest, reference[k:])
    if k < 20:
        # The decoded tier served the resumed run (a whole epoch followed the cut).
        assert m["hits_decoded"] > 0 and m["decoded_hits_served"] > 0, m


def test_state_dict_of_a_resumed_loader_continues_the_count(data, reference):
    loader = build(data)
    it = batches(loader)
    for _ in range(3):
        next(it)
    first = loader.state_dict()
    loader.close()
    loader = build(data)
    loader.load_state_dict(first)
    assert loader.state_dict() == first
    it = batches(loader)
    got = [record(next(it)) for _ in range(4)]
    second = loader.state_dict()
    loader.close()
    same(got, reference[3:7])
    assert second["lobster_loader_state"]["ranks"][0]["iteration"] == 7
    rest, _ = resumed(data, second)
    same(rest, reference[7:])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_state_loads_into_a_loader_whose_state_dict_was_taken_first(data, reference, tmp_path):
    """torch.distributed.checkpoint's load fills a template: the fresh loader's own
    state_dict(), which starts it; loading the saved state then restarts it, resumed."""
    loader = build(data)
    for _ in itertools.islice(batches(loader), 6):
        pass
    loader.close()
    # A closed loader still says where it stopped.
    saved = loader.state_dict()
    assert saved["lobster_loader_state"]["ranks"][0]["iteration"] == 6
    fresh = build(data)
    template = fresh.state_dict()
    assert template["lobster_loader_state"]["ranks"][0]["iteration"] == 0
    assert template["lobster_loader_state"]["job"] == saved["lobster_loader_state"]["job"]
    fresh.load_state_dict(saved)
    rest = [record(b) for b in batches(fresh, 0)]
    fresh.close()
    same(rest, reference[6:])
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    dcp.save({"loader": saved}, checkpoint_id=str(tmp_path / "dcp"))
    again = build(data)
    filled = {"loader": again.state_dict()}
    dcp.load(filled, checkpoint_id=str(tmp_path / "dcp"))
    assert filled["loader"] == saved
    again.load_state_dict(filled["loader"])
    rest = [record(b) for b in batches(again, 0)]
    again.close()
    same(rest, reference[6:])


def test_a_state_survives_torch_save_and_load(data, reference, tmp_path):
    torch = pytest.importorskip("torch")
    loader = build(data)
    for _ in itertools.islice(batches(loader), 4):
        pass
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    loader.close()
    rest, _ = resumed(data, torch.load(tmp_path / "state.pt"))
    same(rest, reference[4:])


def test_a_state_of_another_job_or_a_damaged_one_is_refused_naming_why(data):
    loader = build(data)
    for _ in itertools.islice(batches(loader), 2):
        pass
    state = loader.state_dict()
    loader.close()
    with pytest.raises(lobster_io.StateError, match="order is shuffle seed 5"):
        build(data, seed=6).load_state_dict(state)
    with pytest.raises(lobster_io.StateError, match="batch_size is 4, this loader's 2"):
        build(data, batch_size=2).load_state_dict(state)
    edited = json.loads(json.dumps(state))
    edited["lobster_loader_state"]["ranks"][0]["consumed"] += 4
    with pytest.raises(lobster_io.StateError, match="checksum"):
        build(data).load_state_dict(edited)
    cut = dict(state)
    del cut["crc32"]
    with pytest.raises(lobster_io.StateError, match="not a lobster loader state"):
        build(data).load_state_dict(cut)
    with pytest.raises(lobster_io.StateError, match="not a dict of JSON values"):
        build(data).load_state_dict({"x": object()})
    # Once batches were taken, loading a state would silently restart: refused.
    started = build(data)
    next(batches(started))
    with pytest.raises(ValueError, match="already gave 1 batches"):
        started.load_state_dict(state)
    started.close()


def torchrun(tmp_path, data, job, mode):
    """A job of two rank processes on one node, each running resume_probe.py."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE), LOBSTER_JOB_ID=job)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(29500 + (os.getpid() + len(job)) % 1000),
           str(HERE / "resume_probe.py"), str(data), str(tmp_path), job, mode]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory, data):
    """The uninterrupted torchrun job's batches, per rank."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("torchrun-ref")
    done = torchrun(out, data, "ref", "whole")
    assert done.returncode == 0, done.stdout + done.stderr
    refs = [np.load(out / f"ref.rank{r}.npz") for r in range(2)]
    # 37 samples over 2 ranks: 19 each, 5 batches an epoch, 15 in all.
    for ref in refs:
        assert len(ref["sizes"]) == 15 and ref["sizes"].sum() == 3 * 19
    return refs


# 0: before any batch; 1: one batch in; 4: before the last batch of epoch 0; 5: epoch 0
# done; 7: mid epoch 1.
@pytest.mark.parametrize("stop_after", [0, 1, 4, 5, 7])
def test_a_job_killed_after_saving_resumes_every_rank_bit_for_bit(
    tmp_path, data, torch_reference, stop_after
):
    tag = f"pytest-{os.getpid()}-{stop_after}"
    # Saves every rank's state after `stop_after` batches, then is killed.
    killed = torchrun(tmp_path, data, f"{tag}-cut", f"cut:{stop_after}")
    assert killed.returncode != 0, "the interrupted job was meant to die"
    for r in range(2):
        assert (tmp_path / f"{tag}-cut.state{r}.json").exists(), killed.stdout + killed.stderr
    # Resumes from the saved states and runs to the end.
    again = torchrun(tmp_path, data, f"{tag}-cut", "resume")
    assert again.returncode == 0, again.stdout + again.stderr
    for r in range(2):
        saved = json.loads((tmp_path / f"{tag}-cut.state{r}.json").read_text())
        reloaded = json.loads((tmp_path / f"{tag}-cut.reloaded{r}.json").read_text())
        assert reloaded == saved and saved["lobster_loader_state"]["ranks"][0]["rank"] == r
        ref = torch_reference[r]
        cut = np.load(tmp_path / f"{tag}-cut.rank{r}.npz")
        got = np.load(tmp_path / f"{tag}-cut.resumed.rank{r}.npz")
        assert len(cut["sizes"]) == stop_after and len(got["sizes"]) == 15 - stop_after
        for key in ("sizes", "epochs", "ids", "labels", "images"):
            parts = [cut[key], got[key]] if stop_after else [got[key]]
            assert np.array_equal(np.concatenate(parts), ref[key]), (r, key)
    if stop_after != 7:
        return
    # Elastic: rank 0's state in one process (a world of 1) takes what both ranks had left
    # of epoch 1, each sample with the pixels the two ranks would have given it, then
    # epoch 2 as one rank's.
    state = json.loads((tmp_path / f"{tag}-cut.state0.json").read_text())
    loader = build(data)
    loader.load_state_dict(state)
    rest = [record(b) for b in batches(loader, 1)]
    loader.close()
    left, pixels = [], {}
    for r in range(2):
        ref = torch_reference[r]
        n = int(ref["sizes"][:7].sum())
        in_epoch = ref["epochs"][n:] == 1
        left.extend(ref["ids"][n:][in_epoch].tolist())
        for i, img in zip(ref["ids"][n:][in_epoch], ref["images"][n:][in_epoch]):
            pixels[int(i)] = img
    epoch1 = [(i, img) for e, _, ids, _, imgs in rest if e == 1 for i, img in zip(ids, imgs)]
    assert sorted(i for i, _ in epoch1) == sorted(left) and len(left) == 22
    for i, img in epoch1:
        assert np.array_equal(img, pixels[i]), i
    epoch2 = [i for e, _, ids, _, _ in rest if e == 2 for i in ids]
    assert sorted(epoch2) == list(range(37)) and len(rest) == 6 + 10


def test_ranks_that_loaded_different_states_are_refused_naming_the_field(tmp_path, data):
    pytest.importorskip("torch")
    tag = f"pytest-{os.getpid()}-mix"
    killed = torchrun(tmp_path, data, tag, "cut:6")
    assert killed.returncode != 0
    # Rank 1 gets a state two batches later than rank 0's (both in epoch 1).
    other = torchrun(tmp_path, data, f"{tag}-b", "cut:8")
    assert other.returncode != 0
    (tmp_path / f"{tag}.state1.json").write_text(
        (tmp_path / f"{tag}-b.state1.json").read_text())
    again = torchrun(tmp_path, data, tag, "resume")
    assert again.returncode != 0
    said = again.stdout + again.stderr
    assert re.search(r"StateError: configuration differs from the host's in resume.iteration: "
                     r"host 1, this rank 3", said), said
