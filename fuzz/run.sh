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

# Each fuzzer's own output (its dictionaries and coverage lines: thousands of lines) goes to
# a log beside its artifacts; the run prints one line per fuzzer, and the log's tail when one
# fails.
source "$root/scripts/sanitizer-env.sh"
status=0
for target in "${targets[@]}"; do
  scratch="$build/fuzz-corpus/$target"
  artifacts="$build/fuzz-artifacts/$target"
  log="$build/fuzz-logs/$target.log"
  mkdir -p "$scratch" "$artifacts" "$(dirname "$log")"
  if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$build/bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$scratch" "$root/fuzz/corpus/$target" > "$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    added=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -n 1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
    corpus=$(find "$scratch" -type f | wc -l)
    printf 'fuzz_%-12s ok: %s runs in %ss, %s new inputs (scratch corpus %s), peak RSS %s MB\n' \
      "$target" "${runs:-?}" "$seconds" "${added:-?}" "$corpus" "${rss:-?}"
  else
    echo "fuzz_$target FAILED: the last lines of $log (crash inputs in $artifacts):" >&2
    tail -n 60 "$log" >&2
    status=1
  fi
done
exit $status
