#!/usr/bin/env python3
"""The peers' side of the S3 comparison: MosaicML Streaming and s3torchconnector reading one
S3-compatible server through lobster-bench's delaying proxy.

    peers.py prepare   --data DIR --endpoint URL --bucket B [--shard-bytes N]
    peers.py streaming --endpoint URL --bucket B --cache-limit BYTES|PCT%|none --epochs E
                       --batch N --workers W [--predownload K] --counts-json FILE --out RUN.json
    peers.py s3torch   --endpoint URL --bucket B --epochs E --batch N --workers W
                       [--variant map|tar] --counts-json FILE --out RUN.json
    peers.py sweep     streaming|s3torch [the peer's options] --grid-workers 2,4,8 ...
                       --runs 3 --out SWEEP.json

Bytes and GET requests per epoch are the proxy's counts for this node (`--counts-json`, the
file `lobster-bench s3-proxy --counts-json` rewrites every `--counts-every-ms`): the difference
of two snapshots, each taken once the proxy has rewritten the file twice after the moment it
stands for. Nothing is hard-coded: every figure in the output is measured.

See benches/s3/README.md.
"""

import argparse
import datetime
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

IMG_EXT = (".jpg", ".jpeg", ".png")
FOLDER_PREFIX = "folder/"
MDS_PREFIX = "mds/"
SHARDS_PREFIX = "shards/"
DEFAULT_REGION = "us-east-1"
# Seconds to wait for the proxy to rewrite its counts file before giving up.
COUNTS_WAIT_S = 30.0


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------


def list_images(root):
    """(relative path, label) in ImageFolder's order: sorted class folders, sorted files."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for label, c in enumerate(classes):
        d = os.path.join(root, c)
        for f in sorted(os.listdir(d)):
            if f.lower().endswith(IMG_EXT):
                out.append((f"{c}/{f}", label))
    if not out:
        sys.exit(f"{root}: no images in class folders")
    return classes, out


def set_credentials(args):
    """Credentials and region for boto3 (Streaming) and the CRT (s3torchconnector) alike.

    Values already in the environment win; the flags fill in what is missing. Never printed."""
    if args.access_key is not None:
        os.environ["AWS_ACCESS_KEY_ID"] = args.access_key
    if args.secret_key is not None:
        os.environ["AWS_SECRET_ACCESS_KEY"] = args.secret_key
    os.environ.setdefault("AWS_REGION", args.region)
    os.environ.setdefault("AWS_DEFAULT_REGION", args.region)


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"}),
    )


def list_objects(client, bucket, prefix):
    """{key: size} under prefix."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def versions():
    out = {"python": platform.python_version()}
    for pkg in (
        "mosaicml-streaming",
        "s3torchconnector",
        "s3torchconnectorclient",
        "torch",
        "boto3",
        "botocore",
        "pillow",
        "numpy",
    ):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def machine():
    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
    }


# --------------------------------------------------------------------------------------
# The proxy's counts
# --------------------------------------------------------------------------------------


def _read_counts(path):
    # The proxy renames a complete file over the last: a read sees one whole file.
    with open(path) as f:
        return json.load(f)


def counts_after(path, node, since_ns):
    """This node's counts as of a moment after `since_ns` (time.time_ns()).

    The proxy takes its counts just before it writes the file, so a file written after
    `since_ns` could still hold counts taken a moment before. The second write after
    `since_ns` cannot: its counts were taken after the first write ended."""
    deadline = time.monotonic() + COUNTS_WAIT_S
    seen = None
    writes_after = 0
    while True:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_mtime_ns > since_ns and st.st_mtime_ns != seen:
            seen = st.st_mtime_ns
            writes_after += 1
            if writes_after >= 2:
                doc = _read_counts(path)
                # A write may have landed between stat and read: its counts are later still.
                for n in doc["nodes"]:
                    if n["node"] == node:
                        return doc, n
                sys.exit(f"{path}: the proxy has no node {node}")
        if time.monotonic() > deadline:
            sys.exit(
                f"{path}: not rewritten twice within {COUNTS_WAIT_S} s; is the proxy running "
                "with --counts-json and a --counts-every-ms above 0?"
            )
        time.sleep(0.01)


