#!/usr/bin/env bash
# usage: out_of_tree.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== install to $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >/dev/null

echo "== build examples/layer_plugin against the installed package"
cmake -S "$src/examples/layer_plugin" -B "$work/example" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/example" >/dev/null
# polyprobe_add_plugin: the build tree mirrors the install tree.
ls "$work/example"/lib/polyprobe/plugins/libpolyprobe_example_layers.so

host="$work/prefix/bin/polyprobe"
export POLYPROBE_PLUGIN_PATH="$work/example/lib/polyprobe/plugins"
echo "== the installed host finds both its own plugin and the new one"
"$host" plugins | tee "$work/plugins.txt"
grep -E '^example_layers +1\.0\.0 +3 +available' "$work/plugins.txt"
grep -E '^cpu_tbb +[^ ]+ +3 +available' "$work/plugins.txt"
grep -E 'layer triangle_wave' "$work/plugins.txt"
grep -E 'layer feature_scale' "$work/plugins.txt"

echo "== train a model that uses both new layers"
"$host" train --model "$src/examples/layer_plugin/model.json" --quiet --seed 1 \
  --save "$work/weights.safetensors" | tee "$work/train.txt"
tail -n 1 "$work/train.txt" | grep -E 'test accuracy: [0-9.]+%'
test -s "$work/weights.safetensors"

