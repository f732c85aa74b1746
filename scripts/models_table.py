#!/usr/bin/env python3
"""Regenerates docs/models.md's table of the non-differentiable example models.

Trains the built-in models (the default cnn and the mlp) and every examples/models/*.json with the built `polyprobe` on the
embedded digits data (seed 0, the defaults otherwise, plus EXTRAS below) and writes one
table row per model: its description, parameter count, test accuracy and training time as
polyprobe reports them, between the two markers in docs/models.md. Python 3 standard
library only; run it on a quiet machine, one model at a time (under a minute on 2 cores):

  python3 scripts/models_table.py                 # print the table
  python3 scripts/models_table.py --write         # and replace it in docs/models.md
  python3 scripts/models_table.py --smoke         # one short epoch each: checks, writes nothing

--smoke (used by ctest) trains each model for at most one epoch and one second, checks that
docs/models.md's table has exactly one row per model file, and prints the table it made.
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "models.md"
BEGIN = "<!-- models_table.py: begin (generated; edit scripts/models_table.py) -->"
END = "<!-- models_table.py: end -->"
# Options a model needs beyond the defaults, and why, shown in the table's "command extras".
EXTRAS = {"hard_moe.json": ["--epochs", "10"]}  # every candidate is a full forward: halve it
# The built-in models of `polyprobe train` (no --model): name, what, options.
BUILTIN = [("(default: built-in cnn)", "nothing: the baseline, conv 3x3 (16 channels), ReLU, max-pool", []),
           ("(built-in mlp, ReLU)", "nothing: the previous default", ["--arch", "mlp"])]


def fail(message):
    print(f"models_table.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def train(polyprobe, model, extras, smoke):
    """Runs `polyprobe train`; returns (parameters, test accuracy %, seconds, evaluator)."""
    command = [polyprobe, "train", "--quiet", *extras]
    if model is not None:
        command += ["--model", str(model)]
    if smoke:
        command += ["--time-limit", "1"]
        if "--epochs" not in command:
            command += ["--epochs", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    what = " ".join(command[1:])
    if done.returncode != 0:
        fail(f"'{what}' exited {done.returncode}: {done.stderr.strip()}")
    out = done.stdout
    parameters = re.search(r"^model: \d+ layers?, (\d+) parameters.*; evaluator (\S+)$", out,
                           re.M)
    accuracy = re.search(r"^test accuracy: ([0-9.]+)%$", out, re.M)
    seconds = re.search(r"^trained .* in ([0-9.]+) s", out, re.M)
    if not (parameters and accuracy and seconds):
        fail(f"'{what}' printed no model, summary or test accuracy line:\n{out}")
    return int(parameters[1]), float(accuracy[1]), float(seconds[1]), parameters[2]


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} cores ({cpu}), load average {load:.1f} at the start"


def table(polyprobe, smoke):
    models = sorted((ROOT / "examples" / "models").glob("*.json"))
    if not models:
        fail(f"no model files in {ROOT / 'examples' / 'models'}")
    rows = [
        "| model file | what gradients cannot handle | parameters | command extras | "
        "test accuracy | training time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    runs = [(None, name, what, extras) for name, what, extras in BUILTIN]
    for path in models:
        try:
            description = json.loads(path.read_text()).get("description", "")
        except json.JSONDecodeError as e:
            fail(f"'{path}', line {e.lineno}: {e.msg}")
        runs.append((path, f"`{path.name}`", description.rstrip("."), EXTRAS.get(path.name, [])))
    evaluators = set()
    for path, name, what, extras in runs:
        parameters, accuracy, seconds, evaluator = train(polyprobe, path, extras, smoke)
        evaluators.add(evaluator)
        shown = f"`{' '.join(extras)}`" if extras else ""
        if path is None:
            shown = f"`polyprobe train {' '.join(extras)}`".replace(" `", "`")
        rows.append(f"| {name} | {what} | {parameters} | {shown} | {accuracy:.1f} % | "
                    f"{seconds:.1f} s |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows, [m.name for m in models], ", ".join(sorted(evaluators))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--polyprobe", default=str(ROOT / "build" / "bin" / "polyprobe"),
                        help="the polyprobe executable (default: build/bin/polyprobe)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the table in docs/models.md")
    mode.add_argument("--smoke", action="store_true",
                      help="one short epoch per model; check the doc's rows; write nothing")
    args = parser.parse_args()
    if not os.access(args.polyprobe, os.X_OK):
        fail(f"'{args.polyprobe}' is not an executable (build first or pass --polyprobe)")
    text = DOC.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        fail(f"'{DOC}' must hold the markers '{BEGIN}' and '{END}' once each")
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    started = machine()
    rows, names, evaluators = table(args.polyprobe, args.smoke)
    if args.smoke:
        documented = re.findall(r"^\| `([^`]+\.json)` \|", text[begin:end], re.M)
        if sorted(documented) != names:
            fail(f"'{DOC}' has rows for {documented}, examples/models/ holds {names}: "
                 "rerun scripts/models_table.py --write")
        print("\n".join(rows))
        return
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    block = [f"Measured {date} by `scripts/models_table.py` on {started}; evaluator "
             f"{evaluators}."] + [""] + rows
    print("\n".join(block))
    if args.write:
        DOC.write_text(text[:begin] + "\n" + "\n".join(block) + "\n" + text[end:])
        print(f"wrote the table to {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
