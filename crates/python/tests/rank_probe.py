"""One rank of a test job: iterates a lobster_io Loader placed by the LOBSTER_* variables
and writes what it saw (ids and labels per epoch, buffer addresses, the arena, resident
memory) as JSON to the path in argv[2]."""

import json
import os
import sys

import lobster_io


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    data, out, batch_size, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # Under torchrun every rank is given the same arguments: `{rank}` in the path tells them apart.
    out = out.replace("{rank}", os.environ.get("RANK", "0"))
    try:
        seen = iterate(data, batch_size, epochs)
    except lobster_io.Error as e:
        seen = {"error_class": type(e).__name__, "error": str(e)}
    with open(out, "w") as f:
        json.dump(seen, f)


def iterate(data, batch_size, epochs):
    loader = lobster_io.Loader(data, batch_size, epochs=epochs, seed=11, image_size=16,
                               budgets=lobster_io.Budgets(slots=2))
    seen = {"rank": loader.rank, "arena": loader.arena, "epochs": [], "addresses": [],
            "outside": 0, "batches": 0}
    settled = None
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ids, labels = [], []
        for batch in loader:
            images = batch.images
            assert images.shape == (len(batch), 16, 16, 3), images.shape
            start, size = loader.arena
            if not start <= batch.buffer_address < start + size:
                seen["outside"] += 1
            seen["addresses"].append(batch.buffer_address)
            ids.extend(batch.ids.tolist())
            labels.extend(batch.labels.tolist())
            seen["batches"] += 1
            if seen["batches"] == 20:
                settled = rss_bytes()
            del images, batch
        seen["epochs"].append({"ids": ids, "labels": labels})
    seen["grown_bytes"] = rss_bytes() - settled if settled is not None else None
    loader.close()
    return seen


if __name__ == "__main__":
    main()
