#!/usr/bin/env bash
# Runs clang-tidy (checks in .clang-tidy) on the first-party sources of a configured build
# (its compile_commands.json); fails on any finding.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mapfile -t files < <(git ls-files 'core/*.cpp' 'apps/*.cpp' 'plugins/*.cpp')
log=$(mktemp)
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet --warnings-as-errors='*' >"$log" 2>&1
status=$?
grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated|^Suppressed|^Use -header-filter|^$' "$log"
rm -f "$log"
if ((status != 0)); then echo "clang-tidy: findings above"; exit 1; fi
echo "clang-tidy: ${#files[@]} files clean"
