"""lobster_io under an MPI launcher: a build with MPI makes each process of `mpirun` a node
that fetches from its peers' caches; any build under a launcher of several processes that
cannot join MPI says once that it runs without peers."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import lobster_io
from test_loader import make_folder

# Variables a launcher sets; a test's subprocess starts without any of them.
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "LOBSTER_")
LAUNCHER_NAMES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

TWO_LOADERS = textwrap.dedent("""
    import json, sys, warnings
    import lobster_io
    with warnings.catch_warnings(record=True) as caught:
        # "always": Python's own once-per-place filter must not hide a second warning.
        warnings.simplefilter("always")
        for _ in range(2):
            loader = lobster_io.Loader(sys.argv[1], 4, image_size=8)
            assert not loader.peers
            assert sum(len(b) for b in loader) == 12
            loader.close()
    print(json.dumps([[w.category.__name__, str(w.message)] for w in caught]))
""")


def clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}
    env.update(extra)
    return env


def warnings_with(tmp_path, extra):
    data = tmp_path / "data"
    if not data.exists():
        make_folder(data, 12, 2)
    out = subprocess.run([sys.executable, "-c", TWO_LOADERS, str(data)], env=clean_env(extra),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# Launchers of two processes lobster_io cannot join: any of them without MPI, and srun
# without PMI with it (a build with MPI would join the others).
WITHOUT_MPI = [
    pytest.param({"OMPI_COMM_WORLD_SIZE": "2"}, "mpirun", id="mpirun"),
    pytest.param({"PMI_SIZE": "2"}, "PMI", id="pmi"),
    pytest.param({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "srun", id="srun"),
]


@pytest.mark.parametrize("launcher,name", WITHOUT_MPI)
def test_a_launcher_without_mpi_is_said_once_per_process(tmp_path, launcher, name):
    if lobster_io.built_with_mpi() and name != "srun":
        pytest.skip("a build with MPI joins this launcher's job (test_two_nodes_over_mpirun)")
    caught = warnings_with(tmp_path, launcher)
    assert len(caught) == 1, caught
    category, message = caught[0]
    assert category == "RuntimeWarning"
    assert f"{name}" in message and "started 2 processes" in message
    assert "runs without peers (no remote cache hits" in message
    if lobster_io.built_with_mpi():
        assert "srun --mpi=pmix" in message
    else:
        assert "built without MPI" in message
        assert "--config-settings=build-args='--features mpi'" in message


@pytest.mark.parametrize("launcher", [{}, {"OMPI_COMM_WORLD_SIZE": "1"},
                                      {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}],
                         ids=["none", "mpirun-of-one", "srun-of-one"])
def test_one_process_is_not_warned(tmp_path, launcher):
    assert warnings_with(tmp_path, launcher) == []


def mpirun():
    command = shutil.which("mpirun")
    if command is None:
        return None
    args = [command, "--oversubscribe", "-np", "2"]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    return args


@pytest.mark.skipif(not lobster_io.built_with_mpi(), reason="lobster_io was built without MPI "
                    "(pip install ./crates/python --config-settings=build-args='--features mpi')")
@pytest.mark.skipif(mpirun() is None, reason="no mpirun (apt-get install openmpi-bin)")
def test_two_nodes_over_mpirun_serve_every_planned_remote_hit(tmp_path):
    n = 96
    make_folder(tmp_path / "data", n, 4)
    out = tmp_path / "out"
    out.mkdir()
    probe = os.path.join(os.path.dirname(__file__), "mpi_probe.py")
    run = subprocess.run(mpirun() + [sys.executable, probe, str(tmp_path / "data"), str(out)],
                         env=clean_env({}), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    nodes = [json.loads((out / f"node-{k}.json").read_text()) for k in range(2)]
    share = -(-n // 2)
    for k, seen in enumerate(nodes):
        assert "launch.world_size = 3" in seen["launch_error"], seen["launch_error"]
        assert "MPI job of 2 processes" in seen["launch_error"]
        assert "seed" in (seen["disagree_error"] or ""), seen["disagree_error"]
        assert "assign" in (seen["assign_error"] or ""), seen["assign_error"]
        assert len(seen["rounds"]) == 2
        for r, assign in zip(seen["rounds"], ("sampler", "locality")):
            assert (r["node"], r["nodes"], r["peers"], r["error"]) == (k, 2, True, None), r
            m = r["metrics"]
            assert m["peer_plan"]["mode"] == "cluster", m["peer_plan"]
            assert m["assign"] == {"mode": assign, "reason": None}, m["assign"]
            # Under locality, what a node holds is mostly its own to read.
            assert m["remote_hits"] > 0 or assign == "locality", m
            assert m["remote_hits"] == m["planned_remote_hits"], m
            assert m["remote_misses"] == 0 and m["skipped"] == 0, m
            assert [len(ids) for ids in r["ids"]] == [share] * 3
            assert m["samples"] == 3 * share, m
    for k, seen in enumerate(nodes):
        # Priced: the same batches; the remote hits the link prices made dearer than a
        # storage read came from storage, every one still planned remote served.
        r, plain = seen["priced"], seen["rounds"][0]
        assert r["error"] is None and r["ids"] == plain["ids"], r["error"]
        m, was = r["metrics"], plain["metrics"]
        plan = m["cluster_plan"]
        assert plan["link_prices"] == {"storage_bytes_per_s": 10**9, "net_bytes_per_s": 1000}
        assert was["cluster_plan"]["link_prices"] is None
        rerouted = sum(e["rerouted_reads"] for e in plan["epochs"])
        assert rerouted > 0, plan
        assert m["remote_hits"] == m["planned_remote_hits"] and m["remote_misses"] == 0, m
        assert m["remote_hits"] + rerouted == was["remote_hits"], (m, was)
    for k, seen in enumerate(nodes):
        # The resumed round gives the rest of the uninterrupted round's batches.
        r = seen["resumed"]
        whole = seen["rounds"][0]["ids"]
        flat = [i for epoch in whole for i in epoch]
        got = [i for b in r["taken"] + r["rest"] for i in b]
        assert got == flat, (k, len(got), len(flat))
        m = r["metrics"]
        assert m["remote_hits"] == m["planned_remote_hits"] and m["remote_misses"] == 0, m
    for rnd in range(2):
        for epoch in range(3):
            ids = [set(seen["rounds"][rnd]["ids"][epoch]) for seen in nodes]
            # The nodes split each epoch between them: together every sample.
            assert ids[0] | ids[1] == set(range(n))
    # Locality changes which node takes which of a step's samples, not the step's samples.
    for epoch in range(3):
        steps = [[sorted(nodes[0]["rounds"][rnd]["batches"][epoch][i]
                         + nodes[1]["rounds"][rnd]["batches"][epoch][i])
                  for i in range(len(nodes[0]["rounds"][rnd]["batches"][epoch]))]
                 for rnd in range(2)]
        assert steps[0] == steps[1], epoch
    local = [sum(seen["rounds"][rnd]["metrics"]["hits"] for seen in nodes) for rnd in range(2)]
    assert local[1] > local[0], local
