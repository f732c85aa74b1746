#!/usr/bin/env bash
# Installs what polyprobe needs to build on Debian 12, as root, and with --test also what
# its tests need (PyTorch for the model round trips and the baselines, with OpenBLAS: without
# libopenblas0-openmp torch calls the netlib reference BLAS, about 30x slower, which no
# baseline may be measured against; Optuna for the Python comparison; Chromium for the
# report's rendering; llvm-symbolizer, from llvm-14, so that sanitizer and fuzzer reports
# name source lines). Asks apt only when something is missing, so a
# machine that already has everything is not touched.
set -euo pipefail
packages=(
  build-essential cmake ninja-build git pkg-config
  libboost-dev libboost-program-options-dev libboost-filesystem-dev
  libeigen3-dev libtbb-dev nlohmann-json3-dev zlib1g-dev libnlopt-cxx-dev catch2
  libopenmpi-dev openmpi-bin
  clang clang-format clang-tidy libclang-rt-14-dev
  dataset-fashion-mnist
  python3-dev pybind11-dev python3-numpy python3-tqdm python3-setuptools python3-pip python3-venv
)
if [[ ${1:-} == --test ]]; then
  packages+=(python3-pytest python3-torch libopenblas0-openmp python3-optuna chromium llvm-14)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
