#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each one for SECONDS
# (default 20), starting from its committed corpus in fuzz/corpus/<target>/. New inputs go to
# a scratch corpus in the build folder; a crash leaves crash-* files there and fails the run.
#
#   fuzz/run.sh 20                      # CI: ~20 s per target
#   POLYPROBE_FUZZ_BUILD=/tmp/f fuzz/run.sh 300
set -euo pipefail
seconds=${1:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${POLYPROBE_FUZZ_BUILD:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++-14}
cc=${CC_FUZZ:-clang-14}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DPOLYPROBE_FUZZ=ON \
  -DPOLYPROBE_BUILD_TESTS=OFF -DPOLYPROBE_CUDA=OFF -DPOLYPROBE_WERROR=OFF >/dev/null
targets=(csv idx model_file safetensors)
cmake --build "$build" --target "${targets[@]/#/fuzz_}"

status=0
for target in "${targets[@]}"; do
  scratch="$build/fuzz-corpus/$target"
  artifacts="$build/fuzz-artifacts/$target"
  mkdir -p "$scratch" "$artifacts"
  echo "== fuzz_$target for ${seconds}s"
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$build/bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$scratch" "$root/fuzz/corpus/$target"; then
    echo "fuzz_$target FAILED: see $artifacts" >&2
    status=1
  fi
done
exit $status
