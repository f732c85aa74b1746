#!/usr/bin/env python3
"""Fashion-MNIST, models gradients cannot train: polyprobe beside the gradient methods people
use instead, at equal wall-clock budgets on one device.

For each model of examples/configs/fashion-mnist-MODEL.ini (binary, int8, int4, staircase, lif,
moe, argmax-attention) it trains
  * polyprobe: `polyprobe train --config CONFIG --time-limit B --metrics F --metrics-test`
    (`--device cuda` with --device cuda), the test accuracy of the best validated state read
    from the metrics records;
  * the gradient baseline of that constraint, on the same architecture (the model file's
    layers as polyprobe.torch modules) with Adam:
      binary     clipped straight-through estimator for sign weights and sign activations
                 (BNN: the gradient passes where |w| <= 1, |x| <= 1)
      int8/int4  quantisation-aware training: straight-through rounding, zero gradient outside
                 the clamp range
      staircase  straight-through (identity gradient through the floor)
      lif        surrogate gradient: fast sigmoid 1 / (1 + k |v - threshold|)^2
      moe        straight-through router (hard one-hot forward, softmax(logits / tau) gradient)
                 or Gumbel-softmax straight-through
      argmax     straight-through attention (hard one-hot forward, softmax(scores / tau)
                 gradient)
  * the ceiling: float Adam on the same shapes without the constraint (identity weight
    transforms, ReLU for sign, staircase and LIF units, softmax gating and softmax attention).

The search (stated, the same for every model): Adam's learning rate in {1e-3, 3e-3, 1e-2}, and
for lif the surrogate slope k in {5, 25}, for moe the relaxation (straight-through, Gumbel) and
tau in {0.5, 1}, for argmax attention tau in {0.5, 1}. Every setting trains for --search-budget
seconds; the one with the best validation accuracy then trains for the largest budget. The
search's time is not charged to the baseline (it favours the baselines); polyprobe runs its
config as written, untuned per budget: its schedule anneals over the budget
(`schedule-clock = time`).

Equal budgets: every method's curve is test accuracy of the best validated state against wall
time. polyprobe runs once per budget B (--time-limit B) and its figure is the test accuracy of
the state that run restores; a baseline trains once, for the largest budget, at a constant
learning rate (so a shorter run is a prefix of it), and its figure at B is its curve's last
point at or before B. Baselines validate every --eval-every seconds, with the clock paused
while they evaluate; polyprobe's seconds include its validations (both favour the baselines).

The data: Fashion-MNIST's 60,000 training images (15 % held out for validation by a seeded
shuffle) and its 10,000 test images, standardised per pixel with the training part's
statistics, as polyprobe does; the baselines in batches of 128 (polyprobe: its config's, 128
or 64).

    python3 bench/nondiff_fashion.py --budgets 30,120,600 --out bench/nondiff-cpu.json
    python3 bench/nondiff_fashion.py --device cuda --budgets 10,60 --out bench/nondiff-cuda.json
    python3 bench/plot_nondiff.py bench/nondiff-cpu.json docs/fashion-nondiff-cpu.svg

After a change to polyprobe alone, --reuse-baselines OLD.json trains polyprobe only and copies
the baselines' runs (same device and budgets) from OLD.json; "baselines_from" in the records'
meta says when those ran.

Needs PyTorch (1.13 or 2.x) and numpy; the built `polyprobe` (--polyprobe, default
build/bin/polyprobe or the one on PATH). It loads python/polyprobe/torch.py by path,
so the built Python package is not needed.
"""
import argparse
import gzip
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ["binary", "int8", "int4", "staircase", "lif", "moe", "argmax-attention"]
LEARNING_RATES = [1e-3, 3e-3, 1e-2]
CHANCE = 0.1


