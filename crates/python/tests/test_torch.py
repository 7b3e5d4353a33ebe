"""lobster_io beside PyTorch: each rank's samples are DistributedSampler's over torchvision's
ImageFolder, a node's ranks share one engine through the arena, and the documented DDP example
trains under torchrun."""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import torch
import torchvision
from torch.utils.data import DistributedSampler

import lobster_io
from test_loader import make_folder

HERE = pathlib.Path(__file__).resolve().parent
PYTHON_DOC = HERE.parents[2] / "docs" / "python.md"


def sampler_shares(root, world, epoch, seed, batch_size):
    """What DistributedSampler over ImageFolder(root) gives each rank, batched."""
    folder = torchvision.datasets.ImageFolder(str(root))
    shares = []
    for rank in range(world):
        s = DistributedSampler(folder, num_replicas=world, rank=rank, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        ids = list(s)
        shares.append((ids, [folder.targets[i] for i in ids]))
    return shares, folder


def run_ranks(tmp_path, data, local_world, batch_size, epochs, job):
    """One node of `local_world` rank processes, placed by the LOBSTER_* variables."""
    procs = []
    for r in range(local_world):
        env = dict(os.environ, LOBSTER_RANK=str(r), LOBSTER_WORLD_SIZE=str(local_world),
                   LOBSTER_LOCAL_RANK=str(r), LOBSTER_LOCAL_WORLD_SIZE=str(local_world),
                   LOBSTER_NODE="0", LOBSTER_NODES="1", LOBSTER_JOB_ID=job,
                   PYTHONPATH=str(HERE))
        out = tmp_path / f"rank{r}.json"
        cmd = [sys.executable, str(HERE / "rank_probe.py"), str(data), str(out),
               str(batch_size), str(epochs)]
        procs.append((subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), out))
    seen = []
    for p, out in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        seen.append(json.loads(out.read_text()))
    return seen


def test_each_rank_of_a_node_gets_distributed_sampler_share_over_image_folder(tmp_path):
    # 53 samples over 2 ranks: DistributedSampler pads the shuffle by repeating its start.
    make_folder(tmp_path / "data", 53, 5)
    seen = run_ranks(tmp_path, tmp_path / "data", 2, 4, 2, f"pytest-{os.getpid()}-share")
    for epoch in range(2):
        shares, _ = sampler_shares(tmp_path / "data", 2, epoch, 11, 4)
        for rank, (ids, labels) in enumerate(shares):
            got = seen[rank]["epochs"][epoch]
            assert got["ids"] == ids, f"rank {rank} epoch {epoch}"
            assert got["labels"] == labels, f"rank {rank} epoch {epoch}"
    # Several nodes of one rank each: every rank loads in its own process.
    shares, _ = sampler_shares(tmp_path / "data", 3, 0, 11, 4)
    for rank in range(3):
        loader = lobster_io.Loader(str(tmp_path / "data"), 4, seed=11, image_size=16,
                                   launch=lobster_io.Launch(rank=rank, world_size=3, local_rank=0,
                                                            local_world_size=1))
        assert [i for b in loader for i in b.ids.tolist()] == shares[rank][0]


def test_a_node_s_batches_are_views_of_its_arena_and_memory_stays_flat(tmp_path):
    # 100 samples, 2 ranks, batches of 2: 25 batches an epoch, 200 in 8 epochs.
    make_folder(tmp_path / "data", 100, 4)
    seen = run_ranks(tmp_path, tmp_path / "data", 2, 2, 8, f"pytest-{os.getpid()}-arena")
    for rank, s in enumerate(seen):
        assert s["batches"] == 200
        assert s["outside"] == 0, f"rank {rank}: a batch outside the arena {s['arena']}"
        # The rank's slots: the caller's two, one in the channel, one being filled.
        assert len(set(s["addresses"])) <= 4, sorted(set(s["addresses"]))
        assert s["grown_bytes"] < 16 << 20, f"rank {rank} grew {s['grown_bytes']} bytes"
    assert seen[0]["arena"][1] == seen[1]["arena"][1], "one arena, the same size"


def test_a_failed_sample_on_a_node_raises_its_class_naming_the_file(tmp_path):
    files, _ = make_folder(tmp_path / "data", 20, 2)
    files[13].write_bytes(b"\xff\xd8\xff\xe0 not a jpeg" * 8)
    seen = run_ranks(tmp_path, tmp_path / "data", 2, 4, 1, f"pytest-{os.getpid()}-fail")
    failed = [s for s in seen if "error_class" in s]
    assert failed, seen
    # The rank whose share holds sample 13 gets the decode error; the other may get it as
    # the node's stop.
    decode = [s for s in failed if s["error_class"] == "DecodeError"]
    assert decode and files[13].name in decode[0]["error"] and "sample 13" in decode[0]["error"]


def readme_example():
    """docs/python.md's DDP example: the python block after the 'DDP example' marker."""
    text = PYTHON_DOC.read_text()
    m = re.search(r"<!-- ddp-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/python.md has no ddp-example block"
    return m.group(1)


def test_the_readme_ddp_example_trains_under_torchrun_and_exits_clean(tmp_path):
    make_folder(tmp_path / "data", 60, 3, size=(48, 40))
    script = tmp_path / "train.py"
    script.write_text(readme_example())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(29500 + os.getpid() % 1000), str(script),
           str(tmp_path / "data")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = re.findall(r"rank (\d) epoch (\d): (\d+) samples, loss ([0-9.]+)", done.stdout)
    per = {(int(r), int(e)): int(n) for r, e, n, _ in lines}
    # 60 samples over 2 ranks: 30 each, every epoch.
    assert per == {(r, e): 30 for r in range(2) for e in range(2)}, done.stdout
    # The process tree is gone: no process still runs the script.
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(script).encode() in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                left.append(pid)
        except OSError:
            pass
    assert not left, f"processes left running {script}: {left}"


def test_batches_become_tensors_without_a_copy(tmp_path):
    make_folder(tmp_path / "data", 8, 2)
    loader = lobster_io.Loader(str(tmp_path / "data"), 4, image_size=8, channels_first=True)
    batch = next(iter(loader))
    t = torch.from_numpy(batch.images)
    assert t.shape == (4, 3, 8, 8) and t.dtype == torch.uint8
    assert t.data_ptr() == batch.buffer_address
    d = torch.from_dlpack(batch.images)
    assert d.data_ptr() == batch.buffer_address
    assert np.array_equal(d.numpy(), batch.images)
