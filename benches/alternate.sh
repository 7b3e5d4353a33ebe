#!/usr/bin/env bash
# Alternating runs of `lobster run` settings on one dataset, each run its own process with the
# page cache warmed before it; prints each setting's median samples/s, range and CPU.
#
# Usage: [N=5] [DATA=dir] benches/alternate.sh "label|strategy and options" ...
# e.g.   benches/alternate.sh "lobster|--strategy lobster" \
#            "lobster-normal|--strategy lobster --pipeline-threads normal" \
#            "pytorch-4|--strategy pytorch --workers-per-rank 4"
# Every run adds RUN_OPTS (default: the 2 KiB overhead point's options). DATA defaults to
# the 2 KiB set benches/overhead.sh generates.
set -euo pipefail
n=${N:-5}
data=${DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/lobster-io/overhead/jpeg-100000-2kb}
run_opts=(${RUN_OPTS:---storage-mbps 0 --compute-ms 1 --nodes 2 --ranks-per-node 8 --batch 32 --epochs 2 --decoder raw})
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
[[ -d $data ]] || { echo "no dataset at $data (benches/overhead.sh generates it)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for _ in $(seq "$n"); do
    for spec in "$@"; do
        label=${spec%%|*}
        read -r -a args <<<"${spec#*|}"
        find "$data" -type f -exec cat {} + >/dev/null
        "$bin" run --quiet --data "$data" --json "$out/r.json" "${args[@]}" "${run_opts[@]}" >/dev/null
        python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
print(sys.argv[2], round(r['samples_per_second']), r['cpu_seconds'])" "$out/r.json" "$label" >>"$out/all"
    done
done
python3 - "$out/all" <<'PY'
import collections, statistics, sys
rate, cpu = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, s, c = line.split()
    rate[label].append(int(s))
    cpu[label].append(float(c))
for label, v in rate.items():
    print(f"{label:24s} median {statistics.median(v):8.0f}  min {min(v)}  max {max(v)}  "
          f"cpu s {statistics.median(cpu[label]):.2f}  runs {v}")
PY
