"""lobster_io: load balance-aware sample loading for distributed DNN training.

``Loader`` yields batches whose ``images`` are one uint8 array ``[B, H, W, 3]`` (or
``[B, 3, H, W]`` with ``channels_first=True``) over the loader's own buffer, handed over
without a copy: the batch returns its buffer when it and every view of it are gone. Use
``torch.from_numpy(batch.images)`` for a tensor over the same memory.

Errors are ``lobster_io.Error`` and its subclasses, naming the sample, its file and the
cause; nonsense parameters are ``ValueError`` naming the parameter.

``Loader`` takes the job's settings as keywords and the rest in three groups, as the Rust
crate's ``LoaderConfig`` groups them by stage: ``cache=Cache(...)`` (what the node's cache
keeps), ``budgets=Budgets(...)`` (what the node's ranks share), ``launch=Launch(...)``
(where this process stands, when no launcher's variables say) and ``limits=Limits(...)``
(what one sample may cost).

A package built with MPI (``built_with_mpi()``; ``pip install ./crates/python
--config-settings=build-args='--features mpi'``) makes each process under ``mpirun`` (or
``srun --mpi=pmix``) a node that fetches planned misses from its peers' caches.
"""

import atexit
import os
from dataclasses import dataclass
from typing import Optional, Union

from ._lobster_io import (
    _close_at_exit,
    Batch,
    DatasetError,
    DecodeError,
    Error,
    Loader,
    NodeError,
    ReadError,
    StateError,
    StoppedError,
    TooManyFailures,
    built_with_mpi,
    decode_array,
    decode_image,
    decode_npz,
)

# Loaders left open are closed before Python finalises: their feeder threads must not be
# inside a decode callable (or waiting for the GIL to call one) when the interpreter goes.
atexit.register(_close_at_exit)


@dataclass(frozen=True)
class Cache:
    """The node's cache: ``bytes`` of it (else ``frac`` of the dataset's bytes) under
    ``policy`` ("reuse": evict the sample needed farthest ahead, Lobster's policy; "static":
    pin the most accessed samples, NoPFS's; "lru"; "none"; "lobster" and "nopfs" are taken as
    older spellings of "reuse" and "static").
    ``forms`` is what the lobster cache keeps of an image: "encoded" bytes, "decoded" pixels
    (a hit skips the decode; about 3 to 10 times the bytes) or "auto" (either, per image, by
    the cost model; ``None``: auto for "train" and "eval", encoded otherwise). With the
    default ``Loader(decoding="whole")`` batches are the same bit for bit whatever it
    keeps; with ``decoding="region"``, within the region decode's tolerance, and the same
    every run. ``decoded_max_side`` (lossy, off by default) brings the images it keeps down
    to that many pixels a side, decoded at the coarsest DCT scale that reaches it.

    ``storage_bytes_per_s`` and ``net_bytes_per_s`` (both or neither; ``None``: unpriced)
    are a node's storage and interconnect bandwidths, the same on every node of an MPI job.
    Where the nodes' caches are planned as one, the plan then reads a remote hit from
    storage when the interconnect is the dearer link; the caches are unchanged. Configured,
    never timed, so that every node plans the same job.

    ``disk`` (a directory, made if missing and locked while the loader runs) and
    ``disk_bytes`` (both or neither; ``None``: memory only) add a local disk cache below the
    memory cache, planned with it as a second level: a sample the plan keeps there is read
    from the disk instead of the dataset's storage. It keeps encoded bytes (``forms`` None
    or "encoded"), under the "reuse" or "static" policy, on one node (not with MPI peers);
    ``disk_bytes`` is at least 4096 (its files hold whole 4 KiB blocks). Its files go in a
    subdirectory named by the dataset, so a later loader of the same dataset (any seed)
    starts with what this one left there. The loader refuses a disk it cannot use when it
    starts (the first batch); ``metrics()["disk_cache"]`` says what the disk did."""

    bytes: Optional[int] = None
    frac: float = 0.2
    policy: str = "reuse"
    forms: Optional[str] = None
    decoded_max_side: Optional[int] = None
    storage_bytes_per_s: Optional[int] = None
    net_bytes_per_s: Optional[int] = None
    disk: Optional[Union[str, "os.PathLike[str]"]] = None
    disk_bytes: Optional[int] = None


@dataclass(frozen=True)
class Budgets:
    """What the node's ranks share: ``io_depth`` reads in flight and ``decode_threads``,
    balanced across its ranks every iteration; ``slots``, the batches a caller may hold at
    once while its rank keeps reading ahead (it may hold two more, the rank's read-ahead
    buffers, which then wait to come back; one past those raises ValueError); ``slot_bytes``, each batch's share of the node's shared arena with several ranks a
    node (``None``: a batch of transformed images, or of 4 Mpixel images for "none")."""

    io_depth: int = 128
    decode_threads: int = 2
    slots: int = 2
    slot_bytes: Optional[int] = None


@dataclass(frozen=True)
class Launch:
    """Where this process stands, for launchers whose variables lobster_io does not read
    (torchrun's, Open MPI's, Slurm's and ``LOBSTER_*`` are read without it): all four of
    ``rank``, ``world_size``, ``local_rank``, ``local_world_size``, or none. ``job_id`` keeps
    two jobs on one machine apart (needed with several ranks a node, unless
    ``LOBSTER_JOB_ID`` or the launcher gives one)."""

    rank: Optional[int] = None
    world_size: Optional[int] = None
    local_rank: Optional[int] = None
    local_world_size: Optional[int] = None
    job_id: Optional[str] = None


@dataclass(frozen=True)
class Limits:
    """What one sample may cost: ``image_pixels_max`` pixels a JPEG or PNG may claim in its
    header (``None``: 2**26, 8192 x 8192); a larger one fails as a bad sample (see
    ``on_error``) before it is decoded. A pixel costs 3 bytes of RGB and up to about 16 more
    while decoding."""

    image_pixels_max: Optional[int] = None


__all__ = [
    "Batch",
    "Budgets",
    "Cache",
    "DatasetError",
    "DecodeError",
    "Error",
    "Launch",
    "Limits",
    "Loader",
    "NodeError",
    "ReadError",
    "StateError",
    "StoppedError",
    "TooManyFailures",
    "built_with_mpi",
    "decode_array",
    "decode_image",
    "decode_npz",
]
