#!/usr/bin/env python3
"""Sweeps the spdl loader's concurrency in peers.py: decode-stage concurrency x pool threads.

    python benches/peers/spdl_sweep.py --data DIR [--limit 400] [--rounds 3]
        [--conc 2,4,8] [--pool 2,4] [--tasks decode,train] [--mode warm] [--json OUT]

Each round runs peers.py once per setting (one pass per task, the settings' order rotating
from round to round, so that a drift in the machine's load falls on all of them), and the
table gives each setting's median over the rounds of images/s and CPU ms per image, with the
load averages and the CPU other processes used. The fastest setting per task (images/s) is
what SPDL_BEST in peers.py should hold. See benches/peers/README.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--limit", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", default="2,4,8")
    ap.add_argument("--pool", default="2,4")
    ap.add_argument("--tasks", default="decode,train")
    ap.add_argument("--mode", default="warm")
    ap.add_argument("--settle-max", type=float, default=15.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    peers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
    workdir = os.environ.get("TMPDIR") or "/tmp"
    concs = [int(x) for x in args.conc.split(",")]
    settings = [(c, p) for p in (int(x) for x in args.pool.split(",")) for c in concs]
    runs = {}  # (task, conc, pool) -> list of pass dicts
    for r in range(args.rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        for conc, pool in order:
            out = os.path.join(workdir, "spdl-sweep-%d-%d-%d.json" % (r, conc, pool))
            cmd = [sys.executable, peers, "--data", args.data, "--limit", str(args.limit),
                   "--passes", "1", "--loaders", "spdl", "--tasks", args.tasks, "--modes",
                   args.mode, "--repeats", "0", "--settle-max", str(args.settle_max),
                   "--spdl-conc", str(conc), "--spdl-pool", str(pool), "--json", out]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                rep = json.load(f)
            for c in rep["cells"]:
                for p in c["attempts"][-1]["passes"]:
                    assert p["spdl"] == {"conc": conc, "pool": pool}, p["spdl"]
                    runs.setdefault((c["task"], conc, pool), []).append(p)
            print("round %d conc %d pool %d: %s" % (r, conc, pool, " ".join(
                "%s %.0f/s %.2f ms" % (c["task"], c["images_per_s"], c["cpu_ms_per_image"])
                for c in rep["cells"])), flush=True)

    rows = ["| task | decode concurrency | pool threads | rounds | images/s (median) | range | "
            "CPU ms/image (median) | load at start | foreign cores (median) |",
            "|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for (task, conc, pool), ps in sorted(runs.items()):
        ips = [p["images_per_s"] for p in ps]
        m = statistics.median(ips)
        if m > best.get(task, (0, None))[0]:
            best[task] = (m, (conc, pool))
        la = [p["loadavg_start"][0] for p in ps]
        rows.append("| %s | %d | %d | %d | %.0f | %.0f–%.0f | %.2f | %.2f–%.2f | %.2f |" % (
            task, conc, pool, len(ps), m, min(ips), max(ips),
            statistics.median(p["cpu_ms_per_image"] for p in ps), min(la), max(la),
            statistics.median(p["foreign_cores"] for p in ps)))
    print("\n".join(rows))
    for task, (m, (conc, pool)) in sorted(best.items()):
        print("best %s: concurrency %d, pool %d (%.0f images/s)" % (task, conc, pool, m))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": [sys.executable] + sys.argv,
                       "runs": {"%s/%d/%d" % k: v for k, v in runs.items()},
                       "best": {t: {"conc": c, "pool": p} for t, (_, (c, p)) in best.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
