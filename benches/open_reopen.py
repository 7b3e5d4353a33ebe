# Second opens of D in fresh processes, alternated: the old code's encoded-only reopen
# (`lobster index --open-only`), this code's encoded-only reopen (`lobster-bench plan-bench
# --open D`) and with the decoded tier's headers (`--decoded`). Wall time as each prints it, and the
# child's CPU time (user + system, from getrusage). Each binary keeps its tables in its own
# cache directory (the two table formats differ); open D once with each first.
#
#   python3 benches/open_reopen.py D RUNS OLD_LOBSTER NEW_LOBSTER_BENCH
import os, resource, statistics as st, subprocess, sys
D, runs, OLD, NEW = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cmds = {
    'old_encoded': ([OLD, 'index', '--open-only', '--data', D], '/tmp/lobster-open-old'),
    'new_encoded': ([NEW, 'plan-bench', '--open', D], '/tmp/lobster-open-new'),
    'new_decoded': ([NEW, 'plan-bench', '--open', D, '--decoded'], '/tmp/lobster-open-new'),
}
wall = {k: [] for k in cmds}; cpu = {k: [] for k in cmds}
for i in range(runs):
    for k, (cmd, cache) in cmds.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, env=dict(os.environ, XDG_CACHE_HOME=cache), capture_output=True, text=True, check=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall[k].append(float(out.split()[0]))
        cpu[k].append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
for name, d in [('wall s', wall), ('cpu s', cpu)]:
    for k, v in d.items():
        print(f'{name:6} {k:12} median {st.median(v):.4f}  min {min(v):.4f}  max {max(v):.4f}')
    m = {k: st.median(v) for k, v in d.items()}
    print(f'{name:6} new_decoded / old_encoded {m["new_decoded"]/m["old_encoded"]:.3f}; new_encoded / old_encoded {m["new_encoded"]/m["old_encoded"]:.3f}; new_decoded / new_encoded {m["new_decoded"]/m["new_encoded"]:.3f}')
