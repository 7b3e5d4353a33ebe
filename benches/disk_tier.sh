#!/usr/bin/env bash
# The disk tier on one node (the default set, 4 ranks): memory 10% and a disk of 40% of the
# dataset (F), planned as one. Two runs on one fresh disk directory, and one without the
# disk: every run's batches must be the same; prints each run's bytes read from storage per
# epoch against the floor F - memory - disk (steady: the epochs after the first), and how
# much less the second run read in its first epoch against the bytes it found on the disk.
# STRATEGY: lobster (the reuse plan) or nopfs (the two-level static plan).
#
# Usage: [EPOCHS=4] [STRATEGY=lobster] benches/disk_tier.sh [lobster run options...]
set -euo pipefail
epochs=${EPOCHS:-4}
strategy=${STRATEGY:-lobster}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
bin="${CARGO_TARGET_DIR:-target}/release/lobster"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job=(run --quiet --nodes 1 --strategy "$strategy" --cache-frac 0.1 --epochs "$epochs"
    --storage-mbps 0 --compute-ms 0 --decoder raw)
"$bin" "${job[@]}" --json "$work/none.json" "$@" >/dev/null
disk=$(python3 -c 'import json,sys; print(int(0.4 * json.load(open(sys.argv[1]))["config"]["dataset_bytes"]))' "$work/none.json")
for run in 1 2; do
    "$bin" "${job[@]}" --disk-cache "$work/disk" --disk-cache-bytes "$disk" \
        --json "$work/run$run.json" "$@" >/dev/null
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
runs = {k: json.load(open(f"{work}/{k}.json")) for k in ("none", "run1", "run2")}
cfg = runs["run1"]["config"]
res = {k: r["results"][0] for k, r in runs.items()}
crcs = {k: r["batches_crc32"] for k, r in res.items()}
assert len(set(crcs.values())) == 1, crcs
d1 = res["run1"]["disk_cache"]
F, M, D = cfg["dataset_bytes"], cfg["cache_bytes"], d1["capacity_bytes"]
floor = F - M - D
print(f"{res['run1']['strategy']}: F {F / 1e6:.1f} MB, memory {M / 1e6:.1f} MB, disk {D / 1e6:.1f} MB; "
      f"floor F - memory - disk = {floor / 1e6:.1f} MB per epoch; batches_crc32 {crcs['run1']} in all three runs")
print("| run | storage MB per epoch | steady x floor | disk hits | writes | full | fallbacks | found on disk at start (MB) |")
print("|---|---|---|---|---|---|---|---|")
for k in ("none", "run1", "run2"):
    r = res[k]
    by = r["storage_bytes_by_epoch"]
    steady = " / ".join(f"{b / floor:.3f}" for b in by[1:])
    d = r.get("disk_cache") or {}
    print(f"| {k} | {' / '.join(f'{b / 1e6:.1f}' for b in by)} | {steady} | {d.get('hits', '-')} | "
          f"{d.get('writes', '-')} | {d.get('full', '-')} | {d.get('fallbacks', '-')} | "
          f"{d.get('seed_bytes', 0) / 1e6:.1f} |")
first = res["run1"]["storage_bytes_by_epoch"][0] - res["run2"]["storage_bytes_by_epoch"][0]
seed = res["run2"]["disk_cache"]["seed_bytes"]
print(f"second run: epoch 0 read {first / 1e6:.1f} MB less than the first; it found {seed / 1e6:.1f} MB "
      f"on the disk ({first / seed:.3f}x of it)" if seed else "second run found nothing on the disk")
PY
