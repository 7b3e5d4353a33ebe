#!/usr/bin/env python3
"""What lobster_io's pipeline adds to each image over its bare decoder, decode only.

    python benches/peers/decode_path.py --data DIR [--passes 3] [--threads 2] [--json OUT]

Two figures, in alternating passes, each pass a fresh process on a warm page cache:
- bare: `lobster_io.decode_image` (lobster-image's decoder, into the array it returns) on
  every file of DIR, held in memory, one thread: CPU ms per image (this thread's user and
  system time);
- pipeline: one epoch of `lobster_io.Loader(DIR, 64, transform="none",
  budgets=Budgets(decode_threads=THREADS))`, every image delivered as an array: the
  process's user and system CPU over the loop, per image.
The pipeline's user time beyond the bare decoder's is what it adds on the CPU around the
decoder (its threads, delivery, the Python feeder, cold output buffers); its system time is
mostly reading the files from the page cache (open, pread), which the bare figure does not
do. Medians of the passes.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import list_images  # noqa: E402


def child(kind, data, threads):
    # Imported first, as a training script has: the arrays both figures return need it, and
    # its import (and its BLAS threads' start) is no part of any image's path.
    import numpy  # noqa: F401
    import lobster_io

    files = [f for f, _ in list_images(data)]
    if kind == "bare":
        blobs = []
        for path in files:
            with open(path, "rb") as f:
                blobs.append(f.read())
        # Warm-up: the decoder's first images and the allocator.
        for b in blobs[:200]:
            lobster_io.decode_image(b)
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        n = 0
        for b in blobs:
            n += lobster_io.decode_image(b).shape[0] > 0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
    else:
        for path in files:
            with open(path, "rb") as f:
                f.read()
        loader = lobster_io.Loader(data, 64, epochs=1, seed=1, transform="none",
                                   budgets=lobster_io.Budgets(decode_threads=threads))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        n = 0
        for b in loader:
            for a in b.images:
                n += a.shape[0] > 0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        loader.close()
    user = (r1.ru_utime - r0.ru_utime) * 1000 / n
    system = (r1.ru_stime - r0.ru_stime) * 1000 / n
    print(json.dumps({"images": n, "user_ms": user, "system_ms": system}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.data, args.threads)
        return
    runs = {"bare": [], "pipeline": []}
    for p in range(args.passes):
        for kind in (["bare", "pipeline"] if p % 2 == 0 else ["pipeline", "bare"]):
            out = subprocess.run(
                [sys.executable, __file__, "--data", args.data, "--threads", str(args.threads),
                 "--child", kind], check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            r["loadavg"] = os.getloadavg()[0]
            runs[kind].append(r)
            print("pass %d %-8s user %.3f system %.3f ms/image (%d images, load %.2f)" % (
                p, kind, r["user_ms"], r["system_ms"], r["images"], r["loadavg"]))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("user_ms", "system_ms")}
           for k, v in runs.items()}
    added_user = med["pipeline"]["user_ms"] - med["bare"]["user_ms"]
    added_all = (med["pipeline"]["user_ms"] + med["pipeline"]["system_ms"]
                 - med["bare"]["user_ms"] - med["bare"]["system_ms"])
    print("bare decoder: user %.3f + system %.3f ms/image" % (
        med["bare"]["user_ms"], med["bare"]["system_ms"]))
    print("pipeline:     user %.3f + system %.3f ms/image" % (
        med["pipeline"]["user_ms"], med["pipeline"]["system_ms"]))
    print("added around the decoder: %.3f ms/image of user time (%.3f with the system's, "
          "reads included)" % (added_user, added_all))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"data": args.data, "threads": args.threads, "runs": runs,
                       "medians": med, "added_user_ms": added_user,
                       "added_all_ms": added_all}, f, indent=1)


if __name__ == "__main__":
    main()
