#!/usr/bin/env python3
"""PyTorch reference ("peer") for one polystep candidate-evaluation step.

One step of the polytope optimizer scores P*V*K candidates: the flat parameter vector (or the
coordinate vector of a subspace) is cut into P particles of dimension d; candidate (i, v) is the
model with particle i moved to X_i + 0.5 * r * R_i t_v (t_v: vertex v of a centred unit-radius
regular simplex, V = d + 1; R_i: a Haar-random rotation in SO(d); K = 1 probe at half the probe
radius r = 1e-2).  This script computes the C = P*V candidate losses (mean cross-entropy over the
minibatch) plus the incumbent loss with three methods, checks them against a float64 reference,
and times them.  bench/README.md defines the workloads exactly and lists results.

Methods ("path" in the JSON records):
  naive           materialise every candidate's complete weights (chunks of candidates) and run
                  the whole forward as batched GEMMs (torch.baddbmm) over candidates.
  prefix          candidates reuse the incumbent activations before the first layer they change;
                  only that layer's weights are materialised, laid out (in+1, K*out) so the layer
                  is one GEMM over K candidates; later (shared) layers are one GEMM over all B*K
                  rows.
  sparse          (full space) delta propagation: a particle changes d scalars, i.e. a rank <= d
                  update of one layer's pre-activations on <= d units; ReLU deltas are exact
                  (relu(z+dz) - relu(z) = max(dz + min(z,0), -relu(z))); the next layer gets a
                  rank <= d update; the rest is dense on deltas; the loss change comes from the
                  logit change and the incumbent log-softmax.
  subspace-delta  (subspace) the same delta propagation, with x dW^T = (x V) A^T + (x B^T) U^T:
                  x V is computed once per layer and reused by every candidate.
Particles that straddle two layers (e.g. the end of one layer's bias and the start of the next
layer's weight) are exact in every method: prefix materialises both layers for them, the delta
methods propagate dense deltas through both (a later layer's coordinates then act on the
candidate's own activations a + da).
On CUDA every method is also timed as a CUDA-graph replay ("<method>+cudagraph").

Speed settings made before torch is imported (recorded in the JSON, see --help): an inherited
OPENBLAS_CORETYPE is dropped, ATEN_CPU_CAPABILITY=avx512 where the CPU has AVX-512, and glibc
malloc keeps large blocks on the heap.

Usage (see README.md):
  python3 torch_step.py                                  # all workloads, methods, 1 thread + all cores
  python3 torch_step.py --workloads mlp64-full --threads 1 --json out.json
  python3 torch_step.py --device cuda --json gpu.json    # PyTorch 2.x with CUDA
  python3 torch_step.py --selftest                       # exactness checks on awkward shapes
  python3 torch_step.py --dump DIR --methods none        # workload tensors + expected losses
"""
import argparse
import ctypes
import gzip
import json
import math
import os
import platform
import statistics
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


# ----------------------------------------------------------------------------- before torch
def _argv_value(name, default):
    argv = sys.argv
    for k, a in enumerate(argv):
        if a == name and k + 1 < len(argv):
            return argv[k + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _pre_torch_setup():
    """Settings that must be made before torch (and the BLAS it links) is loaded.

    OPENBLAS_CORETYPE: OpenBLAS reads it when it is loaded.  Some shells preset it (e.g.
    'Haswell', AVX2 kernels, about half the AVX-512 GEMM speed on AVX-512 machines); by default
    ('auto') we remove an inherited value so OpenBLAS detects the CPU itself.  'keep' leaves the
    environment alone; any other value is set as is.
    glibc malloc: keep blocks up to 32 MiB on the heap and never trim it, so large per-chunk
    temporaries are not mmap()ed and page-faulted on every call (mallopt, same effect as the
    MALLOC_*_ environment variables).
    """
    info = {}
    core = _argv_value("--openblas-coretype", "auto")
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    if core == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif core != "keep":
        os.environ["OPENBLAS_CORETYPE"] = core
    info["openblas_coretype_arg"] = core
    info["openblas_coretype_inherited"] = inherited
    info["openblas_coretype_env"] = os.environ.get("OPENBLAS_CORETYPE")
    # ATen's vectorised CPU kernels default to AVX2 even on AVX-512 machines (PyTorch PR 80253);
    # ATEN_CPU_CAPABILITY=avx512 selects the AVX-512 ones ('auto': when the CPU has them)
    cap = _argv_value("--aten-cpu-capability", "auto")
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    info["aten_cpu_capability_inherited"] = os.environ.get("ATEN_CPU_CAPABILITY")
    if cap == "auto":
        if "ATEN_CPU_CAPABILITY" not in os.environ and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            os.environ["ATEN_CPU_CAPABILITY"] = "avx512"
    elif cap != "keep":
        os.environ["ATEN_CPU_CAPABILITY"] = cap
    info["aten_cpu_capability_env"] = os.environ.get("ATEN_CPU_CAPABILITY")
    info["mallopt"] = None
    if sys.platform.startswith("linux") and "--no-mallopt" not in sys.argv:
        try:
            libc = ctypes.CDLL("libc.so.6")
            M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
            ok = [libc.mallopt(M_MMAP_THRESHOLD, 32 << 20),
                  libc.mallopt(M_TRIM_THRESHOLD, 1 << 30),
                  libc.mallopt(M_TOP_PAD, 256 << 20)]
            info["mallopt"] = "mmap_threshold=32MiB trim_threshold=1GiB top_pad=256MiB ok=%s" % ok
        except OSError:
            pass
    return info


PRE_TORCH = _pre_torch_setup()

import numpy as np  # noqa: E402
import torch  # noqa: E402

# ----------------------------------------------------------------------------- constants
PROBE_RADIUS = 1e-2          # r
PROBE_FRACTION = 0.5         # K = 1 probe at k/(K+1) = 1/2 of the probe radius
SUBSPACE_RANK = 8            # natural rank before the budget shrinks it (polystep from_layout(rank=8))
SEED_PARAMS = 0              # torch.manual_seed before creating the nn.Linear layers
SEED_DATA = 1                # random inputs / labels (784-input workloads)
SEED_ROTATIONS = 2           # Haar rotations R_i
SEED_BASIS = 3               # subspace bases U, V

WORKLOADS = {
    "mlp64-full":      dict(sizes=(64, 64, 64, 10), batch=32, data="digits", space="full", d=2),
    "mlp256-full":     dict(sizes=(64, 256, 256, 10), batch=32, data="digits", space="full", d=2),
    "mlp256-sub512":   dict(sizes=(64, 256, 256, 10), batch=32, data="digits", space="subspace",
                            max_dim=512, d=8),
    "mnist128-sub256": dict(sizes=(784, 128, 10), batch=64, data="randn", space="subspace",
                            max_dim=256, d=8),
    "mnist64-full":    dict(sizes=(784, 64, 10), batch=64, data="randn", space="full", d=2),
}

# coordinate kinds: how a coordinate theta enters the augmented transposed weight
# Waug^T = [W^T ; b] of shape (in+1, out) of its layer
POINT = 0   # Waug^T[i, o] += theta      (full-space weight entry W[o, i]; bias b[o] has i = in)
COL = 1     # W^T[:, o]   += theta v_j   (subspace coordinate A[o, j]: dW = A V^T)
ROW = 2     # W^T[i, :]   += theta u_j   (subspace coordinate B[j, i]: dW = U B)

# elements per chunk (see each method's `plan`); tuned on a 2-core AMD EPYC (Zen 5) with
# OpenBLAS 0.3.21, and generous defaults on CUDA
DEFAULT_CHUNK = {
    "cpu": {"naive": 1 << 20, "prefix": 1 << 20, "delta": 1 << 20},
    "cuda": {"naive": 1 << 27, "prefix": 1 << 27, "delta": 1 << 26},
}


# ----------------------------------------------------------------------------- workload
def digits_standardised(csv_path=None):
    """sklearn's digits (1797 x 64), each feature standardised with the mean/std of all 1797
    samples (std 0 -> 1).  Falls back to the same data as gzip CSV (64 features, then label)."""
    try:
        if csv_path:
            raise ImportError
        from sklearn.datasets import load_digits
        d = load_digits()
        X, y, src = d.data.astype(np.float64), d.target.astype(np.int64), "sklearn.datasets.load_digits"
    except ImportError:
        path = csv_path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                        "digits.csv.gz")
        with gzip.open(path, "rt") as f:
            arr = np.loadtxt(f, delimiter=",")
        X, y, src = arr[:, :64].astype(np.float64), arr[:, 64].astype(np.int64), "digits.csv.gz"
    mu, sd = X.mean(0), X.std(0)
    sd[sd == 0] = 1.0
    return (X - mu) / sd, y, src


