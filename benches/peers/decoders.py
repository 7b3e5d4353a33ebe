#!/usr/bin/env python3
"""Single-thread JPEG decode time: lobster_io's decoder (lobster-image's own on a baseline
JPEG, zune-jpeg on any other) against Pillow's
(libjpeg-turbo), on the same files already in memory.

    python benches/peers/decoders.py --data DIR [--data DIR2 ...] [--limit 400] [--rounds 5]

Reads `--limit` files spread evenly over each folder into memory, then runs `--rounds`
rounds; each round decodes every file once with each decoder, the decoders in alternating
order, and records the mean wall time and the mean CPU time (this thread's,
`time.thread_time`) per image; the CPU figure is the steadier one on a shared machine.
Prints the median round and its spread. Pillow's
figure is `Image.open(BytesIO) + load()` (RGB out); the `np.asarray` copy it needs to hand
out an [H, W, 3] array is timed separately. lobster_io.decode_image returns an [H, W, 3]
uint8 array.
"""

import argparse
import io
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import list_images  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", action="append", required=True)
    ap.add_argument("--limit", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np
    from PIL import Image, features

    import lobster_io

    def pil(b):
        img = Image.open(io.BytesIO(b))
        img.load()
        if img.mode != "RGB":
            img = img.convert("RGB")
        return img

    def pil_array(b):
        return np.asarray(pil(b))

    decoders = {"lobster-image (lobster_io.decode_image)": lobster_io.decode_image,
                "libjpeg-turbo (Pillow load)": pil,
                "libjpeg-turbo (Pillow load + np.asarray)": pil_array}
    out = {"pillow": Image.__version__,
           "libjpeg_turbo": features.version("libjpeg_turbo"), "sets": []}
    for data in args.data:
        files = list_images(data)
        step = len(files) / min(args.limit, len(files))
        blobs = []
        for k in range(min(args.limit, len(files))):
            with open(files[int(k * step)][0], "rb") as f:
                blobs.append(f.read())
        # Same pixels from both decoders' shapes (a check that both decode the same files).
        for b in blobs[:8]:
            a, p = lobster_io.decode_image(b), pil_array(b)
            assert a.shape == p.shape, (a.shape, p.shape)
        pixels = sum(pil(b).width * pil(b).height for b in blobs) / len(blobs)
        rounds = {name: [] for name in decoders}
        cpu = {name: [] for name in decoders}
        names = list(decoders)
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                fn = decoders[name]
                t0, c0 = time.perf_counter(), time.thread_time()
                for b in blobs:
                    fn(b)
                cpu[name].append((time.thread_time() - c0) * 1000 / len(blobs))
                rounds[name].append((time.perf_counter() - t0) * 1000 / len(blobs))
        res = {"data": data, "images": len(blobs),
               "mean_kib": sum(map(len, blobs)) / len(blobs) / 1024,
               "mean_megapixels": pixels / 1e6, "loadavg": os.getloadavg(),
               "ms_per_image": {n: statistics.median(v) for n, v in rounds.items()},
               "cpu_ms_per_image": {n: statistics.median(v) for n, v in cpu.items()},
               "rounds": rounds, "cpu_rounds": cpu}
        out["sets"].append(res)
        print("%s: %d images, mean %.1f KiB, %.3f MP, load %.2f" % (
            data, len(blobs), res["mean_kib"], res["mean_megapixels"], res["loadavg"][0]))
        for n, v in rounds.items():
            c = cpu[n]
            print("  %-42s wall %.3f ms/image (rounds %.3f to %.3f), CPU %.3f (%.3f to %.3f)" % (
                n, statistics.median(v), min(v), max(v), statistics.median(c), min(c), max(c)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
