"""Reference DLIO custom data loader: plain numpy, one thread, DLIO's own sample order.

It shows the plug-in interface of dlio-benchmark 2.0.0 (see NOTES.md) and is a baseline that
really decodes every sample (DLIO's PyTorch loader reads each file but yields a constant
dummy image). Use it with sampler `index`:

    PYTHONPATH=benches/dlio ... dlio_benchmark workload=unet3d_a100 \
        ++workload.reader.data_loader_classname=numpy_loader.NumpyLoader \
        ++workload.reader.data_loader_sampler=index ...
"""
import logging

import numpy as np

from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType, Shuffle
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader


class NumpyLoader(BaseDataLoader):
    """Built twice per rank (TRAIN and VALID), once per run; next() is called once per epoch."""

    def __init__(self, format_type, dataset_type, epoch):
        super().__init__(format_type, dataset_type, epoch, DataLoaderType.CUSTOM)
        self._indices = None
        self._epochs_started = 0

    def read(self):
        # Called once, before the first epoch (main.py: run()). This rank's samples: a
        # contiguous block of global indices -> (absolute path, index inside the file).
        train = self.dataset_type is DatasetType.TRAIN
        index_map = self._args.train_global_index_map if train else self._args.val_global_index_map
        self._map = index_map
        self._indices = sorted(index_map)

    def next(self):
        # The training loop abandons this generator after max_steps batches (main.py: _train
        # breaks), so anything placed after the loop below may never run: count epochs here.
        self._epochs_started += 1
        a = self._args
        # Same order as DLIO's dlio_sampler (torch_data_loader.py): reseed with the fixed
        # seed for Shuffle.SEED, then shuffle the rank's block in place, every epoch.
        if a.sample_shuffle != Shuffle.OFF:
            if a.sample_shuffle == Shuffle.SEED:
                np.random.seed(a.seed)
            np.random.shuffle(self._indices)
        logging.debug(f"NumpyLoader rank {a.my_rank} epoch {self._epochs_started}: "
                      f"{len(self._indices)} samples, batch {self.batch_size}")
        batch = []
        for g in self._indices:
            path, sample = self._map[g]
            with np.load(path) as z:
                batch.append(z["x"][..., sample])
            if len(batch) == self.batch_size:  # drop_last, like DLIO's torch loader
                same = all(b.shape == batch[0].shape for b in batch)
                yield np.stack(batch) if same else batch
                batch = []

    def finalize(self):
        pass
