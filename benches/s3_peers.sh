#!/usr/bin/env bash
# lobster-io against MosaicML Streaming and s3torchconnector on one S3 server (s3s-fs,
# `lobster-bench s3-server`), 4 nodes, each node through its own port of one delaying proxy
# (`lobster-bench s3-proxy`: LATENCY_MS per request, MBPS per node), cache 20% of the
# dataset per node (Streaming's cache_limit the same bytes; s3torchconnector has no cache).
# Bytes and GET requests are the proxy's counts for the peers; lobster-io's are its own
# per-epoch metrics, checked against the proxy's counts over the whole run.
#
# lobster-io: 4 processes under mpirun (one node each, 1 rank, peers' caches over MPI),
# the node's AWS_ENDPOINT_URL its proxy port. The peers: `benches/s3/peers.py sweep
# --endpoints` (one process per node, all at once), over a grid of their settings, RUNS runs
# per setting; their best setting by median steady samples/s is the one compared.
#
# Needs the peers' venv (benches/s3/README.md) as PY. Usage:
#   [RUNS=3] [EPOCHS=3] [MBPS=200] [LATENCY_MS=20] [WORK=DIR] [PY=python] benches/s3_peers.sh
set -euo pipefail
runs=${RUNS:-3}
epochs=${EPOCHS:-3}
mbps=${MBPS:-200}
latency=${LATENCY_MS:-20}
py=${PY:-/work/venv-peers/bin/python}
nodes=4
cd "$(dirname "$0")/.."
root=$PWD
cargo build --release -q -p lobster-cli --features mpi -p lobster-bench
bin="${CARGO_TARGET_DIR:-target}/release"
bin=$(cd "$bin" && pwd)
if [[ -n ${WORK:-} ]]; then
    work=$WORK
    mkdir -p "$work"
else
    work=$(mktemp -d)
