#!/usr/bin/env bash
# Parallel efficiency of `polyprobe bench scale` (docs/scale.md): complete steps at train's
# radii of mlp256-full and mnist64-full, N ranks x 1 thread (mpirun) against 1 rank x N threads,
# both against 1 rank x 1 thread, in one script on one machine. Prints one table.
# usage: scripts/bench-scale.sh POLYPROBE "1 2" [REPEATS] [FINISHES] [HYBRIDS] [BALANCES] [WAITS]
#   here (2 cores):            scripts/bench-scale.sh build/bin/polyprobe "1 2"
#   the GPU machine (16 cores): scripts/bench-scale.sh build/bin/polyprobe "1 2 4 8 16" 15 \
#                                 sharded,gathered "2x8 4x4"
# FINISHES (default sharded,gathered): how the ranks finish a step (bench scale --scale-finish);
# each gives its own N-ranks row. HYBRIDS (default none): "RxT" runs of R ranks x T threads
# (sharded finish), each a row at R T cores. BALANCES (default auto): what the ranks' slices are
# balanced by (bench scale --scale-balance: auto, cpu and/or wall), each its own row. WAITS
# (default auto): how the ranks wait for each other (--scale-waits: auto, poll and/or pause),
# each its own row, alternated within each run.
# With BENCH_SCALE_JSON=DIR set, the runs' JSON records are copied into DIR. The last two rows are
# the machine's ceiling: the largest count of independent one-thread processes stepping at once,
# the median one's step and the slowest one's (their iqr column: the spread between the copies'
# medians).
set -euo pipefail
polyprobe=$(realpath "$1")
counts=${2:-"1 2"}
repeats=${3:-7}
finishes=${4:-sharded,gathered}
hybrids=${5:-}
balances=${6:-auto}
waits=${7:-auto}
out=$(mktemp -d)
trap '[[ -n ${BENCH_SCALE_JSON:-} ]] && mkdir -p "$BENCH_SCALE_JSON" && cp "$out"/*.json "$BENCH_SCALE_JSON"/; rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench=(bench scale --repeats "$repeats" --quiet)
# R ranks x T threads into FILE: each rank bound to T cores when there are enough.
ranks() {
  local r=$1 t=$2 file=$3 finish=$4
  local bind=(--bind-to core --map-by "slot:PE=$t")
  ((r * t > $(nproc))) && bind=(--oversubscribe --bind-to none)
  mpirun "${bind[@]}" -np "$r" "$polyprobe" "${bench[@]}" --scale-threads "$t" \
    --scale-finish "$finish" --scale-balance "$balances" --scale-waits "$waits" \
    --json "$file" >/dev/null
}
for n in $counts; do
  # One process, n threads.
  "$polyprobe" "${bench[@]}" --scale-threads "$n" --json "$out/threads-$n.json" >/dev/null
  ranks "$n" 1 "$out/ranks-$n.json" "$finishes"
done
for h in $hybrids; do
  ranks "${h%x*}" "${h#*x}" "$out/hybrid-$h.json" sharded
done
# The machine's own ceiling: as many independent one-thread processes as the most ranks, each
# stepping the whole workload at once, one a core, with nothing exchanged. Shared caches, memory
# bandwidth and clocks slow each of them; no cut of the work between ranks can beat that.
most=$(tr ' ' '\n' <<<"$counts" | sort -n | tail -1)
if ((most > 1 && most <= $(nproc))); then
  for ((i = 0; i < most; i++)); do
    taskset -c "$i" "$polyprobe" "${bench[@]}" --json "$out/copy-$i.json" >/dev/null &
  done
  wait
fi
python3 - "$out" "$counts" "$hybrids" "$most" <<'PY'
import json, os, sys, statistics
out, counts, hybrids = sys.argv[1], [int(c) for c in sys.argv[2].split()], sys.argv[3].split()
most = int(sys.argv[4])
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return {(r["workload"], r["path"]): r for r in json.load(f)["records"]}
base = {w: r for (w, _), r in load("threads-1").items()}
rows = [("workload", "cores", "how", "median ms", "iqr ms", "efficiency", "imbalance", "step imbalance", "cpu imbalance",
         "all-gather ms", "rest ms")]
for w in base:
    runs = [(n, "threads", f"threads-{n}") for n in counts] + \
           [(n, "ranks", f"ranks-{n}") for n in counts]
    runs.sort(key=lambda run: (run[0], run[1] == "ranks"))
    runs += [(int(h.split("x")[0]) * int(h.split("x")[1]), "hybrid", f"hybrid-{h}")
             for h in hybrids]
    for n, kind, name in runs:
        for (workload, path), r in load(name).items():
            if workload != w:
                continue
            cell = lambda k: f"{r[k]:.2f}" if k in r else "-"
            if kind == "threads":
                how = f"1 rank x {n} threads"
            elif kind == "ranks":
                how = f"{n} ranks x 1 thread, "
                how += "gathered" if "gathered-finish" in path else "sharded"
            else:
                how = f"{r['ranks']} ranks x {r['threads']} threads, sharded"
            # What the run asked for beyond the defaults: a balance clock, a way to wait.
            how += "".join(", " + x for x in path.split("+")[1:] if x != "gathered-finish")
            efficiency = base[w]["median_ms"] / (n * r["median_ms"])
            rows.append((w, str(n), how, cell("median_ms"), cell("iqr_ms"),
                         f"{100 * efficiency:.0f}%", cell("imbalance"), cell("step_imbalance"), cell("cpu_imbalance"),
                         cell("allgather_ms"), cell("rest_ms")))
    copies = [os.path.join(out, f"copy-{i}.json") for i in range(most)]
    if most > 1 and all(os.path.exists(c) for c in copies):
        medians = [r["median_ms"] for c in copies for r in json.load(open(c))["records"]
                   if r["workload"] == w]
        # The median copy is what a core gives when most are busy; the slowest copy is what a
        # step that waits for every rank is paced by wherever slow cores are not the same ones
        # from step to step (a slice balancer can only shift work off cores that stay slow).
        for what, m in (("median", statistics.median(medians)), ("slowest", max(medians))):
            rows.append((w, str(most), f"{most} copies x 1 thread, nothing exchanged: {what} copy",
                         f"{m:.2f}", f"{max(medians) - min(medians):.2f}",
                         f"{100 * base[w]['median_ms'] / m:.0f}%", "-", "-", "-", "-", "-"))
width = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
for r in rows:
    print("  ".join(c.ljust(width[i]) if i < 3 else c.rjust(width[i]) for i, c in enumerate(r)))
PY
