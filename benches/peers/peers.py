#!/usr/bin/env python3
"""lobster_io against its peers on one ImageFolder of JPEGs.

    python benches/peers/peers.py --data DIR [--data DIR2 ...] [--passes 3] [--cold-passes N] [--batch 64]
        [--modes cold,warm] [--tasks decode,train] [--loaders lobster,dataloader,dali,pillow,spdl]
        [--threads 2] [--limit N] [--json OUT]

Every timed pass runs in a fresh subprocess of this interpreter (`--one`, internal). The
subprocess imports its libraries and runs a small untimed warm-up pass on a generated
16-image folder (so lazily loaded code is mapped), reports READY, and waits; the parent
then drops the page cache (mode cold: `sync; echo 3 > /proc/sys/vm/drop_caches`) and sends
GO. The timed region, measured inside the subprocess, goes from GO to the last image
consumed and includes building the loader (scanning the folder). CPU time is the
subprocess's own (all its threads) plus that of the child processes it has reaped
(getrusage SELF + CHILDREN), from READY until the loader is closed after the last batch
and its DataLoader workers are joined; the subprocess then leaves with os._exit. The
parent's os.wait4 figure around the whole subprocess (which adds the interpreter's exit) is
kept in the JSON as cpu_s_wait4.

With several --data folders, each (task, mode) group runs on every folder in turn, the
folders' order alternating from one group to the next, so that a drift in the machine's
load falls on all of them alike; ratios compare loaders on the same folder.

See benches/peers/README.md.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

LOADERS = ("lobster", "dataloader", "dali", "pillow", "spdl")
TASKS = ("decode", "train")
MODES = ("cold", "warm")
IMG_EXT = (".jpg", ".jpeg", ".png")
CROP = 224
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------


def list_images(root):
    """(path, label) in ImageFolder's order: sorted class folders, sorted files."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for label, c in enumerate(classes):
        d = os.path.join(root, c)
        for name in sorted(os.listdir(d)):
            if name.lower().endswith(IMG_EXT):
                out.append((os.path.join(d, name), label))
    return out


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_busy_s():
    """Busy CPU seconds of the whole machine (all cores) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def prewarm(files):
    """Reads every file once so that it is in the page cache."""
    buf = bytearray(1 << 20)
    for p, _ in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def rrc_params(w, h, rng):
    """torchvision's RandomResizedCrop.get_params: (left, top, width, height)."""
    area = w * h
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(SCALE[0], SCALE[1])
        ar = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        cw = int(round(math.sqrt(target * ar)))
        ch = int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    in_ratio = w / h
    if in_ratio < RATIO[0]:
        cw, ch = w, int(round(w / RATIO[0]))
    elif in_ratio > RATIO[1]:
        ch, cw = h, int(round(h * RATIO[1]))
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def make_warmup_dir(path):
    """16 small JPEGs in 2 classes, made with Pillow, for the untimed warm-up pass."""
    if os.path.exists(os.path.join(path, ".complete")):
        return path
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    for c in range(2):
        d = os.path.join(path, "c%d" % c)
        os.makedirs(d, exist_ok=True)
        for i in range(8):
            y, x = np.mgrid[0:300, 0:340]
            a = np.stack([(x + 40 * i) % 256, (y + 30 * c) % 256, (x + y) % 256], -1)
            a = (a + rng.integers(0, 40, a.shape)).clip(0, 255).astype(np.uint8)
            Image.fromarray(a).save(os.path.join(d, "%02d.jpg" % i), quality=90)
    open(os.path.join(path, ".complete"), "w").close()
    return path


def make_subset(data, files, limit, workdir):
    """Copies `limit` images spread evenly over `files` into workdir/subset-LIMIT-NAME."""
    dst = os.path.join(workdir, "subset-%d-%s" % (limit, os.path.basename(data)))
    if os.path.exists(os.path.join(dst, ".complete")):
        return dst
    step = len(files) / limit
    for k in range(limit):
        p, _ = files[int(k * step)]
        rel = os.path.relpath(p, data)
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copyfile(p, os.path.join(dst, rel))
    open(os.path.join(dst, ".complete"), "w").close()
    return dst