echo "== the minimal layer plugin of docs/plugins.md, extracted from the page and built"
doc="$work/doc_plugin"
mkdir -p "$doc/backend"
# Each block after a '<!-- file: NAME -->' line of the page becomes the file NAME.
awk -v dir="$doc" '
  /^<!-- file: [^ ]+ -->$/ { file = $3; next }
  file != "" && /^```/ { if (inside) { inside = 0; file = "" } else inside = 1; next }
  inside { print > (dir "/" file) }
' "$src/docs/plugins.md"
for f in softsign.cpp CMakeLists.txt model.json; do test -s "$doc/$f" || { echo "docs/plugins.md lacks $f"; exit 1; }; done
# A plugin that uses neither Eigen nor nlohmann-json configures without them.
cmake -S "$doc" -B "$doc/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON >/dev/null
cmake --build "$doc/build" >/dev/null
# Installed beside the host's own plugins, it is found with no search path at all.
cmake --install "$doc/build" --prefix "$work/prefix" >/dev/null
POLYPROBE_PLUGIN_PATH= "$host" plugins | tee "$work/doc_plugins.txt"
grep -E '^softsign +1\.0\.0 +3 +available' "$work/doc_plugins.txt"
grep -E 'layer softsign' "$work/doc_plugins.txt"
POLYPROBE_PLUGIN_PATH= "$host" train --model "$doc/model.json" --quiet --seed 1 | tee "$work/doc_train.txt"
tail -n 1 "$work/doc_train.txt" | grep -E 'test accuracy: [0-9.]+%'

echo "== the backend of docs/plugins.md (\"Writing a backend\"), extracted from the page and built"
backend="$doc/backend"
for f in example_evaluator.cpp CMakeLists.txt; do test -s "$backend/$f" || { echo "docs/plugins.md lacks backend/$f"; exit 1; }; done
# The page shows examples/evaluator_plugin's source, which the conformance suite runs.
diff -u "$src/examples/evaluator_plugin/example_evaluator.cpp" "$backend/example_evaluator.cpp"
cmake -S "$backend" -B "$backend/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON >/dev/null
cmake --build "$backend/build" >/dev/null
backend_dir="$backend/build/lib/polyprobe/plugins"
POLYPROBE_PLUGIN_PATH="$backend_dir" "$host" plugins | tee "$work/backend_plugins.txt"
grep -E '^example_evaluator +1\.0\.0 +3 +available' "$work/backend_plugins.txt"
grep -E '^    evaluator materialised \[cpu/cpu; float32,float64\]: ' "$work/backend_plugins.txt"
POLYPROBE_PLUGIN_PATH="$backend_dir" "$host" train --backend example_evaluator --hidden 8 \
  --epochs 1 --time-limit 3 --seed 1 --explain 2>&1 | tee "$work/backend_train.txt"
grep -F 'example_evaluator: chosen: requested with --backend' "$work/backend_train.txt"
tail -n 1 "$work/backend_train.txt" | grep -E 'test accuracy: [0-9.]+%'
# Not chosen unless asked: the shipped backend out-scores it.
POLYPROBE_PLUGIN_PATH="$backend_dir" "$host" train --hidden 8 --epochs 1 --time-limit 1 --seed 1 \
  --explain 2>&1 | grep -F 'cpu_tbb: chosen: highest score among those that can serve'

echo "== the package: polyprobe::core with its dependencies, a clear error without them"
mkdir -p "$work/consumer"
cat >"$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
find_package(polyprobe CONFIG REQUIRED COMPONENTS core)
if(NOT TARGET polyprobe::core OR NOT TARGET polyprobe::plugin_api)
  message(FATAL_ERROR "the package defines no polyprobe::core or polyprobe::plugin_api")
endif()
CMAKE
cmake -S "$work/consumer" -B "$work/consumer/ok" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
if cmake -S "$work/consumer" -B "$work/consumer/no_eigen" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON \
  >"$work/consumer.txt" 2>&1; then
  echo "COMPONENTS core configured without Eigen"; exit 1
fi
grep -F "polyprobe::core needs Eigen3 3.4" "$work/consumer.txt"

echo "== a third-party radius model (examples/radius_model_plugin) built out of tree, used by train"
cmake -S "$src/examples/radius_model_plugin" -B "$work/plateau" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/plateau" >/dev/null
plateau_dir="$work/plateau/lib/polyprobe/plugins"
POLYPROBE_PLUGIN_PATH="$plateau_dir" "$host" plugins | tee "$work/plateau_plugins.txt"
grep -E '^plateau +1\.0\.0 +3 +available' "$work/plateau_plugins.txt"
grep -E '^    radius_model plateau: ' "$work/plateau_plugins.txt"
grep -E '^radius models \(--radius-model\): .*plateau \(plateau\)' "$work/plateau_plugins.txt"
POLYPROBE_PLUGIN_PATH="$plateau_dir" "$host" train --quiet --seed 1 --epochs 2 \
  --radius-model plateau --radius-options '{"patience": 3}' | tee "$work/plateau_train.txt"
grep -E '^model: .*; radius model plateau \(plugin\)$' "$work/plateau_train.txt"
tail -n 1 "$work/plateau_train.txt" | grep -E 'test accuracy: [0-9.]+%'
# Options it refuses are an error with its reason.
if POLYPROBE_PLUGIN_PATH="$plateau_dir" "$host" train --quiet --epochs 1 --radius-model plateau \
  --radius-options '{"patience": 0}' 2>"$work/plateau_err.txt"; then
  echo "plateau accepted patience 0"; exit 1
fi
grep -F "radius model 'plateau' (plugin plateau) refuses this configuration: plateau: patience must be at least 1" "$work/plateau_err.txt"

echo "== the factored subspace is a plugin of the install; without it everything else works"
"$host" plugins | grep -E '^factored_subspace +1\.0\.0 +3 +available'
"$host" train --quiet --seed 1 --epochs 1 --subspace factored --subspace-rank 4 | tee "$work/factored.txt"
grep -E '^model: .*; subspace factored \([0-9]+ coordinates\)' "$work/factored.txt"
rm "$work/prefix/lib/polyprobe/plugins/libpolyprobe_factored_subspace.so"
if "$host" train --quiet --epochs 1 --subspace factored 2>"$work/factored_err.txt"; then
  echo "--subspace factored worked without its plugin"; exit 1
fi
grep -F "unknown subspace kind 'factored' (kinds: full, hybrid)" "$work/factored_err.txt"
grep -F "polyprobe ships --subspace factored as the plugin 'factored_subspace' (libpolyprobe_factored_subspace.so)" "$work/factored_err.txt"
"$host" train --quiet --seed 1 --epochs 1 --subspace hybrid --max-subspace-dim 300 | tail -n 1 | grep -E 'test accuracy: [0-9.]+%'
"$host" train --quiet --seed 1 --epochs 1 | tail -n 1 | grep -E 'test accuracy: [0-9.]+%'

echo "== without the plugin, the same model file is a clear error"
unset POLYPROBE_PLUGIN_PATH
if "$host" train --model "$src/examples/layer_plugin/model.json" --quiet 2>"$work/err.txt"; then
  echo "expected a failure without the plugin"; exit 1
fi
grep -E "unknown layer kind 'triangle_wave'" "$work/err.txt"
echo "out-of-tree plugin: OK"
