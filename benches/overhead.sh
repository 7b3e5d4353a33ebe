#!/usr/bin/env bash
# The loader's own cost with nothing else in the way: lobster against pytorch with no emulated
# storage, 1 ms of compute and no decoding, on generated JPEGs of mean 2, 16, 128 and
# 1024 KiB, each with the page cache warm and cold with --direct. Per point pytorch first
# runs once at each of WORKERS workers per rank and keeps the fastest; then lobster and
# pytorch (at that count) run RUNS times each, alternating which goes first, every run in its
# own process. Prints per point the median samples/s of each, their ratio, and the process's
# CPU seconds (user + system) per 1,000 samples delivered.
#
# warm: every dataset file is read once before each run.
# direct: before each run the dataset's pages are dropped from the page cache
# (posix_fadvise DONTNEED, no root needed) and every strategy reads with O_DIRECT (pytorch's
# read-then-decode workers too), so both read every epoch from the device.
#
# Usage: [RUNS=3] [SIZES="2 16 128 1024"] [WORKERS="1 2 4 8 16"] [SAMPLES=N] [MODES="warm direct"]
#        benches/overhead.sh [more lobster run options...]
# Datasets are generated once into DATA_DIR (default ~/.cache/lobster-io/overhead) and
# reused. SAMPLES overrides every size's sample count (at least 512: 2 nodes x 8 ranks x a
# batch of 32), for a smoke run. RUN_OPTS replaces the fixed run options below.
set -euo pipefail
runs=${RUNS:-3}
sizes=(${SIZES:-2 16 128 1024})
workers=(${WORKERS:-1 2 4 8 16})
modes=(${MODES:-warm direct})
run_opts=(${RUN_OPTS:---storage-mbps 0 --compute-ms 1 --nodes 2 --ranks-per-node 8 --batch 32 --epochs 2 --decoder raw})
data_dir=${DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lobster-io/overhead}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Samples per size: 200 MiB to 2 GiB, at least 4 iterations per epoch (2 nodes x 8 ranks x
# a batch of 32 take 512 samples an iteration), so a run lasts seconds, not a blink.
samples_for() {
    if [[ -n ${SAMPLES:-} ]]; then
        echo "$SAMPLES"
        return
    fi
    case $1 in
    2) echo 100000 ;;  # 200 MiB, 195 iterations per epoch
    16) echo 32768 ;;  # 512 MiB, 64
    128) echo 8192 ;;  # 1 GiB, 16
    *) echo 2048 ;;    # 1024 KiB: 2 GiB, 4
    esac
}

# Reads every file of $2 (warm) or drops its pages from the page cache (direct).
page_cache() {
    python3 benches/page_cache.py "$1" "$2"
}

# run MODE DATA JSON STRATEGY [options...]: one strategy in its own process.
run() {
    local mode=$1 data=$2 json=$3 strategy=$4
    shift 4
    local direct=()
    [[ $mode == direct ]] && direct=(--direct)
    page_cache "$mode" "$data"
    "$bin" run --quiet --data "$data" --json "$json" --strategy "$strategy" "${direct[@]}" \
        "${run_opts[@]}" "$@" "${extra[@]}" >/dev/null
}
extra=("$@")

points=()
for kb in "${sizes[@]}"; do
    n=$(samples_for "$kb")
    data="$data_dir/jpeg-$n-${kb}kb"
    if [[ ! -e $data/.complete ]]; then
        rm -rf "$data"
        echo "generating $n samples of mean $kb KiB into $data ..." >&2
        "$bin" gen --samples "$n" --classes 10 --mean-kb "$kb" --out "$data" >&2
        touch "$data/.complete"
    fi
    for mode in "${modes[@]}"; do
        point="$kb-$mode"
        points+=("$point")
        for w in "${workers[@]}"; do
            run "$mode" "$data" "$out/$point-sweep-$w.json" pytorch --workers-per-rank "$w"
        done
        best=$(python3 - "$out" "$point" "${workers[@]}" <<'PY'
import json, sys
out, point, workers = sys.argv[1], sys.argv[2], sys.argv[3:]
rate = lambda w: json.load(open(f"{out}/{point}-sweep-{w}.json"))["results"][0]["samples_per_second"]
print(max(workers, key=rate))
PY
)
        echo "$best" >"$out/$point-best"
        for ((i = 1; i <= runs; i++)); do
            if ((i % 2)); then
                run "$mode" "$data" "$out/$point-lobster-$i.json" lobster
                run "$mode" "$data" "$out/$point-pytorch-$i.json" pytorch --workers-per-rank "$best"
            else
                run "$mode" "$data" "$out/$point-pytorch-$i.json" pytorch --workers-per-rank "$best"
                run "$mode" "$data" "$out/$point-lobster-$i.json" lobster
            fi
        done
    done
done

python3 - "$out" "$runs" "${points[@]}" <<'PY'
import json, statistics, sys
out, runs, points = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"medians of {runs} runs each, lobster and pytorch alternating; pytorch at its best workers per rank")
print("| mean KiB | page cache | samples | dataset MiB | pytorch workers/rank | pytorch samples/s | lobster samples/s | lobster/pytorch | epoch 1 s pytorch / lobster | epoch 2 s pytorch / lobster | pytorch CPU s/1k samples | lobster CPU s/1k samples |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for point in points:
    kb, mode = point.split("-")
    best = open(f"{out}/{point}-best").read().strip()
    med = {}
    for strategy in ("pytorch", "lobster"):
        reports = [json.load(open(f"{out}/{point}-{strategy}-{i}.json")) for i in range(1, runs + 1)]
        results = [r["results"][0] for r in reports]
        med[strategy] = (
            statistics.median(r["samples_per_second"] for r in results),
            statistics.median(1000 * r["cpu_seconds"] / max(r["samples"], 1) for r in results),
            [statistics.median(r["epoch_seconds"][e] for r in results)
             for e in range(len(results[0]["epoch_seconds"]))],
        )
        config = reports[0]["config"]
    epochs = lambda e: "%.3f / %.3f" % (med["pytorch"][2][e], med["lobster"][2][e])
    print("| %s | %s | %d | %.0f | %s | %.0f | %.0f | %.2f | %s | %s | %.3f | %.3f |" % (
        kb, mode, config["samples"], config["dataset_bytes"] / 2**20, best,
        med["pytorch"][0], med["lobster"][0], med["lobster"][0] / med["pytorch"][0],
        epochs(0), epochs(-1), med["pytorch"][1], med["lobster"][1]))
PY
