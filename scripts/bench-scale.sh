#!/usr/bin/env bash
# Parallel efficiency of `polyprobe bench scale` (docs/scale.md): complete steps at train's
# radii of mlp256-full and mnist64-full, N ranks x 1 thread (mpirun) against 1 rank x N threads,
# both against 1 rank x 1 thread, in one script on one machine. Prints one table.
# usage: scripts/bench-scale.sh POLYPROBE "1 2" [REPEATS] [FINISHES]
#   here (2 cores):            scripts/bench-scale.sh build/bin/polyprobe "1 2"
#   the GPU machine (16 cores): scripts/bench-scale.sh build/bin/polyprobe "1 2 4 8 16"
# FINISHES (default sharded,gathered): how the ranks finish a step (bench scale --scale-finish);
# each gives its own N-ranks row.
set -euo pipefail
polyprobe=$(realpath "$1")
counts=${2:-"1 2"}
repeats=${3:-7}
finishes=${4:-sharded,gathered}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench=(bench scale --repeats "$repeats" --quiet)
for n in $counts; do
  # One process, n threads.
  "$polyprobe" "${bench[@]}" --scale-threads "$n" --json "$out/threads-$n.json" >/dev/null
  # n processes, 1 thread each, each bound to its own core when there are enough.
  bind=(--bind-to core)
  ((n > $(nproc))) && bind=(--oversubscribe --bind-to none)
  mpirun "${bind[@]}" -np "$n" "$polyprobe" "${bench[@]}" --scale-threads 1 \
    --scale-finish "$finishes" --json "$out/ranks-$n.json" >/dev/null
done
python3 - "$out" $counts <<'PY'
import json, os, sys
out, counts = sys.argv[1], [int(c) for c in sys.argv[2:]]
def load(kind, n):
    with open(os.path.join(out, f"{kind}-{n}.json")) as f:
        return {(r["workload"], r["path"]): r for r in json.load(f)["records"]}
base = {w: r for (w, _), r in load("threads", 1).items()}
rows = [("workload", "cores", "how", "median ms", "iqr ms", "efficiency", "imbalance",
         "all-gather ms", "rest ms")]
for w in base:
    for n in counts:
        for kind in ("threads", "ranks"):
            for (workload, path), r in load(kind, n).items():
                if workload != w:
                    continue
                cell = lambda k: f"{r[k]:.2f}" if k in r else "-"
                how = f"1 rank x {n} threads" if kind == "threads" else f"{n} ranks x 1 thread"
                if kind == "ranks":
                    how += ", gathered" if path.endswith("gathered-finish") else ", sharded"
                efficiency = base[w]["median_ms"] / (n * r["median_ms"])
                rows.append((w, str(n), how, cell("median_ms"), cell("iqr_ms"),
                             f"{100 * efficiency:.0f}%", cell("imbalance"), cell("allgather_ms"),
                             cell("rest_ms")))
width = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
for r in rows:
    print("  ".join(c.ljust(width[i]) if i < 3 else c.rjust(width[i]) for i, c in enumerate(r)))
PY
