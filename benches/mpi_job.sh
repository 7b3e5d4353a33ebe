#!/usr/bin/env bash
# The default main job over MPI: 4 processes (nodes), each with its emulated storage link and
# its ranks as threads, nopfs and lobster, with remote hits and without (--no-remote),
# RUNS repetitions in alternating order. Prints per setting the medians of the job's
# samples/s (its samples over the slowest node's time), local hit ratio, remote hits and
# planned remote hits (summed over nodes), and remote misses.
#
# Usage: [RUNS=3] [NP=4] benches/mpi_job.sh [more lobster run options...]
set -euo pipefail
runs=${RUNS:-3}
np=${NP:-4}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli --features mpi
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpi=(mpirun --oversubscribe -np "$np")
if [[ $(id -u) == 0 ]]; then mpi+=(--allow-run-as-root); fi
for ((i = 1; i <= runs; i++)); do
    order=(remote local)
    ((i % 2)) || order=(local remote)
    for setting in "${order[@]}"; do
        extra=()
        [[ $setting == local ]] && extra=(--no-remote)
        "${mpi[@]}" "$bin" run --mpi --quiet --nodes "$np" --strategy nopfs,lobster \
            --json "$out/$setting-$i.json" "${extra[@]}" "$@" >/dev/null
    done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
print(f"medians of {runs} runs; figures of the job (sums over nodes; samples/s: the job's samples over its slowest node's time)")
print("| strategy | remote hits | job samples/s | local hit ratio (mean of nodes) | remote hits | planned remote hits | remote misses |")
print("|---|---|---|---|---|---|---|")
for strategy in ("nopfs", "lobster"):
    for setting in ("local", "remote"):
        rows = []
        for i in range(1, runs + 1):
            nodes = json.load(open(f"{out}/{setting}-{i}.json"))["nodes"]
            rs = [next(r for r in n if r["strategy"] == strategy) for n in nodes]
            samples = sum(r["samples"] for r in rs)
            slowest = max(r["samples"] / r["samples_per_second"] for r in rs)
            rows.append((samples / slowest, statistics.mean(r["hit_ratio"] for r in rs),
                         sum(r["remote_hits"] for r in rs), sum(r["planned_remote_hits"] for r in rs),
                         sum(r["remote_misses"] for r in rs)))
        med = [statistics.median(c) for c in zip(*rows)]
        print("| %s | %s | %.0f | %.3f | %d | %d | %d |" % (strategy, "yes" if setting == "remote" else "no", *med))
    per_run = {s: [round(json.load(open(f"{out}/{s}-{i}.json"))["nodes"][0][[r["strategy"] for r in json.load(open(f"{out}/{s}-{i}.json"))["nodes"][0]].index(strategy)]["samples_per_second"]) for i in range(1, runs + 1)] for s in ("local", "remote")}
    print(f"{strategy}: node 0's samples/s per run: {per_run}")
PY
