#!/usr/bin/env bash
# Thread scaling of complete optimizer steps, one table (docs/benchmarks.md, "Every core"):
# `bench step` on mlp256-full (step@reference, step@train) and two Fashion-MNIST training runs
# (the recommended examples/configs/fashion-mnist.ini, a cnn, and the MLP of
# fashion-mnist-mlp.ini; steps timed from the metrics file, validation off) at each thread
# count, with the speed-up over one thread.
#
#   scripts/bench-threads.sh [THREADS] [SECONDS] [OUT_DIR]
#     THREADS  comma list (default 1,2,4,8,16)
#     SECONDS  training time per thread count (default 30)
#     OUT_DIR  default bench-threads-out
#   Environment: POLYPROBE (default build/bin/polyprobe), PYTHON (default python3).
set -euo pipefail
threads=${1:-1,2,4,8,16}
seconds=${2:-30}
out=${3:-bench-threads-out}
polyprobe=${POLYPROBE:-build/bin/polyprobe}
python=${PYTHON:-python3}
mkdir -p "$out"
"$polyprobe" bench step --quiet --workloads mlp256-full --bench-threads "$threads" --no-peak \
  --regimes step@reference,step@train --repeats 9 --json "$out/step.json" > /dev/null
for config in fashion-mnist fashion-mnist-mlp; do
  for t in ${threads//,/ }; do
    "$polyprobe" train --quiet --config "examples/configs/$config.ini" --threads "$t" \
      --time-limit "$seconds" --validate-every 1000000 --metrics "$out/$config-$t.jsonl" > /dev/null
  done
done
"$python" - "$out" "$threads" <<'PY'
import json, os, statistics, sys
out, threads = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
steps = {}
for r in json.load(open(os.path.join(out, "step.json")))["records"]:
    if r.get("suite") == "step" and r.get("regime") in ("step@reference", "step@train"):
        steps[(r["regime"], int(r["threads"]))] = r["median_ms"]
def step_ms(config, t):
    seconds = [json.loads(line)["seconds"] for line in open(os.path.join(out, "%s-%d.jsonl" % (config, t)))
               if '"split"' not in line and '"seconds"' in line]
    gaps = [1e3 * (b - a) for a, b in zip(seconds, seconds[1:])][5:]  # after the warm-up
    return statistics.median(gaps) if gaps else float("nan")
fashion = {(c, t): step_ms(c, t) for c in ("fashion-mnist", "fashion-mnist-mlp") for t in threads}
rows = [("mlp256-full step@reference", lambda t: steps.get(("step@reference", t))),
        ("mlp256-full step@train", lambda t: steps.get(("step@train", t))),
        ("fashion-mnist.ini (cnn) train step", lambda t: fashion.get(("fashion-mnist", t))),
        ("fashion-mnist-mlp.ini train step", lambda t: fashion.get(("fashion-mnist-mlp", t)))]
print("| median ms per step | " + " | ".join("%d thr" % t for t in threads) + " | speed-up at %d |" % threads[-1])
print("|---|" + "---|" * (len(threads) + 1))
for name, get in rows:
    values = [get(t) for t in threads]
    cells = ["%.3g" % v if v else "-" for v in values]
    speed = "%.2fx" % (values[0] / values[-1]) if values[0] and values[-1] else "-"
    print("| %s | %s | %s |" % (name, " | ".join(cells), speed))
PY
