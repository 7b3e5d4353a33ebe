#!/usr/bin/env python3
"""Per-sample array decode from Python: lobster_io.decode_array / decode_npz against
np.load(io.BytesIO(b)) on the same bytes, in one process, alternating.

    python benches/peers/arrays.py [--rounds 7] [--json OUT]

Samples (float32, written by np.save / np.savez in memory): .npy of 4 KiB, 64 KiB, 1 MiB
and 16 MiB, and a UNet3D-like .npz (an image volume and its label volume). Each round times
every decoder over the same samples (enough calls to take about 0.2 s); the figure is the
median over rounds of the time per call, and the ratio np.load's over lobster_io's, both in
the same round. Both make a new writable array holding the data (np.load copies it out of
the BytesIO; lobster_io copies it once out of the bytes). A third column times lobster_io's
`copy=False`, a read-only view of the bytes (what a loader's batch buffer gives without a
copy), for reference.
"""

import argparse
import io
import json
import statistics
import time

import numpy as np

import lobster_io


def samples():
    rng = np.random.default_rng(0)
    out = []
    for kib in [4, 64, 1024, 16384]:
        f = io.BytesIO()
        np.save(f, rng.standard_normal(kib * 256).astype("<f4"))
        out.append((f"npy {kib} KiB", f.getvalue(), "npy"))
    f = io.BytesIO()
    np.savez(
        f,
        x=rng.standard_normal((1, 64, 64, 64)).astype("<f4"),
        y=(rng.random((1, 64, 64, 64)) > 0.5).astype("u1"),
    )
    out.append(("npz volume+label 1.3 MiB", f.getvalue(), "npz"))
    return out


def per_call(f, b):
    f(b)
    n, start = 0, time.perf_counter()
    while True:
        f(b)
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed > 0.2:
            return elapsed / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name, b, kind in samples():
        if kind == "npy":
            ours, numpy_load = lobster_io.decode_array, lambda b: np.load(io.BytesIO(b))
        else:
            ours = lobster_io.decode_npz
            numpy_load = lambda b: dict(np.load(io.BytesIO(b)))  # noqa: E731
        mine, views, theirs, ratios = [], [], [], []
        for _ in range(args.rounds):
            t_ours, t_numpy = per_call(ours, b), per_call(numpy_load, b)
            views.append(per_call(lambda b: ours(b, copy=False), b))
            mine.append(t_ours)
            theirs.append(t_numpy)
            ratios.append(t_numpy / t_ours)
        row = {
            "sample": name,
            "bytes": len(b),
            "lobster_us": statistics.median(mine) * 1e6,
            "np_load_us": statistics.median(theirs) * 1e6,
            "lobster_view_us": statistics.median(views) * 1e6,
            "ratio": statistics.median(ratios),
        }
        rows.append(row)
        print(
            f"{name:26} lobster_io {row['lobster_us']:9.1f} us  np.load {row['np_load_us']:9.1f} us"
            f"  np.load / lobster_io {row['ratio']:.2f}x  (view {row['lobster_view_us']:.1f} us)",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
