#!/usr/bin/env python3
"""PyTorch's native scaled-dot-product attention on the shapes of `polyprobe bench attention`.

16 candidates x batch 16 (256 problems) x HEADS heads, sequence lengths 6, 64, 128 (and 1024
with --device cuda), head size EMBED / HEADS, float32, one CPU thread: cold time, then the
median and interquartile range of --repeats timed calls after warm-up, and the median of
the calling thread's CPU time (the better measure on a shared machine), as polyprobe's bench
reports them. Uses torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0) or, on
older builds such as Debian 12's 1.13, its predecessor torch.nn.functional.
_scaled_dot_product_attention, and says which ran.

    python3 bench/torch_sdpa.py --repeats 7
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blas_check import require_optimised_blas  # noqa: E402


def sdpa_function():
    if hasattr(F, "scaled_dot_product_attention"):
        return "scaled_dot_product_attention", F.scaled_dot_product_attention
    native = F._scaled_dot_product_attention  # PyTorch 1.13: returns (out, weights)
    return "_scaled_dot_product_attention (PyTorch 1.13)", lambda q, k, v: native(q, k, v)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # On the CPU its times stand beside polyprobe's: not against the reference BLAS.
    blas = require_optimised_blas("bench/torch_sdpa.py")[0] if args.device == "cpu" else "-"
    name, sdpa = sdpa_function()
    lengths = [6, 64, 128] + ([1024] if args.device == "cuda" else [])
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    records = []
    print(f"torch {torch.__version__}, {name}, device {args.device}, 1 thread")
    print(f"{'L':>5} {'cold ms':>9} {'median ms':>10} {'iqr ms':>8} {'cpu median ms':>14}")
    for length in lengths:
        shape = (256, args.heads, length, args.embed // args.heads)
        gen = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(shape, generator=gen).to(args.device) for _ in range(3))

        def call():
            sdpa(q, k, v)
            sync()

        start = time.perf_counter()
        call()
        cold = (time.perf_counter() - start) * 1e3
        warm_until = time.perf_counter() + 0.5
        while time.perf_counter() < warm_until:
            call()
        times, cpu = [], []
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.thread_time()
            call()
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.thread_time() - start_cpu) * 1e3)
        q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
        median, cpu_median = statistics.median(times), statistics.median(cpu)
        print(f"{length:>5} {cold:>9.3f} {median:>10.3f} {q3 - q1:>8.3f} {cpu_median:>14.3f}")
        records.append({"length": length, "cold_ms": cold, "median_ms": median,
                        "cpu_median_ms": cpu_median,
                        "iqr_ms": q3 - q1, "function": name, "torch": torch.__version__, "blas": blas})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": records}, f, indent=1)


if __name__ == "__main__":
    main()