# --------------------------------------------------------------------------------------
# One pass per loader (runs in the `--one` subprocess)
# --------------------------------------------------------------------------------------
# Each run_* builds its loader, consumes every image of one shuffled pass and returns
# (images, info, close). `info` holds setup_s (build) and first_batch_s, both from the
# function's start; `close` tears the loader down after the timing.


def run_lobster(data, task, batch, threads, seed, expect):
    import lobster_io

    t0 = time.perf_counter()
    kw = dict(epochs=1, seed=seed, budgets=lobster_io.Budgets(decode_threads=threads))
    if task == "decode":
        loader = lobster_io.Loader(data, batch, transform="none", **kw)
    else:
        # Its faster setting: decode only what the crop keeps.
        loader = lobster_io.Loader(data, batch, transform="train", image_size=CROP,
                                   decoding="region", **kw)
    info = {"setup_s": time.perf_counter() - t0}
    n = 0
    touch = 0
    for b in loader:
        ims = b.images
        if n == 0:
            info["first_batch_s"] = time.perf_counter() - t0
        if task == "decode":
            for a in ims:  # views; touch the shape only, no copy
                touch += a.shape[0] + a.shape[1] + a.shape[2]
            n += len(ims)
        else:
            assert ims.shape[1:] == (CROP, CROP, 3) and ims.dtype.name == "uint8"
            touch += ims.shape[0]
            n += ims.shape[0]
    info["touch"] = touch
    return n, info, loader.close


# DataLoader pieces live at module level so that they pickle for any start method.


def pil_rgb(path):
    from PIL import Image

    img = Image.open(path)
    img.load()
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def pil_to_hwc_tensor(img):
    """PILToTensor without the permute: a [H, W, 3] uint8 tensor (HWC like the others)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(img))


def list_collate(samples):
    return samples


def run_dataloader(data, task, batch, threads, seed, expect):
    import warnings

    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    warnings.filterwarnings("ignore", message=".*not writable.*")
    t0 = time.perf_counter()
    if task == "decode":
        ds = ImageFolder(data, loader=pil_rgb, transform=pil_to_hwc_tensor)
        collate = list_collate
    else:
        tf = T.Compose(
            [T.RandomResizedCrop(CROP, scale=SCALE, ratio=RATIO), T.RandomHorizontalFlip(),
             pil_to_hwc_tensor])
        ds = ImageFolder(data, loader=pil_rgb, transform=tf)
        collate = None  # default_collate: stacks into one [B, 224, 224, 3] uint8 tensor
    g = torch.Generator()
    g.manual_seed(seed)
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=threads,
                    collate_fn=collate, pin_memory=False, persistent_workers=True,
                    generator=g)
    info = {"setup_s": time.perf_counter() - t0}
    n = 0
    touch = 0
    for b in dl:
        if n == 0:
            info["first_batch_s"] = time.perf_counter() - t0
        if task == "decode":
            for x, _ in b:
                touch += x.shape[0] + x.shape[1] + x.shape[2]
            n += len(b)
        else:
            x, _ = b
            assert tuple(x.shape[1:]) == (CROP, CROP, 3) and x.dtype == torch.uint8
            touch += x.shape[0]
            n += x.shape[0]
    info["touch"] = touch

    def close():
        it = getattr(dl, "_iterator", None)
        if it is not None:
            it._shutdown_workers()  # joins the workers so that their CPU is reaped

    return n, info, close


def dali_train(jpegs):
    """DALI's train task as its ImageNet examples: the decoder crops at random (it decodes
    only the crop window), then a resize to 224 and a random flip, collated as HWC uint8."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    images = fn.decoders.image_random_crop(
        jpegs, device="cpu", output_type=types.RGB, random_area=list(SCALE),
        random_aspect_ratio=[0.75, 1.333333], num_attempts=10)
    images = fn.resize(images, resize_x=CROP, resize_y=CROP)
    return fn.crop_mirror_normalize(
        images, mirror=fn.random.coin_flip(probability=0.5), dtype=types.UINT8,
        output_layout="HWC", crop=(CROP, CROP))


