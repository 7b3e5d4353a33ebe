#!/usr/bin/env bash
# The node's ranks as threads of one process against ranks as processes attached to one host
# (lobster-node), on the main job's default setting: RUNS runs of each, alternating which
# goes first, every run in its own process. Prints per strategy the median samples/s of each
# mode and their ratio, the hit ratios, and the node's memory: the threads run's peak RSS
# against the processes run's peak of summed PSS (host and rank processes).
#
# Each strategy runs in a process of its own (the default setting otherwise), so that a
# strategy's memory figure is its own and not what earlier strategies left in the heap of a
# process that ran them all.
#
# Usage: [RUNS=3] [STRATEGIES="pytorch nopfs ..."] benches/ranks_as.sh [more lobster run options...]
set -euo pipefail
runs=${RUNS:-3}
strategies=(${STRATEGIES:-pytorch nopfs lobster-cache-only lobster-alloc-only lobster})
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= runs; i++)); do
    order=(threads processes)
    ((i % 2 == 0)) && order=(processes threads)
    for strategy in "${strategies[@]}"; do
        for mode in "${order[@]}"; do
            "$bin" run --quiet --strategy "$strategy" --ranks-as "$mode" \
                --json "$out/$mode-$i-$strategy.json" "$@" >/dev/null
        done
    done
    echo "run $i done" >&2
done
python3 - "$out" "$runs" <<'PY'
import glob, json, os, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
res = {}
for path in sorted(glob.glob(f"{out}/*.json")):
    mode = os.path.basename(path).split("-")[0]
    for r in json.load(open(path))["results"]:
        res.setdefault((r["strategy"], mode), []).append(r)
print(f"{'strategy':20} {'threads/s':>10} {'procs/s':>10} {'p/t':>6} {'hit t':>6} {'hit p':>6} "
      f"{'RSS t MiB':>10} {'PSS p MiB':>10} {'p/t mem':>8}")
for strategy in dict.fromkeys(p for p, _ in res):
    t, p = res[(strategy, "threads")], res[(strategy, "processes")]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    ts, ps = med(t, "samples_per_second"), med(p, "samples_per_second")
    tm, pm = med(t, "peak_rss_bytes") / 2**20, med(p, "peak_rss_bytes") / 2**20
    print(f"{strategy:20} {ts:10.0f} {ps:10.0f} {ps / ts:6.3f} {med(t, 'hit_ratio'):6.3f} "
          f"{med(p, 'hit_ratio'):6.3f} {tm:10.1f} {pm:10.1f} {pm / tm:8.3f}")
    print(f"{'':20} runs: threads {[round(r['samples_per_second']) for r in t]}, "
          f"processes {[round(r['samples_per_second']) for r in p]}")
PY
