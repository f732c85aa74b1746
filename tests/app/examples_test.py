#!/usr/bin/env python3
"""Every example command the user is shown runs, and exits 0.

usage: examples_test.py POLYPROBE REPO_ROOT

Collects the example lines of every `polyprobe COMMAND --help` (the lines under "example:" or
"examples:"), and every line that starts with `polyprobe ` (after optional VAR=value
assignments) in the code blocks of README.md and docs/*.md, except blocks fenced as text,
json, python, cpp or ini (listings and file contents, not commands). Each source (one help
text, one document) runs in order in a fresh folder holding a link to the repository's
examples/, so an example may use files an earlier example of the same source wrote; a
command that appears in several sources runs once.

`polyprobe` is, on PATH, a wrapper around POLYPROBE that makes each run short: train gets
`--epochs 1 --time-limit 1` in place of its own --epochs and --time-limit, bench (but bench
dfo, which has no --repeats) gets `--repeats 1`. A command is skipped, with the reason printed, only when it needs what is not
installed here: Fashion-MNIST (named on the line or in its --config file) or jq.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

WRAPPER = r'''#!/usr/bin/env python3
import os, sys
REAL = None
args = sys.argv[1:]
def drop(args, name):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out
if args[:1] == ["train"]:
    args = drop(drop(args, "--epochs"), "--time-limit") + ["--epochs", "1", "--time-limit", "1"]
elif args[:1] == ["bench"] and args[1:2] != ["dfo"] and "--repeats" not in args:
    args += ["--repeats", "1"]  # bench dfo has no --repeats (and refuses it)
os.execv(REAL, [REAL] + args)
'''
COMMAND = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*polyprobe\s")
NOT_COMMANDS = {"text", "json", "python", "cpp", "c", "ini", "cmake"}


def help_examples(polyprobe):
    """(source, lines) for every command's --help, in `polyprobe --help`'s order."""
    overview = subprocess.run([polyprobe, "--help"], capture_output=True, text=True).stdout
    names = re.findall(r"^  ([a-z]+)  ", overview.split("commands:", 1)[1].split("\n\n")[0], re.M)
    if len(names) < 5:
        sys.exit(f"FAIL: `polyprobe --help` lists only the commands {names}")
    sources = []
    for name in names:
        text = subprocess.run([polyprobe, name, "--help"], capture_output=True, text=True).stdout
        lines = []
        for section in re.findall(r"^examples?:\n((?:  .*\n?)+)", text, re.M):
            lines += [line.strip() for line in section.splitlines() if COMMAND.match(line)]
        if not lines and name != "version":
            sys.exit(f"FAIL: `polyprobe {name} --help` shows no example")
        sources.append((f"polyprobe {name} --help", lines))
    return sources


def document_examples(root):
    sources = []
    for path in [root / "README.md"] + sorted((root / "docs").glob("*.md")):
        lines, fence = [], None
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence = None if fence is not None else stripped[3:].strip().lower()
                continue
            if fence is not None and fence not in NOT_COMMANDS and COMMAND.match(line):
                lines.append(stripped)
        sources.append((str(path.relative_to(root)), lines))
    return sources


def fashion_mnist_installed():
    folder = os.environ.get("POLYPROBE_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    return os.path.exists(os.path.join(folder, "train-images-idx3-ubyte.gz"))


def skip_reason(line, root):
    needs_fashion = "fashion-mnist" in line
    config = re.search(r"--config\s+(\S+)", line)
    if config and (root / config[1]).is_file():
        needs_fashion |= "fashion-mnist" in (root / config[1]).read_text()
    if needs_fashion and not fashion_mnist_installed():
        return "Fashion-MNIST is not installed (Debian's dataset-fashion-mnist)"
    if re.search(r"\|\s*jq\b", line) and shutil.which("jq") is None:
        return "jq is not installed"
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    polyprobe = os.path.abspath(sys.argv[1])
    root = pathlib.Path(sys.argv[2]).resolve()
    work = pathlib.Path(tempfile.mkdtemp(prefix="polyprobe-examples-"))
    try:
        bin_dir = work / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "polyprobe"
        wrapper.write_text(WRAPPER.replace("REAL = None", f"REAL = {polyprobe!r}"))
        wrapper.chmod(0o755)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                   POLYPROBE_PLUGIN_PATH="")
        seen, failures, ran, skipped = set(), [], 0, 0
        started = time.monotonic()
        sources = help_examples(polyprobe) + document_examples(root)
        for index, (source, lines) in enumerate(sources):
            folder = work / f"source{index}"
            folder.mkdir()
            (folder / "examples").symlink_to(root / "examples")
            for line in lines:
                if line in seen:
                    continue
                seen.add(line)
                reason = skip_reason(line, root)
                if reason:
                    print(f"SKIP {source}: {line}  ({reason})")
                    skipped += 1
                    continue
                t0 = time.monotonic()
                try:
                    done = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], cwd=folder,
                                          env=env, capture_output=True, text=True, timeout=60)
                    status, err = done.returncode, done.stderr.strip()
                except subprocess.TimeoutExpired:
                    status, err = "timeout (60 s)", ""
                ran += 1
                print(f"{'ok  ' if status == 0 else 'FAIL'} {time.monotonic() - t0:5.1f} s  "
                      f"{source}: {line}")
                if status != 0:
                    failures.append(f"{source}: `{line}` exited {status}: {err[-400:]}")
        print(f"{ran} examples ran, {skipped} skipped, in {time.monotonic() - started:.1f} s")
        if ran < 15:
            failures.append(f"only {ran} examples found: is the extraction broken?")
        for failure in failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        sys.exit(1 if failures else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