def run_dali(data, task, batch, threads, seed, expect):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    t0 = time.perf_counter()

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
    def pipe_def():
        jpegs, labels = fn.readers.file(file_root=data, random_shuffle=True, name="Reader")
        if task == "decode":
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        else:
            images = dali_train(jpegs)
        return images, labels

    pipe = pipe_def()
    pipe.build()
    total = pipe.epoch_size("Reader")
    info = {"setup_s": time.perf_counter() - t0, "reader_epoch_size": total}
    n = 0
    touch = 0
    for _ in range(math.ceil(total / batch)):
        images, _labels = pipe.run()
        if n == 0:
            info["first_batch_s"] = time.perf_counter() - t0
        take = min(batch, total - n)  # the reader fills the last batch from the next epoch
        if task == "decode":
            for j in range(take):
                s = images[j].shape()
                touch += s[0] + s[1] + s[2]
        else:
            arr = images.as_array()  # one [B, 224, 224, 3] uint8 numpy array
            assert arr.shape[1:] == (CROP, CROP, 3) and arr.dtype.name == "uint8"
            arr = arr[:take]
            touch += arr.shape[0]
        n += take
    info["touch"] = touch

    holder = [pipe]
    del pipe
    return n, info, holder.clear


def _pillow_decode(path):
    import numpy as np

    return np.asarray(pil_rgb(path))


