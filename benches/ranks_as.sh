#!/usr/bin/env bash
# The node's ranks as threads of one process against ranks as processes attached to one host
# (lobster-node), on the main job's default setting: RUNS runs of each, alternating which
# goes first, every run in its own process. Prints per policy the median samples/s of each
# mode and their ratio, the hit ratios, and the node's memory: the threads run's peak RSS
# against the processes run's peak of summed PSS (host and rank processes).
#
# Usage: [RUNS=3] [POLICIES=all] benches/ranks_as.sh [more lobster run options...]
set -euo pipefail
runs=${RUNS:-3}
policies=${POLICIES:-all}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= runs; i++)); do
    order=(threads processes)
    ((i % 2 == 0)) && order=(processes threads)
    for mode in "${order[@]}"; do
        "$bin" run --quiet --policy "$policies" --ranks-as "$mode" --json "$out/$mode-$i.json" \
            "$@" >/dev/null
        echo "run $i $mode done" >&2
    done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
res = {}
for mode in ("threads", "processes"):
    for i in range(1, runs + 1):
        for r in json.load(open(f"{out}/{mode}-{i}.json"))["results"]:
            res.setdefault((r["policy"], mode), []).append(r)
print(f"{'policy':20} {'threads/s':>10} {'procs/s':>10} {'p/t':>6} {'hit t':>6} {'hit p':>6} "
      f"{'RSS t MiB':>10} {'PSS p MiB':>10} {'p/t mem':>8}")
for policy in dict.fromkeys(p for p, _ in res):
    t, p = res[(policy, "threads")], res[(policy, "processes")]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    ts, ps = med(t, "samples_per_second"), med(p, "samples_per_second")
    tm, pm = med(t, "peak_rss_bytes") / 2**20, med(p, "peak_rss_bytes") / 2**20
    print(f"{policy:20} {ts:10.0f} {ps:10.0f} {ps / ts:6.3f} {med(t, 'hit_ratio'):6.3f} "
          f"{med(p, 'hit_ratio'):6.3f} {tm:10.1f} {pm:10.1f} {pm / tm:8.3f}")
    print(f"{'':20} runs: threads {[round(r['samples_per_second']) for r in t]}, "
          f"processes {[round(r['samples_per_second']) for r in p]}")
PY