def load_polyprobe_torch():
    """python/polyprobe/torch.py as a module of its own (its top level imports only torch)."""
    path = ROOT / "python" / "polyprobe" / "torch.py"
    spec = importlib.util.spec_from_file_location("polyprobe_torch_modules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ppt = load_polyprobe_torch()


# --- data ------------------------------------------------------------------------------------
def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist(seed, validation_fraction=0.15):
    folder = pathlib.Path(os.environ.get("POLYPROBE_FASHION_MNIST_DIR",
                                         "/usr/share/datasets/fashion-mnist"))
    if not (folder / "train-images-idx3-ubyte.gz").exists():
        sys.exit(f"FAIL: Fashion-MNIST is not in {folder} (Debian: dataset-fashion-mnist, or set "
                 "POLYPROBE_FASHION_MNIST_DIR)")
    x = read_idx(folder / "train-images-idx3-ubyte.gz").reshape(60000, -1).astype(np.float32)
    y = read_idx(folder / "train-labels-idx1-ubyte.gz").astype(np.int64)
    xt = read_idx(folder / "t10k-images-idx3-ubyte.gz").reshape(10000, -1).astype(np.float32)
    yt = read_idx(folder / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(round(validation_fraction * len(x)))
    val, train = order[:n_val], order[n_val:]
    mean = x[train].mean(0)
    std = x[train].std(0)
    std[std == 0] = 1
    scale = lambda a: (a - mean) / std
    return {"train": (scale(x[train]), y[train]), "validation": (scale(x[val]), y[val]),
            "test": (scale(xt), yt)}


# --- baselines: the model file's layers with gradients through the constraint ----------------
class _StraightThrough(torch.autograd.Function):
    """forward: fn(x); backward: the incoming gradient where lo <= x <= hi, else zero."""

    @staticmethod
    def forward(ctx, x, fn, lo, hi):
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return fn(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ((x >= ctx.lo) & (x <= ctx.hi)).to(grad.dtype), None, None, None


def straight_through(x, fn, lo=float("-inf"), hi=float("inf")):
    return _StraightThrough.apply(x, fn, lo, hi)


class SteLinear(ppt.TransformedLinear):
    """Quantisation-aware training: the exact transformed forward, a straight-through gradient
    (clipped to |w| <= 1 for sign, to the clamp range for int8/int4)."""

    def q(self, w, transform):
        if transform == "identity":
            return w
        fn = lambda t: ppt.quantise(t, transform, self.quant_step)
        if transform == "sign":
            return straight_through(w, fn, -1.0, 1.0)
        bound = ppt._LEVELS[transform] * self.quant_step
        return straight_through(w, fn, -bound, bound)

    def forward(self, x):
        bias = None if self.bias is None else self.q(self.bias, self.bias_transform)
        return F.linear(x, self.q(self.weight, self.weight_transform), bias)


class SteSign(nn.Module):
    def forward(self, x):
        return straight_through(x, torch.sign, -1.0, 1.0)


class SteStaircase(ppt.Staircase):
    def forward(self, x):
        return straight_through(x, lambda t: self.step * torch.floor(t / self.step))


class _FastSigmoidSpike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, threshold, slope):
        ctx.save_for_backward(v)
        ctx.threshold, ctx.slope = threshold, slope
        return (v >= threshold).to(v.dtype)

    @staticmethod
    def backward(ctx, grad):
        (v,) = ctx.saved_tensors
        return grad / (1 + ctx.slope * (v - ctx.threshold).abs()) ** 2, None, None


class SurrogateLIF(ppt.LIF):
    def __init__(self, slope, **kw):
        super().__init__(**kw)
        self.slope = slope

    def spike(self, v):
        return _FastSigmoidSpike.apply(v, self.threshold, self.slope)


class RelaxedMoE(ppt.HardMoE):
    """Hard top-1 forward in evaluation (and, with straight-through, in training); the gradient
    of softmax(logits / tau) (Gumbel: of logits plus Gumbel noise, whose argmax picks)."""

    def __init__(self, relaxation, tau, *args):
        super().__init__(*args)
        self.relaxation, self.tau = relaxation, tau

    def gates(self, x):
        logits = self.router(x)
        if not self.training:
            return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(x.dtype)
        if self.relaxation == "gumbel":
            return F.gumbel_softmax(logits, tau=self.tau, hard=True)
        soft = torch.softmax(logits / self.tau, dim=-1)
        hard = F.one_hot(logits.argmax(-1), logits.shape[-1]).to(x.dtype)
        return hard + soft - soft.detach()


class SoftMoE(ppt.HardMoE):
    """The ceiling: softmax gating over every expert."""

    def gates(self, x):
        return torch.softmax(self.router(x), dim=-1)


class RelaxedAttention(ppt.SelfAttention):
    """One-hot (argmax) attention forward; softmax(scores / tau) gradient while training."""

    def __init__(self, tau, *args, **kw):
        super().__init__(*args, **kw)
        self.tau = tau

    def forward(self, x):
        s, v = self.scores(x)
        hard = F.one_hot(s.argmax(-1), s.shape[-1]).to(x.dtype)
        if not self.training:
            return self.mix(hard, v)
        soft = torch.softmax(s / self.tau, dim=-1)
        return self.mix(hard + soft - soft.detach(), v)


def model_file(name):
    config = ROOT / "examples" / "configs" / f"fashion-mnist-{name}.ini"
    for line in config.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "model":
            return config, json.loads((ROOT / value.strip()).read_text())
    sys.exit(f"FAIL: {config} names no model file")


def reference_layers(spec):
    """The model file's layers as polyprobe.torch modules (polyprobe's arithmetic), with
    PyTorch's default initialisation; shapes chain by running each on a zero sample."""
    shape, layers = list(spec["input_shape"]), []
    for i, layer in enumerate(spec["layers"]):
        # polyprobe.torch reads only the shapes of these (the modules initialise themselves).
        out = layer.get("out_features", shape[-1])
        shapes = {f"{i}.weight": np.empty((out, shape[-1])),
                  f"{i}.router.weight": np.empty((layer.get("num_experts", 1), shape[-1])),
                  f"{i}.experts.0.weight": np.empty((out, shape[-1]))}
        module = ppt._module(i, layer, shape, shapes)
        with torch.no_grad():
            shape = list(module(torch.zeros([1] + shape)).shape[1:])
        layers.append(module)
    return layers


def build(spec, method, hp):
    """The torch network of a model file's layers: method 'baseline' (gradients through the
    constraint) or 'float' (the constraint removed), with hyper-parameters hp."""
    layers = []
    for m in reference_layers(spec):
        if isinstance(m, ppt.TransformedLinear):
            if method == "float":
                n = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            else:
                n = SteLinear(m.in_features, m.out_features, m.bias is not None,
                              m.weight_transform, m.bias_transform, m.quant_step)
            n.load_state_dict(m.state_dict())
            m = n
        elif isinstance(m, ppt.Sign):
            m = nn.ReLU() if method == "float" else SteSign()
        elif isinstance(m, ppt.Staircase):
            m = nn.ReLU() if method == "float" else SteStaircase(m.step)
        elif isinstance(m, ppt.LIF):
            m = nn.ReLU() if method == "float" else SurrogateLIF(
                hp["slope"], steps=m.steps, beta=m.beta, threshold=m.threshold, reset=m.reset)
        elif isinstance(m, ppt.HardMoE):
            args = (m.router.in_features, len(m.experts), m.experts[0].out_features)
            n = SoftMoE(*args) if method == "float" else RelaxedMoE(hp["relaxation"],
                                                                    hp["tau"], *args)
            n.load_state_dict(m.state_dict())
            m = n
        elif isinstance(m, ppt.SelfAttention) and m.attention == "argmax":
            args = (m.embed_dim, m.num_heads)
            kw = {"bias": m.in_proj_bias is not None, "causal": m.causal}
            n = (ppt.SelfAttention(*args, "softmax", **kw) if method == "float"
                 else RelaxedAttention(hp["tau"], *args, "argmax", **kw))
            n.load_state_dict(m.state_dict())
            m = n
        layers.append(m)
    return nn.Sequential(*layers)


def search_space(name, method):
    if method == "float":
        return [{"lr": lr} for lr in LEARNING_RATES]
    extra = {"lif": [{"slope": k} for k in (5.0, 25.0)],
             "moe": [{"relaxation": r, "tau": t} for r in ("straight_through", "gumbel")
                     for t in (0.5, 1.0)],
             "argmax-attention": [{"tau": t} for t in (0.5, 1.0)]}.get(name, [{}])
    return [dict(e, lr=lr) for e in extra for lr in LEARNING_RATES]


def accuracy(net, x, y, device, batch=2000):
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = net(x[i:i + batch])
            correct += (out.argmax(-1) == y[i:i + batch]).sum().item()
    net.train()
    return correct / len(x)


def train_torch(spec, method, hp, data, budget, eval_every, device, seed):
    """Adam at a constant learning rate for `budget` seconds of training (the clock paused
    while it validates); returns the curve [(seconds, test accuracy of the best validated
    state, step)] and the best validation accuracy."""
    torch.manual_seed(seed)
    shape = [-1] + list(spec["input_shape"])
    tensors = {k: (torch.from_numpy(x).reshape(shape).to(device), torch.from_numpy(y).to(device))
               for k, (x, y) in data.items()}
    xtr, ytr = tensors["train"]
    net = build(spec, method, hp).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=hp["lr"])
    gen = torch.Generator(device="cpu").manual_seed(seed)
    curve, best_val, best_test = [], -1.0, 0.0
    clock, step, next_eval = 0.0, 0, eval_every
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    while clock < budget:
        order = torch.randperm(len(xtr), generator=gen).to(device)
        for i in range(0, len(order), 128):
            start = time.perf_counter()
            idx = order[i:i + 128]
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            clock += time.perf_counter() - start
            step += 1
            if clock >= next_eval or clock >= budget:
                val = accuracy(net, *tensors["validation"], device)
                if val > best_val:
                    best_val, best_test = val, accuracy(net, *tensors["test"], device)
                curve.append((round(clock, 3), best_test, step))
                next_eval = clock + eval_every
            if clock >= budget:
                break
    return curve, best_val


def polyprobe_exe(given):
    for candidate in ([given] if given else []) + [str(ROOT / "build/bin/polyprobe"),
                                                    shutil.which("polyprobe") or ""]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("FAIL: no polyprobe executable (build it, or pass --polyprobe)")


def train_polyprobe(exe, config, budget, device, folder, extra):
    """`polyprobe train --config` for `budget` seconds; the curve from its metrics records."""
    metrics = pathlib.Path(folder) / f"{config.stem}-{device}.jsonl"
    metrics.unlink(missing_ok=True)  # a file from the previous budget's run
    command = [exe, "train", "--config", str(config), "--time-limit", str(budget), "--metrics",
               str(metrics), "--metrics-test", "--quiet"] + extra
    if device != "cpu":
        command += ["--device", device]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return None, " ".join(command[1:]) + ": " + (run.stderr.strip() or "exit %d" % run.returncode)
    curve = []
    for line in metrics.read_text().splitlines():
        r = json.loads(line)
        if r.get("split") == "validation" and "best_test_accuracy" in r:
            curve.append((r["seconds"], r["best_test_accuracy"], r["step"]))
        elif r.get("split") == "test" and (not curve or curve[-1][2] != r["step"]):
            curve.append((r["seconds"], r["accuracy"], r["step"]))
    return curve, None


def at_budget(curve, budget):
    """The accuracy the run would restore if stopped at `budget` seconds (None: no point yet)."""
    done = [a for s, a, _ in curve if s <= budget * 1.02]
    return done[-1] if done else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--budgets", default="30,120,600", help="seconds, comma-separated")
    parser.add_argument("--search-budget", type=float, default=30.0,
                        help="seconds each hyper-parameter setting trains in the search")
    parser.add_argument("--eval-every", type=float, default=0.0,
                        help="baselines validate every this many seconds (0: smallest budget / 10)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both polyprobe and torch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's CPU threads (0: all cores, as polyprobe's default)")
    parser.add_argument("--polyprobe", help="the polyprobe executable")
    parser.add_argument("--polyprobe-args", default="",
                        help="extra arguments for every polyprobe run (e.g. '--threads 16')")
    parser.add_argument("--reuse-baselines", metavar="FILE",
                        help="take the gradient baselines' and the ceiling's runs from FILE (records "
                        "of this script on the same device and budgets) and train polyprobe only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON records to write")
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for n in names:
        if n not in MODELS:
            sys.exit(f"FAIL: --models: unknown model '{n}' (choose from {', '.join(MODELS)})")
    budgets = sorted(float(b) for b in args.budgets.split(","))
    if not budgets or budgets[0] <= 0:
        sys.exit("FAIL: --budgets must be positive seconds")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("FAIL: --device cuda, but this PyTorch sees no CUDA device")
    torch.set_num_threads(args.threads or os.cpu_count())
    exe = polyprobe_exe(args.polyprobe)
    eval_every = args.eval_every or budgets[0] / 10
    reused = None
    if args.reuse_baselines:
        try:
            reused = json.loads(pathlib.Path(args.reuse_baselines).read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"FAIL: --reuse-baselines {args.reuse_baselines}: {e}")
        meta = reused.get("meta", {})
        if meta.get("device") != args.device or meta.get("budgets") != budgets:
            sys.exit(f"FAIL: --reuse-baselines {args.reuse_baselines} holds device "
                     f"{meta.get('device')} and budgets {meta.get('budgets')}; this run asks "
                     f"for {args.device} and {budgets}")
    data = fashion_mnist(args.seed)
    records = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        "device": args.device, "budgets": budgets,
                        "search_budget": args.search_budget, "eval_every": eval_every,
                        "torch": torch.__version__, "machine": platform.processor() or
                        platform.machine(), "cores": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(),
                        "load_average": os.getloadavg()[0],
                        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda")
                        else None}, "runs": []}
    if reused is not None:
        records["meta"]["baselines_from"] = reused["meta"].get("date")

    def save():
        pathlib.Path(args.out).write_text(json.dumps(records, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            config, spec = model_file(name)
            # One run per budget: its final record is the restored state's test accuracy at
            # that budget (its validations, every 100 steps, are too sparse for short ones);
            # the longest run gives the curve.
            finals, curve, error = {}, None, None
            for budget in budgets:
                curve, error = train_polyprobe(exe, config, budget, args.device, folder,
                                               args.polyprobe_args.split())
                if error:
                    break
                finals[str(budget)] = curve[-1][1]
            records["runs"].append({"model": name, "method": "polyprobe", "config":
                                    str(config.relative_to(ROOT)), "curve": curve,
                                    "error": error, "at_budget": finals})
            print(f"{name} polyprobe: " + (error or f"{curve[-1][1]:.4f} at {curve[-1][0]} s"),
                  flush=True)
            for method in ("baseline", "float"):
                if reused is not None:
                    old = [r for r in reused["runs"] if r["model"] == name and r["method"] == method]
                    if not old:
                        sys.exit(f"FAIL: --reuse-baselines {args.reuse_baselines} has no {method} "
                                 f"run of {name}")
                    records["runs"].append(old[0])
                    continue
                search = []
                for hp in search_space(name, method):
                    c, val = train_torch(spec, method, hp, data, args.search_budget,
                                         args.search_budget / 5, args.device, args.seed)
                    search.append({"hp": hp, "validation_accuracy": val})
                best = max(search, key=lambda s: s["validation_accuracy"])["hp"]
                curve, _ = train_torch(spec, method, best, data, budgets[-1], eval_every,
                                       args.device, args.seed)
                records["runs"].append({"model": name, "method": method, "hp": best,
                                        "search": search, "curve": curve, "at_budget": {
                                            str(b): at_budget(curve, b) for b in budgets}})
                print(f"{name} {method} {best}: {curve[-1][1]:.4f} at {curve[-1][0]} s",
                      flush=True)
                save()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