fi
server= proxy=
cleanup() {
    for p in $proxy $server; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    [[ -n ${WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
export TMPDIR=$work/tmp XDG_CACHE_HOME=$work/cache
mkdir -p "$TMPDIR"
rm -rf "${TMPDIR:?}"/* "$work/out"
mkdir -p "$work/out"

# 4,000 JPEG-sized samples of ~110 KB (~460 MiB) in 10 classes; lobster's tar shards of them.
[[ -d $work/data ]] || "$bin/lobster" gen --out "$work/data" --samples 4000 --classes 10 \
    --mean-kb 110 --seed 0 >/dev/null
[[ -d $work/shards ]] || "$bin/lobster" pack --data "$work/data" --out "$work/shards" >/dev/null

mkfifo "$work/server.out" 2>/dev/null || true
"$bin/lobster-bench" s3-server --root "$work/root" >"$work/server.out" 2>"$work/server.err" &
server=$!
exec 3<"$work/server.out"
read -r _ endpoint <&3
read -r _ access <&3
read -r _ secret <&3
export AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret AWS_REGION=us-east-1
export AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent
# MDS shards at most 5% of the set (Streaming refuses a cache_limit under 4x its largest
# shard), the ImageFolder, and lobster's shards: straight to the server, not through the proxy.
"$py" benches/s3/peers.py prepare --data "$work/data" --endpoint "$endpoint" --bucket bench \
    --shard-bytes 16777216 --tar-shards "$work/shards" >"$work/prepare.log"

counts=$work/counts.json
rm -f "$counts"
mkfifo "$work/proxy.out" 2>/dev/null || true
"$bin/lobster-bench" s3-proxy --upstream "${endpoint#http://}" --nodes "$nodes" \
    --latency-ms "$latency" --node-mbps "$mbps" --counts-json "$counts" --counts-every-ms 100 \
    >"$work/proxy.out" 2>"$work/proxy.err" &
proxy=$!
exec 4<"$work/proxy.out"
ports=()
for ((n = 0; n < nodes; n++)); do
    read -r _ _ url <&4
    ports+=("$url")
done
endpoints=$(IFS=,; echo "${ports[*]}")
until [[ -s $counts ]]; do sleep 0.05; done

mpi=(mpirun --oversubscribe)
if [[ $(id -u) == 0 ]]; then mpi+=(--allow-run-as-root); fi
job=(run --mpi --quiet --nodes "$nodes" --ranks-per-node 1 --cache-frac 0.2 --decoder raw
    --storage-mbps 0 --compute-ms 0 --batch-size 64 --epochs "$epochs" --strategy lobster
    --data s3://bench/shards/)
for ((i = 1; i <= runs; i++)); do
    cp "$counts" "$work/out/lobster-$i.before.json"
    argv=()
    for ((n = 0; n < nodes; n++)); do
        ((n == 0)) || argv+=(:)
        argv+=(-np 1 -x "AWS_ENDPOINT_URL=${ports[n]}" "$bin/lobster" "${job[@]}"
            --json "$work/out/lobster-$i.json")
    done
    "${mpi[@]}" "${argv[@]}" >/dev/null
    sleep 0.3 # two rewrites of the counts file
    cp "$counts" "$work/out/lobster-$i.after.json"
done

common=(--bucket bench --epochs "$epochs" --batch 64 --counts-json "$counts"
    --endpoints "$endpoints" --runs "$runs" --run-timeout-s 300)
"$py" benches/s3/peers.py sweep streaming --grid-workers 2,4 --grid-predownload 32,64 \
    --grid-shuffle-block-size 256 --cache-limit 20% --out "$work/out/streaming.json" \
    "${common[@]}" >/dev/null
"$py" benches/s3/peers.py sweep s3torch --grid-workers 4,8,12 --out "$work/out/s3torch.json" \
    "${common[@]}" >/dev/null

"$py" benches/s3/peers.py table "$work/out/streaming.json" "$work/out/s3torch.json"
python3 - "$work/out" "$runs" "$nodes" "$mbps" "$latency" <<'PY'
import json, statistics, sys
out, runs, nodes, mbps, latency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
mib = 1 << 20
rows = []
for i in range(1, runs + 1):
    doc = json.load(open(f"{out}/lobster-{i}.json"))
    rs = [n[0] for n in doc["nodes"]]
    epochs = len(rs[0]["epoch_seconds"])
    per_epoch = sum(r["samples"] for r in rs) / epochs
    secs = [max(r["epoch_seconds"][e] for r in rs) for e in range(epochs)]
    got = [sum(r["storage_bytes_by_epoch"][e] for r in rs) for e in range(epochs)]
    gets = [sum(r["object_requests_by_epoch"][e] for r in rs) for e in range(epochs)]
    before, after = (json.load(open(f"{out}/lobster-{i}.{k}.json"))["nodes"] for k in ("before", "after"))
    proxy = sum(a["down_bytes"] - b["down_bytes"] for a, b in zip(after, before))
    proxy_req = sum(a["requests"] - b["requests"] for a, b in zip(after, before))
    rows.append({
        "first": per_epoch / secs[0],
        "steady": per_epoch * (epochs - 1) / sum(secs[1:]),
        "bytes": statistics.median(got[1:]),
        "gets": statistics.median(gets[1:]),
        "run_bytes": sum(got), "proxy_bytes": proxy, "proxy_requests": proxy_req,
    })
lob = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
print(f"\n{nodes} nodes, {latency} ms per request, {mbps} Mbit/s per node, cache 20% per node; "
      f"medians of {runs} runs")
print("| loader | setting | first epoch samples/s | steady samples/s | steady MiB/epoch | steady GETs/epoch |")
print("|---|---|---|---|---|---|")
print(f"| lobster-io | 1 rank per node, defaults | {lob['first']:.1f} | {lob['steady']:.1f} "
      f"| {lob['bytes'] / mib:.1f} | {lob['gets']:.0f} |")
peers = {}
for name in ("streaming", "s3torch"):
    best = json.load(open(f"{out}/{name}.json"))["best"]
    peers[name] = best
    print(f"| {name} (best) | {best['grid']} | {best['median_first_epoch_samples_per_s']:.1f} "
          f"| {best['median_steady_samples_per_s']:.1f} "
          f"| {best['median_steady_bytes_down_per_epoch'] / mib:.1f} "
          f"| {best['median_steady_requests_per_epoch']:.0f} |")
for name, best in peers.items():
    print(f"lobster-io vs {name}: {lob['steady'] / best['median_steady_samples_per_s']:.2f}x "
          f"steady samples/s, {lob['bytes'] / best['median_steady_bytes_down_per_epoch']:.3f}x "
          "bytes fetched per epoch")
print("lobster-io per run: " + "; ".join(
    f"steady {r['steady']:.1f}/s, {r['bytes'] / mib:.1f} MiB/epoch; its metrics over the run "
    f"{r['run_bytes'] / mib:.1f} MiB, the proxy's {r['proxy_bytes'] / mib:.1f} MiB in "
    f"{r['proxy_requests']} requests" for r in rows))
PY
