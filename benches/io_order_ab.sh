#!/usr/bin/env bash
# A/B of the pipelined read order and schedule on the main job: runs `lobster run --strategy
# lobster` in four settings, interleaved RUNS times (the machine is shared and noisy; each
# repetition starts one setting further along, so none always runs first), and
# prints per setting the median figures and the ratio against the paper's mechanism (per-rank
# io_depth shares from the allocator) measured in the same run.
# Usage: benches/io_order_ab.sh RUNS [lobster run options...]
set -euo pipefail
runs=${1:?usage: benches/io_order_ab.sh RUNS [lobster run options...]}
shift
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
settings=("shares allocate" "shares equal" "deadline allocate" "deadline equal")
for i in $(seq 1 "$runs"); do
    for k in "${!settings[@]}"; do
        read -r order schedule <<<"${settings[$(((k + i) % ${#settings[@]}))]}"
        "$bin" run --quiet --strategy lobster --io-order "$order" \
            --schedule "$schedule" --json "$out/$order-$schedule-$i.json" "$@" >/dev/null
    done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
settings = [("shares", "allocate"), ("shares", "equal"), ("deadline", "allocate"), ("deadline", "equal")]
rows = {}
for order, schedule in settings:
    results = [json.load(open(f"{out}/{order}-{schedule}-{i}.json"))["results"][0] for i in range(1, runs + 1)]
    med = lambda key: statistics.median(r[key] for r in results)
    rows[(order, schedule)] = {k: med(k) for k in ("samples_per_second", "job_stall_fraction", "imbalance_p50", "imbalance_p95")}
    rows[(order, schedule)]["p95s"] = sorted(r["imbalance_p95"] for r in results)
base = rows[("shares", "allocate")]
print(f"medians of {runs} interleaved runs; ratios against shares + allocate (the paper's mechanism)")
print("| read order | schedule | samples/s | ratio | job stall % | imbalance p50 | imbalance p95 | p95 of each run |")
print("|---|---|---|---|---|---|---|---|")
for (order, schedule), r in rows.items():
    print("| %s | %s | %.0f | %.3f | %.1f | %.3f | %.3f | %s |" % (
        order, schedule, r["samples_per_second"], r["samples_per_second"] / base["samples_per_second"],
        100 * r["job_stall_fraction"], r["imbalance_p50"], r["imbalance_p95"],
        ", ".join("%.3f" % p for p in r["p95s"])))
PY
