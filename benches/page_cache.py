#!/usr/bin/env python3
"""Warms a dataset into the page cache, or drops it from there (no root needed).

Usage: benches/page_cache.py warm|direct DIR
warm: every file of DIR is read once. direct: every file's pages are dropped
(posix_fadvise DONTNEED), for runs that read with O_DIRECT from the device.
"""
import os
import sys

mode, root = sys.argv[1], sys.argv[2]
for d, _, files in os.walk(root):
    for f in files:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        try:
            if mode == "warm":
                while os.read(fd, 1 << 20):
                    pass
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