def _pillow_train(path, seed, out, j):
    import numpy as np
    from PIL import Image

    img = pil_rgb(path)
    rng = random.Random(seed)
    left, top, cw, ch = rrc_params(img.width, img.height, rng)
    img = img.resize((CROP, CROP), Image.BILINEAR, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    out[j] = np.asarray(img)  # collate: each thread writes its row of the batch


def run_pillow(data, task, batch, threads, seed, expect):
    import collections
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    t0 = time.perf_counter()
    files = list_images(data)
    random.Random(seed).shuffle(files)
    ex = ThreadPoolExecutor(threads)
    info = {"setup_s": time.perf_counter() - t0}
    batches = [files[i:i + batch] for i in range(0, len(files), batch)]
    ahead = 4  # batches in flight

    def submit(k):
        chunk = batches[k]
        if task == "decode":
            return None, [ex.submit(_pillow_decode, p) for p, _ in chunk]
        out = np.empty((len(chunk), CROP, CROP, 3), np.uint8)
        futs = [ex.submit(_pillow_train, p, seed * 1000003 + k * batch + j, out, j)
                for j, (p, _) in enumerate(chunk)]
        return out, futs

    q = collections.deque(submit(k) for k in range(min(ahead, len(batches))))
    nxt = len(q)
    n = 0
    touch = 0
    while q:
        out, futs = q.popleft()
        if nxt < len(batches):
            q.append(submit(nxt))
            nxt += 1
        if task == "decode":
            ims = [f.result() for f in futs]
            for a in ims:
                touch += a.shape[0] + a.shape[1] + a.shape[2]
            n += len(ims)
        else:
            for f in futs:
                f.result()
            touch += out.shape[0]
            n += out.shape[0]
        if info.get("first_batch_s") is None:
            info["first_batch_s"] = time.perf_counter() - t0
    info["touch"] = touch
    return n, info, lambda: ex.shutdown(wait=True)


# SPDL: stage concurrency and the size of the pipeline's thread pool, per task, picked by
# spdl_sweep.py on this 2-core machine, warm, 400 photos (see the README); --spdl-conc /
# --spdl-pool override.
SPDL_BEST = {"decode": {"conc": 4, "pool": 2}, "train": {"conc": 8, "pool": 2}}
SPDL_CFG = {}  # set by one() from --spdl-conc / --spdl-pool
# Full-size RGB: SPDL's own filter helper, scale at the source size (w=0:h=0) with the
# bilinear flag, which only sets how swscale upsamples the 4:2:0 chroma: about 0.3 ms an
# image cheaper than the default (bicubic), within 0.1 ms of the cheapest flags tried.
SPDL_SCALE_ALGO = "bilinear"


def spdl_config(task):
    cfg = dict(SPDL_BEST[task])
    cfg.update({k: v for k, v in SPDL_CFG.items() if v})
    return cfg


def spdl_train_filter(w, h, rng):
    """FFmpeg filter graph for one image: torchvision's crop box (drawn here with
    rrc_params), scale to 224 x 224 (bilinear), a horizontal flip at p = 0.5, rgb24."""
    import spdl.io

    left, top, cw, ch = rrc_params(w, h, rng)
    parts = ["crop=w=%d:h=%d:x=%d:y=%d:exact=1" % (cw, ch, left, top),
             "scale=w=%d:h=%d:flags=%s" % (CROP, CROP, SPDL_SCALE_ALGO)]
    if rng.random() < 0.5:
        parts.append("hflip")
    return spdl.io.get_video_filter_desc(pix_fmt="rgb24", filter_desc=",".join(parts))


def run_spdl(data, task, batch, threads, seed, expect):
    """Meta's SPDL: a PipelineBuilder over the shuffled file list. decode: load_image per
    image (demux, decode, rgb24) into one [H, W, 3] array, batches are lists. train: demux
    (which gives the size), crop box drawn in Python, then decode + crop + scale + flip in
    FFmpeg's filter graph, and a collate stage (convert_frames) to one [B, 224, 224, 3]
    uint8 array. `threads` is not used: SPDL's own concurrency is SPDL_BEST / SPDL_CFG."""
    import spdl.io
    import spdl.io.utils
    from spdl.pipeline import PipelineBuilder

    # swscale warns per image about the JPEG's full-range pixel format; printing that
    # is not decoding.
    spdl.io.utils.set_ffmpeg_log_level(16)
    cfg = spdl_config(task)
    t0 = time.perf_counter()
    files = list_images(data)
    random.Random(seed).shuffle(files)
    items = [(k, p) for k, (p, _) in enumerate(files)]

    if task == "decode":
        full_rgb = spdl.io.get_video_filter_desc(
            scale_width=0, scale_height=0, scale_algo=SPDL_SCALE_ALGO, scale_mode=None,
            pix_fmt="rgb24")

        def load(item):
            k, path = item
            return k, spdl.io.to_numpy(spdl.io.load_image(path, filter_desc=full_rgb))

        def collate(xs):
            return [k for k, _ in xs], [a for _, a in xs]
    else:
        def load(item):
            k, path = item
            packets = spdl.io.demux_image(path)
            codec = packets.codec
            # the same per-image seed as the Pillow pool (its batch k // B, row k % B)
            rng = random.Random(seed * 1000003 + k)
            fd = spdl_train_filter(codec.width, codec.height, rng)
            return k, spdl.io.decode_packets(packets, filter_desc=fd)

        def collate(xs):
            return [k for k, _ in xs], spdl.io.to_numpy(
                spdl.io.convert_frames([f for _, f in xs]))

    pipeline = (
        PipelineBuilder()
        .add_source(items)
        .pipe(load, concurrency=cfg["conc"])
        .aggregate(batch)
        .pipe(collate)
        .add_sink(4)
        # no per-task statistics hooks: timing every task is not loading
        .build(num_threads=cfg["pool"], task_hook_factory=lambda _: [])
    )
    pipeline.start()
    info = {"setup_s": time.perf_counter() - t0, "spdl": cfg}
    n = 0
    touch = 0
    seen = bytearray(len(items))
    for ks, ims in pipeline.get_iterator():
        if n == 0:
            info["first_batch_s"] = time.perf_counter() - t0
        for k in ks:
            if seen[k]:
                raise RuntimeError("spdl delivered image %d twice" % k)
            seen[k] = 1
        if task == "decode":
            for a in ims:
                touch += a.shape[0] + a.shape[1] + a.shape[2]
            n += len(ims)
        else:
            assert ims.shape == (len(ks), CROP, CROP, 3) and ims.dtype.name == "uint8"
            touch += ims.shape[0]
            n += ims.shape[0]
    info["touch"] = touch
    return n, info, pipeline.stop


RUNNERS = {"lobster": run_lobster, "dataloader": run_dataloader, "dali": run_dali,
           "pillow": run_pillow, "spdl": run_spdl}


def self_cpu():
    import resource

    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def one(args):
    """The `--one` subprocess: warm up, READY, wait for GO, one timed pass, DONE."""
    run = RUNNERS[args.loader]
    SPDL_CFG.update({"conc": args.spdl_conc, "pool": args.spdl_pool})
    # Warm-up on the small generated folder: maps the code paths, not the data.
    n, _, close = run(args.warmup, args.task, 8, args.threads, 99, None)
    close()
    del close
    import gc

    gc.collect()
    print("READY " + json.dumps({"cpu_s": self_cpu()}), flush=True)
    line = sys.stdin.readline()
    if line.strip() != "GO":
        sys.exit(2)
    t0 = time.perf_counter()
    n, info, close = run(args.data, args.task, args.batch, args.threads, args.seed, args.expect)
    wall = time.perf_counter() - t0
    info.update({"wall_s": wall, "images": n})
    print("DONE " + json.dumps(info), flush=True)
    t1 = time.perf_counter()
    close()
    import multiprocessing

    alive = len(multiprocessing.active_children())  # joins (reaps) any that have ended
    if args.expect is not None and n != args.expect:
        print("expected %d images, got %d" % (args.expect, n), file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    print("CLOSED " + json.dumps({"teardown_s": time.perf_counter() - t1,
                                  "cpu_s": self_cpu(), "children_alive": alive}), flush=True)
    # Skip the interpreter's own teardown (seconds with torch loaded): not the loader's cost.
    os._exit(0)


# --------------------------------------------------------------------------------------
# Versions and machine
# --------------------------------------------------------------------------------------


def versions_child():
    import importlib.metadata as md

    v = {"python": platform.python_version()}
    for name, mod in (("torch", "torch"), ("torchvision", "torchvision"),
                      ("pillow", "PIL"), ("numpy", "numpy"), ("dali", "nvidia.dali")):
        try:
            m = __import__(mod, fromlist=["__version__"])
            v[name] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            v[name] = "missing (%s)" % type(e).__name__
    try:
        import spdl
        import spdl.io.utils

        v["spdl"] = getattr(spdl, "__version__", None) or md.version("spdl")
        av = spdl.io.utils.get_ffmpeg_versions()
        v["spdl_ffmpeg"] = {k: ".".join(map(str, x)) for k, x in sorted(av.items())}
    except Exception as e:  # noqa: BLE001
        v["spdl"] = "missing (%s)" % type(e).__name__
    try:
        from PIL import features

        v["pillow_libjpeg_turbo"] = features.version("libjpeg_turbo")
        v["pillow_simd"] = "post" in v.get("pillow", "")
    except Exception:  # noqa: BLE001
        pass
    try:
        import lobster_io

        v["lobster_io"] = getattr(lobster_io, "__version__", None) or "editable"
        try:
            v["lobster_io_dist"] = md.version("lobster-io")
        except md.PackageNotFoundError:
            pass
        pkg = os.path.dirname(lobster_io.__file__)
        v["lobster_io_path"] = pkg
        for f in sorted(os.listdir(pkg)):
            if f.endswith(".so"):
                p = os.path.join(pkg, f)
                with open(p, "rb") as fh:
                    v["lobster_io_so_sha256"] = hashlib.sha256(fh.read()).hexdigest()[:16]
                v["lobster_io_so_mtime"] = datetime.datetime.fromtimestamp(
                    os.path.getmtime(p)).isoformat(timespec="seconds")
    except Exception as e:  # noqa: BLE001
        v["lobster_io"] = "missing (%s)" % type(e).__name__
    print(json.dumps(v))


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = f.readline().split()[1]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    git = {}
    for key, cmd in (("head", ["git", "rev-parse", "HEAD"]),
                     ("dirty_files", ["git", "status", "--porcelain", "--untracked-files=no"])):
        try:
            out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True).stdout
            git[key] = out.strip() if key == "head" else len(out.splitlines())
        except OSError:
            pass
    return {"cpu_model": model, "cores": os.cpu_count(), "mem_kib": int(mem),
            "kernel": platform.release(), "git": git}


# --------------------------------------------------------------------------------------
# The parent: cells, passes, table
# --------------------------------------------------------------------------------------


def run_pass(args, data, loader, task, mode, seed, expect, env):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--loader", loader,
           "--task", task, "--data", data, "--batch", str(args.batch), "--threads",
           str(args.threads), "--seed", str(seed), "--expect", str(expect),
           "--warmup", args.warmup]
    if loader == "spdl":
        for opt, val in (("--spdl-conc", args.spdl_conc), ("--spdl-pool", args.spdl_pool)):
            if val:
                cmd += [opt, str(val)]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    msgs = {}

    def expect_line(tag):
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError("%s/%s/%s: subprocess ended before %s" %
                                   (loader, task, mode, tag))
            if line.startswith(tag + " "):
                msgs[tag] = json.loads(line[len(tag) + 1:])
                return
            sys.stderr.write(line)  # a library's chatter on stdout

    expect_line("READY")
    if mode == "cold":
        drop_caches()
    la0 = loadavg()
    busy0 = cpu_busy_s()
    t_go = time.perf_counter()
    p.stdin.write("GO\n")
    p.stdin.flush()
    expect_line("DONE")
    t_done = time.perf_counter()
    expect_line("CLOSED")
    rest = p.stdout.read()
    if rest:
        sys.stderr.write(rest)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    t_exit = time.perf_counter()
    busy1 = cpu_busy_s()
    la1 = loadavg()
    if p.returncode != 0:
        raise RuntimeError("%s/%s/%s: exit %d" % (loader, task, mode, p.returncode))
    d = msgs["DONE"]
    if msgs["CLOSED"]["children_alive"]:
        raise RuntimeError("%s/%s/%s: worker processes still alive after close" %
                           (loader, task, mode))
    # CPU from READY to the loader closed (its worker processes joined), measured by the
    # subprocess; the parent's wait4 figure (to the subprocess's exit) is kept beside it.
    cpu = msgs["CLOSED"]["cpu_s"] - msgs["READY"]["cpu_s"]
    cpu_wait4 = ru.ru_utime + ru.ru_stime - msgs["READY"]["cpu_s"]
    n = d["images"]
    foreign = max(0.0, (busy1 - busy0) - cpu_wait4) / (t_exit - t_go)
    return {
        "seed": seed, "images": n, "wall_s": d["wall_s"],
        "images_per_s": n / d["wall_s"], "cpu_s": cpu, "cpu_ms_per_image": cpu * 1000 / n,
        "cpu_s_wait4": cpu_wait4, "cpu_user_s_total": ru.ru_utime, "cpu_sys_s_total": ru.ru_stime,
        "cpu_s_before_go": msgs["READY"]["cpu_s"], "maxrss_kib": ru.ru_maxrss,
        "setup_s": d.get("setup_s"), "first_batch_s": d.get("first_batch_s"),
        "teardown_s": msgs["CLOSED"]["teardown_s"], "parent_go_done_s": t_done - t_go,
        "parent_go_exit_s": t_exit - t_go, "foreign_cores": foreign,
        "loadavg_start": la0, "loadavg_end": la1,
        **({"reader_epoch_size": d["reader_epoch_size"]} if "reader_epoch_size" in d else {}),
        **({"spdl": d["spdl"]} if "spdl" in d else {}),
    }


