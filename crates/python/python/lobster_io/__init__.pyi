import os
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import numpy.typing as npt

class Error(Exception): ...
class ReadError(Error): ...
class DecodeError(Error): ...
class DatasetError(Error): ...
class TooManyFailures(Error): ...
class StoppedError(Error): ...
class StateError(Error): ...
class NodeError(Error): ...

class Batch:
    @property
    def images(self) -> Union[npt.NDArray[np.uint8], list[Any]]:
        """[B, H, W, 3] (or [B, 3, H, W]) uint8, a writable view of the batch's buffer;
        with transform="none" a list of [H, W, 3] views, with decode= a list of what the
        callable returned."""
    @property
    def labels(self) -> npt.NDArray[np.int64]: ...
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def iteration(self) -> int: ...
    @property
    def skipped(self) -> list[int]: ...
    @property
    def buffer_address(self) -> int: ...
    def __len__(self) -> int: ...
    def __repr__(self) -> str: ...

class Cache:
    bytes: Optional[int]
    frac: float
    policy: str
    forms: Optional[str]
    decoded_max_side: Optional[int]
    storage_bytes_per_s: Optional[int]
    net_bytes_per_s: Optional[int]
    disk: Optional[Union[str, os.PathLike[str]]]
    disk_bytes: Optional[int]
    def __init__(
        self,
        bytes: Optional[int] = None,
        frac: float = 0.2,
        policy: str = "reuse",
        forms: Optional[str] = None,
        decoded_max_side: Optional[int] = None,
        storage_bytes_per_s: Optional[int] = None,
        net_bytes_per_s: Optional[int] = None,
        disk: Optional[Union[str, os.PathLike[str]]] = None,
        disk_bytes: Optional[int] = None,
    ) -> None: ...

class Budgets:
    io_depth: int
    decode_threads: int
    slots: int
    slot_bytes: Optional[int]
    def __init__(
        self,
        io_depth: int = 128,
        decode_threads: int = 2,
        slots: int = 2,
        slot_bytes: Optional[int] = None,
    ) -> None: ...

class Launch:
    rank: Optional[int]
    world_size: Optional[int]
    local_rank: Optional[int]
    local_world_size: Optional[int]
    job_id: Optional[str]
    def __init__(
        self,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        local_rank: Optional[int] = None,
        local_world_size: Optional[int] = None,
        job_id: Optional[str] = None,
    ) -> None: ...

class Limits:
    image_pixels_max: Optional[int]
    def __init__(self, image_pixels_max: Optional[int] = None) -> None: ...

class Loader:
    def __init__(
        self,
        data: Union[str, os.PathLike[str]],
        batch_size: int,
        *,
        epochs: int = 1,
        seed: int = 0,
        drop_last: bool = False,
        transform: str = "train",
        image_size: int = 224,
        decoding: str = "whole",
        channels_first: bool = False,
        on_error: str = "fail",
        max_failures: Optional[float] = None,
        decode: Optional[Callable[[bytes], Any]] = None,
        assign: str = "sampler",
        cache: Optional[Cache] = None,
        budgets: Optional[Budgets] = None,
        launch: Optional[Launch] = None,
        limits: Optional[Limits] = None,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_world_size(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def peers(self) -> bool: ...
    def step_barrier(self) -> None: ...
    @property
    def arena(self) -> Optional[tuple[int, int]]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    def metrics(self) -> Optional[dict[str, object]]: ...
    def close(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

def built_with_mpi() -> bool: ...
def decode_image(data: bytes) -> npt.NDArray[np.uint8]:
    """Decodes a JPEG or PNG to [H, W, 3] uint8."""
def decode_array(data: bytes, bytes_max: int = ..., copy: bool = True) -> npt.NDArray[Any]:
    """Decodes one .npy file's bytes to the array np.load gives (copy=False: a read-only
    view of data)."""
def decode_npz(
    data: bytes, bytes_max: int = ..., copy: bool = True
) -> dict[str, npt.NDArray[Any]]:
    """Decodes a stored .npz archive's bytes to its arrays by name."""
