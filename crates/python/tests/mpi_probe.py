"""One node of a test MPI job (`mpirun -np N python mpi_probe.py DATA OUT`): builds two
lobster_io Loaders in turn (MPI is joined once; the second assigns each step's samples to the
nodes holding them), iterates each in lock-step with the other nodes (leaving the second open
for exit to close), then a third whose remote hits are priced against storage reads, and
writes what it saw (ids per epoch and per batch, metrics), and the errors a launch= that
disagrees with the MPI world and a seed or an assign that differs between nodes got, as JSON
to OUT/node-<node>.json."""

import json
import os
import sys
import warnings

import lobster_io

BATCH = 8
EPOCHS = 3
# Steps the resumed round's first loader takes: mid-epoch 0 (6 steps an epoch).
STOP = 4
LEFT_OPEN = []


def run_round(loader):
    """Every epoch of `loader` in lock-step with the other nodes: ids, batches, metrics."""
    node = {"node": loader.node, "nodes": loader.nodes, "peers": loader.peers,
            "len": len(loader), "ids": [], "batches": [], "error": None}
    try:
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            ids, batches = [], []
            for batch in loader:
                ids.extend(batch.ids.tolist())
                batches.append(batch.ids.tolist())
                # No DDP here: the step ends for the whole job at this barrier.
                loader.step_barrier()
            node["ids"].append(ids)
            node["batches"].append(batches)
    except lobster_io.Error as e:
        node["error"] = f"{type(e).__name__}: {e}"
    node["metrics"] = loader.metrics()
    return node


def main():
    data, out = sys.argv[1], sys.argv[2]
    settings = dict(
        epochs=EPOCHS, seed=5, image_size=16,
        # C * N^2 > F for N = 2 nodes: the job's cluster plan runs.
        cache=lobster_io.Cache(frac=0.4, forms="encoded"),
        budgets=lobster_io.Budgets(decode_threads=1, io_depth=8),
    )
    seen = {"launch_error": None, "disagree_error": None, "assign_error": None, "rounds": []}
    # Joining the MPI job is no reason to warn.
    warnings.simplefilter("error", RuntimeWarning)
    try:
        lobster_io.Loader(data, BATCH, launch=lobster_io.Launch(
            rank=int(os.environ["OMPI_COMM_WORLD_RANK"]), world_size=3, local_rank=0,
            local_world_size=1), **settings)
    except ValueError as e:
        seen["launch_error"] = str(e)
    # Nodes that would plan from different inputs are refused, every one of them.
    try:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        lobster_io.Loader(data, BATCH, **dict(settings, seed=rank))
    except lobster_io.NodeError as e:
        seen["disagree_error"] = str(e)
    try:
        lobster_io.Loader(data, BATCH, assign=("sampler", "locality")[rank], **settings)
    except lobster_io.NodeError as e:
        seen["assign_error"] = str(e)
    for assign in ("sampler", "locality"):
        loader = lobster_io.Loader(data, BATCH, assign=assign, **settings)
        seen["rounds"].append(run_round(loader))
        if len(seen["rounds"]) == 1:
            loader.close()
        else:
            # Left open: at exit lobster_io closes it, then finalises MPI (mpirun fails a
            # process that exits without MPI_Finalize).
            LEFT_OPEN.append(loader)
    # Storage priced far cheaper than the interconnect: the plan reads the remote hits from
    # storage instead.
    priced = lobster_io.Cache(frac=0.4, forms="encoded", storage_bytes_per_s=10**9,
                              net_bytes_per_s=1000)
    loader = lobster_io.Loader(data, BATCH, **dict(settings, cache=priced))
    seen["priced"] = run_round(loader)
    loader.close()
    # Stopped after STOP steps, its state saved, and resumed in a new Loader: the rest of
    # the first round's batches, the peers serving every remote hit planned.
    first = lobster_io.Loader(data, BATCH, **settings)
    taken = []
    first.set_epoch(0)
    for batch in first:
        taken.append(batch.ids.tolist())
        first.step_barrier()
        if len(taken) == STOP:
            break
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    again = lobster_io.Loader(data, BATCH, **settings)
    again.load_state_dict(state)
    rest = []
    for epoch in range(state["lobster_loader_state"]["ranks"][0]["epoch"], EPOCHS):
        again.set_epoch(epoch)
        for batch in again:
            rest.append(batch.ids.tolist())
            again.step_barrier()
    seen["resumed"] = {"taken": taken, "rest": rest, "metrics": again.metrics()}
    again.close()
    with open(os.path.join(out, f"node-{seen['rounds'][0]['node']}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
