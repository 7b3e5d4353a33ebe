#!/usr/bin/env bash
# Runs the main job several times with the given options and prints, per policy, the median
# of each figure over the runs (the machine is shared and noisy).
# Usage: benches/main_job.sh RUNS [lobster run options...]
set -euo pipefail
runs=${1:?usage: benches/main_job.sh RUNS [lobster run options...]}
shift
cd "$(dirname "$0")/.."
cargo build --release -q -p lobster-cli
out=$(mktemp -d)
for i in $(seq 1 "$runs"); do
    ./target/release/lobster run --quiet --json "$out/$i.json" "$@" >/dev/null
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
reports = [json.load(open(f"{out}/{i}.json")) for i in range(1, runs + 1)]
print("config:", json.dumps(reports[0]["config"]))
print(f"medians of {runs} runs")
print("| policy | epoch s | samples/s | stall % | job stall % | imbalance p50 | imbalance p95 | hit ratio | speedup vs pytorch | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k, first in enumerate(reports[0]["results"]):
    rows = [r["results"][k] for r in reports]
    med = lambda f: statistics.median(f(r) for r in rows)
    print("| %s | %.2f | %.0f | %.1f | %.1f | %.3f | %.3f | %.3f | %s | %.0f |" % (
        first["policy"],
        med(lambda r: sum(r["epoch_seconds"]) / len(r["epoch_seconds"])),
        med(lambda r: r["samples_per_second"]),
        100 * med(lambda r: r["stall_fraction"]),
        100 * med(lambda r: r["job_stall_fraction"]),
        med(lambda r: r["imbalance_p50"]),
        med(lambda r: r["imbalance_p95"]),
        med(lambda r: r["hit_ratio"]),
        "%.2fx" % med(lambda r: r["speedup_vs_pytorch"]) if first["speedup_vs_pytorch"] is not None else "-",
        med(lambda r: r["peak_rss_bytes"]) / 2**20,
    ))
PY
rm -rf "$out"
