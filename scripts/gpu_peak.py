#!/usr/bin/env python3
"""The two ceilings of the GPU a benchmark runs on, measured there: float32 arithmetic (a large
float32 matrix product through PyTorch with TF32 off, 2 n^3 FLOPs) and device memory bandwidth
(a large device-to-device copy, bytes read plus bytes written). A path's floor is its FLOPs
over the first and its bytes over the second, whichever is larger.

usage: python3 scripts/gpu_peak.py [--json FILE]
"""
import argparse
import json

import torch


def timed(fn, repeats=10):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the ceilings to FILE")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_peak.py: this torch build sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 8192
    x = torch.randn(n, n, device="cuda")
    y = torch.randn(n, n, device="cuda")
    flops = 2 * n**3 / timed(lambda: x @ y)
    src = torch.randn(1 << 28, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src))
    out = {"gpu": torch.cuda.get_device_name(), "fp32_tflops": flops / 1e12,
           "copy_tb_per_s": bandwidth / 1e12}
    print("%s: float32 %.1f TFLOP/s (no TF32), copy %.2f TB/s" % (out["gpu"], out["fp32_tflops"],
                                                                  out["copy_tb_per_s"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
