#!/usr/bin/env bash
# Runs the cuda plugin's tests on a machine with a GPU, from the repository root of an
# already-built tree (default build/, or $1): the conformance suite, the Cheri block kernels'
# parity test, candidate_autocast's rank test, then a short
# `polyprobe train --device cuda` smoke run. Prints one summary line; exits non-zero when
# anything failed or was skipped (a skip here means the GPU was not usable).
set -uo pipefail
build=${1:-build}
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true

"$build/bin/test_cuda" --durations yes >"$log/test.txt" 2>&1
test_rc=$?
tail -n 30 "$log/test.txt"

"$build/bin/test_cuda_cheri" --durations yes >"$log/cheri.txt" 2>&1
cheri_rc=$?
tail -n 12 "$log/cheri.txt"

"$build/bin/test_cuda_autocast" --durations yes >"$log/autocast.txt" 2>&1
autocast_rc=$?
tail -n 12 "$log/autocast.txt"

"$build/bin/polyprobe" plugins >"$log/plugins.txt" 2>&1
grep -A3 -i "cuda" "$log/plugins.txt" | head -8

# The embedded default run, on the GPU, kept short.
"$build/bin/polyprobe" train --device cuda --epochs 1 --time-limit 120 >"$log/train.txt" 2>&1
train_rc=$?
tail -n 8 "$log/train.txt"

verdict() { case $1 in 0) echo ok ;; 77) echo skipped ;; *) echo "FAILED($1)" ;; esac; }
summary=$(grep -E "^(All tests passed|test cases:)" "$log/test.txt" | tail -1)
cheri=$(grep -E "^(All tests passed|test cases:)" "$log/cheri.txt" | tail -1)
autocast=$(grep -E "^(All tests passed|test cases:)" "$log/autocast.txt" | tail -1)
echo "cuda device tests: conformance $(verdict $test_rc) [${summary:-no summary}];" \
     "cheri kernels $(verdict $cheri_rc) [${cheri:-no summary}];" \
     "autocast $(verdict $autocast_rc) [${autocast:-no summary}];" \
     "train --device cuda $(verdict $train_rc); logs in $log"
[[ $test_rc -eq 0 && $cheri_rc -eq 0 && $autocast_rc -eq 0 && $train_rc -eq 0 ]]
