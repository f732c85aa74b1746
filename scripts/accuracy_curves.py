#!/usr/bin/env python3
"""Curves of test accuracy of the restored state against wall time, from metrics files.

`polyprobe train --metrics FILE --metrics-test` writes into every validation record
"best_test_accuracy": the test accuracy of the best validated state so far, the one a run
stopped at that moment restores. Runs are deterministic, so a --time-limit run is a prefix of
the longer one. Every metrics file also ends with {"split": "test", ...}: the test result of
the state the run restored (so a file without --metrics-test gives one point).

  accuracy_curves.py OUT.svg LABEL=FILE [LABEL=FILE ...]
      prints a Markdown table (label, seconds, step, test accuracy of the restored state) and
      writes the curves, one line per label, as a self-contained SVG.
"""
import json
import sys


def test_points(path):
    """(seconds, accuracy, step) of every validation that knows the restored state's test
    accuracy, then the final test record."""
    points = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "validation" and "best_test_accuracy" in record:
                points.append((record["seconds"], record["best_test_accuracy"], record["step"]))
            elif record.get("split") == "test":
                # The run's end; with --metrics-test its last validation already says it.
                if not points or points[-1][2] != record["step"]:
                    points.append((record["seconds"], record["accuracy"], record["step"]))
    if not points:
        sys.exit(f"FAIL: {path} has no test results (train with --metrics-test and a test split)")
    return points


def svg(curves, width=640, height=360):
    """One polyline per label; x = seconds, y = test accuracy in percent."""
    # The legend sits right of the plot: wide enough for the longest label (about 7 px a
    # character at font size 12).
    pad_l, pad_t, pad_b = 56, 16, 40
    pad_r = max(150, 16 + 7 * max(len(label) for label in curves))
    width += pad_r - 150
    xs = [s for points in curves.values() for s, _, _ in points]
    ys = [100 * a for points in curves.values() for _, a, _ in points]
    x_max = max(xs) * 1.05
    y_lo, y_hi = min(ys) - 1, max(ys) + 1
    sx = lambda x: pad_l + (width - pad_l - pad_r) * x / x_max
    sy = lambda y: height - pad_b - (height - pad_t - pad_b) * (y - y_lo) / (y_hi - y_lo)
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for i in range(6):  # grid and y labels
        y = y_lo + (y_hi - y_lo) * i / 5
        out.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
                   f'stroke="#ddd"/><text x="{pad_l - 6}" y="{sy(y) + 4:.1f}" '
                   f'text-anchor="end">{y:.1f}%</text>')
    for i in range(6):
        x = x_max * i / 5
        out.append(f'<text x="{sx(x):.1f}" y="{height - pad_b + 16}" '
                   f'text-anchor="middle">{x:.0f} s</text>')
    out.append(f'<text x="{(pad_l + width - pad_r) / 2}" y="{height - 6}" text-anchor="middle">'
               'wall time of training (s)</text>')
    for i, (label, points) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        path = " ".join(f"{sx(s):.1f},{sy(100 * a):.1f}" for s, a, _ in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for s, a, _ in points:
            out.append(f'<circle cx="{sx(s):.1f}" cy="{sy(100 * a):.1f}" r="3" fill="{colour}"/>')
        out.append(f'<text x="{width - pad_r + 8}" y="{pad_t + 16 * (i + 1)}" '
                   f'fill="{colour}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    curves = {}
    print("| configuration | seconds | step | test accuracy (restored state) |")
    print("| --- | --- | --- | --- |")
    for spec in sys.argv[2:]:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit(f"FAIL: '{spec}' is not LABEL=FILE")
        curves[label] = test_points(path)
        for s, a, step in curves[label]:
            print(f"| {label} | {s:.1f} | {step} | {100 * a:.1f}% |")
    with open(sys.argv[1], "w") as f:
        f.write(svg(curves))


if __name__ == "__main__":
    main()