def counts_delta(a, b):
    return {
        "bytes_down": b["down_bytes"] - a["down_bytes"],
        "bytes_up": b["up_bytes"] - a["up_bytes"],
        "requests": b["requests"] - a["requests"],
        "connections": b["connections"] - a["connections"],
    }


# --------------------------------------------------------------------------------------
# Work per sample: raw bytes and label, or a JPEG decode too
# --------------------------------------------------------------------------------------


def decode_jpeg(data):
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img = img.convert("RGB")
    return np.asarray(img)


def collate(samples, decode):
    """A batch as (list of images, labels): raw bytes, or HWC uint8 arrays with `decode`."""
    images = [s[0] for s in samples]
    if decode:
        images = [torch.from_numpy(decode_jpeg(b)) for b in images]
    labels = torch.tensor([s[1] for s in samples], dtype=torch.int64)
    return images, labels


def batch_size_bytes(images):
    return sum(len(b) if isinstance(b, (bytes, bytearray)) else b.numel() for b in images)


def run_epochs(loader, epochs, counts_json, node, on_epoch_start=None):
    """Iterates `loader` for `epochs` passes; per epoch its samples, time and proxy counts."""
    _, base = counts_after(counts_json, node, time.time_ns())
    out = []
    for e in range(epochs):
        if on_epoch_start is not None:
            on_epoch_start(e)
        samples = 0
        payload_bytes = 0
        t0 = time.perf_counter()
        for images, labels in loader:
            samples += len(labels)
            payload_bytes += batch_size_bytes(images)
        secs = time.perf_counter() - t0
        _, now = counts_after(counts_json, node, time.time_ns())
        d = counts_delta(base, now)
        base = now
        out.append(
            {
                "epoch": e,
                "samples": samples,
                "seconds": secs,
                "samples_per_s": samples / secs if secs > 0 else None,
                "payload_bytes": payload_bytes,
                **d,
            }
        )
        print(
            f"epoch {e}: {samples} samples in {secs:.2f} s = {samples / secs:.1f}/s, "
            f"{d['bytes_down'] / 2**20:.1f} MiB down, {d['requests']} requests",
            file=sys.stderr,
            flush=True,
        )
    return out


def steady(epochs):
    """The steady figures: epochs after the first (the first fills the cache, if any)."""
    rest = epochs[1:]
    if not rest:
        return None
    secs = sum(e["seconds"] for e in rest)
    return {
        "epochs": [e["epoch"] for e in rest],
        "samples_per_s": sum(e["samples"] for e in rest) / secs,
        "bytes_down_per_epoch": statistics.median(e["bytes_down"] for e in rest),
        "requests_per_epoch": statistics.median(e["requests"] for e in rest),
    }


def write_report(path, report):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def base_report(args, peer, variant):
    return {
        "peer": peer,
        "variant": variant,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable] + sys.argv,
        "versions": versions(),
        "machine": machine(),
    }


def proxy_info(counts_json):
    doc = _read_counts(counts_json)
    return {
        "latency_ms": doc["latency_ms"],
        "node_bytes_per_s": doc["node_bytes_per_s"],
        "delay_accept": doc["delay_accept"],
    }


# --------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def same_digest(client, bucket, key, digest):
    return client.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get("sha256") == digest


def upload_dir(client, bucket, local_root, prefix, files, last=()):
    """Uploads `files` (paths relative to local_root) under prefix, skipping objects already
    there with the same size and sha256 (kept in the object's metadata), then deletes other objects under prefix. `last` go last (an
    index, so a reader never sees it before its shards)."""
    have = list_objects(client, bucket, prefix)
    want = {}
    order = [f for f in files if f not in last] + [f for f in files if f in last]
    uploaded = skipped = 0
    for rel in order:
        path = os.path.join(local_root, rel)
        key = prefix + rel
        size = os.path.getsize(path)
        want[key] = size
        digest = sha256_file(path)
        if have.get(key) == size and same_digest(client, bucket, key, digest):
            skipped += 1
            continue
        client.upload_file(path, bucket, key, ExtraArgs={"Metadata": {"sha256": digest}})
        uploaded += 1
    stale = [k for k in have if k not in want]
    for i in range(0, len(stale), 1000):
        client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in stale[i : i + 1000]]}
        )
    print(
        f"{prefix}: {len(want)} objects, {sum(want.values())} bytes "
        f"({uploaded} uploaded, {skipped} already there, {len(stale)} stale deleted)"
    )
    return sum(want.values()), len(want)


