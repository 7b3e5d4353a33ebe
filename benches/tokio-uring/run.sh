#!/usr/bin/env bash
# lobster-uring's Session against tokio-uring, side by side: builds the standalone bench in
# release, runs every case RUNS times (default 7) alternating the engines (the order flips
# every run), and prints the medians and the ratios tokio-uring / lobster for MB/s and CPU s
# per GB. Every run checks the CRC32 of every read; this script also asserts that both
# engines read the same bytes (reads, bytes and the sum of the CRCs agree per case).
#
# Caches: nothing is dropped (no root needed). The direct-* cases open the large file with
# O_DIRECT, so the page cache plays no part; cached-128k reads the same file buffered after
# a warming pass; path and path-nodir read small files the generator wrote, warm in the
# page cache after the first pass (they measure the cost of open + read + close per sample).
#
# Usage: benches/tokio-uring/run.sh [OUT.jsonl]
#   RUNS=7  CASES="direct-4k direct-128k cached-128k path path-nodir"
#   ENGINES="lobster tokio-uring:fixed"  (tokio-uring:FORM, FORM workers|unordered|fixed)
#   DIR=$TMPDIR/lobster-tokio-uring-bench  (the generated file set, ~1.4 GB, kept for reruns)
#   SUMMARY_ONLY=1  (print the table of an existing OUT.jsonl, run nothing)
set -euo pipefail
cd "$(dirname "$0")"

RUNS=${RUNS:-7}
CASES=${CASES:-direct-4k direct-128k cached-128k path path-nodir}
ENGINES=${ENGINES:-lobster tokio-uring:fixed}
DIR=${DIR:-${TMPDIR:-/tmp}/lobster-tokio-uring-bench}
OUT=${1:-results.jsonl}

if [[ -z ${SUMMARY_ONLY:-} ]]; then
    cargo build --release --quiet
    bin=target/release/lobster-tokio-uring-bench
    "$bin" --dir "$DIR" --case gen
    "$bin" --dir "$DIR" --case crc >"$OUT"

    read -r -a engines <<<"$ENGINES"
    for case in $CASES; do
        for run in $(seq 1 "$RUNS"); do
            order=("${engines[@]}")
            if ((run % 2 == 0)); then
                order=()
                for ((i = ${#engines[@]} - 1; i >= 0; i--)); do order+=("${engines[i]}"); done
            fi
            for e in "${order[@]}"; do
                engine=${e%%:*}
                form=${e#*:}
                [[ $form == "$e" ]] && form=fixed
                "$bin" --dir "$DIR" --engine "$engine" --form "$form" --case "$case" | tee -a "$OUT"
            done
        done
    done
fi

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
crc = [r for r in rows if r["case"] == "crc"]
runs = [r for r in rows if r["case"] != "crc"]
cases = list(dict.fromkeys(r["case"] for r in runs))
name = lambda r: r["engine"] if r["engine"] == "lobster" else f'{r["engine"]}:{r["form"]}'
engines = list(dict.fromkeys(name(r) for r in runs))
med = lambda xs: statistics.median(xs)
print()
print(f'{"case":<12} {"engine":<22} {"runs":>4} {"MB/s":>8} {"MB/s min-max":>12} {"samples/s":>10} '
      f'{"CPU s/GB":>9} {"MB/s ratio":>10} {"CPU/GB ratio":>12} {"paired MB/s ratios min-max":>26}')
for case in cases:
    of = {e: [r for r in runs if r["case"] == case and name(r) == e] for e in engines}
    # Both engines read the same ranges: the totals must agree.
    keys = {(r["reads"], r["bytes"], r["crc_sum"]) for rs in of.values() for r in rs}
    assert len(keys) == 1, (case, keys)
    base = of.get("lobster")
    for e, rs in of.items():
        if not rs:
            continue
        mbs = med([r["mb_per_s"] for r in rs])
        sps = med([r["samples_per_s"] for r in rs])
        cpu = med([r["cpu_s_per_gb"] for r in rs])
        spread = f'{min(r["mb_per_s"] for r in rs):.0f}-{max(r["mb_per_s"] for r in rs):.0f}'
        ratio = ""
        if base and e != "lobster":
            # Run k of each engine ran back to back: their ratio sees the same machine load.
            paired = [t["mb_per_s"] / l["mb_per_s"] for t, l in zip(rs, base)]
            ratio = (f'{mbs / med([r["mb_per_s"] for r in base]):>10.3f} '
                     f'{cpu / med([r["cpu_s_per_gb"] for r in base]):>12.3f} '
                     f'{f"{min(paired):.2f}-{max(paired):.2f}":>26}')
        print(f"{case:<12} {e:<22} {len(rs):>4} {mbs:>8.0f} {spread:>12} {sps:>10.0f} {cpu:>9.4f} {ratio}")
if crc:
    print(f'\nthe CRC32 check alone, included in every CPU figure: {crc[0]["cpu_s_per_gb"]:.4f} CPU s/GB')
print("ratios: tokio-uring / lobster, medians; MB/s ratio > 1 and CPU/GB ratio < 1 favour tokio-uring")
PY
