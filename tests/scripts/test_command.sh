#!/usr/bin/env bash
# The test command always tests: after the README's first command (scripts/main.sh
# configures build/ without tests), the second's configure (scripts/test.sh, the ci preset)
# turns them on again, and every test preset fails on zero tests. Configures a scratch copy of
# the presets' binary folder only; builds nothing.
set -uo pipefail
src=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

grep -q '^cmake --preset release -DPOLYPROBE_BUILD_TESTS=OFF$' "$src/scripts/main.sh" ||
  fail "scripts/main.sh no longer configures as this test assumes"
configure=$(grep -E '^cmake --preset (ci|asan)' "$src/scripts/test.sh")
[[ $(grep -c . <<< "$configure") == 2 ]] || fail "scripts/test.sh: expected the ci and asan configures"
grep -qv 'POLYPROBE_BUILD_TESTS=ON' <<< "$configure" &&
  fail "scripts/test.sh configures without -DPOLYPROBE_BUILD_TESTS=ON: $configure"

# The two configures in that order, into one folder, as the README's commands do.
cd "$src"
cmake --preset release -B "$scratch/build" -DPOLYPROBE_BUILD_TESTS=OFF > "$scratch/log" 2>&1 ||
  fail "main.sh's configure failed: $(tail -n 5 "$scratch/log")"
read -r -a args <<< "$(grep -E '^cmake --preset ci' scripts/test.sh | sed 's/^cmake //')"
cmake "${args[@]}" -B "$scratch/build" > "$scratch/log" 2>&1 ||
  fail "test.sh's configure failed: $(tail -n 5 "$scratch/log")"
grep -q '^POLYPROBE_BUILD_TESTS:BOOL=ON$' "$scratch/build/CMakeCache.txt" ||
  fail "after main.sh then test.sh, POLYPROBE_BUILD_TESTS is $(grep POLYPROBE_BUILD_TESTS "$scratch/build/CMakeCache.txt")"
tests=$(ctest --test-dir "$scratch/build" -N | sed -n 's/^Total Tests: //p')
((tests > 0)) || fail "no tests configured after main.sh then test.sh"

# Every test preset fails when it finds no test.
presets=$(sed -n '/"testPresets"/,$p' CMakePresets.json | grep -c '"name"')
actions=$(sed -n '/"testPresets"/,$p' CMakePresets.json | grep -c '"noTestsAction": "error"')
((presets > 0 && presets == actions)) || fail "$actions of $presets test presets fail on zero tests"
mkdir "$scratch/empty"
printf 'cmake_minimum_required(VERSION 3.25)\nproject(empty NONE)\nenable_testing()\n' \
  > "$scratch/empty/CMakeLists.txt"
cmake -S "$scratch/empty" -B "$scratch/empty/build" > /dev/null 2>&1 || fail "empty project"
ctest --test-dir "$scratch/empty/build" --no-tests=error > /dev/null 2>&1 &&
  fail "ctest --no-tests=error passed with zero tests"
echo "the test command configures its tests ($tests entries before discovery)"