def write_mds(data, files, out, shard_bytes):
    from streaming import MDSWriter

    if os.path.exists(out):
        shutil.rmtree(out)
    with MDSWriter(
        out=out,
        columns={"image": "bytes", "label": "int"},
        compression=None,
        size_limit=shard_bytes,
    ) as w:
        for rel, label in files:
            with open(os.path.join(data, rel), "rb") as f:
                w.write({"image": f.read(), "label": label})
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    return [s["raw_data"]["basename"] for s in index["shards"]], index


def cmd_prepare(args):
    set_credentials(args)
    client = s3_client(args.endpoint)
    try:
        client.head_bucket(Bucket=args.bucket)
    except client.exceptions.ClientError:
        client.create_bucket(Bucket=args.bucket)
    classes, files = list_images(args.data)
    print(f"{args.data}: {len(files)} images in {len(classes)} classes")
    upload_dir(client, args.bucket, args.data, FOLDER_PREFIX, [f for f, _ in files])
    work = tempfile.mkdtemp(prefix="peers-mds-", dir=os.environ.get("TMPDIR"))
    try:
        shard_names, index = write_mds(args.data, files, os.path.join(work, "mds"), args.shard_bytes)
        mds_bytes, _ = upload_dir(
            client,
            args.bucket,
            os.path.join(work, "mds"),
            MDS_PREFIX,
            shard_names + ["index.json"],
            last=("index.json",),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.tar_shards is not None:
        tars = sorted(f for f in os.listdir(args.tar_shards) if f.endswith(".tar"))
        upload_dir(client, args.bucket, args.tar_shards, SHARDS_PREFIX, tars)
    largest = max(s["raw_data"]["bytes"] for s in index["shards"])
    samples = sum(s["samples"] for s in index["shards"])
    print(
        f"mds: {len(shard_names)} shards, {samples} samples, largest shard {largest} bytes; "
        f"Streaming needs cache_limit >= 4 x {largest} = {4 * largest} bytes "
        f"({100.0 * 4 * largest / mds_bytes:.1f}% of the shards' bytes)"
    )
    if samples != len(files):
        sys.exit(f"mds holds {samples} samples, the folder {len(files)}")


# --------------------------------------------------------------------------------------
# streaming (MosaicML Streaming over MDS)
# --------------------------------------------------------------------------------------


def mds_index(endpoint, bucket):
    client = s3_client(endpoint)
    body = client.get_object(Bucket=bucket, Key=MDS_PREFIX + "index.json")["Body"].read()
    return json.loads(body)


def parse_cache_limit(text, dataset_bytes):
    if text.lower() == "none":
        return None
    if text.endswith("%"):
        return int(dataset_bytes * float(text[:-1]) / 100.0)
    return int(text)


class _StreamingSamples:
    """Maps Streaming's sample dicts to (bytes, label) inside the DataLoader's workers."""

    def __init__(self, decode):
        self.decode = decode

    def __call__(self, samples):
        return collate([(s["image"], int(s["label"])) for s in samples], self.decode)


def cmd_streaming(args):
    set_credentials(args)
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    # Streaming's boto3 client takes S3_ENDPOINT_URL; keep AWS_ENDPOINT_URL from pointing
    # the same process's other clients elsewhere.
    os.environ.pop("AWS_ENDPOINT_URL", None)
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    index = mds_index(args.endpoint, args.bucket)
    dataset_bytes = sum(s["raw_data"]["bytes"] for s in index["shards"])
    dataset_samples = sum(s["samples"] for s in index["shards"])
    cache_limit = parse_cache_limit(args.cache_limit, dataset_bytes)
    predownload = args.predownload
    if args.nodes != 1 or args.rank != 0:
        # Streaming reads its place in the job from these; one process per emulated node.
        os.environ.update(
            WORLD_SIZE=str(args.nodes), RANK=str(args.rank), LOCAL_WORLD_SIZE="1", LOCAL_RANK="0"
        )
    clean_stale_shared_memory()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    local = tempfile.mkdtemp(prefix="peers-streaming-", dir=os.environ.get("TMPDIR"))
    report = base_report(args, "mosaicml-streaming", "mds")
    try:
        _, before = counts_after(args.counts_json, args.rank, time.time_ns())
        t0 = time.perf_counter()
        ds = StreamingDataset(
            remote=f"s3://{args.bucket}/{MDS_PREFIX.rstrip('/')}",
            local=local,
            cache_limit=cache_limit,
            predownload=predownload,
            num_canonical_nodes=args.nodes,
            shuffle=True,
            shuffle_algo=args.shuffle_algo,
            shuffle_seed=args.seed,
            shuffle_block_size=args.shuffle_block_size,
            batch_size=args.batch,
            download_retry=2,
        )
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=args.batch,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            prefetch_factor=args.prefetch if args.workers > 0 else None,
            collate_fn=_StreamingSamples(args.decode),
        )
        setup_s = time.perf_counter() - t0
        _, after = counts_after(args.counts_json, args.rank, time.time_ns())
        epochs = run_epochs(loader, args.epochs, args.counts_json, args.rank)
        del loader
    finally:
        shutil.rmtree(local, ignore_errors=True)
    report.update(
        settings={
            "endpoint": args.endpoint,
            "bucket": args.bucket,
            "remote": f"s3://{args.bucket}/{MDS_PREFIX.rstrip('/')}",
            "cache_limit_bytes": cache_limit,
            "cache_limit_arg": args.cache_limit,
            "predownload": predownload,
            "predownload_effective": ds.predownload,
            "num_canonical_nodes": args.nodes,
            "rank": args.rank,
            "shuffle_algo": ds.shuffle_algo,
            "shuffle_block_size": ds.shuffle_block_size,
            "shuffle_seed": args.seed,
            "batch": args.batch,
            "workers": args.workers,
            "prefetch_factor": args.prefetch,
            "decode": args.decode,
        },
        dataset={
            "samples": dataset_samples,
            "shards": len(index["shards"]),
            "bytes": dataset_bytes,
            "largest_shard_bytes": max(s["raw_data"]["bytes"] for s in index["shards"]),
        },
        proxy=proxy_info(args.counts_json),
        setup={"seconds": setup_s, **counts_delta(before, after)},
        epochs=epochs,
        steady=steady(epochs),
    )
    write_report(args.out, report)
    print(json.dumps(report["steady"]))