def init_params(sizes, seed=SEED_PARAMS):
    """Default nn.Linear init after torch.manual_seed(seed), layers created in order."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(sizes[k], sizes[k + 1]) for k in range(len(sizes) - 1)]
    return [(m.weight.detach().clone(), m.bias.detach().clone()) for m in layers]


def simplex_template(d):
    """Regular simplex, V = d+1 vertices in R^d, centred, unit radius (polystep's construction)."""
    pts = math.sqrt(1 + 1 / d) * torch.eye(d, dtype=torch.float64)
    pts = pts - (math.sqrt(d + 1) + 1) / math.sqrt(d ** 3)
    pts = torch.cat([pts, torch.full((1, d), 1 / math.sqrt(d), dtype=torch.float64)])
    pts = pts - pts.mean(0, keepdim=True)
    pts = pts / pts.norm(dim=1, keepdim=True)
    return pts


def haar_rotations(P, d, seed=SEED_ROTATIONS):
    """P Haar-random rotations in SO(d): QR of a Gaussian, columns sign-fixed by diag(R), first
    column negated where det < 0.  float64, CPU."""
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(P, d, d, generator=g, dtype=torch.float64)
    Q, Rq = torch.linalg.qr(G)
    s = torch.where(torch.diagonal(Rq, dim1=-2, dim2=-1) >= 0, 1.0, -1.0).to(torch.float64)
    Q = Q * s.unsqueeze(-2)
    neg = torch.linalg.det(Q) < 0
    Q[neg, :, 0] = -Q[neg, :, 0]
    return Q


def subspace_allocation(sizes, max_dim, rank=SUBSPACE_RANK):
    """Coordinate counts per parameter entry (model.parameters() order) under max_dim.

    Natural counts: weight (out x in) r0*(out+in) with r0 = min(rank, out, in); bias: out.
    If the total exceeds max_dim:
      (a) biases fit with >= 1 coordinate left per weight: biases stay whole, each weight gets
          max(1, floor(n_w * (max_dim - N_bias) / N_weights + 1/2)) (polystep's rule; then the
          largest count is decremented while the total exceeds max_dim);
      (b) otherwise every entry, biases included, is scaled by s = max_dim / N_total:
          max(1, floor(n * s)), and the coordinates still missing go one each to the entries with
          the largest fractional parts of n * s (ties: earlier entry; entries raised to 1 by the
          max are skipped); a bias keeps its first c elements.
    Returns (entries, rule) with entries = dicts(kind, layer, natural, count).
    """
    entries = []
    for l in range(len(sizes) - 1):
        din, dout = sizes[l], sizes[l + 1]
        r0 = min(rank, din, dout)
        entries.append(dict(kind="weight", layer=l, natural=r0 * (dout + din), r0=r0))
        entries.append(dict(kind="bias", layer=l, natural=dout))
    nat = [e["natural"] for e in entries]
    total = sum(nat)
    if max_dim is None or total <= max_dim:
        counts, rule = list(nat), "none (natural size fits)"
    else:
        nb = sum(e["natural"] for e in entries if e["kind"] == "bias")
        nw = total - nb
        n_weights = sum(1 for e in entries if e["kind"] == "weight")
        if nb + n_weights <= max_dim:
            avail = max_dim - nb
            counts = [e["natural"] if e["kind"] == "bias" else
                      max(1, int(math.floor(e["natural"] * avail / nw + 0.5))) for e in entries]
            while sum(counts) > max_dim:
                k = max((c, -idx) for idx, c in enumerate(counts) if entries[idx]["kind"] == "weight")
                counts[-k[1]] -= 1
            rule = "(a) biases whole, weights scaled by %d/%d" % (avail, nw)
        else:
            s = max_dim / total
            raw = [n * s for n in nat]
            counts = [max(1, int(math.floor(x))) for x in raw]
            missing = max_dim - sum(counts)
            order = sorted((idx for idx in range(len(raw)) if math.floor(raw[idx]) >= 1),
                           key=lambda idx: (-(raw[idx] - math.floor(raw[idx])), idx))
            for idx in order[:max(0, missing)]:
                counts[idx] += 1
            while sum(counts) > max_dim:
                k = max((c, -idx) for idx, c in enumerate(counts))
                counts[-k[1]] -= 1
            rule = "(b) biases do not fit (%d > %d - %d weights): all entries scaled by %d/%d" % (
                nb, max_dim, n_weights, max_dim, total)
    for e, c in zip(entries, counts):
        e["count"] = c
    return entries, rule


class Problem:
    """One workload, fully determined by its name (all tensors float32 values, CPU).

    coordinate table (numpy, one row per coordinate of the search space, in particle order):
      c_layer, c_kind (POINT/COL/ROW), c_i (input row, 'in' for a bias), c_o (unit), c_j (rank index)
    part: (P, d) coordinate ids per particle, -1 = padding (does not exist in the model).
    bases: per layer (U (out, r), V (in, r)) with orthonormal columns, or None in full space.
    """

    def __init__(self, name, sizes, batch, data, space, d, max_dim=None, digits_csv=None):
        self.name, self.sizes, self.batch, self.space, self.d = name, tuple(sizes), batch, space, d
        self.max_dim = max_dim
        self.L = len(sizes) - 1
        self.V = d + 1
        self.params = init_params(self.sizes)
        self.n_params = sum(W.numel() + b.numel() for W, b in self.params)
        if data == "digits":
            X, y, self.data_source = digits_standardised(digits_csv)
            self.X = torch.tensor(X[:batch], dtype=torch.float32)
            self.y = torch.tensor(y[:batch], dtype=torch.int64)
        else:
            g = torch.Generator().manual_seed(SEED_DATA)
            self.X = torch.randn(batch, sizes[0], generator=g)
            self.y = torch.randint(0, sizes[-1], (batch,), generator=g)
            self.data_source = "randn (seed %d)" % SEED_DATA
        rows = []          # (layer, kind, i, o, j)
        self.bases = [None] * self.L
        self.alloc = None
        if space == "full":
            for l in range(self.L):
                din, dout = sizes[l], sizes[l + 1]
                o, i = np.divmod(np.arange(dout * din), din)
                rows.append(np.stack([np.full_like(o, l), np.full_like(o, POINT), i, o, np.zeros_like(o)], 1))
                ob = np.arange(dout)
                rows.append(np.stack([np.full_like(ob, l), np.full_like(ob, POINT), np.full_like(ob, din),
                                      ob, np.zeros_like(ob)], 1))
        else:
            entries, self.alloc_rule = subspace_allocation(sizes, max_dim)
            g = torch.Generator().manual_seed(SEED_BASIS)
            for e in entries:
                l = e["layer"]
                din, dout = sizes[l], sizes[l + 1]
                c = e["count"]
                if e["kind"] == "weight":
                    cA = int(math.floor(c * dout / (dout + din) + 0.5))
                    cB = c - cA
                    r = max(1, -(-cA // dout), -(-cB // din))
                    e.update(count_A=cA, count_B=cB, rank=r, rank_fractional=c / (dout + din))
                    U = torch.linalg.qr(torch.randn(dout, r, generator=g, dtype=torch.float64))[0]
                    Vb = torch.linalg.qr(torch.randn(din, r, generator=g, dtype=torch.float64))[0]
                    self.bases[l] = (U.float(), Vb.float())
                    t = np.arange(cA)
                    j, o = np.divmod(t, dout)
                    rows.append(np.stack([np.full_like(t, l), np.full_like(t, COL), np.full_like(t, -1), o, j], 1))
                    t = np.arange(cB)
                    j, i = np.divmod(t, din)
                    rows.append(np.stack([np.full_like(t, l), np.full_like(t, ROW), i, np.full_like(t, -1), j], 1))
                else:
                    ob = np.arange(c)
                    rows.append(np.stack([np.full_like(ob, l), np.full_like(ob, POINT), np.full_like(ob, din),
                                          ob, np.zeros_like(ob)], 1))
            self.alloc = entries
        table = np.concatenate(rows).astype(np.int64)
        self.c_layer, self.c_kind, self.c_i, self.c_o, self.c_j = (table[:, k].copy() for k in range(5))
        self.n_coords = table.shape[0]
        self.P = -(-self.n_coords // d)
        part = np.full(self.P * d, -1, dtype=np.int64)
        part[:self.n_coords] = np.arange(self.n_coords)
        self.part = part.reshape(self.P, d)
        self.C = self.P * self.V
        self.T = simplex_template(d).float()                  # (V, d)
        self.R = haar_rotations(self.P, d).float()            # (P, d, d)
        self.scale = PROBE_FRACTION * PROBE_RADIUS

    def describe(self):
        s = dict(workload=self.name, sizes=list(self.sizes), batch=self.batch, space=self.space,
                 d=self.d, V=self.V, P=self.P, candidates=self.C, n_params=self.n_params,
                 n_coords=self.n_coords, data=self.data_source)
        if self.space == "subspace":
            s["max_subspace_dim"] = self.max_dim
            s["allocation_rule"] = self.alloc_rule
            s["allocation"] = [{k: v for k, v in e.items()} for e in self.alloc]
        return s

    def particle_layers(self):
        """(P,) first and last layer each particle touches."""
        lay = np.where(self.part >= 0, self.c_layer[np.maximum(self.part, 0)], -1)
        lo = np.where(self.part >= 0, lay, 1 << 30).min(1)
        hi = lay.max(1)
        return lo, hi


# ----------------------------------------------------------------------------- helpers
class Scratch:
    """Per-thread reusable buffers (a real engine would preallocate these once)."""

    def __init__(self):
        self._tls = threading.local()

    def get(self, name, shape, dtype, device):
        d = getattr(self._tls, "bufs", None)
        if d is None:
            d = self._tls.bufs = {}
        key = (name, tuple(shape))
        t = d.get(key)
        if t is None:
            t = d[key] = torch.empty(shape, dtype=dtype, device=device)
        return t


def run_items(items, pool):
    """Run the callables (independent chunks), on a thread pool if one is given (torch ops
    release the GIL; each op is then single-threaded)."""
    if pool is None or len(items) < 2:
        for f in items:
            f()
        return
    for _ in pool.map(lambda f: f(), items):
        pass


def split(n, per):
    """Balanced chunks of range(n), each about `per` long (within a factor 1.5)."""
    k = max(1, int(round(n / max(1, per))))
    bounds = [n * i // k for i in range(k + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i + 1] > bounds[i]]


def to_dev(a, device):
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.int64).to(device)


def incumbent_forward(params, X, y):
    """A[l] = input of Linear l (A[0] = X), Z[l+1] = its output; log-softmax of the logits; L0."""
    A, Z = [X], [None]
    h = X
    L = len(params)
    for l, (W, b) in enumerate(params):
        z = torch.addmm(b, h, W.t())
        Z.append(z)
        if l < L - 1:
            h = torch.relu(z)
            A.append(h)
    logp = torch.log_softmax(Z[L], -1)
    L0 = -logp.gather(1, y.view(-1, 1)).mean()
    return A, Z, logp, L0


def ce_candidates(logits, y, batch_dim):
    """Mean cross-entropy over the batch dimension for logits (..., classes)."""
    lse = torch.logsumexp(logits, -1)
    shape = [1] * (logits.dim() - 1)
    shape[batch_dim] = y.numel()
    idx = y.view(*shape, 1).expand(*logits.shape[:-1], 1)
    return (lse - logits.gather(-1, idx).squeeze(-1)).mean(batch_dim)


def candidate_deltas(T, R, scale):
    """Delta[i, v] = scale * R_i t_v, (P, V, d), flattened (candidate c = i*V + v, slot s)."""
    return (torch.matmul(T, R.transpose(1, 2)) * scale).reshape(-1)


def augmented_wt(params):
    """Per layer [W^T ; b], (in+1, out), contiguous."""
    return [torch.cat([W.t(), b.unsqueeze(0)], 0) for W, b in params]


# ----------------------------------------------------------------------------- materialisation
def update_plan(prob, cands, layer, layout, device):
    """Index plan to add the perturbations of candidates `cands` (numpy, local order k) that fall
    in `layer` to a buffer of that layer's augmented transposed weights, layout 'kio'
    (K, in+1, out) or 'iko' (in+1, K, out).  Values are looked up in the flat delta vector."""
    d = prob.d
    din, dout = prob.sizes[layer], prob.sizes[layer + 1]
    K = len(cands)
    coords = prob.part[cands // prob.V]                          # (K, d)
    kk = np.repeat(np.arange(K), d)
    cid = coords.reshape(-1)
    vidx = (cands[:, None] * d + np.arange(d)[None, :]).reshape(-1)
    ok = cid >= 0
    ok[ok] = prob.c_layer[cid[ok]] == layer
    kk, cid, vidx = kk[ok], cid[ok], vidx[ok]
    kind = prob.c_kind[cid]
    plan = {}
    m = kind == POINT
    if m.any():
        k, i, o = kk[m], prob.c_i[cid[m]], prob.c_o[cid[m]]
        flat = ((k * (din + 1) + i) * dout + o) if layout == "kio" else ((i * K + k) * dout + o)
        plan["point"] = (to_dev(flat, device), to_dev(vidx[m], device))
    m = kind == COL
    if m.any():
        k, o, j = kk[m], prob.c_o[cid[m]], prob.c_j[cid[m]]
        ii = np.arange(din)[None, :]
        if layout == "kio":
            flat = ((k[:, None] * (din + 1) + ii) * dout + o[:, None])
        else:
            flat = ((ii * K + k[:, None]) * dout + o[:, None])
        plan["col"] = (to_dev(flat.reshape(-1), device), to_dev(vidx[m], device), to_dev(j, device))
    m = kind == ROW
    if m.any():
        k, i, j = kk[m], prob.c_i[cid[m]], prob.c_j[cid[m]]
        row = (k * (din + 1) + i) if layout == "kio" else (i * K + k)
        plan["row"] = (to_dev(row, device), to_dev(vidx[m], device), to_dev(j, device))
    return plan


def apply_plan(buf, plan, dflat, Vt, Ut):
    """buf (contiguous, 3-D) += the planned perturbations.  Vt = V^T (r, in), Ut = U^T (r, out)."""
    flat = buf.view(-1)
    if "point" in plan:
        pos, vi = plan["point"]
        flat.index_add_(0, pos, dflat.index_select(0, vi))
    if "col" in plan:
        pos, vi, j = plan["col"]
        vals = dflat.index_select(0, vi).unsqueeze(1) * Vt.index_select(0, j)
        flat.index_add_(0, pos, vals.view(-1))
    if "row" in plan:
        rows, vi, j = plan["row"]
        vals = dflat.index_select(0, vi).unsqueeze(1) * Ut.index_select(0, j)
        buf.view(-1, buf.shape[-1]).index_add_(0, rows, vals)


class Method:
    """Base: owns the problem's index structures on the device.  __call__(params, X, y, R, T)
    returns (incumbent loss, losses (P, V)) for one step; everything that depends on the
    parameters, the rotations or the data happens inside the call (timed)."""

    name = chunk_key = "?"

    def __init__(self, prob, device, dtype=torch.float32, chunk=None, workers=1):
        self.prob, self.device, self.dtype = prob, torch.device(device), dtype
        self.workers = workers
        # a persistent pool, so its threads (and their scratch buffers) live across steps
        self.pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
        self.chunk = chunk or DEFAULT_CHUNK["cuda" if self.device.type == "cuda" else "cpu"][self.chunk_key]
        self.scratch = Scratch()
        P = prob
        self.Ut = [None if b is None else b[0].t().contiguous().to(device, dtype) for b in P.bases]
        self.Vt = [None if b is None else b[1].t().contiguous().to(device, dtype) for b in P.bases]
        self.Vb = [None if b is None else b[1].to(device, dtype) for b in P.bases]

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def buf(self, name, shape):
        return self.scratch.get(name, shape, self.dtype, self.device)

    def _write(self, out, sel, vals):
        if isinstance(sel, slice):
            out[sel] = vals
        else:
            out.index_copy_(0, sel, vals)

    @staticmethod
    def _sel(ids, device):
        """A slice if ids (sorted numpy) are contiguous, else an index tensor."""
        if len(ids) and ids[-1] - ids[0] + 1 == len(ids):
            return slice(int(ids[0]), int(ids[-1]) + 1)
        return to_dev(ids, device)

    def plan_materialised(self, cands, l0, l1, layout):
        return [update_plan(self.prob, cands, l, layout, self.device) for l in range(l0, l1 + 1)]

    def run_materialised(self, WaugT, A, params, y, dflat, cands_K, l0, l1, plans, tag):
        """Candidates that change layers l0..l1: per-candidate weights (K, in+1, out) for those
        layers via baddbmm, then shared layers as one GEMM over all B*K rows.  Returns (K,)."""
        s, L = self.prob.sizes, self.prob.L
        K = cands_K
        B = A[0].shape[0]
        h = A[l0].unsqueeze(0).expand(K, B, s[l0])
        for l, plan in zip(range(l0, l1 + 1), plans):
            din, dout = s[l], s[l + 1]
            buf = self.buf("%s_W%d" % (tag, l), (K, din + 1, dout))
            buf.copy_(WaugT[l].unsqueeze(0).expand(K, din + 1, dout))
            apply_plan(buf, plan, dflat, self.Vt[l], self.Ut[l])
            hn = self.buf("%s_h%d" % (tag, l), (K, B, dout))
            torch.baddbmm(buf[:, din:din + 1, :], h, buf[:, :din, :], out=hn)
            if l < L - 1:
                hn.relu_()
            h = hn
        if l1 == L - 1:
            return ce_candidates(h, y, 1)
        h = h.view(K * B, -1)
        for m in range(l1 + 1, L):
            W, b = params[m]
            hn = self.buf("%s_s%d" % (tag, m), (K * B, s[m + 1]))
            torch.addmm(b, h, W.t(), out=hn)
            if m < L - 1:
                hn.relu_()
            h = hn
        return ce_candidates(h.view(K, B, -1), y, 1)


class Naive(Method):
    """Every candidate's complete weights are materialised; whole forward by baddbmm."""

    name = chunk_key = "naive"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        P = self.prob
        per_cand = P.n_params + P.batch * sum(P.sizes[1:])
        K = max(1, self.chunk // per_cand)
        self.K = K
        self.items = []
        for sl in split(P.C, K):
            cands = np.arange(sl.start, sl.stop)
            self.items.append((sl, len(cands), self.plan_materialised(cands, 0, P.L - 1, "kio")))

    def __call__(self, params, X, y, R, T):
        P = self.prob
        A, Z, logp, L0 = incumbent_forward(params, X, y)
        dflat = candidate_deltas(T, R, P.scale)
        WaugT = augmented_wt(params)
        out = torch.empty(P.C, dtype=self.dtype, device=self.device)
        Ax = [X]

        def make(sel, K, plans):
            def f():
                out[sel] = self.run_materialised(WaugT, Ax, params, y, dflat, K, 0, P.L - 1, plans, "nv")
            return f

        run_items([make(*it) for it in self.items], self.pool)
        return L0, out.view(P.P, P.V)


class Prefix(Method):
    """Prefix reuse: only the first changed layer is materialised, (in+1, K*out) layout."""

    name = chunk_key = "prefix"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        P = self.prob
        lo, hi = P.particle_layers()
        self.items = []
        for l0 in range(P.L):
            for l1 in range(l0, P.L):
                pids = np.nonzero((lo == l0) & (hi == l1))[0]
                if len(pids) == 0:
                    continue
                cands = (pids[:, None] * P.V + np.arange(P.V)[None, :]).reshape(-1)
                width = sum((P.sizes[l] + 1) * P.sizes[l + 1] for l in range(l0, l1 + 1))
                K = max(1, self.chunk // width)
                for sl in split(len(cands), K):
                    cc = cands[sl]
                    layout = "iko" if l1 == l0 else "kio"
                    self.items.append((self._sel(cc, self.device), cc, l0, l1,
                                       self.plan_materialised(cc, l0, l1, layout)))

    def __call__(self, params, X, y, R, T):
        P = self.prob
        s, L = P.sizes, P.L
        A, Z, logp, L0 = incumbent_forward(params, X, y)
        B = X.shape[0]
        dflat = candidate_deltas(T, R, P.scale)
        WaugT = augmented_wt(params)
        ones = torch.ones(B, 1, dtype=self.dtype, device=self.device)
        Aaug = [torch.cat([A[l], ones], 1) for l in range(L)]
        out = torch.empty(P.C, dtype=self.dtype, device=self.device)

        def regular(sel, K, l0, plan):
            din, dout = s[l0], s[l0 + 1]
            buf = self.buf("pf_W", (din + 1, K, dout))
            buf.copy_(WaugT[l0].unsqueeze(1).expand(din + 1, K, dout))
            apply_plan(buf, plan, dflat, self.Vt[l0], self.Ut[l0])
            h = self.buf("pf_z%d" % l0, (B, K * dout))
            torch.mm(Aaug[l0], buf.view(din + 1, K * dout), out=h)
            h = h.view(B * K, dout)
            for m in range(l0 + 1, L):
                h.relu_()
                W, b = params[m]
                hn = self.buf("pf_z%d" % m, (B * K, s[m + 1]))
                torch.addmm(b, h, W.t(), out=hn)
                h = hn
            self._write(out, sel, ce_candidates(h.view(B, K, -1), y, 0))

        def make(sel, cc, l0, l1, plans):
            if l0 == l1:
                return lambda: regular(sel, len(cc), l0, plans[0])
            return lambda: self._write(out, sel, self.run_materialised(
                WaugT, A, params, y, dflat, len(cc), l0, l1, plans, "pfx"))

        run_items([make(*it) for it in self.items], self.pool)
        return L0, out.view(P.P, P.V)


class Delta(Method):
    """Delta propagation ('sparse' in full space, 'subspace-delta' in a subspace).

    A coordinate theta of Linear l changes that layer's pre-activation by a rank-1 term
    theta * src (B) x dir (out):  POINT W[o,i]: src = a[:, i], dir = e_o;  bias: src = 1,
    dir = e_o;  COL A[o,j]: src = (a V)[:, j], dir = e_o;  ROW B[j,i]: src = a[:, i], dir = u_j.
    Regular particles (all coordinates in one layer) are grouped by layer and flavour:
      sparse  (every dir one-hot): dz lives on m <= d units -> (n, m, V*B); the ReLU delta
              and the next layer's rank-m update use only those units;
      dense   (some dir = u_j):   dz = Dir^T (theta * src), dense over the layer's units.
    Particles that touch several layers (few) use dense deltas; a coordinate of a later layer
    acts on the candidate's activations a + da there.  Groups are cut into chunks of about
    `chunk` elements of the widest per-chunk tensor.
    """

    chunk_key = "delta"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        P = self.prob
        self.name = "sparse" if P.space == "full" else "subspace-delta"
        L = P.L
        lo, hi = P.particle_layers()
        self.items = []          # (kind, ...) work descriptors
        # regular particles
        reg = np.nonzero(lo == hi)[0]
        cid = P.part[reg]                                                # (n, d)
        valid = cid >= 0
        c0 = np.maximum(cid, 0)
        kind = np.where(valid, P.c_kind[c0], -1)
        onehot = np.all((kind == POINT) | (kind == COL) | ~valid, axis=1)
        units = np.where(valid & (kind != ROW), P.c_o[c0], -1)
        for l in range(L):
            in_l = lo[reg] == l
            # sparse groups by number of distinct units m
            idx_sparse = np.nonzero(in_l & onehot)[0]
            by_m = {}
            for q in idx_sparse:
                u = list(dict.fromkeys(int(x) for x in units[q] if x >= 0))
                by_m.setdefault(len(u), []).append((q, u))
            for m, lst in sorted(by_m.items()):
                self._add_group(l, "sparse", m, reg, cid, lst)
            idx_dense = np.nonzero(in_l & ~onehot)[0]
            if len(idx_dense):
                self._add_group(l, "dense", 0, reg, cid, [(q, None) for q in idx_dense])
        # particles that touch several layers (straddling a layer boundary): dense deltas
        for l0 in range(L):
            for l1 in range(l0 + 1, L):
                pids = np.nonzero((lo == l0) & (hi == l1))[0]
                if len(pids):
                    self._add_multi(l0, l1, pids)
        self.src_layers = sorted({it[1] for it in self.items})

    def _width(self, l, m=None):
        """Widest per-candidate, per-sample tensor a layer-l candidate needs (sparse flavour:
        m units at layer l+1, dense from layer l+2 on)."""
        s, L = self.prob.sizes, self.prob.L
        return max([m if m else s[l + 1]] + [s[k] for k in range(l + 2, L + 1)])

    def _src_rows(self, l, cid, mask):
        """Row of each coordinate cid (n, d) of layer l in the source table
        [(a V)^T (r rows); a^T (in rows); ones; zeros]; the zeros row where not mask."""
        P = self.prob
        r = 0 if P.bases[l] is None else P.bases[l][0].shape[1]
        c0 = np.maximum(cid, 0)
        src = np.where(P.c_kind[c0] == COL, P.c_j[c0], r + P.c_i[c0])    # POINT/ROW: r + i (bias: r+in)
        return np.where(mask, src, r + P.sizes[l] + 1)

    def _dirs_t(self, l, cid, mask):
        """Direction of each coordinate (e_o or u_j; zero where not mask), as (n, out, d)."""
        P = self.prob
        Dir = torch.zeros(cid.shape[0], cid.shape[1], P.sizes[l + 1], dtype=torch.float64)
        Ut = P.bases[l][0].t().double() if P.bases[l] is not None else None
        for t, k in zip(*np.nonzero(mask)):
            c = cid[t, k]
            if P.c_kind[c] == ROW:
                Dir[t, k] = Ut[P.c_j[c]]
            else:
                Dir[t, k, P.c_o[c]] = 1.0
        return Dir.transpose(1, 2).contiguous().to(self.device, self.dtype)

    def _add_multi(self, l0, l1, pids):
        P = self.prob
        cid = P.part[pids]
        valid = cid >= 0
        lay = np.where(valid, P.c_layer[np.maximum(cid, 0)], -1)
        cands = (pids[:, None] * P.V + np.arange(P.V)[None, :]).reshape(-1)
        layers = []
        for l in range(l0, l1 + 1):
            src = self._src_rows(l, cid, lay == l)
            layers.append((l, to_dev(src.reshape(-1), self.device), to_dev(src, self.device),
                           self._dirs_t(l, cid, lay == l)))
        item = dict(pids=self._sel(pids, self.device), n=len(pids), out=self._sel(cands, self.device),
                    layers=layers, l1=l1)
        self.items.append(("multi", l0, item))

    def _add_group(self, l, flavour, m, reg, cid, lst):
        P = self.prob
        d, V, B = P.d, P.V, P.batch
        q = np.array([x[0] for x in lst])
        pids = reg[q]
        cq = cid[q]
        src = self._src_rows(l, cq, cq >= 0)
        per = max(1, self.chunk // (V * B * self._width(l, m)))
        for sl in split(len(pids), per):
            pp = pids[sl]
            cands = (pp[:, None] * V + np.arange(V)[None, :]).reshape(-1)
            item = dict(pids=self._sel(pp, self.device), n=len(pp),
                        out=self._sel(cands, self.device), src=to_dev(src[sl].reshape(-1), self.device))
            if flavour == "sparse":
                U = np.array([x[1] for x in lst[sl]], dtype=np.int64)         # (n, m) distinct units
                slot = np.zeros((len(pp), m, d))
                for t, (qq, u) in enumerate(lst[sl]):
                    for kk in range(d):
                        c = cid[qq, kk]
                        if c >= 0:
                            slot[t, u.index(int(P.c_o[c])), kk] = 1.0
                item["units"] = to_dev(U.reshape(-1), self.device)
                item["units1"] = to_dev(U[:, 0], self.device)
                item["ET"] = torch.tensor(slot, dtype=self.dtype, device=self.device)   # (n, m, d)
                item["m"] = m
            else:
                item["DirT"] = self._dirs_t(l, cq[sl], cq[sl] >= 0)
            self.items.append((flavour, l, item))

    def __call__(self, params, X, y, R, T):
        # Layout: per-candidate tensors are (n particles, units, V*B): the V candidates of a
        # particle and the batch are the innermost, contiguous axis, and incumbent tensors are
        # repeated V times along it ("Rep", (units, V*B)), so elementwise ops run over long
        # contiguous rows and every dense layer is one small GEMM per particle (bmm).
        P = self.prob
        s, L, d, V = P.sizes, P.L, P.d, P.V
        B = X.shape[0]
        VB = V * B
        dev, dt = self.device, self.dtype
        A, Z, logp, L0 = incumbent_forward(params, X, y)
        logpRep = logp.t().repeat(1, V)                                      # log-softmax (C, V*B)
        pRep = logpRep.exp()
        yRep = y.repeat(V)                                                   # (V*B,)
        dflat = candidate_deltas(T, R, P.scale)
        deltaT = dflat.view(P.P, V, d).transpose(1, 2).contiguous()          # (P, d, V)
        zRep = [None] + [torch.clamp(Z[m], max=0).t().repeat(1, V) for m in range(1, L)]   # min(z,0)
        nRep = [None] + [(-A[m]).t().repeat(1, V) for m in range(1, L)]                    # -relu(z)
        Ws = [W for W, _ in params]
        WTc = [None] + [W.t().contiguous() for W in Ws[1:]]                 # rows = columns of W
        WyT = {L - 1: Ws[L - 1].index_select(0, yRep).t().contiguous()}    # W_last[y_b, :]^T (in, V*B)
        ones = torch.ones(1, B, dtype=dt, device=dev)
        zeros = torch.zeros(1, B, dtype=dt, device=dev)
        SrcT = {}
        for l in self.src_layers:
            aT = A[l].t()
            parts = [aT]
            if self.Vb[l] is not None:
                parts.insert(0, torch.mm(self.Vt[l], aT))                    # (a V)^T: once per layer
            SrcT[l] = torch.cat(parts + [ones, zeros], 0)                   # (r + in + 2, B)
        out = torch.empty(P.C, dtype=dt, device=dev)

        def ce(dl, e=None, dly=None):
            # loss change from logit changes dl (n, C, V*B): log(sum_c p_c exp(dl_c)) - dl_y,
            # with p_c exp(dl_c) = exp(log p_c + dl_c); mean over the batch -> (n, V)
            n = dl.shape[0] if dl is not None else e.shape[0]
            if e is None:
                e = torch.add(dl, logpRep)
            e.exp_()
            if dly is None:
                dly = dl.gather(1, yRep.view(1, 1, VB).expand(n, 1, VB)).squeeze(1)
            return (torch.log(e.sum(1)) - dly).view(n, V, B).mean(2)

        def hidden(dz, m):
            # dz (n, s[m], V*B): pre-activation change at hidden layer m -> da (in place)
            dz.add_(zRep[m])
            return torch.maximum(dz, nRep[m], out=dz)

        def suffix(v, m):
            # v: da at the input of Linear m; dense on deltas to the logits
            n = v.shape[0]
            while True:
                dz = torch.bmm(Ws[m].expand(n, s[m + 1], s[m]), v)
                if m == L - 1:
                    return ce(dz)
                v = hidden(dz, m + 1)
                m += 1

        def scaled_src(it, l, n):
            # Tm[p, k, v*B + b] = delta[p, v, k] * src[p, k, b]  -> (n, d, V*B)
            src = SrcT[l].index_select(0, it["src"]).view(n, d, 1, B)
            return (deltaT[it["pids"]].unsqueeze(3) * src).view(n, d, VB)

        def sparse_group(l, it):
            n, m = it["n"], it["m"]
            Tm = scaled_src(it, l, n)
            if m == 1:                                                       # one unit per particle
                dz = Tm.sum(1)                                               # (n, V*B)
                u = it["units1"]
                if l == L - 1:
                    po = pRep.index_select(0, u)
                    yo = (yRep.view(1, VB) == u.view(n, 1)).to(dt)
                    return (torch.log1p(po * torch.expm1(dz)) - yo * dz).view(n, V, B).mean(2)
                da = torch.maximum(dz + zRep[l + 1].index_select(0, u), nRep[l + 1].index_select(0, u))
                w = WTc[l + 1].index_select(0, u).unsqueeze(2)               # W_{l+1}[:, u]: (n, out, 1)
                if l + 1 == L - 1:                                           # rank-1 logit change
                    dly = WyT[l + 1].index_select(0, u) * da                 # W[y_b, u] * da
                    return ce(None, e=torch.addcmul(logpRep, w, da.unsqueeze(1)), dly=dly)
                v = torch.addcmul(zRep[l + 2], w, da.unsqueeze(1))          # rank-1 update of z
                torch.maximum(v, nRep[l + 2], out=v)
                return suffix(v, l + 2)
            u = it["units"]
            dz = torch.bmm(it["ET"], Tm)                                     # (n, m, V*B)
            if l == L - 1:                                                   # m logits change
                pS = pRep.index_select(0, u).view(n, m, VB)
                yS = (yRep.view(1, 1, VB) == u.view(n, m, 1)).to(dt)
                dL = torch.log1p((pS * torch.expm1(dz)).sum(1)) - (yS * dz).sum(1)
                return dL.view(n, V, B).mean(2)
            da = torch.maximum(dz + zRep[l + 1].index_select(0, u).view(n, m, VB),
                               nRep[l + 1].index_select(0, u).view(n, m, VB))
            wT = WTc[l + 1].index_select(0, u).view(n, m, -1).transpose(1, 2).contiguous()  # (n, out, m)
            dz2 = torch.bmm(wT, da)                                          # rank-m update
            if l + 1 == L - 1:
                return ce(dz2)
            return suffix(hidden(dz2, l + 2), l + 2)

        def dense_group(l, it):
            n = it["n"]
            dz = torch.bmm(it["DirT"], scaled_src(it, l, n))                 # (n, out, V*B)
            if l == L - 1:
                return ce(dz)
            return suffix(hidden(dz, l + 1), l + 1)

        def multi_group(l0, it):
            # several layers: a later layer's own coordinates act on the candidate's activations
            # a + da, so their sources come from a per-candidate table
            n = it["n"]
            th = deltaT[it["pids"]].unsqueeze(3)                             # (n, d, V, 1)
            v = None
            for l, src_flat, src_idx, DirT in it["layers"]:
                din, dout = s[l], s[l + 1]
                if v is None:
                    src = SrcT[l].index_select(0, src_flat).view(n, d, 1, B)
                    dz = torch.bmm(DirT, (th * src).view(n, d, VB))
                else:
                    acand = v + torch.relu(Z[l]).t().repeat(1, V)            # a + da, (n, in, V*B)
                    parts = [acand, torch.ones_like(acand[:, :1]), torch.zeros_like(acand[:, :1])]
                    if self.Vb[l] is not None:
                        parts.insert(0, torch.matmul(self.Vt[l], acand))
                    table = torch.cat(parts, 1)                              # (n, r + in + 2, V*B)
                    src = table.gather(1, src_idx.view(n, d, 1).expand(n, d, VB))
                    dz = torch.bmm(DirT, (th * src.view(n, d, V, B)).view(n, d, VB))
                    dz.baddbmm_(Ws[l].expand(n, dout, din), v)
                if l == L - 1:
                    return ce(dz)
                v = hidden(dz, l + 1)
            return suffix(v, it["l1"] + 1)

        def make(it):
            flavour, l, g = it
            fn = {"sparse": sparse_group, "dense": dense_group, "multi": multi_group}[flavour]
            return lambda: self._write(out, g["out"], fn(l, g).reshape(-1))

        run_items([make(it) for it in self.items], self.pool)
        return L0, (out + L0).view(P.P, P.V)


METHODS = {"naive": Naive, "prefix": Prefix, "delta": Delta}


def method_names(prob):
    return ["naive", "prefix", "sparse" if prob.space == "full" else "subspace-delta"]


def build_method(name, prob, device, dtype=torch.float32, chunk=None, workers=1):
    key = "delta" if name in ("sparse", "subspace-delta", "delta", "structured") else name
    return METHODS[key](prob, device, dtype=dtype, chunk=chunk, workers=workers)


def step_inputs(prob, device, dtype):
    params = [(W.to(device, dtype), b.to(device, dtype)) for W, b in prob.params]
    return (params, prob.X.to(device, dtype), prob.y.to(device), prob.R.to(device, dtype),
            prob.T.to(device, dtype))


# ----------------------------------------------------------------------------- reference checks
def reference_losses(prob, threads=None):
    """Naive in float64 on the float32 problem values: (L0, losses (P, V)) on CPU."""
    m = build_method("naive", prob, "cpu", dtype=torch.float64, chunk=1 << 21)
    with torch.no_grad():
        L0, losses = m(*step_inputs(prob, "cpu", torch.float64))
    return float(L0), losses


def literal_check(prob, L0ref, ref, n_random=16, seed=7):
    """Independent float64 ground truth for a few candidates (all straddling particles plus
    random ones): build the perturbed nn.Sequential literally (full space: vector_to_parameters;
    subspace: dW = A V^T + U B from dense A, B) and run it.  Returns the max abs difference."""
    s, L = prob.sizes, prob.L
    layers = []
    for l in range(L):
        layers.append(torch.nn.Linear(s[l], s[l + 1]).double())
        if l < L - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    base = [(W.double(), b.double()) for W, b in prob.params]

    def load(pairs):
        with torch.no_grad():
            for l, (W, b) in enumerate(pairs):
                net[2 * l].weight.copy_(W)
                net[2 * l].bias.copy_(b)

    X, y = prob.X.double(), prob.y
    Td, Rd = prob.T.double(), prob.R.double()
    lo, hi = prob.particle_layers()
    g = torch.Generator().manual_seed(seed)
    pick = set(np.nonzero(lo != hi)[0].tolist())
    pick |= set(torch.randint(0, prob.P, (n_random,), generator=g).tolist())
    worst = 0.0
    with torch.no_grad():
        load(base)
        l0 = torch.nn.functional.cross_entropy(net(X), y).item()
        worst = max(worst, abs(l0 - L0ref))
        for pi in sorted(pick):
            for v in range(prob.V):
                theta = prob.scale * (Rd[pi] @ Td[v])
                pairs = [(W.clone(), b.clone()) for W, b in base]
                if prob.space == "full":
                    flat = torch.cat([torch.cat([W.reshape(-1), b]) for W, b in pairs])
                    for k, c in enumerate(prob.part[pi]):
                        if c >= 0:
                            flat[c] += theta[k]
                    torch.nn.utils.vector_to_parameters(flat, net.parameters())
                else:
                    Ad = [None] * L
                    Bd = [None] * L
                    for l in range(L):
                        if prob.bases[l] is not None:
                            r = prob.bases[l][0].shape[1]
                            Ad[l] = torch.zeros(s[l + 1], r, dtype=torch.float64)
                            Bd[l] = torch.zeros(r, s[l], dtype=torch.float64)
                    for k, c in enumerate(prob.part[pi]):
                        if c < 0:
                            continue
                        l, kind = prob.c_layer[c], prob.c_kind[c]
                        if kind == COL:
                            Ad[l][prob.c_o[c], prob.c_j[c]] += theta[k]
                        elif kind == ROW:
                            Bd[l][prob.c_j[c], prob.c_i[c]] += theta[k]
                        else:
                            pairs[l][1][prob.c_o[c]] += theta[k]
                    for l in range(L):
                        if Ad[l] is not None:
                            U, Vb = (t.double() for t in prob.bases[l])
                            pairs[l] = (pairs[l][0] + Ad[l] @ Vb.t() + U @ Bd[l], pairs[l][1])
                    load(pairs)
                lc = torch.nn.functional.cross_entropy(net(X), y).item()
                worst = max(worst, abs(lc - float(ref[pi, v])))
    return worst, len(pick) * prob.V


def parity(L0, losses, L0ref, ref):
    """Max relative error of the float32 losses (incumbent included) vs the float64 reference,
    and the max abs error of the loss differences L - L0."""
    Lc = losses.detach().cpu().double()
    rel = ((Lc - ref).abs() / ref.abs()).max().item()
    rel = max(rel, abs(float(L0) - L0ref) / abs(L0ref))
    dd = ((Lc - float(L0)) - (ref - L0ref)).abs().max().item()
    return rel, dd


# ----------------------------------------------------------------------------- timing
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class LoadMonitor:
    """CPU time used by *other* processes (in cores) over an interval, from /proc/stat."""

    def __init__(self):
        self.ok = os.path.exists("/proc/stat")

    def _busy(self):
        with open("/proc/stat") as f:
            v = list(map(int, f.readline().split()[1:9]))
        return sum(v) - v[3] - v[4]

    def _self(self):
        with open("/proc/self/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
        return int(x[11]) + int(x[12])

    def start(self):
        if self.ok:
            self.t0, self.b0, self.s0 = time.perf_counter(), self._busy(), self._self()

    def stop(self):
        if not self.ok:
            return None
        dt = time.perf_counter() - self.t0
        return max(0.0, ((self._busy() - self.b0) - (self._self() - self.s0)) / CLK_TCK / max(dt, 1e-9))


def wait_quiet(max_wait, threshold=0.1):
    """Wait (up to max_wait s) until other processes use < threshold cores over 1 s."""
    mon = LoadMonitor()
    if not mon.ok or max_wait <= 0:
        return None
    t0 = time.perf_counter()
    while True:
        mon.start()
        time.sleep(1.0)
        f = mon.stop()
        if f < threshold or time.perf_counter() - t0 >= max_wait:
            return f


def time_calls(fn, repeats, warmup, device, quiet_wait=0.0, retries=2, contended=0.15, min_warm_s=0.5):
    """cold = the first call on a fresh evaluator; then more untimed calls, at least warmup-1
    and until warm-up has lasted min_warm_s (short calls after an idle period otherwise run on a
    core that has not ramped up yet); then `repeats` timed calls.  CUDA: events around each
    call, synchronised after each.
    CPU: the CPU time that *other* processes used during the timed block is recorded
    (foreign_load_cores, from /proc/stat; blocks under 0.5 s are judged over a 0.5 s window
    after them as well); a block above `contended` cores is timed again (after waiting up to
    quiet_wait s for quiet), at most `retries` times, and the least contended block is kept."""
    cuda = torch.device(device).type == "cuda"

    def one():
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            e0.record()
            res = fn()
            e1.record()
            torch.cuda.synchronize()
            return e0.elapsed_time(e1), res
        t0 = time.perf_counter()
        res = fn()
        return (time.perf_counter() - t0) * 1e3, res

    def warm(t0, done):
        while done < warmup or (time.perf_counter() - t0 < min_warm_s and done < 1000):
            one()
            done += 1
        return done

    wait_quiet(quiet_wait)
    t0 = time.perf_counter()
    cold, res = one()
    n_warm = warm(t0, 1)
    best = None
    for attempt in range(retries + 1):
        if attempt:
            wait_quiet(quiet_wait)
            n_warm += warm(time.perf_counter(), 0)
        mon = LoadMonitor()
        mon.start()
        times = []
        for _ in range(repeats):
            t, res = one()
            times.append(t)
        load = None if cuda else mon.stop()
        if load is not None and sum(times) < 500:
            mon.start()
            time.sleep(0.5)
            load = max(load, mon.stop())
        if best is None or (load or 0) < (best[1] or 0):
            best = (times, load, attempt)
        if cuda or load is None or load <= contended:
            break
    times, load, attempt = best
    q1, q3 = np.percentile(times, [25, 75])
    return dict(cold_ms=cold, median_ms=statistics.median(times), iqr_ms=float(q3 - q1),
                min_ms=min(times), max_ms=max(times), times_ms=times, reps=repeats,
                foreign_load_cores=load, timing_attempts=attempt + 1, warmup_calls=n_warm), res


# ----------------------------------------------------------------------------- environment
def blas_info():
    libs, core = set(), None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if any(k in p for k in ("blas", "blis", "lapack", "mkl", "dnnl")):
                    libs.add(os.path.basename(p))
                    if "libopenblas" in p and core is None:
                        try:
                            ob = ctypes.CDLL(p)
                            ob.openblas_get_corename.restype = ctypes.c_char_p
                            core = ob.openblas_get_corename().decode()
                        except (OSError, AttributeError):
                            pass
    except OSError:
        pass
    return dict(libs=sorted(libs), openblas_core=core)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def env_info(device):
    cfg = torch.__config__.show()
    cap = cfg.split("CPU capability usage:")[1].split()[0] if "CPU capability usage:" in cfg else None
    binfo = cfg.split("BLAS_INFO=")[1].split(",")[0] if "BLAS_INFO=" in cfg else None
    e = dict(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__,
             aten_cpu_capability=cap, torch_blas_info=binfo,
             cpu=cpu_model(), cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count(), blas=blas_info(), pre_torch=PRE_TORCH,
             date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if torch.device(device).type == "cuda":
        e["gpu"] = torch.cuda.get_device_name(0)
        e["cuda"] = torch.version.cuda
        e["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return e


# ----------------------------------------------------------------------------- safetensors dump
def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer (little-endian, row-major, 8-byte aligned header)."""
    names = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        t = t.detach().cpu().contiguous()
        b = t.numpy().tobytes()
        header[k] = dict(dtype=names[t.dtype], shape=list(t.shape), data_offsets=[off, off + len(b)])
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def dump_workload(prob, L0ref, ref, losses32, path):
    t = {}
    for l, (W, b) in enumerate(prob.params):
        t["%d.weight" % (2 * l)] = W                      # nn.Sequential(Linear, ReLU, ...) names
        t["%d.bias" % (2 * l)] = b
    t["input"], t["target"] = prob.X, prob.y
    t["template"], t["rotations"] = prob.T, prob.R
    t["particles"] = torch.as_tensor(prob.part)
    t["coord_table"] = torch.as_tensor(np.stack([prob.c_layer, prob.c_kind, prob.c_i, prob.c_o, prob.c_j], 1))
    for l, bs in enumerate(prob.bases):
        if bs is not None:
            t["basis.%d.U" % l], t["basis.%d.V" % l] = bs
    t["losses_ref_f64"] = ref.double()
    t["incumbent_loss_ref_f64"] = torch.tensor([L0ref], dtype=torch.float64)
    t["losses_naive_f32"] = losses32.detach().cpu().float()
    meta = dict(prob.describe())
    meta.update(probe_scale=prob.scale, coord_table_columns="layer,kind(0=POINT,1=COL,2=ROW),i,o,j",
                torch=torch.__version__)
    write_safetensors(path, t, {k: json.dumps(v) if not isinstance(v, str) else v for k, v in meta.items()})


# ----------------------------------------------------------------------------- commands
def parse_threads(spec, device):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = []
    for t in spec.split(","):
        n = cores if t == "all" else int(t)
        if n not in out:
            out.append(n)
    return out


def cuda_graphed(m, inputs):
    """Capture one evaluation into a CUDA graph.  Returns (run, capture_ms): run() copies the
    step inputs into the graph's static input tensors (as a real step would: new parameters and
    rotations every step), replays the graph and returns its static outputs."""
    flat = [t for W, b in inputs[0] for t in (W, b)] + list(inputs[1:])
    static = [t.clone() for t in flat]
    L = len(inputs[0])
    sparams = [(static[2 * l], static[2 * l + 1]) for l in range(L)]
    sinputs = [sparams] + static[2 * L:]
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            m(*sinputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = m(*sinputs)
    torch.cuda.synchronize()
    capture_ms = (time.perf_counter() - t0) * 1e3

    def run():
        for dst, src in zip(static, flat):
            dst.copy_(src)
        graph.replay()
        return outs
    return run, capture_ms


def run_suite(a):
    dev = a.device
    cuda = torch.device(dev).type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    names = list(WORKLOADS) if a.workloads == "all" else a.workloads.split(",")
    records = []
    env = env_info(dev)
    print("# torch %s | %s | ATen CPU capability %s | BLAS %s %s (%s) | %s" % (
        torch.__version__, env["cpu"], env["aten_cpu_capability"], env["torch_blas_info"],
        env["blas"]["libs"], env["blas"]["openblas_core"], env.get("gpu", "cpu")), flush=True)
    if env["blas"]["libs"] and any(l.startswith("libblas") for l in env["blas"]["libs"]) \
            and not any("openblas" in l for l in env["blas"]["libs"]):
        print("# WARNING: torch uses the reference BLAS (libblas); install an optimised one "
              "(Debian: apt-get install libopenblas0-openmp)", flush=True)
    threads_list = parse_threads(a.threads if a.threads else ("1" if cuda else "1,all"), dev)
    all_cores = parse_threads("all", dev)[0]
    for wname in names:
        cfg = WORKLOADS[wname]
        prob = Problem(wname, digits_csv=a.digits_csv, **cfg)
        info = prob.describe()
        print("\n## %s: sizes %s, batch %d, %s, d=%d, P=%d, V=%d, C=%d candidates, %d coordinates"
              % (wname, "-".join(map(str, prob.sizes)), prob.batch,
                 "full space" if prob.space == "full" else "subspace", prob.d, prob.P, prob.V,
                 prob.C, prob.n_coords), flush=True)
        if prob.space == "subspace":
            print("   allocation %s: %s" % (prob.alloc_rule, ", ".join(
                "%s%d=%d" % (e["kind"][0].upper(), e["layer"], e["count"]) for e in prob.alloc)), flush=True)
        L0ref, ref = None, None
        if not a.no_parity:
            torch.set_num_threads(all_cores)
            t0 = time.perf_counter()
            L0ref, ref = reference_losses(prob)
            lit, nlit = literal_check(prob, L0ref, ref)
            print("   float64 reference: %.1f s; literal nn.Module check on %d candidates: max abs err %.2e"
                  % (time.perf_counter() - t0, nlit, lit), flush=True)
            info["reference_literal_check_max_abs_err"] = lit
            if lit > 1e-10:
                print("   WARNING: the float64 reference disagrees with the literal module check", flush=True)
        meths = method_names(prob) if a.methods == "all" else [] if a.methods == "none" else [
            m if m not in ("sparse", "subspace-delta", "structured") else method_names(prob)[2]
            for m in a.methods.split(",")]
        for mname in meths:
            for th in threads_list:
                modes = ["intraop"]
                if th > 1 and not cuda:
                    modes = {"intraop": ["intraop"], "chunks": ["chunks"],
                             "both": ["intraop", "chunks"]}[a.parallel]
                for mode in modes:
                    for graphed in ([False, True] if cuda and not a.no_cuda_graphs else [False]):
                        workers = th if mode == "chunks" else 1
                        torch.set_num_threads(1 if mode == "chunks" else th)
                        chunk = a.chunk.get(mname) if a.chunk else None
                        m = build_method(mname, prob, dev, chunk=chunk, workers=workers)
                        inputs = step_inputs(prob, dev, torch.float32)
                        capture_ms = None
                        with torch.no_grad():
                            fn = lambda: m(*inputs)  # noqa: E731
                            if graphed:
                                fn, capture_ms = cuda_graphed(m, inputs)
                            rec, (L0, losses) = time_calls(fn, a.repeats, a.warmup, dev,
                                                           quiet_wait=a.quiet_wait)
                        r = dict(suite="step", workload=wname, path=m.name + ("+cudagraph" if graphed else ""),
                                 device=str(dev), dtype="float32", threads=th,
                                 parallel=mode if th > 1 else "none", candidates=prob.C, batch=prob.batch)
                        r.update(rec)
                        if graphed:
                            r["cold_ms"] += capture_ms        # capture (2 eager warm-ups + capture) + 1st replay
                            r["capture_ms"] = capture_ms
                        if ref is not None:
                            rel, dd = parity(L0, losses, L0ref, ref)
                            r["parity_max_rel_err"] = rel
                            r["parity_max_abs_err_loss_change"] = dd
                        else:
                            r["parity_max_rel_err"] = None
                        r.update(chunk_elements=m.chunk, incumbent_loss=float(L0),
                                 checksum_mean_loss=float(losses.double().mean()))
                        r["us_per_candidate"] = r["median_ms"] * 1e3 / prob.C
                        r["workload_info"] = info
                        records.append(r)
                        fl = rec["foreign_load_cores"]
                        print("   %-25s threads=%d%-9s cold %9.2f  median %9.2f ms  (min %9.2f, max %9.2f, "
                              "IQR %7.2f)  %.3f us/cand  parity %s%s" % (
                                  r["path"], th, "" if th == 1 else "/" + mode, r["cold_ms"], r["median_ms"],
                                  r["min_ms"], r["max_ms"], r["iqr_ms"], r["us_per_candidate"],
                                  "%.2e" % r["parity_max_rel_err"] if ref is not None else "-",
                                  "" if not fl or fl < 0.15 else "  (foreign load %.2f cores)" % fl), flush=True)
                        m.close()
                        m = fn = None     # free the evaluator, its buffers and any CUDA graph
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            torch.set_num_threads(all_cores)
            if ref is None:
                L0ref, ref = reference_losses(prob)
            nv = build_method("naive", prob, "cpu")
            with torch.no_grad():
                _, l32 = nv(*step_inputs(prob, "cpu", torch.float32))
            path = os.path.join(a.dump, wname + ".safetensors")
            dump_workload(prob, L0ref, ref, l32, path)
            print("   wrote %s" % path, flush=True)
    print_table(records)
    if a.json:
        with open(a.json, "w") as f:
            opts = {k: v for k, v in vars(a).items() if k not in ("json", "dump", "digits_csv")}
            json.dump(dict(records=records, env=env, options=opts), f, indent=1)
        print("wrote %s" % a.json)
    return records


def print_table(records):
    if not records:
        return
    print("\n| workload | C | path | device | threads | cold ms | median ms | min ms | max ms | IQR ms "
          "| us/cand | parity (max rel err) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        th = str(r["threads"]) + ("" if r["parallel"] in ("none", "intraop") else "/" + r["parallel"])
        print("| %s | %d | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f | %s |" % (
            r["workload"], r["candidates"], r["path"], r["device"], th, r["cold_ms"], r["median_ms"],
            r["min_ms"], r["max_ms"], r["iqr_ms"], r["us_per_candidate"],
            "%.1e" % r["parity_max_rel_err"] if r["parity_max_rel_err"] is not None else "-"))


def run_tune(a):
    """Sweep chunk sizes (elements per chunk) per workload and method; prints medians."""
    dev = a.device
    names = list(WORKLOADS) if a.workloads == "all" else a.workloads.split(",")
    chunks = [int(eval(c, {})) for c in a.tune.split(",")]
    for th in parse_threads(a.threads or "1", dev):
        torch.set_num_threads(th)
        for wname in names:
            prob = Problem(wname, digits_csv=a.digits_csv, **WORKLOADS[wname])
            meths = method_names(prob) if a.methods == "all" else a.methods.split(",")
            for mname in meths:
                for ch in chunks:
                    m = build_method(mname, prob, dev, chunk=ch)
                    inputs = step_inputs(prob, dev, torch.float32)
                    with torch.no_grad():
                        rec, _ = time_calls(lambda: m(*inputs), a.repeats, a.warmup, dev,
                                            quiet_wait=a.quiet_wait)
                    print("tune %s %s threads=%d chunk=%d (2^%.1f): median %.2f ms (min %.2f, max %.2f) "
                          "foreign load %s" % (wname, m.name, th, ch, math.log2(ch), rec["median_ms"],
                                               rec["min_ms"], rec["max_ms"], rec["foreign_load_cores"]),
                          flush=True)


def selftest(a):
    """Exactness on awkward shapes: odd d, particles straddling rows, tensors and layers,
    padding, subspace rules (a) and (b), every method (on --device; on CPU also with Python-thread
    chunks), float64 (1e-12) and float32 (1e-5) against the float64 naive reference on CPU."""
    torch.set_num_threads(1)
    cases = [
        dict(name="full-d3", sizes=(4, 7, 6, 3), batch=4, data="randn", space="full", d=3),
        dict(name="full-d5", sizes=(6, 9, 4), batch=5, data="randn", space="full", d=5),
        dict(name="full-d2-2layer", sizes=(7, 5, 3), batch=3, data="randn", space="full", d=2),
        dict(name="sub-a", sizes=(13, 11, 9, 4), batch=6, data="randn", space="subspace", max_dim=57, d=8),
        dict(name="sub-b", sizes=(12, 20, 16, 5), batch=4, data="randn", space="subspace", max_dim=40, d=8),
        dict(name="sub-fit", sizes=(6, 5, 3), batch=4, data="randn", space="subspace", max_dim=10000, d=3),
        dict(name="sub-d5", sizes=(10, 9, 7, 3), batch=5, data="randn", space="subspace", max_dim=45, d=5),
        dict(name="full-3layers", sizes=(2, 2, 1, 2, 3), batch=4, data="randn", space="full", d=5),
        dict(name="sub-3layers", sizes=(3, 2, 2, 3), batch=4, data="randn", space="subspace", max_dim=12, d=8),
    ]
    worst = 0.0
    ok = True
    for c in cases:
        name = c.pop("name")
        prob = Problem(name, **c)
        L0ref, ref = reference_losses(prob)
        lit, nlit = literal_check(prob, L0ref, ref, n_random=prob.P)
        line = ["%-15s P=%-4d C=%-5d literal %.1e" % (name, prob.P, prob.C, lit)]
        ok &= lit < 1e-12
        for mname in method_names(prob):
            err = {torch.float64: 0.0, torch.float32: 0.0}
            for dtype in (torch.float64, torch.float32):
                for workers in ((1, 2) if a.device == "cpu" else (1,)):
                    for chunk in (64, 1 << 20):
                        m = build_method(mname, prob, a.device, dtype=dtype, chunk=chunk, workers=workers)
                        with torch.no_grad():
                            L0, losses = m(*step_inputs(prob, a.device, dtype))
                        m.close()
                        err[dtype] = max(err[dtype], parity(L0, losses, L0ref, ref)[0])
            good = err[torch.float64] < 1e-12 and err[torch.float32] < 1e-5
            ok &= good
            worst = max(worst, err[torch.float32])
            line.append("%s f64 %.1e f32 %.1e%s" % (mname, err[torch.float64], err[torch.float32],
                                                   "" if good else " FAIL"))
        if prob.space == "subspace":
            line.append("rule " + prob.alloc_rule.split(" ")[0])
        lo, hi = prob.particle_layers()
        line.append("straddling %d" % int((lo != hi).sum()))
        print("  ".join(line), flush=True)
    print("selftest %s (worst float32 max rel err %.2e)" % ("PASSED" if ok else "FAILED", worst))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="all", help="comma list of %s, or all" % ",".join(WORKLOADS))
    ap.add_argument("--methods", default="all",
                    help="comma list of naive,prefix,structured (structured = sparse or subspace-delta)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", default=None,
                    help="torch.set_num_threads values, comma list; 'all' = every core we may use "
                         "(default: 1,all on CPU, 1 on CUDA)")
    ap.add_argument("--no-cuda-graphs", action="store_true",
                    help="on CUDA, time only eager execution (default: eager and CUDA-graph replay)")
    ap.add_argument("--parallel", choices=["intraop", "chunks", "both"], default="intraop",
                    help="for threads > 1 on CPU: intraop = torch.set_num_threads(T); chunks = T Python "
                         "threads over candidate chunks, each op single-threaded; both = time both")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk", default=None,
                    help="elements per chunk per method, e.g. naive=1048576,prefix=524288,delta=262144")
    ap.add_argument("--no-parity", action="store_true", help="skip the float64 reference")
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--dump", default=None, help="write DIR/<workload>.safetensors (tensors + expected losses)")
    ap.add_argument("--digits-csv", default=None, help="digits as gzip CSV if sklearn is missing")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="wait up to S seconds for other processes to go idle before each timing")
    ap.add_argument("--openblas-coretype", default="auto",
                    help="auto (drop an inherited OPENBLAS_CORETYPE), keep, or a core name")
    ap.add_argument("--aten-cpu-capability", default="auto",
                    help="auto (avx512 where the CPU has it, unless ATEN_CPU_CAPABILITY is set), keep, "
                         "default, avx2 or avx512")
    ap.add_argument("--no-mallopt", action="store_true", help="leave glibc malloc settings alone")
    ap.add_argument("--tune", default=None, help="comma list of chunk sizes to sweep (e.g. 2**16,2**18)")
    ap.add_argument("--selftest", action="store_true", help="exactness checks on awkward shapes")
    a = ap.parse_args()
    if a.chunk:
        kv = dict(x.split("=") for x in a.chunk.split(","))
        a.chunk = {}
        for k, v in kv.items():
            v = int(eval(v, {}))
            for m in (["sparse", "subspace-delta"] if k in ("delta", "structured") else [k]):
                a.chunk[m] = v
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: this torch build sees no CUDA device")
    if a.selftest:
        sys.exit(0 if selftest(a) else 1)
    if not a.device.startswith("cuda") and a.methods != "none":
        # Timed on the CPU: a ratio against the reference BLAS would be inflated.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from blas_check import require_optimised_blas
        require_optimised_blas("bench/torch_step.py")
    if a.tune:
        run_tune(a)
        return
    run_suite(a)


if __name__ == "__main__":
    main()
