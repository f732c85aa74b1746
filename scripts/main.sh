#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): install what is missing, build,
# and train the default model on the embedded data set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DPOLYPROBE_BUILD_TESTS=OFF
cmake --build --preset release
./build/bin/polyprobe train "$@"
