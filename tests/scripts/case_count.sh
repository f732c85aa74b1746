#!/usr/bin/env bash
# Every Catch2 case reaches ctest as exactly one entry: the names the test binaries list are
# the names ctest runs, as many. (catch_discover_tests splits a name holding ';' into two
# filters that match nothing, so such a case would never run.)
set -uo pipefail
build=$1
shift
ctest_names=$(ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: //p')
catch_names=$(for bin in "$@"; do "$bin" --list-test-names-only | sed '/^$/d'; done)
listed=$(grep -c . <<< "$catch_names")
run=$(grep -cxFf <(printf '%s\n' "$catch_names") <<< "$ctest_names")
missing=$(grep -vxFf <(printf '%s\n' "$ctest_names") <<< "$catch_names")
if [[ -n $missing ]]; then
  echo "FAIL: Catch2 cases that ctest never runs (a name with ';'?):" >&2
  printf '  %s\n' "$missing" >&2
  exit 1
fi
((listed == run)) || { echo "FAIL: the binaries list $listed cases, ctest runs $run" >&2; exit 1; }
echo "ctest runs all $listed Catch2 cases of $# binaries"
