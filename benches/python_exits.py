"""How often a Python process with a lobster_io Loader exits cleanly: leaving a loop
mid-epoch (closed or not) and Ctrl-C while iterating, with and without a `decode=`
callable, in one process and as the two ranks of a `torchrun --nproc-per-node 2` job.
Prints clean / total per case and the lobster entries /dev/shm gained.

    python benches/python_exits.py [--runs 20]

Needs the package installed (pip install ./crates/python), Pillow, numpy and torch (for
torchrun). The child is crates/python/tests/test_exits.py's.

Clean: a single process exits 0 with nothing on stderr after leaving a loop, or -SIGINT
with Python's KeyboardInterrupt as the last line after Ctrl-C; a torchrun job exits 0 after
leaving a loop, or ends within the hang guard after Ctrl-C (sent to its process group, as a
terminal does); in every case no abort, crash, panic or fatal error is reported."""

import argparse
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent / "crates" / "python" / "tests"
sys.path.insert(0, str(TESTS))

from test_exits import CHILD, lobster_shm  # noqa: E402
from test_loader import make_folder  # noqa: E402

HANG_GUARD_S = 120
# torch.distributed.elastic's metrics wrapper, interrupted before it set `start`.
AGENT_FAILED = "UnboundLocalError: cannot access local variable 'start'"
BAD = ("Fatal Python error", "panicked", "SIGABRT", "SIGSEGV", "Signal 6", "Signal 11",
       "core dumped", "Exception ignored", "lost sys.stderr", "Error:")


# Why the last unclean run was not clean, printed with its case.
WHY = []


def unclean(reason):
    WHY.append(reason)
    return False


def judged(clean, err):
    return True if clean else unclean(f"stderr ends: {err.strip()[-600:]!r}")


def env(**extra):
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS), **extra)
    for v in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOBSTER_LOCAL_RANK"):
        e.pop(v, None)
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single(child, data, output, how, _scratch):
    cmd = [sys.executable, child, str(data), output, how]
    if how != "interrupt":
        p = subprocess.run(cmd, env=env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
        return judged(p.returncode == 0 and p.stderr == "" and "finished" in p.stdout,
                      f"rc {p.returncode}: {p.stderr}")
    p = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        if "iterating" not in p.stdout.readline():
            return unclean("it ended before iterating")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        return unclean("hang guard")
    finally:
        p.kill()
    lines = err.strip().splitlines()
    return judged(p.returncode == -signal.SIGINT and lines[-1:] == ["KeyboardInterrupt"]
                  and not any(b in err for b in BAD), f"rc {p.returncode}: {err}")


def run_torchrun(child, data, output, how, scratch):
    meet = tempfile.mkdtemp(dir=scratch)
    job = f"bench-exits-{os.getpid()}-{os.path.basename(meet)}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), child, str(data), output, how, meet]
    p = subprocess.Popen(cmd, env=env(LOBSTER_JOB_ID=job), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if how == "interrupt":
            # Mid-iteration on both ranks (a rank still starting would die of SIGINT before
            # Python is up, silently).
            seen, lines = set(), []
            while not {"0", "1"} <= seen:
                line = p.stdout.readline()
                if not line:
                    return unclean(f"a rank ended before iterating: rc {p.wait()}, stdout "
                                   f"{''.join(lines)[-600:]!r}, stderr {p.stderr.read()[-600:]!r}")
                lines.append(line)
                words = line.split()
                if len(words) == 2 and words[0] == "iterating":
                    seen.add(words[1])
            # Ctrl-C at a terminal: SIGINT to the whole foreground process group.
            os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        return unclean("hang guard")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if how == "interrupt" and AGENT_FAILED in err:
        # torchrun's agent failed in its own SIGINT handling and sent SIGTERM to the ranks
        # instead: counted apart, with the ranks' part still checked.
        return "agent" if not any(b in err for b in BAD if b != "Error:") else False
    if any(b in err for b in BAD):
        return judged(False, err)
    if how == "interrupt":
        # Both ranks end by their own KeyboardInterrupt (their stderr lines may interleave).
        return judged(err.count("KeyboardInterrupt") >= 2, err)
    return judged(p.returncode == 0 and out.count("finished") == 2, f"rc {p.returncode}: {err}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lobster-exits-") as scratch:
        data = pathlib.Path(scratch) / "data"
        make_folder(data, 64, 4)
        child = pathlib.Path(scratch) / "child.py"
        child.write_text(CHILD)
        before = lobster_shm()
        print(f"{'launch':<10} {'output':<8} {'ends by':<12} clean/total")
        for launch, run in (("process", run_single), ("torchrun", run_torchrun)):
            for output in ("decode", "train"):
                for how in ("close", "leave", "interrupt"):
                    got = [run(str(child), data, output, how, scratch)
                           for _ in range(args.runs)]
                    clean = sum(g is True for g in got)
                    agent = sum(g == "agent" for g in got)
                    ends = {"close": "break+close", "leave": "break", "interrupt": "Ctrl-C"}
                    apart = (f" (+{agent} where torchrun's agent failed on SIGINT and "
                             "SIGTERMed the ranks, which then exited cleanly)" if agent else "")
                    print(f"{launch:<10} {output:<8} {ends[how]:<12} {clean}/{args.runs - agent}"
                          f"{apart}", flush=True)
                    for reason in WHY:
                        print(f"  unclean: {reason}", file=sys.stderr, flush=True)
                    WHY.clear()
        gained = lobster_shm() - before
        print(f"/dev/shm: {len(gained)} new lobster entries {sorted(gained)}")


if __name__ == "__main__":
    main()
