#!/usr/bin/env python3
"""`polyprobe report`: a self-contained page that a browser draws, and one-line errors.

usage: report_test.py POLYPROBE REPO_ROOT

Trains two short runs with --metrics, writes their report and checks the page: inline SVG
only (no script, nothing fetched), every chart well-formed XML, both runs in the legend. Bad
input (a missing file, a malformed line, an empty file, a record without "step", no -o, -o
naming an input) fails with one error line naming the file and line and leaves no page.
Then headless Chromium renders the page: the screenshot must not be blank (non-white pixels,
both runs' colours drawn) and the page must log nothing to the console. Without a `chromium`
on PATH (Debian's chromium package) that part is skipped and the test exits 77, which ctest
reports as skipped.
"""
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
import zlib

SKIP = 77
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(*args, cwd):
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POLYPROBE_PLUGIN_PATH=""))


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA PNG, standard library only."""
    data = pathlib.Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        raise ValueError(f"{path}: PNG depth {depth}, colour type {colour}: not handled")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 0xFF
        rows.append(line)
        previous = line
    return width, height, [[tuple(r[x * channels:x * channels + 3]) for x in range(width)]
                           for r in rows]


def screenshot(chromium, page, png, work):
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={work / 'chromium-profile'}", f"--screenshot={png}",
         "--window-size=1100,2300", "--enable-logging=stderr", "--v=0", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.returncode, console


def pixel_counts(png, colours):
    """The share of non-white pixels, and the pixels near each of `colours` (hex)."""
    width, height, rows = png_pixels(png)
    targets = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in colours]
    near = [0] * len(targets)
    ink = 0
    for row in rows:
        for pixel in row:
            if pixel != (255, 255, 255):
                ink += 1
                for k, t in enumerate(targets):
                    if sum(abs(a - b) for a, b in zip(pixel, t)) < 40:
                        near[k] += 1
    return ink / (width * height), near


def main():
    polyprobe, root = os.path.abspath(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
    work = pathlib.Path(tempfile.mkdtemp(prefix="polyprobe-report-"))
    try:
        # Two runs: the default MLP, and hard argmax attention (two evaluation paths).
        a = run(polyprobe, "train", "--quiet", "--epochs", "3", "--validate-every", "5",
                "--metrics", "relu.jsonl", cwd=work)
        b = run(polyprobe, "train", "--quiet", "--epochs", "2", "--model",
                str(root / "examples/models/argmax_attention.json"), "--metrics",
                "attention.jsonl", cwd=work)
        check(a.returncode == 0 and b.returncode == 0, f"training failed: {a.stderr}{b.stderr}")
        made = run(polyprobe, "report", "relu.jsonl", "attention.jsonl", "-o", "report.html",
                   cwd=work)
        check(made.returncode == 0 and "wrote report.html (2 runs)" in made.stdout,
              f"report exited {made.returncode}: {made.stdout}{made.stderr}")
        html = (work / "report.html").read_text()
        check("<script" not in html.lower(), "the page holds a script")
        check(not re.search(r"https?:|src=|@import|<link", html, re.I),
              "the page refers to something outside itself")
        check(all(u.startswith("url(#") for u in re.findall(r"url\([^)]*\)", html)),
              "a url() that is not a reference inside the page")
        svgs = re.findall(r"<svg.*?</svg>", html, re.S)
        check(len(svgs) == 10, f"{len(svgs)} charts, expected 8 and one paths chart per run")
        for svg in svgs:
            try:
                ElementTree.fromstring(svg)
            except ElementTree.ParseError as e:
                check(False, f"a chart is not well-formed XML: {e}")
        check("relu.jsonl" in html and "attention.jsonl" in html, "a run is missing from the legend")
        check("site-local" in html and "sparse" in html, "the attention run's paths are not named")

        # Bad input: one line naming the file (and the line), exit 1 (2 for usage), no page.
        (work / "bad.jsonl").write_text(
            (work / "relu.jsonl").read_text().splitlines()[0] + "\n\n{\"step\": 2, oops}\n")
        (work / "empty.jsonl").write_text("")
        (work / "nostep.jsonl").write_text('{"seconds": 1.0, "loss": 2}\n')
        for args, status, needle in [
            (["missing.jsonl"], 1, "'missing.jsonl'"),
            (["bad.jsonl"], 1, "metrics file 'bad.jsonl', line 3: not JSON"),
            (["empty.jsonl"], 1, "metrics file 'empty.jsonl' is empty"),
            (["nostep.jsonl"], 1, "metrics file 'nostep.jsonl', line 1: the record has no \"step\""),
            (["relu.jsonl", "-o", "relu.jsonl"], 2, "is the input 'relu.jsonl'"),
            ([], 2, "no metrics file given"),
        ]:
            out = "out.html"
            full = args if "-o" in args else args + ["-o", out]
            if not args:
                full = ["-o", out]
            r = run(polyprobe, "report", *full, cwd=work)
            check(r.returncode == status, f"report {' '.join(full)} exited {r.returncode}, "
                  f"expected {status}: {r.stderr}")
            check(needle in r.stderr and r.stderr.count("\n") == 1,
                  f"report {' '.join(full)}: expected one line with {needle!r}: {r.stderr!r}")
            check(not (work / out).exists(), f"report {' '.join(full)} left {out} behind")
        r = run(polyprobe, "report", "relu.jsonl", cwd=work)
        check(r.returncode == 2 and "-o report.html" in r.stderr, f"no -o: {r.stderr}")

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            print("SKIP: the browser check: no chromium on PATH (apt-get install chromium)")
            return SKIP if not failures else 1
        status, console = screenshot(chromium, work / "report.html", work / "shot.png", work)
        check(status == 0 and (work / "shot.png").exists(), f"chromium exited {status}")
        check(not console, f"console messages: {console}")
        ink, near = pixel_counts(work / "shot.png", ["#1f77b4", "#d62728"])
        print(f"screenshot: {100 * ink:.1f} % non-white, {near} pixels in the two runs' colours")
        check(ink > 0.03, f"the screenshot is nearly blank ({100 * ink:.2f} % non-white)")
        check(min(near) > 300, f"a run's colour is barely drawn: {near} pixels")
        # The same check on a blank page must see a blank page.
        (work / "blank.html").write_text("<!DOCTYPE html><html><body></body></html>\n")
        screenshot(chromium, work / "blank.html", work / "blank.png", work)
        blank, _ = pixel_counts(work / "blank.png", [])
        check(blank < 0.001, f"a blank page counts {100 * blank:.2f} % non-white")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