def settle(args):
    """Waits (at most args.settle_max s) for the 1-minute load average to fall below
    args.settle_below, so that the previous cell's own load does not count."""
    t0 = time.time()
    while loadavg()[0] > args.settle_below and time.time() - t0 < args.settle_max:
        time.sleep(2)
    return time.time() - t0


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", action="append", default=None,
                    help="an ImageFolder; give it more than once to compare folders")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--cold-passes", type=int, default=None,
                    help="passes for mode cold (default: --passes)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="loader threads or workers")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--tasks", default="decode,train")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--limit", type=int, default=None,
                    help="use a copy of N images spread over the folder")
    ap.add_argument("--json", default=None)
    ap.add_argument("--workdir", default=None,
                    help="for the warm-up folder and --limit copies (default $TMPDIR)")
    ap.add_argument("--max-load", type=float, default=1.5,
                    help="repeat a cell whose 1-min load average at its start is above this")
    ap.add_argument("--max-foreign", type=float, default=0.3,
                    help="repeat a cell if other processes used more than this many cores")
    ap.add_argument("--repeats", type=int, default=2, help="at most this many repeats a cell")
    ap.add_argument("--settle-below", type=float, default=1.0)
    ap.add_argument("--settle-max", type=float, default=60.0)
    ap.add_argument("--spdl-conc", type=int, default=None,
                    help="spdl: concurrency of its decode stage (default: per task, SPDL_BEST)")
    ap.add_argument("--spdl-pool", type=int, default=None,
                    help="spdl: threads of its pipeline's pool (default: per task, SPDL_BEST)")
    # internal
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loader", help=argparse.SUPPRESS)
    ap.add_argument("--task", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.versions:
        return versions_child()
    if args.one:
        args.data = args.data[0]
        return one(args)
    if not args.data:
        ap.error("--data is required")

    loaders = [x for x in args.loaders.split(",") if x]
    tasks = [x for x in args.tasks.split(",") if x]
    modes = [x for x in args.modes.split(",") if x]
    for xs, ok in ((loaders, LOADERS), (tasks, TASKS), (modes, MODES)):
        bad = set(xs) - set(ok)
        if bad:
            ap.error("unknown %s (choose from %s)" % (",".join(bad), ",".join(ok)))
    if "cold" in modes and os.geteuid() != 0:
        ap.error("mode cold drops the page cache and needs root")
    workdir = args.workdir or os.environ.get("TMPDIR") or "/tmp"
    os.makedirs(workdir, exist_ok=True)
    args.warmup = make_warmup_dir(os.path.join(workdir, "peers-warmup"))

    sets = []
    for d in args.data:
        data = os.path.abspath(d)
        files = list_images(data)
        if args.limit:
            data = make_subset(data, files, args.limit, workdir)
            files = list_images(data)
        sizes = [os.path.getsize(p) for p, _ in files]
        sets.append({"name": os.path.basename(data.rstrip("/")), "data": data,
                     "images": len(files), "mean_file_kib": sum(sizes) / len(sizes) / 1024,
                     "files": files})
    if len({s["name"] for s in sets}) != len(sets):
        ap.error("--data folders need distinct names")
    env = dict(os.environ)
    v = subprocess.run([sys.executable, os.path.abspath(__file__), "--versions"],
                       capture_output=True, text=True, check=True, env=env)
    versions = json.loads(v.stdout)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable] + sys.argv,
        "sets": [{k: v for k, v in s.items() if k != "files"} for s in sets],
        "batch": args.batch, "threads": args.threads, "machine": machine(),
        "versions": versions, "loadavg_at_start": loadavg(), "cells": [],
    }
    if len(sets) == 1:  # the single-folder layout of earlier results files
        report.update({k: sets[0][k] for k in ("data", "images", "mean_file_kib")})
    for s in sets:
        print("# %s: %d images, mean %.1f KiB, %s" % (s["name"], s["images"],
                                                      s["mean_file_kib"], s["data"]),
              flush=True)
    print("# " + json.dumps(versions), flush=True)

    groups = [(task, mode) for task in tasks for mode in modes]
    for g, (task, mode) in enumerate(groups):
        passes = args.cold_passes if (mode == "cold" and args.cold_passes) else args.passes
        for st in (sets if g % 2 == 0 else sets[::-1]):
            data, files, n_images = st["data"], st["files"], st["images"]
            for loader in loaders:
                cell = {"set": st["name"], "task": task, "mode": mode, "loader": loader,
                        "attempts": []}
                for attempt in range(args.repeats + 1):
                    if mode == "warm":
                        prewarm(files)
                    waited = settle(args)
                    la0 = loadavg()
                    t0 = time.time()
                    started = datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds")
                    runs = []
                    for i in range(passes):
                        seed = i + 1  # pass i has the same seed for every loader
                        runs.append(run_pass(args, data, loader, task, mode, seed, n_images,
                                             env))
                    la1 = loadavg()
                    foreign = med([r["foreign_cores"] for r in runs])
                    flagged = la0[0] > args.max_load or foreign > args.max_foreign
                    cell["attempts"].append({
                        "settle_wait_s": waited, "loadavg_start": la0, "loadavg_end": la1,
                        "started": started, "ended": datetime.datetime.now(
                            datetime.timezone.utc).isoformat(timespec="seconds"),
                        "elapsed_s": time.time() - t0, "foreign_cores_median": foreign,
                        "flagged": flagged, "passes": runs})
                    print("%s %-6s %-4s %-10s attempt %d: %s images/s, %s CPU ms/img; load "
                          "%.2f -> %.2f, foreign %.2f cores%s" % (
                              st["name"][:12], task, mode, loader, attempt,
                              " ".join("%.0f" % r["images_per_s"] for r in runs),
                              " ".join("%.2f" % r["cpu_ms_per_image"] for r in runs),
                              la0[0], la1[0], foreign, " FLAGGED" if flagged else ""),
                          flush=True)
                    if not flagged or attempt == args.repeats:
                        break
                    time.sleep(30)
                last = cell["attempts"][-1]["passes"]
                cell["images_per_s"] = med([r["images_per_s"] for r in last])
                cell["cpu_ms_per_image"] = med([r["cpu_ms_per_image"] for r in last])
                cell["passes"] = len(last)
                report["cells"].append(cell)
                if args.json:
                    write_json(args.json, report)

    for c in report["cells"]:
        ref = next((x for x in report["cells"] if x["loader"] == "lobster"
                    and x.get("set") == c.get("set") and x["task"] == c["task"]
                    and x["mode"] == c["mode"]), None)
        if ref:
            c["lobster_over_peer_images_per_s"] = ref["images_per_s"] / c["images_per_s"]
            c["lobster_over_peer_cpu"] = ref["cpu_ms_per_image"] / c["cpu_ms_per_image"]
    report["loadavg_at_end"] = loadavg()
    v = subprocess.run([sys.executable, os.path.abspath(__file__), "--versions"],
                       capture_output=True, text=True, check=True, env=env)
    report["versions_at_end"] = json.loads(v.stdout)  # an editable lobster_io may be rebuilt
    if report["versions_at_end"] != versions:
        print("# WARNING: versions changed during the run: %s" % v.stdout.strip())
    print()
    print(table(report))
    if args.json:
        write_json(args.json, report)


