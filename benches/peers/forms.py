#!/usr/bin/env python3
"""The decoded-sample tier against NVIDIA DALI's CPU pipeline over several epochs.

    python benches/peers/forms.py --data DIR [--epochs 3] [--budgets 10,25,50,100]
        [--passes 3] [--threads 2] [--batch 64] [--decoding region|whole] [--json OUT]

One rank, `--threads` decode threads (DALI: `num_threads`), `--epochs` epochs of the train
task: decode, RandomResizedCrop 224, horizontal flip, collate into one [B, 224, 224, 3]
uint8 batch. The page cache is warm (every file read once before the run), so storage is
the same for both and decoding is the wall. lobster_io runs with its cache at each budget
(a percentage of the decoded dataset's size: the sum of width x height x 3 over the set)
keeping `encoded`, `decoded` or `auto` forms; DALI runs `fn.readers.file` +
`fn.decoders.image_random_crop` + `fn.resize` + `fn.crop_mirror_normalize` at each of a
few settings (prefetch queue depth, reader prefetch), and its best is kept.

Every timed pass runs in a fresh subprocess after an untimed warm-up on a 16-image folder;
the cells of a pass run in a rotating order, so that none always runs first. Before the
timed passes, one untimed pass of each lobster_io setting records a digest of every batch
(ids and pixels): with `--decoding whole` (the loader's default) all of them must be
equal, since the cache's forms never change the output; with `--decoding region` (the
default here, the faster) each must repeat on a second pass. The script fails if they do not.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402  (the warm-up folder, image listing, pre-warming)

CROP = 224
FORMS = ("encoded", "decoded", "auto")
DALI_SETTINGS = {
    "q2": dict(prefetch_queue_depth=2, reader_prefetch=1),
    "q4": dict(prefetch_queue_depth=4, reader_prefetch=1),
    "q4r4": dict(prefetch_queue_depth=4, reader_prefetch=4),
}


def decoded_bytes(files):
    """The decoded set's size: width x height x 3 over every image (headers only)."""
    from PIL import Image

    total = 0
    for p, _ in files:
        with Image.open(p) as im:
            total += im.width * im.height * 3
    return total


def run_lobster(spec):
    import lobster_io

    if spec["cache_bytes"]:
        cache = lobster_io.Cache(bytes=spec["cache_bytes"], forms=spec["forms"])
    else:
        cache = lobster_io.Cache(policy="none", forms=spec["forms"])
    loader = lobster_io.Loader(spec["data"], spec["batch"], epochs=spec["epochs"],
                               seed=spec["seed"], transform="train", image_size=CROP,
                               decoding=spec["decoding"], cache=cache,
                               budgets=lobster_io.Budgets(decode_threads=spec["threads"]))
    n, digest = 0, 0
    for epoch in range(spec["epochs"]):
        loader.set_epoch(epoch)
        for b in loader:
            ims = b.images
            assert ims.shape[1:] == (CROP, CROP, 3)
            n += ims.shape[0]
            if spec["digest"]:
                digest = zlib.crc32(b.ids.tobytes(), digest)
                digest = zlib.crc32(memoryview(ims).cast("B"), digest)
    m = loader.metrics()
    loader.close()
    return n, {"digest": digest, "metrics": m}


def run_dali(spec):
    import math

    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    setting = DALI_SETTINGS[spec["dali"]]

    @pipeline_def(batch_size=spec["batch"], num_threads=spec["threads"], device_id=None,
                  seed=spec["seed"], prefetch_queue_depth=setting["prefetch_queue_depth"])
    def pipe_def():
        jpegs, labels = fn.readers.file(file_root=spec["data"], random_shuffle=True,
                                        prefetch_queue_depth=setting["reader_prefetch"],
                                        name="Reader")
        return peers.dali_train(jpegs), labels

    pipe = pipe_def()
    pipe.build()
    total = pipe.epoch_size("Reader")
    n = 0
    for _ in range(spec["epochs"]):
        got = 0
        for _ in range(math.ceil(total / spec["batch"])):
            images, _labels = pipe.run()
            arr = images.as_array()
            assert arr.shape[1:] == (CROP, CROP, 3)
            take = min(spec["batch"], total - got)  # the last batch spills into the next
            got += take
        n += got
    del pipe
    return n, {}


def child(spec):
    """One pass in this fresh process: warm up untimed, then time the run."""
    import resource

    warm = dict(spec, data=spec["warmup"], epochs=1, batch=8, digest=False)
    if spec["loader"] == "lobster":
        warm["cache_bytes"] = 1 << 20
    (run_lobster if spec["loader"] == "lobster" else run_dali)(warm)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n, info = (run_lobster if spec["loader"] == "lobster" else run_dali)(spec)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    print("RESULT " + json.dumps(dict(info, images=n, wall_s=wall, cpu_s=cpu)), flush=True)
    os._exit(0)


