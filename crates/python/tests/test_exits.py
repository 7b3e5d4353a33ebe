"""How a Python process with a Loader ends: leaving a loop mid-epoch (closed or not), Ctrl-C
while iterating or while a rank waits for its node's host, each in a real child process that
must exit cleanly (no abort, nothing on stderr but Python's own KeyboardInterrupt) and leave
nothing in /dev/shm. Also the parameters a user gets wrong and the epoch bookkeeping of
loaders iterated side by side."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import lobster_io
from test_loader import make_folder

HERE = pathlib.Path(__file__).resolve().parent

# A child iterating a loader: argv is data, output ("decode": a Python decode callable of
# about 10 ms a sample, or "train"), how it ends ("close": break after 3 batches and close;
# "leave": break and exit without closing; "interrupt": iterate until Ctrl-C), and for the
# ranks of a node a directory where they meet before breaking, in lock-step as DDP's ranks
# are (a rank that leaves early stops the node's others). benches/python_exits.py runs it
# too.
CHILD = r"""
import io, os, signal, sys, time
import numpy as np
from PIL import Image
import lobster_io

# A child of a process that ignores SIGINT would inherit that: Ctrl-C as a terminal has it.
signal.signal(signal.SIGINT, signal.default_int_handler)
data, output, how = sys.argv[1:4]
meet = sys.argv[4] if len(sys.argv) > 4 else None

def all_here():
    rank = os.environ.get("LOBSTER_LOCAL_RANK") or os.environ["LOCAL_RANK"]
    ranks = int(os.environ.get("LOBSTER_LOCAL_WORLD_SIZE") or os.environ["LOCAL_WORLD_SIZE"])
    open(os.path.join(meet, f"rank{rank}"), "w").close()
    for _ in range(6000):
        if len(os.listdir(meet)) == ranks:
            return
        time.sleep(0.01)
    raise SystemExit("the node's other ranks did not come")

def slow_decode(b):
    time.sleep(0.01)
    return np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))

kw = dict(transform="none", decode=slow_decode) if output == "decode" else dict(image_size=32)
loader = lobster_io.Loader(data, 16, epochs=3, **kw)
taken = 0
for epoch in range(3):
    loader.set_epoch(epoch)
    for batch in loader:
        taken += 1
        if how == "interrupt":
            # One write: the ranks of a torchrun job share one pipe, and a print in pieces
            # (their output unbuffered) interleaves with the other rank's.
            os.write(1, ("iterating %s\n" % os.environ.get("LOCAL_RANK", "")).encode())
            time.sleep(0.05)
        elif taken == 3:
            # Mid-epoch: an epoch is 4 batches in one process, 2 for each of two ranks.
            if meet:
                all_here()
            break
    else:
        continue
    break
if how == "close":
    loader.close()
