#!/usr/bin/env bash
# Complete optimizer steps on the CPU beside the PyTorch reference, in one script, and one
# table (docs/benchmarks.md, "Complete optimizer steps").
#
#   scripts/bench-step-cpu.sh [THREADS] [WORKLOADS] [OUT_DIR]
#     THREADS    comma list for both sides (default 1,2)
#     WORKLOADS  comma list of bench step workloads (default: the five of the reference)
#     OUT_DIR    where step.json, torch.json (and before.json) go (default bench-step-out)
#   Environment: POLYPROBE (default build/bin/polyprobe), BEFORE (another polyprobe binary,
#   timed the same way as a "before" column), TORCH_REF (default bench/torch_step.py, the
#   PyTorch step reference), PYTHON (default /usr/bin/python3, which has PyTorch),
#   REPEATS (timed steps per record, default 7).
#   Debian 12: apt-get install python3-torch libopenblas0-openmp (scripts/install-deps.sh
#   --test). Without OpenBLAS torch calls the netlib reference BLAS, about 30x slower, and the
#   script stops before timing anything (bench/blas_check.py).
#
# Columns: median wall ms per complete step (and, at 1 thread, the calling thread's CPU ms)
# for evaluation, step@reference and step@train, and PyTorch's best structured method at the
# same thread count (its cost does not depend on the radius), with the speed-ups.
set -euo pipefail
threads=${1:-1,2}
workloads=${2:-mlp64-full,mlp256-full,mlp256-sub512,mnist128-sub256,mnist64-full}
out=${3:-bench-step-out}
polyprobe=${POLYPROBE:-build/bin/polyprobe}
torch_ref=${TORCH_REF:-$(dirname "$0")/../bench/torch_step.py}
python=${PYTHON:-/usr/bin/python3}
repeats=${REPEATS:-7}
mkdir -p "$out"
# No ratio against the reference BLAS: it would be inflated about 30x.
"$python" "$(dirname "$0")/../bench/blas_check.py" ||
  { echo "bench-step-cpu.sh: PyTorch's BLAS is the reference one (above); no table" >&2; exit 1; }
"$polyprobe" bench step --quiet --workloads "$workloads" --bench-threads "$threads" --no-peak \
  --repeats "$repeats" --json "$out/step.json" > /dev/null
if [[ -n "${BEFORE:-}" ]]; then
  "$BEFORE" bench step --quiet --workloads "$workloads" --bench-threads "$threads" --no-peak \
    --repeats "$repeats" --json "$out/before.json" > /dev/null
fi
"$python" "$torch_ref" --workloads "$workloads" --methods structured --threads "$threads" \
  --repeats "$repeats" --json "$out/torch.json" > "$out/torch.log"
# The reference's own warnings, passed on.
grep -h "WARNING" "$out/torch.log" >&2 || true
"$python" - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def records(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    doc = json.load(open(path))
    return doc["records"] if isinstance(doc, dict) else doc
def index(recs):
    table = {}
    for r in recs:
        if r.get("suite") != "step" or r.get("median_ms") is None:
            continue
        regime = r.get("regime", r.get("path"))
        if r.get("path") in ("sparse", "subspace-delta", "site-local", "dense", "auto") and "regime" not in r:
            regime = "evaluation"
        table[(r["workload"], regime, int(r["threads"]))] = r
    return table
ours, before = index(records("step.json")), index(records("before.json"))
torch = {}
for r in records("torch.json"):
    key = (r["workload"], int(r["threads"]))
    if r.get("median_ms") is not None and (key not in torch or r["median_ms"] < torch[key]["median_ms"]):
        torch[key] = r
rows = sorted({(w, t) for (w, _, t) in ours})
print("| workload | threads | regime | %smedian ms | 1-thread CPU ms | PyTorch best ms (method) | speed-up |"
      % ("before ms | " if before else ""))
print("|---|---|---|%s---|---|---|---|" % ("---|" if before else ""))
for w, t in rows:
    for regime in ("evaluation", "step@reference", "step@train"):
        r = ours.get((w, regime, t))
        if r is None:
            continue
        b = before.get((w, regime, t))
        ref = torch.get((w, t))
        cpu = r.get("thread_cpu_median_ms")
        cells = [w, str(t), regime]
        if before:
            cells.append("%.3g" % b["median_ms"] if b else "-")
        cells.append("%.3g (IQR %.2g)" % (r["median_ms"], r.get("iqr_ms", float("nan"))))
        cells.append("%.3g" % cpu if cpu is not None else "-")
        cells.append("%.3g (%s)" % (ref["median_ms"], ref["path"]) if ref else "-")
        cells.append("%.2fx" % (ref["median_ms"] / r["median_ms"]) if ref else "-")
        print("| " + " | ".join(cells) + " |")
PY