def launch(spec):
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                         capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit("pass %s failed (%d):\n%s%s" % (spec, out.returncode, out.stdout,
                                                         out.stderr))
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--budgets", default="10,25,50,100")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decoding", default="region", choices=("region", "whole"))
    ap.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--json")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(json.loads(a.child))
    if not a.data:
        ap.error("--data is required")

    files = peers.list_images(a.data)
    total_decoded = decoded_bytes(files)
    warmup = peers.make_warmup_dir(os.path.join(a.workdir, "peers-warmup"))
    budgets = [int(b) for b in a.budgets.split(",")]
    base = dict(data=a.data, warmup=warmup, epochs=a.epochs, threads=a.threads,
                batch=a.batch, seed=a.seed, decoding=a.decoding, digest=False)
    cells = []
    for pct in budgets:
        for forms in FORMS:
            cells.append(dict(base, loader="lobster", forms=forms, budget_pct=pct,
                              cache_bytes=total_decoded * pct // 100))
    for name in DALI_SETTINGS:
        cells.append(dict(base, loader="dali", dali=name))
    print("%d images, decoded set %.1f MiB, %d epochs, %d threads" % (
        len(files), total_decoded / 2**20, a.epochs, a.threads), flush=True)
    peers.prewarm(files)

    # Decoding whole, the outputs do not depend on the forms: one digest pass per lobster
    # cell, all equal. Decoding regions, a sample kept decoded is transformed from its whole
    # image, so the forms may move pixels within the region tolerance: each cell's digest
    # must then repeat on a second pass.
    digests = {}
    for c in cells:
        if c["loader"] == "lobster":
            r = launch(dict(c, digest=True))
            digests[(c["budget_pct"], c["forms"])] = r["digest"]
            if a.decoding == "region" and launch(dict(c, digest=True))["digest"] != r["digest"]:
                raise SystemExit("batches differ between two passes of %s at %d%%" % (
                    c["forms"], c["budget_pct"]))
    if a.decoding == "whole" and len(set(digests.values())) != 1:
        raise SystemExit("batches differ between cache forms: %s" % digests)
    print("digests of every batch (decoding %s): %s" % (
        a.decoding, {"%d%% %s" % k: "%08x" % v for k, v in digests.items()}), flush=True)

    results = {i: [] for i in range(len(cells))}
    for p in range(a.passes):
        order = list(range(len(cells)))
        k = p * 7 % len(order)
        for i in order[k:] + order[:k]:
            peers.prewarm(files)
            results[i].append(launch(cells[i]))
            r = results[i][-1]
            print("  pass %d %s: %.0f images/s" % (p + 1, label(cells[i]),
                                                   r["images"] / r["wall_s"]), flush=True)

    def rate(i):
        return statistics.median(r["images"] / r["wall_s"] for r in results[i])

    dali = {cells[i]["dali"]: rate(i) for i in results if cells[i]["loader"] == "dali"}
    best_dali = max(dali, key=dali.get)
    print("\nDALI settings (median images/s): %s; best %s" % (
        ", ".join("%s %.0f" % kv for kv in dali.items()), best_dali))
    print("| budget % of decoded | encoded | decoded | auto | auto / better | auto / DALI "
          "| decoded hits (auto) | decode s saved (auto) |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for pct in budgets:
        row = {}
        for i in results:
            c = cells[i]
            if c["loader"] == "lobster" and c["budget_pct"] == pct:
                row[c["forms"]] = (rate(i), results[i][-1]["metrics"])
        auto = row["auto"][0]
        better = max(row["encoded"][0], row["decoded"][0])
        m = row["auto"][1]
        print("| %d | %.0f | %.0f | %.0f | %.3f | %.2f | %d | %.1f |" % (
            pct, row["encoded"][0], row["decoded"][0], auto, auto / better,
            auto / dali[best_dali], m["hits_decoded"], m["decode_saved_seconds"]))
        table.append(dict(budget_pct=pct, **{f: row[f][0] for f in FORMS},
                          auto_metrics=m))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           images=len(files), decoded_bytes=total_decoded,
                           epochs=a.epochs, threads=a.threads, batch=a.batch,
                           dali=dali, table=table,
                           passes={label(cells[i]): results[i] for i in results}),
                      f, indent=1)


def label(c):
    if c["loader"] == "dali":
        return "dali-%s" % c["dali"]
    return "lobster-%s-%d%%" % (c["forms"], c["budget_pct"])


if __name__ == "__main__":
    main()
