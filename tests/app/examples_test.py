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

The README is what a newcomer runs after `bash scripts/main.sh`, whose build puts the app at
./build/bin/polyprobe and not on the PATH, so its shell blocks (```sh) are checked as written:
a `polyprobe` command must be spelled `./build/bin/polyprobe ...` (it then runs as above, the
prefix standing for POLYPROBE, which must be where the release preset builds it); a
`bash scripts/X.sh` line, which takes minutes to an hour, gets `bash -n` (the script exists
and parses); the install and out-of-tree build lines are not run (they write outside the
build tree), but every repository path they name must exist.
"""
import json
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
COMMAND = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\./build/bin/)?polyprobe\s")
# The README's spelling of the app after scripts/main.sh; the wrapper stands for it.
BUILT = "./build/bin/polyprobe"
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


def readme_shell_checks(root, polyprobe):
    """The README's ```sh lines as a newcomer runs them after scripts/main.sh: (ran, failures).
    Its polyprobe commands run with the other examples; this checks how they are spelled
    and every other line."""
    failures, checked = [], 0
    presets = json.loads((root / "CMakePresets.json").read_text())
    release = next(p for p in presets["configurePresets"] if p["name"] == "release")
    if release.get("binaryDir") != "${sourceDir}/build":
        failures.append(f"the release preset builds in {release.get('binaryDir')}, not build/: "
                        f"the README's {BUILT} is not where scripts/main.sh puts the app")
    if not polyprobe.endswith("/bin/polyprobe"):
        failures.append(f"{polyprobe} is not a build tree's bin/polyprobe")
    fence = None
    for number, line in enumerate((root / "README.md").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        if fence != "sh" or not stripped or stripped.startswith("#"):
            continue
        where = f"README.md:{number}"
        if re.match(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*polyprobe\s", stripped):
            failures.append(f"{where}: `{stripped}`: polyprobe is not on the PATH after "
                            f"scripts/main.sh; write {BUILT} (or install it first)")
        elif COMMAND.match(stripped):
            continue  # runs with the other examples
        elif (script := re.match(r"^bash (scripts/[\w.-]+\.sh)\b", stripped)):
            checked += 1
            done = subprocess.run(["bash", "-n", str(root / script[1])], capture_output=True,
                                  text=True)
            print(f"{'ok  ' if done.returncode == 0 else 'FAIL'} bash -n {script[1]}  "
                  f"({where}: `{stripped}` takes minutes to an hour: parsed, not run)")
            if done.returncode != 0:
                failures.append(f"{where}: {script[1]}: {done.stderr.strip()[-300:]}")
        else:
            checked += 1
            paths = re.findall(r"(?<![\w/$.-])((?:examples|scripts|python|build)/[\w./-]*\w)",
                               stripped)
            missing = [p for p in paths if not p.startswith("build")
                       and not (root / p).exists()]
            print(f"{'ok  ' if not missing else 'FAIL'} not run, paths checked  ({where}: "
                  f"`{stripped}` writes outside the build tree)")
            if missing:
                failures.append(f"{where}: `{stripped}` names {', '.join(missing)}, "
                                "which does not exist")
    return checked, failures


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
        readme_checked, readme_failures = readme_shell_checks(root, polyprobe)
        failures += readme_failures
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
                    command = line.replace(BUILT + " ", "polyprobe ")
                    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=folder,
                                          env=env, capture_output=True, text=True, timeout=60)
                    status, err = done.returncode, done.stderr.strip()
                except subprocess.TimeoutExpired:
                    status, err = "timeout (60 s)", ""
                ran += 1
                print(f"{'ok  ' if status == 0 else 'FAIL'} {time.monotonic() - t0:5.1f} s  "
                      f"{source}: {line}")
                if status != 0:
                    failures.append(f"{source}: `{line}` exited {status}: {err[-400:]}")
        print(f"{ran} examples ran, {skipped} skipped, {readme_checked} other README lines "
              f"checked, in {time.monotonic() - started:.1f} s")
        if ran < 15:
            failures.append(f"only {ran} examples found: is the extraction broken?")
        for failure in failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        sys.exit(1 if failures else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
