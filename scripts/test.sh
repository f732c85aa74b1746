#!/usr/bin/env bash
# Every check CI runs, on a fresh Debian 12 machine (as root): install what is missing,
# then a Release build with warnings as errors and all tests, the same under AddressSanitizer
# and UndefinedBehaviorSanitizer, the formatting and clang-tidy checks, and each fuzzer for
# a bounded time. Stops at the first failure. About 45 to 57 minutes on 2 cores from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
source scripts/sanitizer-env.sh
step() { printf '\n==== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "format check"
bash scripts/check-format.sh

step "release build"
# build/ may hold another configuration (scripts/main.sh turns the tests off): set it again.
cmake --preset ci -DPOLYPROBE_BUILD_TESTS=ON
cmake --build --preset ci
step "release tests"
ctest --preset ci

step "clang-tidy"
bash scripts/check-tidy.sh build

step "sanitizer build (ASan + UBSan)"
cmake --preset asan -DPOLYPROBE_BUILD_TESTS=ON
cmake --build --preset asan
step "sanitizer tests"
ctest --preset asan

if [[ -x fuzz/run.sh ]]; then
  step "fuzzing"
  bash fuzz/run.sh "${POLYPROBE_FUZZ_SECONDS:-20}"
fi
step "all checks passed"
