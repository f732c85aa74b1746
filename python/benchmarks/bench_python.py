"""The measurements of docs/python.md: the Python layer's overhead over the core.

    PYTHONPATH=build/python /usr/bin/python3 python/benchmarks/bench_python.py [--bin build/bin/polyprobe]

1. ask/tell overhead per candidate at N = 1e5, d = 2, set up as `polyprobe bench asktell`
   (P = (N + 2) / 3 points, simplex V = 3, a shifted sphere scored in numpy; only ask() and
   tell() are timed; median of 7 steps after 3 warm-up steps).
2. minimize() with a cheap Python callable: evaluations per second.
3. train() on digits against `polyprobe train` (same model, data, seeds and options).
"""
import argparse
import re
import statistics
import subprocess
import time

import numpy as np

import polyprobe


def asktell(n_target: int, config: dict) -> float:
    p = (n_target + 2) // 3
    i = np.arange(p)
    start = np.stack([np.sin(0.37 * i) * 3, np.cos(0.11 * i) * 3], axis=1)
    opt = polyprobe.AskTell(start, config)

    def step():
        t0 = time.perf_counter()
        X = opt.ask()
        t1 = time.perf_counter()
        losses = np.sum((X - 0.5) ** 2, axis=1)
        t2 = time.perf_counter()
        opt.tell(losses)
        t3 = time.perf_counter()
        return (t1 - t0) + (t3 - t2), len(X)

    step()
    for _ in range(3):
        step()
    times = [step() for _ in range(7)]
    return statistics.median(t for t, _ in times) / times[0][1]


def minimize_rate(config, budget=20000) -> float:
    f = lambda x: float(x @ x)  # noqa: E731
    t0 = time.perf_counter()
    r = polyprobe.minimize(f, np.ones(10), budget, config)
    return r.evaluations / (time.perf_counter() - t0)


def train_compare(binary: str, epochs: int) -> None:
    t0 = time.perf_counter()
    out = subprocess.run([binary, "train", "--quiet", "--epochs", str(epochs)],
                         capture_output=True, text=True, check=True).stdout
    cli_wall = time.perf_counter() - t0
    cli_train = float(re.search(r"candidates\) in ([0-9.]+) s", out).group(1))
    cli_acc = re.search(r"test accuracy: ([0-9.]+)%", out).group(1)
    t0 = time.perf_counter()
    data = polyprobe.load_data("digits")
    model = polyprobe.Model({"input_shape": data["sample_shape"], "layers": [
        {"kind": "flatten"}, {"kind": "linear", "out_features": 32}, {"kind": "relu"},
        {"kind": "linear", "out_features": data["num_classes"]}]}, seed=0)
    r = polyprobe.train(model, *data["train"], validation=data["validation"], epochs=epochs,
                        progress=False)
    acc = polyprobe.evaluate(model, *data["test"])["accuracy"]
    py_wall = time.perf_counter() - t0
    print(f"train digits, {epochs} epochs: polyprobe train {cli_acc}% test in {cli_train:.2f} s "
          f"(process {cli_wall:.2f} s); polyprobe.train {100 * acc:.1f}% test in "
          f"{r.seconds:.2f} s (load + train + test {py_wall:.2f} s); "
          f"training-loop overhead {100 * (r.seconds / cli_train - 1):+.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/polyprobe")
    ap.add_argument("--epochs", type=int, default=20)
    a = ap.parse_args()
    for name, cfg in (("sinkhorn", {}), ("softmax", {"solver": "softmax"})):
        print(f"ask/tell N=1e5 d=2 {name}: {asktell(100000, cfg) * 1e9:.0f} ns per candidate")
    print(f"minimize, cheap callable (x @ x, n=10), default config: "
          f"{minimize_rate(None):,.0f} evaluations/s")
    print(f"minimize, same, recommended_minimize_config(10): "
          f"{minimize_rate(polyprobe.recommended_minimize_config(10)):,.0f} evaluations/s")
    train_compare(a.bin, a.epochs)


if __name__ == "__main__":
    main()
