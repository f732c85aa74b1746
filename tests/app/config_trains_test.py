#!/usr/bin/env python3
"""An example config runs as written and trains: a short run of it (the config's own options,
with --time-limit SECONDS, one thread and a validation after every step) exits 0, its
validation loss falls from the first step's to the last's, and the restored state's test
accuracy is above chance.

usage: config_trains_test.py POLYPROBE REPO_ROOT CONFIG SECONDS

Runs from REPO_ROOT, as the config's comment says to. Exit 77 (skipped) when the config's data
set is Fashion-MNIST and it is not installed (Debian's dataset-fashion-mnist).
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile


def fail(message):
    sys.exit(f"FAIL: {message}")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    polyprobe, root, config, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], \
        sys.argv[4]
    text = (root / config).read_text()
    options = dict(line.split("=", 1) for line in text.splitlines()
                   if "=" in line and not line.lstrip().startswith("#"))
    options = {k.strip(): v.strip() for k, v in options.items()}
    if options.get("data") == "fashion-mnist":
        folder = pathlib.Path(os.environ.get("POLYPROBE_FASHION_MNIST_DIR",
                                             "/usr/share/datasets/fashion-mnist"))
        if not (folder / "train-images-idx3-ubyte.gz").exists():
            print(f"SKIP: Fashion-MNIST is not installed in {folder}")
            sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = pathlib.Path(tmp) / "m.jsonl"
        command = [polyprobe, "train", "--config", config, "--time-limit", seconds,
                   "--validate-every", "1", "--threads", "1", "--metrics", str(metrics),
                   "--quiet"]
        run = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            fail(f"`{' '.join(command)}` exited {run.returncode}: {run.stderr.strip()}")
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "split" not in r]
    validations = [r for r in records if r.get("split") == "validation"]
    tests = [r for r in records if r.get("split") == "test"]
    if len(validations) < 2 or not tests:
        fail(f"{config}: only {len(steps)} steps ({len(validations)} validations) and "
             f"{len(tests)} test records in {seconds} s")
    first, last = validations[0]["loss"], validations[-1]["loss"]
    accuracy = tests[-1]["accuracy"]
    classes = 10
    print(f"{config}: {len(steps)} steps in {seconds} s, validation loss {first:.4f} after "
          f"step 1 -> {last:.4f}, test accuracy {accuracy:.4f}")
    if not last < first:
        fail(f"{config}: the validation loss did not fall ({first:.4f} -> {last:.4f})")
    if not accuracy > 1.5 / classes:
        fail(f"{config}: test accuracy {accuracy:.4f} is not above chance ({1 / classes:.2f})")

if __name__ == "__main__":
    main()
