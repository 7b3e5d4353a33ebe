#!/usr/bin/env bash
# Runs the main job RUNS times with the given options and prints, per strategy, the median of
# each figure over the runs (the machine is shared and noisy). Every repetition runs every
# strategy, starting one further along the list each time, so none always runs first or last.
#
# With SWEEP=1 each repetition also runs the read-then-decode baselines (pytorch, nopfs) at
# each of WORKERS workers per rank (default "1 2 4 8 16 32"), in a rotating order with the main
# job, and prints each baseline's best worker count against lobster from the same script run.
#
# Usage: [SWEEP=1] [WORKERS="1 2 4 8 16 32"] benches/main_job.sh RUNS [lobster run options...]
# The options must not include --strategy or --json (the script sets them).
set -euo pipefail
runs=${1:?usage: [SWEEP=1] benches/main_job.sh RUNS [lobster run options...]}
shift
sweep=${SWEEP:-0}
workers=(${WORKERS:-1 2 4 8 16 32})
strategies=(pytorch nopfs lobster-cache-only lobster-alloc-only lobster)
baselines=(pytorch nopfs)
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The items of list "$@" rotated left by $rot, joined by commas.
rotated() {
    local rot=$1
    shift
    local items=("$@") n=$# k joined=""
    for ((k = 0; k < n; k++)); do
        joined+="${joined:+,}${items[$(((k + rot) % n))]}"
    done
    echo "$joined"
}

jobs=(main)
if [[ $sweep == 1 ]]; then
    for w in "${workers[@]}"; do jobs+=("w$w"); done
fi
for ((i = 1; i <= runs; i++)); do
    for job in $(rotated "$i" "${jobs[@]}" | tr , ' '); do
        if [[ $job == main ]]; then
            "$bin" run --quiet --strategy "$(rotated "$i" "${strategies[@]}")" \
                --json "$out/main-$i.json" "$@" >/dev/null
        else
            "$bin" run --quiet --strategy "$(rotated "$i" "${baselines[@]}")" \
                --workers-per-rank "${job#w}" --json "$out/$job-$i.json" "$@" >/dev/null
        fi
    done
done

python3 - "$out" "$runs" "$sweep" "${workers[*]}" <<'PY'
import json, statistics, sys
out, runs, sweep, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", [int(w) for w in sys.argv[4].split()]
order = ["pytorch", "nopfs", "lobster-cache-only", "lobster-alloc-only", "lobster"]

def load(name):
    """Per strategy, its result in each of the runs of job `name`."""
    by_strategy = {}
    for i in range(1, runs + 1):
        report = json.load(open(f"{out}/{name}-{i}.json"))
        for r in report["results"]:
            by_strategy.setdefault(r["strategy"], []).append(r)
    return report["config"], by_strategy

config, main = load("main")
print("config:", json.dumps(config))
print(f"medians of {runs} runs, strategies in a rotating order")
print("| strategy | epoch s | samples/s | stall % | job stall % | imbalance p50 | imbalance p95 | hit ratio | speedup vs pytorch | peak RSS MiB | CPU s per 1k samples |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for strategy in order:
    rows = main.get(strategy)
    if not rows:
        continue
    med = lambda f: statistics.median(f(r) for r in rows)
    speedup = "-" if rows[0]["speedup_vs_pytorch"] is None else "%.2fx" % med(lambda r: r["speedup_vs_pytorch"])
    print("| %s | %.2f | %.0f | %.1f | %.1f | %.3f | %.3f | %.3f | %s | %.0f | %.3f |" % (
        strategy,
        med(lambda r: sum(r["epoch_seconds"]) / len(r["epoch_seconds"])),
        med(lambda r: r["samples_per_second"]),
        100 * med(lambda r: r["stall_fraction"]),
        100 * med(lambda r: r["job_stall_fraction"]),
        med(lambda r: r["imbalance_p50"]),
        med(lambda r: r["imbalance_p95"]),
        med(lambda r: r["hit_ratio"]),
        speedup,
        med(lambda r: r["peak_rss_bytes"]) / 2**20,
        med(lambda r: 1000 * r["cpu_seconds"] / max(r["samples"], 1)),
    ))

if sweep:
    lobster = statistics.median(r["samples_per_second"] for r in main["lobster"])
    table = {}
    for w in workers:
        _, by_strategy = load(f"w{w}")
        table[w] = {p: statistics.median(r["samples_per_second"] for r in rows) for p, rows in by_strategy.items()}
    baselines = ["pytorch", "nopfs"]
    print(f"\nbaselines' workers per rank (main job: {config['workers_per_rank']}), median samples/s of {runs} runs")
    print("| workers per rank | " + " | ".join(baselines) + " |")
    print("|---|" + "---|" * len(baselines))
    for w in workers:
        print(f"| {w} | " + " | ".join("%.0f" % table[w][p] for p in baselines) + " |")
    print(f"\nlobster: {lobster:.0f} samples/s (median of the main job's runs)")
    for p in baselines:
        best = max(workers, key=lambda w: table[w][p])
        print(f"lobster / best {p} = {lobster / table[best][p]:.2f} ({p} best at {best} workers per rank, {table[best][p]:.0f} samples/s)")
PY
