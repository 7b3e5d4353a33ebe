#!/usr/bin/env bash
# The cost of a resume (issue 29): time from the start of the loader's build to the first
# batch, and samples/s of the first epoch, for a fresh start and for a resume mid-epoch, on
# the default main-job dataset (4000 samples, 110 KB) and on a 100,000-sample folder of small
# files (generated once, 4 KB mean, 100 classes). The main job's other defaults hold (4
# nodes of 4 ranks, this node 0, batch 16, 8 epochs, emulated storage, 25 ms compute).
#
# Per dataset: one run stops at 1.5 epochs and saves its state; then RUNS times, alternating
# which goes first, a fresh start runs its first epoch (--stop-after-iterations one epoch)
# and a resume from the state runs the rest of its epoch. Prints the medians and the ratio
# resume / fresh. The page cache is warm: the files were read by the runs before (the
# storage emulation still charges every read its bandwidth and latency).
#
# Usage: [RUNS=5] [STRATEGY=lobster] [BIG=path] benches/resume.sh [lobster run options...]
#   BIG: the 100,000-sample folder to use (default: generated into the lobster-io cache
#   directory); BIG=none skips it. Options must not include --strategy, --json, --data,
#   --stop-after-iterations, --save-state or --resume.
set -euo pipefail
runs=${RUNS:-5}
strategy=${STRATEGY:-lobster}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cache="${XDG_CACHE_HOME:-$HOME/.cache}/lobster-io"
big=${BIG:-$cache/gen-100000-100-4kb-seed0}
if [[ $big != none && ! -e $big/.complete ]]; then
    echo "generating the 100,000-sample folder into $big ..." >&2
    rm -rf "$big"
    "$bin" gen --samples 100000 --classes 100 --mean-kb 4 --out "$big" >/dev/null
    touch "$big/.complete"
fi

# bench NAME [lobster run options...]: the runs on one dataset, reports $out/NAME-*.json.
bench() {
    local name=$1
    shift
    local run=("$bin" run --quiet --strategy "$strategy" "$@")
    # A first run stopped at once says how many iterations an epoch has.
    "${run[@]}" --stop-after-iterations 1 --json "$out/$name-probe.json" >/dev/null
    local epoch
    epoch=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["results"][0]["start"]["steps"] // d["config"]["epochs"])' "$out/$name-probe.json")
    local half=$((epoch / 2))
    "${run[@]}" --stop-after-iterations $((epoch + half)) --save-state "$out/$name-state.json" \
        --json "$out/$name-stop.json" >/dev/null
    for ((i = 1; i <= runs; i++)); do
        local order=(fresh resume)
        ((i % 2)) || order=(resume fresh)
        for job in "${order[@]}"; do
            if [[ $job == fresh ]]; then
                "${run[@]}" --stop-after-iterations "$epoch" --json "$out/$name-fresh-$i.json" >/dev/null
            else
                "${run[@]}" --resume "$out/$name-state.json" --stop-after-iterations $((epoch - half)) \
                    --json "$out/$name-resume-$i.json" >/dev/null
            fi
        done
    done
}

bench default "$@"
names=(default)
if [[ $big != none ]]; then
    bench big --data "$big" "$@"
    names+=(big)
fi

python3 - "$out" "$runs" "${names[@]}" <<'PY'
import json, statistics, sys
out, runs, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"medians of {runs} runs; times from the start of the loader's build")
print("| dataset | samples | start | build s | first batch s (min-max) | first epoch steps | first epoch samples/s |")
print("|---|---|---|---|---|---|---|")
ratios = []
for name in names:
    med = {}
    for job in ("fresh", "resume"):
        rows = [json.load(open(f"{out}/{name}-{job}-{i}.json")) for i in range(1, runs + 1)]
        starts = [r["results"][0]["start"] for r in rows]
        m = lambda k: statistics.median(s[k] for s in starts)
        med[job] = {k: m(k) for k in ("build_s", "first_batch_s", "first_epoch_samples_per_second")}
        spread = "%.3f-%.3f" % (min(s["first_batch_s"] for s in starts), max(s["first_batch_s"] for s in starts))
        s = starts[0]
        where = "fresh" if job == "fresh" else f"resume at epoch {s['epoch']} iteration {s['iteration']}"
        print("| %s | %d | %s | %.3f | %.3f (%s) | %d | %.0f |" % (
            rows[0]["config"]["data"].split("/")[-1], rows[0]["config"]["samples"], where,
            med[job]["build_s"], med[job]["first_batch_s"], spread, s["first_epoch_steps"],
            med[job]["first_epoch_samples_per_second"]))
    ratios.append((name, med))
print()
for name, med in ratios:
    f, r = med["fresh"], med["resume"]
    print(f"{name}: resume / fresh: first batch {r['first_batch_s'] / f['first_batch_s']:.2f}x, "
          f"build {r['build_s'] / f['build_s']:.2f}x, "
          f"first-epoch samples/s {r['first_epoch_samples_per_second'] / f['first_epoch_samples_per_second']:.2f}x")
PY