# --------------------------------------------------------------------------------------
# s3torch (s3torchconnector: one object per sample, or tar shards streamed)
# --------------------------------------------------------------------------------------


class _ObjectSample:
    """S3MapDataset's transform: the object's bytes and the label of its class folder."""

    def __init__(self, class_index):
        self.class_index = class_index

    def __call__(self, reader):
        data = reader.read()
        cls = reader.key[len(FOLDER_PREFIX) :].split("/", 1)[0]
        return data, self.class_index[cls]


def _identity(reader):
    return reader


def _tar_samples(reader):
    """(bytes, label) per sample of one streamed tar shard (`<id>.<ext>` then `<id>.cls`)."""
    pending = {}
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            stem, _, ext = member.name.rpartition(".")
            data = tar.extractfile(member).read()
            entry = pending.setdefault(stem, {})
            if ext == "cls":
                entry["label"] = int(data.decode().strip())
            else:
                entry["image"] = data
            if "label" in entry and "image" in entry:
                del pending[stem]
                yield entry["image"], entry["label"]
    if pending:
        raise ValueError(f"{reader.key}: samples without both image and label: {sorted(pending)[:5]}")


class _TarShards(torch.utils.data.IterableDataset):
    """Samples over s3torchconnector's S3IterableDataset of shards (which splits the shards
    over ranks, then over DataLoader workers)."""

    def __init__(self, shards):
        self.shards = shards

    def __iter__(self):
        for reader in self.shards:
            yield from _tar_samples(reader)


