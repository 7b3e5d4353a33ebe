#!/usr/bin/env bash
# Two builds of `lobster run` side by side: each run in its own process, the two builds
# alternating which goes first, the page cache warmed (or, with MODE=direct, dropped and
# every read O_DIRECT) before each run. Prints per strategy the median samples/s of each build,
# their ratio and range, and whether both delivered the same hits and batches (CRC) in every
# run.
#
# Usage: BEFORE=path/to/lobster AFTER=path/to/lobster [N=3] [MODE=warm|direct]
#        benches/before_after.sh [lobster run options...]
# Without options it runs the main job's default (all five strategies, the built-in set).
set -euo pipefail
n=${N:-3}
mode=${MODE:-warm}
: "${BEFORE:?the build to compare against}" "${AFTER:?the build to measure}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
data=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --data ]] && data=${args[i + 1]}
done
page_cache() {
    [[ -n $data ]] || return 0
    python3 "$(dirname "$0")/page_cache.py" "$mode" "$data"
}
direct=()
[[ $mode == direct ]] && direct=(--direct)
one() {
    page_cache
    "$2" run --quiet --json "$out/$1.json" "${direct[@]}" "${args[@]}" >/dev/null
}
for ((i = 1; i <= n; i++)); do
    if ((i % 2)); then
        one "before-$i" "$BEFORE"
        one "after-$i" "$AFTER"
    else
        one "after-$i" "$AFTER"
        one "before-$i" "$BEFORE"
    fi
done
python3 - "$out" "$n" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = {b: [json.load(open(f"{out}/{b}-{i}.json"))["results"] for i in range(1, n + 1)]
        for b in ("before", "after")}
print(f"medians of {n} runs each, the builds alternating")
print("| strategy | before samples/s (range) | after samples/s (range) | after/before | hits before = after | batches CRC before = after |")
print("|---|---|---|---|---|---|")
for k, r in enumerate(runs["before"][0]):
    strategy = r.get("strategy", r.get("policy"))  # builds before the rename wrote "policy"
    rate = {b: [rs[k]["samples_per_second"] for rs in runs[b]] for b in runs}
    hits = {b: {rs[k]["hits"] for rs in runs[b]} for b in runs}
    crc = {b: {rs[k].get("batches_crc32") for rs in runs[b]} for b in runs}
    med = {b: statistics.median(v) for b, v in rate.items()}
    same = lambda d: "yes (%s)" % ",".join(map(str, sorted(d["before"]))) \
        if d["before"] == d["after"] and len(d["before"]) == 1 else "NO: %s" % d
    print("| %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.3f | %s | %s |" % (
        strategy, med["before"], min(rate["before"]), max(rate["before"]),
        med["after"], min(rate["after"]), max(rate["after"]),
        med["after"] / med["before"], same(hits), same(crc)))
PY
