#!/usr/bin/env python3
"""Draws every figure of the docs from the measurements recorded in docs/figures/*.json.

    python3 scripts/docs_figures.py
        writes docs/NAME.svg for every docs/figures/NAME.json and prints what it wrote
    python3 scripts/docs_figures.py --check
        writes nothing; fails naming every docs/NAME.svg that differs from what its JSON draws
    python3 scripts/docs_figures.py --record docs/figures/NAME.json "LABEL=metrics.jsonl" ...
        first records the test-accuracy curve of each `polyprobe train --metrics FILE
        --metrics-test` run under LABEL in that curves file (replacing a curve of that label),
        then draws every figure

Two kinds of file: {"curves": {LABEL: [[seconds, test accuracy, step], ...]}} is drawn as
time-to-accuracy curves by scripts/accuracy_curves.py's svg(); {"groups": [{"device": ...,
"rows": [[workload, regime, polyprobe ms, baseline ms], ...]}]} as horizontal bars of the
speed-up (baseline ms over polyprobe ms, log scale, 1x marked). Every file also says where
its numbers come from ("source"), and the figure's title is its "title".
"""
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from accuracy_curves import svg as curves_svg, test_points  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def speedup_svg(title, groups, width=720):
    """One bar a row, grouped by device; x is the speed-up on a log scale."""
    ratios = [row[3] / row[2] for group in groups for row in group["rows"]]
    if not ratios or min(ratios) <= 0:
        raise ValueError("every row needs positive times")
    lo = 2 ** math.floor(math.log2(min(min(ratios), 1.0)))
    hi = 2 ** math.ceil(math.log2(max(max(ratios), 1.0)))
    pad_l, pad_r, bar, gap = 230, 60, 14, 26
    rows = sum(len(g["rows"]) for g in groups)
    height = 40 + rows * (bar + 4) + len(groups) * gap + 40
    sx = lambda r: pad_l + (width - pad_l - pad_r) * math.log(r / lo) / math.log(hi / lo)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">'
           f'{escape(title)}</text>']
    ticks, r = [], lo
    while r <= hi * 1.0001:
        ticks.append(r)
        r *= 2
    bottom = height - 30
    for r in ticks:
        x = sx(r)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="30" y2="{bottom}" '
                   f'stroke="{"#888" if r == 1 else "#ddd"}"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
                   f'{r:g}x</text>' if r >= 1 else f'1/{round(1 / r)}x</text>')
    y = 30
    for g, group in enumerate(groups):
        y += gap
        out.append(f'<text x="8" y="{y - 8}" font-weight="bold">{escape(group["device"])}</text>')
        for workload, regime, ours, baseline in group["rows"]:
            ratio = baseline / ours
            colour = COLOURS[0] if regime.endswith("reference") else COLOURS[2]
            x0, x1 = sx(1.0), sx(ratio)
            out.append(f'<text x="{pad_l - 6}" y="{y + bar - 3}" text-anchor="end">'
                       f'{escape(workload)} {escape(regime)}</text>')
            out.append(f'<rect x="{min(x0, x1):.1f}" y="{y}" width="{abs(x1 - x0):.1f}" '
                       f'height="{bar}" fill="{colour}"/>')
            out.append(f'<text x="{max(x0, x1) + 4:.1f}" y="{y + bar - 3}">{ratio:.2g}x</text>')
            y += bar + 4
    out.append(f'<text x="{(pad_l + width - pad_r) / 2}" y="{height - 4}" '
               'text-anchor="middle">PyTorch best ms / polyprobe ms (log scale; right of 1x: '
               'polyprobe is faster)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw(path):
    doc = json.loads(path.read_text())
    if "curves" in doc:
        curves = {label: [tuple(p) for p in points] for label, points in doc["curves"].items()}
        return curves_svg(curves)
    if "groups" in doc:
        return speedup_svg(doc.get("title", path.stem), doc["groups"])
    raise ValueError(f"{path} has neither 'curves' nor 'groups'")


def record(target, specs):
    doc = json.loads(target.read_text())
    if "curves" not in doc:
        sys.exit(f"FAIL: {target} is not a curves file")
    for spec in specs:
        label, _, metrics = spec.partition("=")
        if not metrics:
            sys.exit(f"FAIL: '{spec}' is not LABEL=METRICS_FILE")
        doc["curves"][label] = [list(p) for p in test_points(metrics)]
    target.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"recorded {len(specs)} curve(s) in {target}")


def main():
    args = sys.argv[1:]
    check = args == ["--check"]
    if args and args[0] == "--record":
        if len(args) < 3:
            sys.exit(__doc__)
        record(pathlib.Path(args[1]), args[2:])
    elif args and not check:
        sys.exit(__doc__)
    sources = sorted((ROOT / "docs" / "figures").glob("*.json"))
    if not sources:
        sys.exit(f"FAIL: no docs/figures/*.json under {ROOT}")
    stale = []
    for source in sources:
        out = ROOT / "docs" / f"{source.stem}.svg"
        drawn = draw(source)
        if check:
            if not out.exists() or out.read_text() != drawn:
                stale.append(str(out.relative_to(ROOT)))
            continue
        out.write_text(drawn)
        print(f"wrote {out.relative_to(ROOT)} from {source.relative_to(ROOT)}")
    if stale:
        sys.exit(f"FAIL: {', '.join(stale)} differ from what docs/figures/ draws: run "
                 "python3 scripts/docs_figures.py and commit the figures")
    if check:
        print(f"ok: {len(sources)} figures match docs/figures/*.json")


if __name__ == "__main__":
    main()