def write_json(path, report):
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def table(report):
    rows = ["| set | task | mode | loader | passes | images/s (median) | range | CPU ms/image | "
            "lobster/peer images/s | lobster/peer CPU | load start→end |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    cells = sorted(report["cells"], key=lambda c: [s["name"] for s in report["sets"]].index(
        c["set"])) if "sets" in report else report["cells"]
    for c in cells:
        ips = [r["images_per_s"] for r in c["attempts"][-1]["passes"]]
        a = c["attempts"][-1]
        rows.append("| %s | %s | %s | %s | %d%s | %.0f | %.0f–%.0f | %.2f | %s | %s | %.2f→%.2f |" % (
            c.get("set", "-"), c["task"], c["mode"], c["loader"], c["passes"],
            " (%d tries)" % len(c["attempts"]) if len(c["attempts"]) > 1 else "",
            c["images_per_s"], min(ips), max(ips), c["cpu_ms_per_image"],
            "%.2f" % c["lobster_over_peer_images_per_s"]
            if "lobster_over_peer_images_per_s" in c else "-",
            "%.2f" % c["lobster_over_peer_cpu"] if "lobster_over_peer_cpu" in c else "-",
            a["loadavg_start"][0], a["loadavg_end"][0]))
    return "\n".join(rows)


if __name__ == "__main__":
    main()
