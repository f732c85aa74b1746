#!/usr/bin/env python3
"""Draws and tabulates the records of bench/nondiff_fashion.py.

  plot_nondiff.py RECORDS.json OUT_PREFIX
      prints a Markdown table (per model: polyprobe, the gradient baseline and the float
      ceiling, test accuracy at each budget) and writes OUT_PREFIX-MODEL.svg, the curves of
      test accuracy against wall time (scripts/accuracy_curves.py's drawing), one per model.
"""
import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABELS = {"polyprobe": "polyprobe", "baseline": "gradient baseline", "float": "float ceiling"}


def accuracy_curves():
    path = ROOT / "scripts" / "accuracy_curves.py"
    spec = importlib.util.spec_from_file_location("accuracy_curves", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell(run, budget):
    if run.get("error"):
        return "fails (see records)"
    value = run.get("at_budget", {}).get(str(float(budget)))
    return "no point yet" if value is None else f"{100 * value:.1f} %"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    records = json.loads(pathlib.Path(sys.argv[1]).read_text())
    meta, runs = records["meta"], records["runs"]
    budgets = meta["budgets"]
    print(f"{meta['date']}, device {meta['device']}"
          + (f" ({meta['gpu']})" if meta.get("gpu") else "")
          + f", {meta['cores']} cores, torch {meta['torch']}, load average "
          f"{meta['load_average']:.1f} at the start"
          + (f"; the baselines' runs from {meta['baselines_from']}" if meta.get("baselines_from")
             else "") + "\n")
    print("| model | method | " + " | ".join(f"{b:g} s" for b in budgets) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in budgets) + " |")
    draw = accuracy_curves().svg
    models = list(dict.fromkeys(r["model"] for r in runs))
    for model in models:
        curves = {}
        for run in (r for r in runs if r["model"] == model):
            label = LABELS[run["method"]]
            if run.get("hp"):
                label += " " + ", ".join(f"{k}={v}" for k, v in run["hp"].items())
            print(f"| {model} | {label} | " + " | ".join(cell(run, b) for b in budgets) + " |")
            if run.get("curve"):
                curves[LABELS[run["method"]]] = [tuple(p) for p in run["curve"]]
        if curves:
            out = pathlib.Path(f"{sys.argv[2]}-{model}.svg")
            out.write_text(draw(curves))


if __name__ == "__main__":
    main()
