#!/usr/bin/env bash
# The cluster cache on the default main job shape (4 nodes of 4 ranks, cache 20% of the
# dataset per node) with link-bound emulated storage: nopfs (remote hits from what peers
# happen to hold), lobster-node-plan (each node's own Belady plan, remote hits replayed) and
# lobster (the nodes' caches planned as one), every node with its emulated storage link and
# interconnect; and lobster with locality-aware assignment (`--assign locality`, each step's
# samples to the nodes holding them), as `lobster+locality`; and lobster with
# `--link-prices off` (a peer serves every remote hit, however slow the interconnect), as
# `lobster+unpriced`. Each baseline runs at every
# prefetch distance in PREFETCH and is quoted at its best; lobster at the default distance. RUNS repetitions, the strategies' order reversed
# every other run. Prints medians: the job's samples/s overall and after the first (cold)
# epoch, steady-state storage reads per epoch against the floor F - N*C, and the ratios of
# lobster to each baseline's best.
#
# Usage: [RUNS=3] [MODE=cluster|mpi] [PREFETCH="2 8"] benches/cluster_job.sh [lobster run options...]
#   MODE=cluster: every node in one process (`lobster run --cluster`), the default;
#   MODE=mpi:     4 processes under mpirun (`lobster run --mpi`, needs Open MPI).
# Defaults added to the options: --decoder raw --storage-mbps 30 (link-bound storage).
set -euo pipefail
runs=${RUNS:-3}
mode=${MODE:-cluster}
prefetch=(${PREFETCH:-2 8})
cd "$(dirname "$0")/.."
case $mode in
cluster)
    cargo build --release -q -p lobster-cli
    launch=()
    job=(--cluster)
    ;;
mpi)
    cargo build --release -q -p lobster-cli --features mpi
    launch=(mpirun --oversubscribe -np 4)
    if [[ $(id -u) == 0 ]]; then launch+=(--allow-run-as-root); fi
    job=(--mpi --nodes 4)
    ;;
*)
    echo "MODE=$mode: cluster or mpi" >&2
    exit 2
    ;;
esac
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
defaults=(--decoder raw --storage-mbps 30)
for ((i = 1; i <= runs; i++)); do
    for p in "${prefetch[@]}"; do
        strategies=nopfs,lobster-node-plan,lobster
        ((i % 2)) || strategies=lobster,lobster-node-plan,nopfs
        "${launch[@]}" "$bin" run "${job[@]}" --quiet "${defaults[@]}" --prefetch "$p" \
            --strategy "$strategies" --json "$out/p$p-$i.json" "$@" >/dev/null
    done
    "${launch[@]}" "$bin" run "${job[@]}" --quiet "${defaults[@]}" --prefetch "${prefetch[0]}" \
        --strategy lobster --assign locality --json "$out/loc-$i.json" "$@" >/dev/null
    "${launch[@]}" "$bin" run "${job[@]}" --quiet "${defaults[@]}" --prefetch "${prefetch[0]}" \
        --strategy lobster --link-prices off --json "$out/unp-$i.json" "$@" >/dev/null
done
python3 - "$out" "$runs" "${prefetch[@]}" <<'PY'
import json, statistics, sys
out, runs, prefetch = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
files = [(p, f"p{p}-{i}") for p in prefetch for i in range(1, runs + 1)]
files += [(prefetch[0], f"{kind}-{i}") for kind in ("loc", "unp") for i in range(1, runs + 1)]
for p, name in files:
        d = json.load(open(f"{out}/{name}.json"))
        cfg = d["config"]
        floor = max(0, cfg["dataset_bytes"] - cfg["nodes"] * cfg["cache_bytes"])
        by = {}
        for node in d["nodes"]:
            for r in node:
                s = r["strategy"] + ("+locality" if r["assign"]["mode"] == "locality" else "")
                s += "+unpriced" if name.startswith("unp") else ""
                by.setdefault(s, []).append(r)
        for s, rs in by.items():
            samples = sum(r["samples"] for r in rs)
            slowest = max(r["samples"] / r["samples_per_second"] for r in rs)
            steady = sum(r["steady_samples_per_second"] for r in rs)
            epochs = [sum(x) for x in zip(*(r["storage_bytes_by_epoch"] for r in rs))][1:]
            storage = statistics.mean(epochs) if epochs else 0.0
            remote = sum(r["remote_hits"] for r in rs)
            planned = sum(r["planned_remote_hits"] for r in rs)
            local = sum(r["hits"] for r in rs) / sum(r["accesses"] for r in rs)
            net = sum(r["remote_hit_bytes"] for r in rs)
            rerouted = sum(e["rerouted_reads"] for r in rs
                           for e in (r.get("cluster_plan") or {}).get("epochs", []))
            rows.setdefault((s, p), []).append(
                (samples / slowest, steady, storage, remote, planned, local, net, rerouted))
print(f"floor F - N*C = {floor / 1e6:.1f} MB per epoch; medians of {runs} runs "
      "(job samples/s: the job's samples over its slowest node's time; steady: the nodes' "
      "samples/s after the first epoch, summed)")
print("| strategy | prefetch | job samples/s | steady samples/s | storage MB/epoch | x floor | remote hits | planned | own-cache hits | net MB | rerouted |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
med = {}
for (s, p), rs in sorted(rows.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
    m = [statistics.median(c) for c in zip(*rs)]
    med[(s, p)] = m
    x = f"{m[2] / floor:.3f}" if floor > 0 else "-"
    print(f"| {s} | {p} | {m[0]:.0f} | {m[1]:.0f} | {m[2] / 1e6:.1f} | {x} | {m[3]:.0f} "
          f"| {m[4]:.0f} | {m[5]:.3f} | {m[6] / 1e6:.1f} | {m[7]:.0f} |")
def best(s, k):
    return max((med[(s, p)][k], p) for p in prefetch if (s, p) in med)
for ours in ("lobster", "lobster+locality"):
    lob = med[(ours, prefetch[0])]
    for base in ("lobster-node-plan", "nopfs", "lobster+unpriced"):
        if ours != "lobster" and base == "lobster+unpriced":
            continue
        (job, pj), (steady, ps) = best(base, 0), best(base, 1)
        print(f"{ours} (prefetch {prefetch[0]}) / {base} at its best: job samples/s "
              f"{lob[0] / job:.2f}x (its best at prefetch {pj}), steady {lob[1] / steady:.2f}x "
              f"(prefetch {ps})")
PY
