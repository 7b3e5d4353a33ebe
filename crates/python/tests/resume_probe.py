"""One rank of a torchrun job for test_resume.py: argv is data, out_dir, job, mode.

mode "whole": the whole run. "cut:K": after K batches (0: before the first) every rank saves
its state_dict, the ranks meet (gloo), and each kills itself with SIGKILL. "resume": loads
the saved state and runs to the end. The batches seen go to an .npz per rank."""

import json
import os
import pathlib
import signal
import sys

import numpy as np
import torch.distributed as dist

import lobster_io


def main():
    data, out, job, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    stop_after = int(mode[4:]) if mode.startswith("cut:") else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = lobster_io.Loader(
        data, 4, epochs=3, seed=5, image_size=16, transform="train",
        cache=lobster_io.Cache(frac=1.0, forms="decoded"), budgets=lobster_io.Budgets(slots=2),
    )
    start = 0
    name = f"{job}.rank{rank}.npz"
    if mode == "resume":
        state = json.loads((out / f"{job}.state{rank}.json").read_text())
        loader.load_state_dict(state)
        # Attached to the resumed host, the rank says where it stands before any batch.
        (out / f"{job}.reloaded{rank}.json").write_text(json.dumps(loader.state_dict()))
        start = state["lobster_loader_state"]["ranks"][0]["epoch"]
        name = f"{job}.resumed.rank{rank}.npz"
    seen = {"sizes": [], "epochs": [], "ids": [], "labels": [], "images": []}

    def save():
        # Batches end to end (an epoch's last may be short), with each batch's size.
        flat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in seen.items()}
        np.savez(out / name, **flat)

    def cut():
        (out / f"{job}.state{rank}.json").write_text(json.dumps(loader.state_dict()))
        save()
        dist.barrier()
        os.kill(os.getpid(), signal.SIGKILL)

    if stop_after == 0:
        cut()
    for epoch in range(start, loader.epochs):
        loader.set_epoch(epoch)
        for b in loader:
            seen["sizes"].append([len(b)])
            seen["epochs"].append([b.epoch] * len(b))
            seen["ids"].append(b.ids.copy())
            seen["labels"].append(b.labels.copy())
            seen["images"].append(np.array(b.images))
            del b
            if len(seen["sizes"]) == stop_after:
                cut()
    save()
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
