#!/usr/bin/env python3
"""Prints polyprobe's cuda records (bench step --json) beside the PyTorch baseline's
(bench/torch_step.py --json) as one Markdown table: median ms of candidate evaluation and of
complete steps, the baseline's best method, and the ratio baseline / polyprobe (above 1:
polyprobe is faster).

usage: scripts/gpu_table.py POLYPROBE_JSON TORCH_JSON
"""
import json
import sys


def records(path):
    with open(path) as f:
        data = json.load(f)
    return data["records"] if isinstance(data, dict) else data


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours, torch = records(sys.argv[1]), records(sys.argv[2])
    best = {}
    for r in torch:
        w = r["workload"]
        if w not in best or r["median_ms"] < best[w]["median_ms"]:
            best[w] = r
    rows = {}
    for r in ours:
        if r.get("device") != "cuda":
            continue
        regime = r.get("regime", "evaluation")
        rows.setdefault(r["workload"], {})[regime] = r
    print("| workload | candidates | evaluation | step@reference | step@train | step phases@train "
          "(plan/score/transport/move/other) | PyTorch best | step@train vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    for w, by in rows.items():
        ev = by.get("evaluation")
        ref = by.get("step@reference")
        tr = by.get("step@train")
        cand = (tr or ev or ref)["candidates"]
        def ms(r):
            return "%.3f" % r["median_ms"] if r else "-"
        phases = "-"
        if tr and "last_step_phases_ms" in tr:
            p = tr["last_step_phases_ms"]
            known = sum(p.get(k, 0) or 0 for k in ("plan", "score", "transport", "move"))
            other = tr.get("last_step_ms", known) - known
            phases = "/".join("%.2f" % (p.get(k, 0) or 0) for k in ("plan", "score", "transport",
                                                                     "move")) + "/%.2f" % other
        b = best.get(w)
        base = "%.3f `%s`" % (b["median_ms"], b["path"]) if b else "-"
        ratio = "%.2fx" % (b["median_ms"] / tr["median_ms"]) if b and tr else "-"
        print("| %s | %d | %s | %s | %s | %s | %s | %s |" % (w, cand, ms(ev), ms(ref), ms(tr),
                                                           phases, base, ratio))


if __name__ == "__main__":
    main()
