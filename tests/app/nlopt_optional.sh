#!/usr/bin/env bash
# usage: nlopt_optional.sh BUILD_DIR SOURCE_DIR
# NLopt is optional: configure and build the host with it disabled (a scratch build in
# BUILD_DIR/nlopt-off, kept between runs so a rerun only rebuilds what changed), check that
# the summary says so, that `bench dfo` runs the polyprobe solvers only and says the
# baselines are unavailable, and that naming one is a one-line error naming the package.
set -euo pipefail
build=$1 src=$2
scratch="$build/nlopt-off"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$scratch" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_DISABLE_FIND_PACKAGE_NLopt=ON -DPOLYPROBE_BUILD_TESTS=OFF -DPOLYPROBE_CUDA=OFF \
  -DPOLYPROBE_PYTHON=OFF >"$scratch.configure.txt" 2>&1 || { cat "$scratch.configure.txt"; exit 1; }
grep -F "NLopt baselines of bench dfo OFF" "$scratch.configure.txt"
cmake --build "$scratch" --target polyprobe >/dev/null
host="$scratch/bin/polyprobe"
if ldd "$host" | grep -E 'libnlopt'; then echo "the host links NLopt"; exit 1; fi

echo "== bench dfo: the polyprobe solvers only"
POLYPROBE_PLUGIN_PATH= "$host" bench dfo --quiet --dfo-problems beale --dfo-threads 1 | tee "$scratch.all.txt"
grep -F "NLopt baselines unavailable: this polyprobe was built without NLopt (install libnlopt-cxx-dev" "$scratch.all.txt"
grep -E '^polyprobe-tr-dn ' "$scratch.all.txt"
if grep -E '^nlopt-' "$scratch.all.txt"; then echo "an NLopt solver ran"; exit 1; fi

echo "== naming an NLopt baseline is a one-line error"
status=0
POLYPROBE_PLUGIN_PATH= "$host" bench dfo --quiet --dfo-problems beale --dfo-solvers nlopt-sbplx \
  2>"$scratch.err.txt" || status=$?
cat "$scratch.err.txt"
test "$status" -eq 1
test "$(wc -l <"$scratch.err.txt")" -eq 1
grep -F "nlopt-sbplx is an NLopt baseline, but this polyprobe was built without NLopt" "$scratch.err.txt"
echo "NLopt optional: OK"
