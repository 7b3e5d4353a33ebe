#!/usr/bin/env bash
# fio against `lobster-bench read-bench` on the same file, alternating (and, O_DIRECT, alternating
# which of the two goes first), three runs each.
#
# Usage: benches/fio_compare.sh [FILE]
#   FILE     test file of a few GiB with real data (default /work/bench-data/f4g.bin);
#            create one with: dd if=/dev/urandom of=FILE bs=1M count=4096
#   env: SECONDS_PER_RUN (default 10), RUNS (default 3), CASES ("direct cached", the
#        default, or one of them), LOBSTER (the lobster-bench binary; default:
#        cargo build --release -p lobster-bench), CACHED_THREADS (threads on both sides in the
#        page-cache cases, default: the number of cores)
#
# read-bench runs caller-driven (`--threads N`, the reader's only way to read): N threads,
# each submitting to and reaping from its own ring (a lobster-uring Session) with depth 32,
# no thread in between, exactly like fio's N jobs. O_DIRECT cases: 1 read-bench thread against 1 fio job, each handing every
# new read to the kernel as soon as a completion is processed (fio's default
# iodepth_batch_submit=1; read-bench --submit-batch 1). Page-cache cases: read-bench submits
# once per reap (the copies happen in that system call), fio psync makes one call per read.
#
# Cases and targets (ratio = read-bench MB/s / fio MB/s, median over the alternating pairs):
#   O_DIRECT 128 KiB depth 32 vs fio io_uring      >= 0.95
#   O_DIRECT   4 KiB depth 32 vs fio io_uring      >= 0.90
#   page cache warm, 128 KiB and 4 KiB, depth 32   >= 0.90 of the better of fio io_uring
#     (numjobs=N, iodepth=32) and fio psync (numjobs=N), with N = CACHED_THREADS read-bench
#     threads (page-cache hits are copied inline by the thread that submits, so N threads
#     use N cores on both sides).
# O_DIRECT runs bypass the page cache; the page-cache runs read the whole file once first
# (cat) and run fio with --invalidate=0 so fio does not drop it.
set -euo pipefail
cd "$(dirname "$0")/.."

FILE=${1:-/work/bench-data/f4g.bin}
SECS=${SECONDS_PER_RUN:-10}
RUNS=${RUNS:-3}
THREADS=${CACHED_THREADS:-$(nproc)}
if [[ -z "${LOBSTER:-}" ]]; then
    cargo build --release -q -p lobster-bench
    LOBSTER="${CARGO_TARGET_DIR:-target}/release/lobster-bench"
fi
command -v fio >/dev/null || { echo "fio is not installed" >&2; exit 1; }
[[ -f "$FILE" ]] || { echo "no test file $FILE" >&2; exit 1; }

# MB/s (1e6 bytes) of one fio run.
fio_mb() {
    fio --name=cmp --filename="$FILE" --rw=randread --runtime="$SECS" --time_based \
        --group_reporting --output-format=json "$@" 2>/dev/null |
        python3 -c 'import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index("{"):])
print(sum(job["read"]["bw_bytes"] for job in j["jobs"]) / 1e6)'
}

rb_mb() {
    "$LOBSTER" read-bench --file "$FILE" --seconds "$SECS" --backend uring --json "$@" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["mb_per_s"])'
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
pass() { python3 -c "print('PASS' if $1 >= $2 else 'FAIL')"; }

echo "fio_compare: $FILE, $SECS s per run, $RUNS alternating runs each, read-bench caller-driven (1 thread O_DIRECT, $THREADS threads page cache, depth 32 each; fio numjobs the same), $(date -u +%FT%TZ)"
echo "kernel $(uname -r), $(nproc) cores, fio $(fio --version)"
summary=()

direct_case() { # bs target
    local bs=$1 target=$2 fios=() rbs=() ratios=()
    for ((i = 1; i <= RUNS; i++)); do
        # Alternating which goes first, so that neither always meets the device fresh.
        if ((i % 2)); then
            f=$(fio_mb --bs="$bs" --iodepth=32 --direct=1 --ioengine=io_uring)
            r=$(rb_mb --bs "$bs" --depth 32 --direct --threads 1 --submit-batch 1)
        else
            r=$(rb_mb --bs "$bs" --depth 32 --direct --threads 1 --submit-batch 1)
            f=$(fio_mb --bs="$bs" --iodepth=32 --direct=1 --ioengine=io_uring)
        fi
        fios+=("$f"); rbs+=("$r"); ratios+=("$(ratio "$r" "$f")")
        printf '  O_DIRECT %-5s run %d: fio io_uring %8.1f MB/s  read-bench %8.1f MB/s  ratio %s\n' "$bs" "$i" "$f" "$r" "${ratios[-1]}"
    done
    local m; m=$(median "${ratios[@]}")
    summary+=("$(printf 'O_DIRECT %-5s depth 32: fio %8.1f MB/s, read-bench %8.1f MB/s, median ratio %s (target %s) %s' \
        "$bs" "$(median "${fios[@]}")" "$(median "${rbs[@]}")" "$m" "$target" "$(pass "$m" "$target")")")
}

cached_case() { # bs target
    local bs=$1 target=$2 fus=() fps=() rbs=() ratios=()
    for ((i = 1; i <= RUNS; i++)); do
        fu=$(fio_mb --bs="$bs" --iodepth=32 --ioengine=io_uring --numjobs="$THREADS" --invalidate=0)
        fp=$(fio_mb --bs="$bs" --ioengine=psync --numjobs="$THREADS" --invalidate=0)
        r=$(rb_mb --bs "$bs" --depth 32 --threads "$THREADS")
        best=$(python3 -c "print(max($fu, $fp))")
        fus+=("$fu"); fps+=("$fp"); rbs+=("$r"); ratios+=("$(ratio "$r" "$best")")
        printf '  cached   %-5s run %d: fio io_uring x%d %8.1f  psync x%d %8.1f  read-bench x%d %8.1f MB/s  ratio %s\n' \
            "$bs" "$i" "$THREADS" "$fu" "$THREADS" "$fp" "$THREADS" "$r" "${ratios[-1]}"
    done
    local m; m=$(median "${ratios[@]}")
    summary+=("$(printf 'cached   %-5s depth 32: fio io_uring x%d %8.1f, psync x%d %8.1f, read-bench x%d %8.1f MB/s, median ratio %s (target %s) %s' \
        "$bs" "$THREADS" "$(median "${fus[@]}")" "$THREADS" "$(median "${fps[@]}")" "$THREADS" "$(median "${rbs[@]}")" "$m" "$target" "$(pass "$m" "$target")")")
}

cases=" ${CASES:-direct cached} "
if [[ $cases == *" direct "* ]]; then
    direct_case 128k 0.95
    direct_case 4k 0.90
fi
if [[ $cases == *" cached "* ]]; then
    cat "$FILE" >/dev/null # warm the page cache
    cached_case 128k 0.90
    cached_case 4k 0.90
fi

echo
printf '%s\n' "${summary[@]}"
