#!/usr/bin/env bash
# The same dataset as an ImageFolder and as WebDataset shards, read cold: the page cache is
# dropped before every run (needs root), `--decoder raw --storage-mbps 0`, each strategy in
# its own process, folder and shards alternating. Prints per strategy and layout the median
# samples/s of RUNS runs. The shards are packed once (lobster pack, SHARD_BYTES each) next
# to the folder.
#
# Usage: [RUNS=3] [STRATEGIES="lobster pytorch"] [SHARD_BYTES=67108864]
#        benches/shards_cold.sh [FOLDER] [lobster run options...]
# FOLDER defaults to the main job's generated 4,000-image set.
set -euo pipefail
runs=${RUNS:-3}
strategies=(${STRATEGIES:-lobster pytorch})
shard_bytes=${SHARD_BYTES:-67108864}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
folder=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/lobster-io/imagefolder-4000-10-110kb-seed0}
shift || true
if [[ ! -d $folder ]]; then
    "$bin" run --quiet --strategy pytorch --epochs 1 >/dev/null # generates the default set
fi
shards="$folder.shards-$shard_bytes"
if [[ ! -e $shards/.complete ]]; then
    rm -rf "$shards"
    "$bin" pack --data "$folder" --out "$shards" --shard-bytes "$shard_bytes" >&2
    touch "$shards/.complete"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= runs; i++)); do
    for layout in folder shards; do
        data=$folder
        [[ $layout == shards ]] && data=$shards
        for p in "${strategies[@]}"; do
            sync
            echo 3 >/proc/sys/vm/drop_caches
            "$bin" run --quiet --data "$data" --strategy "$p" --decoder raw --storage-mbps 0 \
                --json "$out/$layout-$p-$i.json" "$@" >/dev/null
        done
    done
done
python3 - "$out" "$runs" "${strategies[@]}" <<'PY'
import json, statistics, sys
out, runs, strategies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"cold reads (page cache dropped before each run), medians of {runs}")
print("| strategy | folder samples/s | shards samples/s | shards / folder |")
print("|---|---|---|---|")
for p in strategies:
    med = {}
    for layout in ("folder", "shards"):
        rs = [json.load(open(f"{out}/{layout}-{p}-{i}.json"))["results"][0]["samples_per_second"] for i in range(1, runs + 1)]
        med[layout] = statistics.median(rs)
    print(f"| {p} | {med['folder']:.0f} | {med['shards']:.0f} | {med['shards'] / med['folder']:.2f} |")
PY