def cmd_s3torch(args):
    set_credentials(args)
    from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset

    if args.variant == "tar" and args.nodes != 1:
        # S3IterableDataset shards by torch.distributed's rank, which this process has not.
        sys.exit("--variant tar: only --nodes 1 (sharding over ranks needs torch.distributed)")
    client = s3_client(args.endpoint)
    if args.variant == "map":
        objects = list_objects(client, args.bucket, FOLDER_PREFIX)
        objects = {k: v for k, v in objects.items() if k.lower().endswith(IMG_EXT)}
        classes = sorted({k[len(FOLDER_PREFIX) :].split("/", 1)[0] for k in objects})
        prefix = FOLDER_PREFIX
    else:
        objects = list_objects(client, args.bucket, SHARDS_PREFIX)
        objects = {k: v for k, v in objects.items() if k.endswith(".tar")}
        classes = None
        prefix = SHARDS_PREFIX
    if not objects:
        sys.exit(f"s3://{args.bucket}/{prefix}: no objects (run prepare, or upload the shards)")
    config = S3ClientConfig(force_path_style=True, max_attempts=10)
    report = base_report(args, "s3torchconnector", args.variant)
    _, before = counts_after(args.counts_json, args.rank, time.time_ns())
    t0 = time.perf_counter()
    sampler = None
    if args.variant == "map":
        # The object list as listed above: from_prefix's own listing sends `delimiter=`
        # empty, which s3s-fs (the benchmark's server) takes as a delimiter and answers
        # with one common prefix and no objects; AWS takes it as none.
        ds = S3MapDataset.from_objects(
            [f"s3://{args.bucket}/{k}" for k in sorted(objects)],
            region=args.region,
            endpoint=args.endpoint,
            transform=_ObjectSample({c: i for i, c in enumerate(classes)}),
            s3client_config=config,
        )
        n = len(ds)
        sampler = torch.utils.data.DistributedSampler(
            ds, num_replicas=args.nodes, rank=args.rank, shuffle=True, seed=args.seed
        )
        dataset_samples = n
    else:
        shards = S3IterableDataset.from_prefix(
            f"s3://{args.bucket}/{prefix}",
            region=args.region,
            endpoint=args.endpoint,
            transform=_identity,
            s3client_config=config,
            enable_sharding=True,
        )
        ds = _TarShards(shards)
        dataset_samples = None  # known only after a pass
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=args.batch,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        prefetch_factor=args.prefetch if args.workers > 0 else None,
        collate_fn=functools.partial(collate, decode=args.decode),
    )
    setup_s = time.perf_counter() - t0
    _, after = counts_after(args.counts_json, args.rank, time.time_ns())
    epochs = run_epochs(
        loader,
        args.epochs,
        args.counts_json,
        args.rank,
        on_epoch_start=sampler.set_epoch if sampler is not None else None,
    )
    if dataset_samples is None:
        dataset_samples = epochs[0]["samples"] if args.nodes == 1 else None
    report.update(
        settings={
            "endpoint": args.endpoint,
            "bucket": args.bucket,
            "prefix": prefix,
            "region": args.region,
            "force_path_style": True,
            "max_attempts": 10,
            "sampler": (
                f"DistributedSampler(num_replicas={args.nodes}, rank={args.rank}, "
                f"shuffle=True, seed={args.seed})"
                if sampler is not None
                else "none: S3IterableDataset(enable_sharding=True), shard-sequential"
            ),
            "nodes": args.nodes,
            "rank": args.rank,
            "batch": args.batch,
            "workers": args.workers,
            "prefetch_factor": args.prefetch,
            "decode": args.decode,
        },
        dataset={
            "samples": dataset_samples,
            "objects": len(objects),
            "bytes": sum(objects.values()),
            "classes": len(classes) if classes is not None else None,
        },
        proxy=proxy_info(args.counts_json),
        setup={"seconds": setup_s, **counts_delta(before, after)},
        epochs=epochs,
        steady=steady(epochs),
    )
    write_report(args.out, report)
    print(json.dumps(report["steady"]))


# --------------------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------------------


def ints(text):
    return [int(x) for x in text.split(",") if x]


