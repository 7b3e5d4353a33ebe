"""lobster_io: load balance-aware sample loading for distributed DNN training.

``Loader`` yields batches whose ``images`` are one uint8 array ``[B, H, W, 3]`` (or
``[B, 3, H, W]`` with ``channels_first=True``) over the loader's own buffer, handed over
without a copy: the batch returns its buffer when it and every view of it are gone. Use
``torch.from_numpy(batch.images)`` for a tensor over the same memory.

Errors are ``lobster_io.Error`` and its subclasses, naming the sample, its file and the
cause; nonsense parameters are ``ValueError`` naming the parameter.
"""

from ._lobster_io import (
    Batch,
    DatasetError,
    DecodeError,
    Error,
    Loader,
    NodeError,
    ReadError,
    StoppedError,
    TooManyFailures,
    decode_image,
)

__all__ = [
    "Batch",
    "DatasetError",
    "DecodeError",
    "Error",
    "Loader",
    "NodeError",
    "ReadError",
    "StoppedError",
    "TooManyFailures",
    "decode_image",
]
