#!/usr/bin/env python3
"""Curves of test accuracy of the restored state against wall time, from metrics files.

`polyprobe train --metrics FILE` ends FILE with a record {"split": "test", "seconds": ...,
"accuracy": ...}: the test result of the state the run restored (its best validated one) after
`seconds` of training. One run with --time-limit T is therefore one point of the curve "what
does training for T seconds give"; runs of the same configuration with several limits make the
curve. (A run's own validation records are not test results, so they are not used.)

  accuracy_curves.py run DIR LABEL LIMITS POLYPROBE [TRAIN ARGS...]
      runs `POLYPROBE train TRAIN ARGS --time-limit T --metrics DIR/LABEL-T.jsonl` for each T
      in LIMITS (comma-separated seconds), one after the other.
  accuracy_curves.py plot OUT.svg LABEL=GLOB [LABEL=GLOB ...]
      reads the final test record of every metrics file GLOB matches, prints a Markdown table
      (label, seconds, steps, test accuracy) and writes the curves, one line per label, as a
      self-contained SVG.
"""
import glob
import json
import subprocess
import sys


def run(out_dir, label, limits, polyprobe, args):
    for limit in limits.split(","):
        path = f"{out_dir}/{label}-{limit}.jsonl"
        open(path, "w").close()  # a fresh file, not appended to an old one
        cmd = [polyprobe, "train", "--quiet", *args, "--time-limit", limit, "--metrics", path]
        print("+", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)}\n{done.stderr}")
        print(done.stdout.strip().splitlines()[-1], flush=True)


def test_point(path):
    """(seconds, accuracy, step) of the file's final test record."""
    last = None
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "test":
                last = record
    if last is None:
        sys.exit(f"FAIL: {path} has no test record (a run without a test split, or interrupted)")
    return last["seconds"], last["accuracy"], last["step"]


def svg(curves, width=640, height=360):
    """One polyline per label; x = seconds, y = test accuracy in percent."""
    pad_l, pad_r, pad_t, pad_b = 56, 150, 16, 40
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


def plot(out_svg, specs):
    curves = {}
    print("| configuration | seconds | steps | test accuracy (restored state) |")
    print("| --- | --- | --- | --- |")
    for spec in specs:
        label, _, pattern = spec.partition("=")
        files = sorted(glob.glob(pattern))
        if not files:
            sys.exit(f"FAIL: {pattern} matches no file")
        points = sorted(test_point(f) for f in files)
        curves[label] = points
        for s, a, step in points:
            print(f"| {label} | {s:.1f} | {step} | {100 * a:.1f}% |")
    with open(out_svg, "w") as f:
        f.write(svg(curves))


def main():
    if len(sys.argv) >= 6 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "plot":
        plot(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
