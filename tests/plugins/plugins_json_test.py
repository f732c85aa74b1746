#!/usr/bin/env python3
"""Every backend declares each path it runs: `polyprobe plugins --json` lists, per shipped
evaluator backend, one evaluator capability for every path a session can be forced to (the
plugin's own list of path names, kPathNames in its sources), on its device, with a summary.

usage: plugins_json_test.py POLYPROBE SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys


def forcible_paths(source_dir, header):
    """The path names a plugin accepts (its kPathNames, "auto" aside)."""
    with open(os.path.join(source_dir, header), encoding="utf-8") as f:
        text = f.read()
    match = re.search(r'kPathNames\s*=\s*((?:"[^"]*"\s*)+);', text)
    if not match:
        sys.exit(f"{header}: no kPathNames")
    names = "".join(re.findall(r'"([^"]*)"', match.group(1)))
    return {n.strip() for n in names.split(",") if n.strip() and n.strip() != "auto"}


def evaluators(plugin):
    return {c["name"]: c for c in plugin["capabilities"] if c["component"] == "evaluator"}


def check_backend(plugin, expected, device):
    failures = []
    declared = evaluators(plugin)
    missing = sorted(expected - declared.keys())
    if missing:
        failures.append(f"{plugin['name']} runs paths it does not declare: {', '.join(missing)}")
    for name, cap in declared.items():
        if cap["device"] != device:
            failures.append(f"{plugin['name']}: evaluator {name} on {cap['device']}, not {device}")
        if not cap["summary"]:
            failures.append(f"{plugin['name']}: evaluator {name} has no summary")
        if not {"float32", "float64"} <= set(cap["dtypes"]):
            failures.append(f"{plugin['name']}: evaluator {name} dtypes {cap['dtypes']}")
    if not plugin["summary"]:
        failures.append(f"{plugin['name']} has no summary")
    return failures


def main():
    polyprobe, source_dir = sys.argv[1], sys.argv[2]
    env = dict(os.environ, POLYPROBE_PLUGIN_PATH="")
    out = subprocess.run([polyprobe, "plugins", "--json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    failures = []

    cpu = plugins.get("cpu_tbb")
    if cpu is None or not cpu["available"]:
        sys.exit(f"cpu_tbb is not listed as available: {cpu}")
    cpu_paths = forcible_paths(source_dir, "plugins/cpu_tbb/evaluator.hpp")
    failures += check_backend(cpu, cpu_paths, "cpu")
    extra = sorted(evaluators(cpu).keys() - cpu_paths)
    if extra:
        failures.append(f"cpu_tbb declares paths it cannot be forced to: {', '.join(extra)}")

    # The cuda plugin is built wherever nvcc is, GPU or not; without one it is listed
    # unavailable with the runtime's reason, its capabilities still declared.
    gpu = plugins.get("cuda")
    if gpu is None:
        print("cuda: not built here; its declarations are not checked")
    else:
        if not gpu["available"] and not gpu["reason"]:
            failures.append("cuda is unavailable without a reason")
        # site-local is chosen per particle group, never forced, and runs all the same.
        gpu_paths = forcible_paths(source_dir, "plugins/cuda/session.hpp") | {"site-local"}
        failures += check_backend(gpu, gpu_paths, "cuda")

    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print("declared paths: cpu_tbb", sorted(cpu_paths),
          "; cuda", sorted(evaluators(gpu)) if gpu else "(not built)")


if __name__ == "__main__":
    main()
