#!/usr/bin/env bash
# The factored_correction operation (the factored_subspace plugin's x B^T for evaluators)
# against each evaluator's own products, one per direction: `polyprobe bench step` on the
# factored workloads with the operation and with --no-operation factored_correction,
# alternated ROUNDS times in one script, then one table of the medians of their medians.
# Complete steps at train's radii (step@train) beside candidate evaluation alone, and the
# incumbent phase of the last step (the forward and x B^T), both in ms.
# usage: scripts/bench-factored.sh POLYPROBE [WORKLOADS] [THREADS] [ROUNDS] [DEVICE]
#   here:        scripts/bench-factored.sh build/bin/polyprobe
#   on the GPU:  scripts/bench-factored.sh build/bin/polyprobe \
#                  mnist128-factored-r2,mnist128-factored-r32,wide-factored-r64 1 3 cuda
set -euo pipefail
polyprobe=$(realpath "$1")
workloads=${2:-mnist128-factored-r2,mnist128-factored-r32,wide-factored-r64}
threads=${3:-1,all}
rounds=${4:-3}
device=${5:-cpu}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bench=(bench step --workloads "$workloads" --bench-threads "$threads" --bench-device "$device"
  --bench-backend "$([[ $device == cuda ]] && echo cuda || echo cpu_tbb)"
  --regimes evaluation,step@train --no-peak --repeats 7 --parity-sample 64 --quiet)
for ((i = 0; i < rounds; ++i)); do
  "$polyprobe" "${bench[@]}" --json "$out/with-$i.json" >/dev/null
  "$polyprobe" "${bench[@]}" --no-operation factored_correction --json "$out/without-$i.json" \
    >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for arm in ("with", "without"):
    for i in range(rounds):
        for r in json.load(open(f"{out}/{arm}-{i}.json"))["records"]:
            if r["suite"] != "step":
                continue
            key = (r["workload"], r["threads"], r["path"])
            slot = rows.setdefault(key, {"with": [], "without": [], "inc": {"with": [], "without": []}})
            slot[arm].append(r["median_ms"])
            inc = (r.get("last_call_ms") or {}).get("incumbent")
            if inc is not None:
                slot["inc"][arm].append(inc)
med = lambda v: statistics.median(v) if v else float("nan")
print(f"{'workload':24} {'threads':>7} {'what':16} {'operation ms':>13} {'own products ms':>16} "
      f"{'ratio':>6} {'incumbent ms (op / own)':>24}")
for (w, t, p), s in sorted(rows.items()):
    a, b = med(s["with"]), med(s["without"])
    inc = s["inc"]
    extra = f"{med(inc['with']):.3f} / {med(inc['without']):.3f}" if inc["with"] else "-"
    print(f"{w:24} {t:>7} {p:16} {a:13.3f} {b:16.3f} {b / a:6.2f} {extra:>24}")
print(f"(medians over {rounds} alternated rounds of each run's median of 7 calls; ratio = own / operation)")
PY
