#!/usr/bin/env bash
# `polyprobe bench attention` and PyTorch's native SDPA on the same shapes, one after the
# other in one script (docs/benchmarks.md, "Attention"): 16 candidates x batch 16, E = 64,
# 4 heads, L = 6, 64, 128, float32, one thread.
#   bash bench/attention.sh [BUILD_DIR] [REPEATS]   (records: BUILD_DIR/attention.json, torch_sdpa.json)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-7}
uptime
"$build/bin/polyprobe" bench attention --repeats "$repeats" --json "$build/attention.json"
/usr/bin/python3 bench/torch_sdpa.py --repeats "$repeats" --json "$build/torch_sdpa.json"
uptime