def stop_group(child):
    """SIGTERM to the run's process group (the run cleans its temp dir), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 20.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _exit_on_sigterm(signum, frame):
    # Unwinds through `finally`, so a stopped run removes its temp dir.
    sys.exit(128 + signum)


def run_job(cmd, endpoints, out, timeout_s):
    """One run of `cmd`: one process, or with `endpoints` one process per node (node i
    through endpoint i, all at once), merged into one run; None if it took over
    `timeout_s`."""
    if not endpoints:
        cmds = [cmd + ["--out", out]]
    else:
        n = len(endpoints)
        # Each node its own /dev/shm, as separate machines have: Streaming names its shared
        # memory per host, so nodes sharing one would take each other's (root only).
        own_shm = [
            "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount -t tmpfs -o size=8g tmpfs /dev/shm && exec "$@"', "sh",
        ]
        cmds = [
            own_shm
            + cmd
            + ["--endpoint", e, "--nodes", str(n), "--rank", str(i), "--out", f"{out}.{i}"]
            for i, e in enumerate(endpoints)
        ]
    # The nodes of one run meet at one torch.distributed rendezvous (Streaming's barriers).
    env = dict(os.environ)
    if endpoints:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    # A session of its own per process, so that a run over time goes with its workers.
    children = []
    for c in cmds:
        children.append(subprocess.Popen(c, start_new_session=True, env=env))
        # Streaming claims its shared memory prefix at start-up: one node at a time.
        time.sleep(1.0 if len(cmds) > 1 else 0.0)
    deadline = time.monotonic() + timeout_s
    try:
        for c, child in zip(cmds, children):
            rc = child.wait(timeout=max(0.0, deadline - time.monotonic()))
            if rc != 0:
                for other in children:
                    stop_group(other)
                return {"failed": f"{' '.join(c)} exited with {rc}"}
    except (KeyboardInterrupt, subprocess.TimeoutExpired) as e:
        # The runs have sessions of their own: Ctrl-C does not reach them. A setting that
        # thrashes (Streaming's cache below its working set downloads shards again and
        # again) is reported, not waited for.
        for child in children:
            stop_group(child)
        if isinstance(e, KeyboardInterrupt):
            raise
        return None
    if not endpoints:
        with open(out) as f:
            return json.load(f)
    nodes = []
    for i in range(len(endpoints)):
        with open(f"{out}.{i}") as f:
            nodes.append(json.load(f))
    return merge_nodes(nodes)


def merge_nodes(nodes):
    """A job's run from its nodes' runs: per epoch, the samples, bytes and requests summed
    over the nodes, and the job's time the slowest node's (the nodes are not in lock-step,
    so this is never slower than a job whose steps wait for every node)."""
    epochs = []
    for per_node in zip(*(n["epochs"] for n in nodes)):
        samples = sum(e["samples"] for e in per_node)
        secs = max(e["seconds"] for e in per_node)
        merged = {"epoch": per_node[0]["epoch"], "samples": samples, "seconds": secs}
        merged["samples_per_s"] = samples / secs if secs > 0 else None
        for key in ("payload_bytes", "bytes_down", "bytes_up", "requests", "connections"):
            merged[key] = sum(e[key] for e in per_node)
        epochs.append(merged)
    run = {k: v for k, v in nodes[0].items() if k not in ("epochs", "steady", "setup")}
    run.update(
        nodes=nodes,
        job_nodes=len(nodes),
        setup={"seconds": max(n["setup"]["seconds"] for n in nodes)},
        epochs=epochs,
        steady=steady(epochs),
    )
    return run


def cmd_sweep(args, passthrough):
    """Runs the peer once per grid point and run, each in a fresh process; medians of runs."""
    grid = [{"workers": w, "prefetch": p} for w in args.grid_workers for p in args.grid_prefetch]
    if args.peer == "streaming":
        pre = args.grid_predownload or [None]
        grid = [dict(g, predownload=k) for g in grid for k in pre]
        blocks = args.grid_shuffle_block_size or [None]
        grid = [dict(g, shuffle_block_size=b) for g in grid for b in blocks]
    work = tempfile.mkdtemp(prefix="peers-sweep-", dir=os.environ.get("TMPDIR"))
    points = []
    try:
        for g in grid:
            runs, failed = [], []
            attempt = 0
            # A run that fails (the peer crashed) is reported and run again, up to
            # --retries more times in all: the setting is ranked on --runs runs that ended.
            while len(runs) < args.runs and len(failed) <= args.retries:
                out = os.path.join(work, f"run-{len(points)}-{attempt}.json")
                attempt += 1
                cmd = [sys.executable, os.path.abspath(__file__), args.peer] + passthrough
                cmd += ["--workers", str(g["workers"]), "--prefetch", str(g["prefetch"])]
                for key in ("predownload", "shuffle_block_size"):
                    if g.get(key) is not None:
                        cmd += ["--" + key.replace("_", "-"), str(g[key])]
                print(f"sweep: {g} run {len(runs) + 1}/{args.runs}", file=sys.stderr, flush=True)
                run = run_job(cmd, args.endpoints, out, args.run_timeout_s)
                if run is None:
                    print(f"sweep: {g} over {args.run_timeout_s} s, skipped", file=sys.stderr)
                    break
                if "failed" in run:
                    print(f"sweep: {g} failed: {run['failed']}", file=sys.stderr)
                    failed.append(run["failed"])
                    continue
                runs.append(run)
            if len(runs) < args.runs:
                why = {"failed_runs": failed} if len(failed) > args.retries else {
                    "timed_out_after_s": args.run_timeout_s}
                points.append({"grid": g, **why, "runs": runs})
                continue
            st = [run["steady"] for run in runs]
            if any(s is None for s in st):
                sys.exit("sweep: --epochs must be at least 2 (the steady figures skip the first)")
            points.append(
                {
                    "grid": g,
                    "median_steady_samples_per_s": statistics.median(s["samples_per_s"] for s in st),
                    "median_steady_bytes_down_per_epoch": statistics.median(
                        s["bytes_down_per_epoch"] for s in st
                    ),
                    "median_steady_requests_per_epoch": statistics.median(
                        s["requests_per_epoch"] for s in st
                    ),
                    "median_first_epoch_samples_per_s": statistics.median(
                        run["epochs"][0]["samples_per_s"] for run in runs
                    ),
                    "runs": runs,
                    "failed_runs": failed,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = [p for p in points if "median_steady_samples_per_s" in p]
    if not done:
        sys.exit("sweep: every setting timed out or failed")
    best = max(done, key=lambda p: p["median_steady_samples_per_s"])
    report = {
        "peer": {"streaming": "mosaicml-streaming", "s3torch": "s3torchconnector"}[args.peer],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable] + sys.argv,
        "runs_per_setting": args.runs,
        "steady": "epochs after the first; per run, samples over seconds of those epochs and "
        "the median of their bytes and requests; per setting, the median of the runs",
        "best": {k: v for k, v in best.items() if k != "runs"},
        "settings": points,
    }
    write_report(args.out, report)
    print(json.dumps(report["best"], indent=2))


def _setting_text(settings):
    keys = (
        "cache_limit_bytes",
        "workers",
        "prefetch_factor",
        "predownload_effective",
        "shuffle_block_size",
        "decode",
    )
    return ", ".join(f"{k}={settings[k]}" for k in keys if settings.get(k) not in (None, False))


def cmd_table(args):
    """A Markdown table of run and sweep JSONs: one row per run, or per sweep setting."""
    mib = 1 << 20
    print(
        "| peer | variant | setting | runs | first epoch samples/s | steady samples/s "
        "| steady MiB/epoch | steady requests/epoch |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        if "settings" in doc and isinstance(doc["settings"], list):
            for point in doc["settings"]:
                first = point["runs"][0] if point["runs"] else None
                mark = " (best)" if point["grid"] == doc["best"]["grid"] else ""
                if "median_steady_samples_per_s" not in point:
                    print(
                        f"| {doc['peer']} | {first['variant'] if first else ''} | "
                        f"{point['grid']}{mark} | "
                        + (
                            f"timed out after {point['timed_out_after_s']} s "
                            if "timed_out_after_s" in point
                            else f"failed {len(point['failed_runs'])} times "
                        )
                        + "| | | | |"
                    )
                    continue
                print(
                    f"| {doc['peer']} | {first['variant']} | {_setting_text(first['settings'])}"
                    f"{mark} | median of {len(point['runs'])}"
                    + (f" ({len(point['failed_runs'])} failed)" if point.get("failed_runs") else "")
                    + " "
                    f"| {point['median_first_epoch_samples_per_s']:.1f} "
                    f"| {point['median_steady_samples_per_s']:.1f} "
                    f"| {point['median_steady_bytes_down_per_epoch'] / mib:.1f} "
                    f"| {point['median_steady_requests_per_epoch']:.0f} |"
                )
        else:
            st = doc["steady"]
            print(
                f"| {doc['peer']} | {doc['variant']} | {_setting_text(doc['settings'])} | 1 "
                f"| {doc['epochs'][0]['samples_per_s']:.1f} | {st['samples_per_s']:.1f} "
                f"| {st['bytes_down_per_epoch'] / mib:.1f} | {st['requests_per_epoch']:.0f} |"
            )


# --------------------------------------------------------------------------------------


def add_common(p, peer):
    p.add_argument("--endpoint", required=True, help="the S3 endpoint (the proxy's node port)")
    p.add_argument("--bucket", required=True)
    p.add_argument("--region", default=DEFAULT_REGION)
    p.add_argument("--access-key", default=None, help="else AWS_ACCESS_KEY_ID")
    p.add_argument("--secret-key", default=None, help="else AWS_SECRET_ACCESS_KEY")
    if peer is None:
        return
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=4, help="DataLoader prefetch_factor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--rank", type=int, default=0, help="this node; also its node in --counts-json")
    p.add_argument("--decode", action="store_true", help="decode JPEGs with Pillow in the workers")
    p.add_argument("--counts-json", required=True, help="lobster-bench s3-proxy --counts-json FILE")
    p.add_argument("--out", required=True, help="the run's JSON")
    if peer == "streaming":
        p.add_argument(
            "--cache-limit",
            required=True,
            help="bytes, PCT%% of the MDS shards' bytes, or none (no eviction)",
        )
        p.add_argument("--predownload", type=int, default=None, help="samples ahead per worker")
        p.add_argument("--shuffle-algo", default="py1e")
        p.add_argument(
            "--shuffle-block-size",
            type=int,
            default=None,
            help="samples per shuffle block (default: Streaming's, max(4e6 / nodes, 2^18))",
        )
    if peer == "s3torch":
        p.add_argument("--variant", choices=("map", "tar"), default="map")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="upload the ImageFolder and MDS shards of it")
    add_common(p, None)
    p.add_argument("--data", required=True, help="an ImageFolder (lobster gen --out DIR)")
    p.add_argument("--shard-bytes", type=int, default=64 << 20, help="MDSWriter size_limit")
    p.add_argument(
        "--tar-shards",
        default=None,
        help="also upload this folder's .tar shards (lobster pack --out DIR) under shards/",
    )
    add_common(sub.add_parser("streaming", help="MosaicML Streaming over mds/"), "streaming")
    add_common(sub.add_parser("s3torch", help="s3torchconnector over folder/ or shards/"), "s3torch")
    p = sub.add_parser(
        "sweep",
        help="a peer over a grid of settings, --runs each; the rest of the line goes to the peer",
    )
    p.add_argument("peer", choices=("streaming", "s3torch"))
    p.add_argument("--grid-workers", type=ints, default=[2, 4, 8])
    p.add_argument("--grid-prefetch", type=ints, default=[4])
    p.add_argument("--grid-predownload", type=ints, default=None, help="streaming only")
    p.add_argument("--grid-shuffle-block-size", type=ints, default=None, help="streaming only")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--retries", type=int, default=2, help="failed runs tolerated per setting (re-run)"
    )
    p.add_argument(
        "--endpoints",
        type=lambda t: [x for x in t.split(",") if x],
        default=None,
        help="one endpoint per node (the proxy's node ports): each run is a job of that many "
        "nodes, one process each, merged (sums per epoch; the slowest node's time)",
    )
    p.add_argument(
        "--run-timeout-s", type=float, default=1800.0, help="a run taking longer fails its setting"
    )
    p.add_argument("--out", required=True, help="the sweep's JSON")
    p = sub.add_parser("table", help="a Markdown table of run and sweep JSONs")
    p.add_argument("files", nargs="+")
    args, rest = ap.parse_known_args()
    if args.cmd == "sweep":
        cmd_sweep(args, rest)
        return
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    cmds = {
        "prepare": cmd_prepare,
        "streaming": cmd_streaming,
        "s3torch": cmd_s3torch,
        "table": cmd_table,
    }
    cmds[args.cmd](args)


if __name__ == "__main__":
    main()
