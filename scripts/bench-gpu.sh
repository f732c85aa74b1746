#!/usr/bin/env bash
# The GPU benchmark in one script: polyprobe's cuda backend (candidate evaluation and complete
# steps at the reference's and at train's radius) and the PyTorch baseline (bench/torch_step.py,
# its structured method eager and under CUDA graphs) on the same GPU, one after the other, then
# one table side by side (scripts/gpu_table.py), after the GPU's measured ceilings
# (scripts/gpu_peak.py) that a path's floor divides by. Needs a built tree with the cuda plugin and a
# python3 with PyTorch 2.x and CUDA.
#
#   usage: scripts/bench-gpu.sh [BUILD_DIR] [OUT_DIR] [REPEATS] [WORKLOADS]
#   e.g.   scripts/bench-gpu.sh build /tmp/gpu 9
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-bench-gpu-out}
repeats=${3:-9}
workloads=${4:-mlp64-full,mlp256-full,mlp256-sub512,mnist128-sub256,mnist64-full,mnist128-rank8}
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm \
  --format=csv,noheader | tee "$out/gpu.txt"
echo "== the GPU's ceilings (float32 FLOP/s, copy bandwidth)"
python3 scripts/gpu_peak.py --json "$out/peak.json"
threads=$(nproc)
echo "== polyprobe bench step (cuda, $threads host threads)"
"$build/bin/polyprobe" bench step --bench-backend cuda --bench-device cuda --no-peak \
  --repeats "$repeats" --bench-threads "$threads" --workloads "$workloads" \
  --json "$out/polyprobe.json" >"$out/polyprobe.txt"
echo "== PyTorch baseline (bench/torch_step.py, structured method, eager and CUDA graphs)"
torch_workloads=$(echo "$workloads" | tr ',' '\n' | grep -v rank8 | paste -sd, -)
python3 bench/torch_step.py --device cuda --methods structured --repeats "$repeats" \
  --workloads "$torch_workloads" --json "$out/torch.json" >"$out/torch.txt"
python3 scripts/gpu_table.py "$out/polyprobe.json" "$out/torch.json" | tee "$out/table.md"
