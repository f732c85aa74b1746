#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): install what is missing, build,
# and train the default model on the embedded data set. Arguments go to `polyprobe train`.
# On a fresh 2-core machine: about 2.5 minutes of packages and 19.5 of build; a second run
# only rebuilds what changed. The app is ./build/bin/polyprobe.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { printf '==== %s (%s UTC) %s\n' "$1" "$(date -u +%H:%M:%S)" "${2:-}"; }

stage "packages" "(what is missing; about 2.5 min on a fresh machine)"
bash scripts/install-deps.sh
stage "configure"
cmake --preset release -DPOLYPROBE_BUILD_TESTS=OFF
jobs=$(nproc 2> /dev/null || echo 2)
stage "build" "(ninja prints [done/total]; about 20 min on 2 cores from scratch, $jobs here)"
cmake --build --preset release
stage "train" "(./build/bin/polyprobe train $*)"
./build/bin/polyprobe train "$@"
