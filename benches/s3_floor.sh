#!/usr/bin/env bash
# The default set packed with `lobster pack` and uploaded by PUT to a real S3 server on
# loopback (`lobster-bench s3-server`: s3s-fs), read by 4 nodes of 4 ranks (`--cluster`,
# cache 20% of the dataset per node) from the bucket and from the same shards on local disk:
# every strategy's batches must be the same (batches_crc32, per node), and the steady-state
# bytes fetched from the store per epoch (summed over the nodes, epochs after the first)
# are set against the floor F - N*C. RUNS repetitions; prints medians and per-run figures.
# Before them, one node of 4 ranks runs every strategy from both, and their batches must match.
#
# Usage: [RUNS=3] [EPOCHS=4] benches/s3_floor.sh [lobster run options...]
set -euo pipefail
runs=${RUNS:-3}
epochs=${EPOCHS:-4}
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli -p lobster-bench
bin="${CARGO_TARGET_DIR:-target}/release"
work=$(mktemp -d)
server=
cleanup() {
    if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
# The default set, generated once into the cache directory as `lobster run` generates it.
"$bin/lobster" run --quiet --strategy pytorch --epochs 1 --compute-ms 0 --storage-mbps 0 \
    --json "$work/gen.json" >/dev/null
images=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["data"])' "$work/gen.json")
"$bin/lobster" pack --data "$images" --out "$work/shards" >/dev/null
mkfifo "$work/server.out"
"$bin/lobster-bench" s3-server --root "$work/root" --upload "data/shards=$work/shards" \
    >"$work/server.out" 2>"$work/server.err" &
server=$!
exec 3<"$work/server.out"
read -r _ endpoint <&3
read -r _ access <&3
read -r _ secret <&3
export AWS_ENDPOINT_URL=$endpoint AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent
export XDG_CACHE_HOME=$work/cache
job=(run --quiet --cluster --nodes 4 --ranks-per-node 4 --cache-frac 0.2 --decoder raw
    --storage-mbps 0 --compute-ms 0 --epochs "$epochs" --strategy nopfs,lobster-node-plan,lobster)
# One node, every strategy: the same batches from the bucket as from the local shards.
one=(run --quiet --ranks-per-node 4 --cache-frac 0.2 --decoder raw --storage-mbps 0 --compute-ms 0
    --epochs 2 --strategy all)
"$bin/lobster" "${one[@]}" --data "$work/shards" --json "$work/one-local.json" "$@" >/dev/null
"$bin/lobster" "${one[@]}" --data s3://data/shards/ --json "$work/one-s3.json" "$@" >/dev/null
for ((i = 1; i <= runs; i++)); do
    "$bin/lobster" "${job[@]}" --data "$work/shards" --json "$work/local-$i.json" "$@" >/dev/null
    "$bin/lobster" "${job[@]}" --data s3://data/shards/ --json "$work/s3-$i.json" "$@" >/dev/null
done
python3 - "$work" "$runs" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
one = [json.load(open(f"{work}/one-{k}.json"))["results"] for k in ("local", "s3")]
crc = [[(r["strategy"], r["batches_crc32"]) for r in rs] for rs in one]
assert crc[0] == crc[1], crc
print(f"one node: {len(crc[1])} strategies ({', '.join(s for s, _ in crc[1])}) deliver the "
      "local shards' batches_crc32 from the bucket")
rows = {}
for i in range(1, runs + 1):
    local, s3 = (json.load(open(f"{work}/{k}-{i}.json")) for k in ("local", "s3"))
    cfg = s3["config"]
    floor = max(0, cfg["dataset_bytes"] - cfg["nodes"] * cfg["cache_bytes"])
    for n, (ln, sn) in enumerate(zip(local["nodes"], s3["nodes"])):
        for a, b in zip(ln, sn):
            assert a["strategy"] == b["strategy"]
            assert a["batches_crc32"] == b["batches_crc32"], (n, a["strategy"])
    by = {}
    for node in s3["nodes"]:
        for r in node:
            by.setdefault(r["strategy"], []).append(r)
    for s, rs in by.items():
        epochs = [sum(x) for x in zip(*(r["storage_bytes_by_epoch"] for r in rs))][1:]
        gets = [sum(x) for x in zip(*(r["object_requests_by_epoch"] for r in rs))][1:]
        rows.setdefault(s, []).append((statistics.mean(epochs), statistics.mean(gets)))
print(f"dataset {cfg['dataset_bytes'] / 1e6:.1f} MB, 4 nodes, cache {cfg['cache_bytes'] / 1e6:.1f} MB "
      f"each; floor F - N*C = {floor / 1e6:.1f} MB per epoch; batches_crc32 equal to the local "
      f"shards' for every node and strategy in all {runs} runs")
print("| strategy | steady MB fetched/epoch (median) | x floor | GETs/epoch | runs (MB) |")
print("|---|---|---|---|---|")
for s, rs in rows.items():
    mb = statistics.median(r[0] for r in rs)
    gets = statistics.median(r[1] for r in rs)
    each = ", ".join(f"{r[0] / 1e6:.1f}" for r in rs)
    print(f"| {s} | {mb / 1e6:.1f} | {mb / floor:.3f} | {gets:.0f} | {each} |")
PY