print("finished", flush=True)
"""


def lobster_shm():
    return {n for n in os.listdir("/dev/shm") if "lobster" in n}


def clean_exit_env(**extra):
    env = dict(os.environ, PYTHONPATH=str(HERE), **extra)
    for v in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "SLURM_LOCALID"):
        env.pop(v, None)
    return env


def interrupt_when_ready(proc, word):
    """Sends SIGINT once the child printed `word`; returns its stdout and stderr."""
    line = proc.stdout.readline()
    assert word in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    proc.send_signal(signal.SIGINT)
    # A hang guard only: a child that answers Ctrl-C ends well within it.
    out, err = proc.communicate(timeout=120)
    return line + out, err


def assert_interrupted_cleanly(proc, out, err):
    # Python ends on an uncaught KeyboardInterrupt by the signal itself: -SIGINT.
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "KeyboardInterrupt", err
    for bad in ("Fatal Python error", "panicked", "Exception ignored", "abort"):
        assert bad not in err, err
    assert "finished" not in out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("exits") / "data"
    make_folder(root, 64, 4)
    return root


@pytest.mark.parametrize("output", ["decode", "train"])
@pytest.mark.parametrize("how", ["close", "leave"])
def test_leaving_a_loop_mid_epoch_exits_cleanly(data, output, how):
    before = lobster_shm()
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", CHILD, str(data), output, how],
                              env=clean_exit_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.returncode, done.stderr)
        assert done.stderr == "", done.stderr
        assert "finished" in done.stdout
    assert lobster_shm() <= before


@pytest.mark.parametrize("output", ["decode", "train"])
def test_ctrl_c_while_iterating_raises_keyboard_interrupt_and_exits_cleanly(data, output):
    before = lobster_shm()
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data), output, "interrupt"],
                                env=clean_exit_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            out, err = interrupt_when_ready(proc, "iterating")
        finally:
            proc.kill()
        assert_interrupted_cleanly(proc, out, err)
    assert lobster_shm() <= before


@pytest.mark.parametrize("how", ["close", "leave"])
def test_a_node_s_ranks_leaving_mid_epoch_with_a_decode_callable_exit_cleanly(
        data, how, tmp_path):
    before = lobster_shm()
    for k in range(3):
        meet = tmp_path / f"meet{k}"
        meet.mkdir()
        procs = []
        for r in range(2):
            env = clean_exit_env(LOBSTER_RANK=str(r), LOBSTER_WORLD_SIZE="2",
                                 LOBSTER_LOCAL_RANK=str(r), LOBSTER_LOCAL_WORLD_SIZE="2",
                                 LOBSTER_NODE="0", LOBSTER_NODES="1",
                                 LOBSTER_JOB_ID=f"pytest-{os.getpid()}-leave-{how}-{k}")
            cmd = [sys.executable, "-c", CHILD, str(data), "decode", how, str(meet)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, (p.returncode, err)
            assert err == "", err
            assert "finished" in out
    assert lobster_shm() <= before


# A rank whose node's host (local rank 0) never comes: it waits up to the 300 s attach
# timeout.
WAITING_RANK = r"""
import signal, sys
import lobster_io
signal.signal(signal.SIGINT, signal.default_int_handler)
loader = lobster_io.Loader(sys.argv[1], 4, image_size=16)
print("waiting", flush=True)
next(iter(loader))
print("finished", flush=True)
"""


def test_ctrl_c_while_a_rank_waits_for_its_host_raises_keyboard_interrupt(data):
    env = clean_exit_env(LOBSTER_RANK="1", LOBSTER_WORLD_SIZE="2", LOBSTER_LOCAL_RANK="1",
                         LOBSTER_LOCAL_WORLD_SIZE="2", LOBSTER_NODE="0", LOBSTER_NODES="1",
                         LOBSTER_JOB_ID=f"pytest-{os.getpid()}-no-host")
    proc = subprocess.Popen([sys.executable, "-c", WAITING_RANK, str(data)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Give the rank time to be inside its wait (the test holds whether or not it is).
        line = proc.stdout.readline()
        assert "waiting" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert_interrupted_cleanly(proc, out, err)


def test_a_loader_that_gave_its_whole_epoch_in_zip_takes_the_next_epoch(tmp_path):
    make_folder(tmp_path / "data", 16, 2)
    a = lobster_io.Loader(str(tmp_path / "data"), 4, epochs=2, image_size=8)
    b = lobster_io.Loader(str(tmp_path / "data"), 4, epochs=2, image_size=8, seed=1)
    for epoch in range(2):
        a.set_epoch(epoch)
        # zip stops at a's end of the epoch and never asks b for its own.
        b.set_epoch(epoch)
        pairs = [(x.epoch, y.epoch) for x, y in zip(a, b)]
        assert pairs == [(epoch, epoch)] * 4
    # Both gave every batch: neither has another epoch.
    with pytest.raises(ValueError, match="epoch = 2"):
        b.set_epoch(2)
    assert list(b) == [] and list(a) == []


def test_a_loader_not_finished_with_its_epoch_refuses_the_next(tmp_path):
    make_folder(tmp_path / "data", 16, 2)
    # list(it) below holds three batches at the epoch's turn: within the default slots + 2.
    b = lobster_io.Loader(str(tmp_path / "data"), 4, epochs=2, image_size=8)
    it = iter(b)
    next(it)
    with pytest.raises(ValueError, match="next epoch is 0"):
        b.set_epoch(1)
    # Without set_epoch, the loop that follows a whole epoch still ends it first.
    assert len(list(it)) == 3
    assert [x.epoch for x in b] == [1] * 4


@pytest.mark.parametrize("name", ["batch_size", "epochs", "seed", "image_size"])
@pytest.mark.parametrize("value", [-1, 2**64])
def test_out_of_range_integers_raise_value_error_naming_the_parameter(data, name, value):
    kw = {"batch_size": 4, name: value}
    with pytest.raises(ValueError, match=rf"^{name} = {value}: "):
        lobster_io.Loader(str(data), **kw)


@pytest.mark.parametrize("name", ["batch_size", "epochs", "seed", "image_size"])
def test_a_non_integer_raises_type_error_naming_the_parameter(data, name):
    kw = {"batch_size": 4, name: "8"}
    with pytest.raises(TypeError, match=rf"^{name} = '8': "):
        lobster_io.Loader(str(data), **kw)


def test_set_epoch_names_its_parameter_when_out_of_range(data):
    loader = lobster_io.Loader(str(data), 16, image_size=8)
    with pytest.raises(ValueError, match=r"^epoch = -1: "):
        loader.set_epoch(-1)
    with pytest.raises(TypeError, match=r"^epoch = '1': "):
        loader.set_epoch("1")
    loader.close()


def test_a_path_like_dataset_path_is_taken(data):
    loader = lobster_io.Loader(pathlib.Path(data), 16, image_size=8)
    assert len(list(loader)) == 4
    with pytest.raises(TypeError, match="data"):
        lobster_io.Loader(3, 16)


# Sizes that would ask for more memory than any machine has, each refused by its name
# before anything is allocated (a child: an allocation that fails aborts the process).
HUGE = r"""
import sys
import lobster_io
data, case = sys.argv[1], sys.argv[2]
name, _, value = case.partition("=")
kw = dict(image_size=int(value)) if name == "image_size" else dict(
    budgets=lobster_io.Budgets(slots=2**40))
try:
    loader = lobster_io.Loader(data, 8, **kw)
    next(iter(loader))
except ValueError as e:
    print("ValueError:", e)
"""


@pytest.mark.parametrize("case,name", [
    ("image_size=100000", "image_size = 100000"),
    ("image_size=8193", "image_size = 8193"),
    ("slots", "budgets.slots = 1099511627776"),
])
def test_sizes_past_their_bound_are_refused_naming_the_parameter(data, case, name):
    done = subprocess.run([sys.executable, "-c", HUGE, str(data), case], env=clean_exit_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.startswith(f"ValueError: {name}: "), (done.stdout, done.stderr)


def test_the_largest_image_size_is_taken(data):
    # The bound is the CLI's: 8192 is allowed (its batches are not asked for here).
    lobster_io.Loader(str(data), 1, image_size=8192).close()
