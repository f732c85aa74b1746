"""PyTorch interop: ``nn.Sequential`` <-> :class:`polyprobe.Model`, and PyTorch modules for
every built-in layer kind ``torch.nn`` lacks, with polyprobe's arithmetic and parameter names:
:class:`Sign`, :class:`Staircase`, :class:`TransformedLinear` (sign, int8 or int4 weights),
:class:`SelfAttention` (softmax or argmax), :class:`HardMoE`, :class:`LIF` and
:class:`CheriBlock`. A model trained in polyprobe runs in PyTorch through
:meth:`polyprobe.Model.to_torch`, and a model defined in PyTorch with these modules trains in
polyprobe through :meth:`polyprobe.Model.from_torch` and comes back with its weights.

These modules are forward definitions for deployment: where polyprobe's arithmetic is a step
(sign, rounding, argmax, a spike threshold) their gradient is zero almost everywhere, as the
arithmetic's is.

Importing this module needs torch (Debian's python3-torch)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("polyprobe.torch needs PyTorch (Debian: apt-get install python3-torch)") from e

__all__ = ["CheriBlock", "HardMoE", "LIF", "LayerNorm", "SelfAttention", "Sign", "Staircase",
           "TransformedLinear", "from_torch", "quantise", "to_torch"]

# The linear layer's weight transforms: name -> largest |level| (None: not a quantiser).
_LEVELS = {"identity": None, "sign": None, "int8": 127, "int4": 7}


def quantise(w: torch.Tensor, transform: str, step: float = 1.0 / 64.0) -> torch.Tensor:
    """A linear layer's elementwise weight transform Q(w): ``identity``; ``sign`` (-1, 0 or 1);
    ``int8`` / ``int4``: ``clamp(round(w / step), -L, L) * step`` with L = 127 or 7 (round half
    to even, as polyprobe's nearbyint)."""
    if transform == "identity":
        return w
    if transform == "sign":
        return torch.sign(w)
    if transform not in _LEVELS:
        raise ValueError(f"unknown weight transform {transform!r} (use identity, sign, int8 or "
                         "int4)")
    levels = float(_LEVELS[transform])
    return torch.clamp(torch.round(w / step), -levels, levels) * step


class Sign(nn.Module):
    """sign(x) in {-1, 0, 1}: polyprobe's ``sign`` layer (zero gradient almost everywhere)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)


class Staircase(nn.Module):
    """``step * floor(x / step)``: polyprobe's ``staircase`` layer."""

    def __init__(self, step: float = 0.25) -> None:
        super().__init__()
        self.step = float(step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step * torch.floor(x / self.step)

    def extra_repr(self) -> str:
        return f"step={self.step}"


class TransformedLinear(nn.Linear):
    """polyprobe's ``linear`` with weight transforms: ``y = x Q(W)^T + Qb(b)`` over the last
    dimension, Q and Qb as :func:`quantise` (``weight`` and ``bias`` hold the raw values)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 weight_transform: str = "identity", bias_transform: str = "identity",
                 quant_step: float = 1.0 / 64.0) -> None:
        super().__init__(in_features, out_features, bias=bias)
        for t in (weight_transform, bias_transform):
            if t not in _LEVELS:
                raise ValueError(f"TransformedLinear: unknown transform {t!r} (use identity, "
                                 "sign, int8 or int4)")
        if not quant_step > 0:
            raise ValueError(f"TransformedLinear: quant_step must be positive, got {quant_step}")
        self.weight_transform, self.bias_transform = weight_transform, bias_transform
        self.quant_step = float(quant_step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else quantise(self.bias, self.bias_transform,
                                                       self.quant_step)
        return F.linear(x, quantise(self.weight, self.weight_transform, self.quant_step), bias)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, weight_transform={self.weight_transform}, "
                f"bias_transform={self.bias_transform}, quant_step={self.quant_step}")


class LayerNorm(nn.Module):
    """polyprobe's ``layer_norm`` where ``nn.LayerNorm`` cannot say it: an affine scale without
    a bias (``nn.LayerNorm(bias=False)`` needs PyTorch 2.1)."""

    def __init__(self, normalized_shape: Sequence[int], eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, None, self.eps)


class SelfAttention(nn.MultiheadAttention):
    """polyprobe's ``self_attention`` on ``[B, L, E]``: ``nn.MultiheadAttention`` called on
    (x, x, x) (same parameters); ``attention="argmax"`` makes each query's weights the one-hot
    of its best score; ``causal`` lets position i attend to j <= i only."""

    def __init__(self, embed_dim: int, num_heads: int, attention: str = "softmax",
                 bias: bool = True, causal: bool = False) -> None:
        if attention not in ("softmax", "argmax"):
            raise ValueError(f"SelfAttention: attention must be softmax or argmax, got "
                             f"{attention!r}")
        super().__init__(embed_dim, num_heads, bias=bias, batch_first=True)
        self.attention, self.causal = attention, bool(causal)

    def scores(self, x: torch.Tensor):
        """(scaled scores [B, H, L, L] with the causal mask applied, values [B, H, L, d])."""
        b, length, e = x.shape
        d = e // self.num_heads
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).split(e, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, length, self.num_heads, d).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        s = (q / d ** 0.5) @ k.transpose(-1, -2)
        if self.causal:
            mask = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
            s = s.masked_fill(mask, float("-inf"))
        return s, v

    def mix(self, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """out_proj of the heads' weighted values, back to [B, L, E]."""
        b, _, length, _ = v.shape
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, length, self.embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        s, v = self.scores(x)
        if self.attention == "softmax":
            weights = torch.softmax(s, dim=-1)
        else:
            weights = F.one_hot(s.argmax(-1), s.shape[-1]).to(x.dtype)
        return self.mix(weights, v)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"attention={self.attention}, causal={self.causal}")


class HardMoE(nn.Module):
    """polyprobe's ``moe`` over the last dimension: the router (a Linear) picks the argmax
    expert per position, whose Linear output is the output (no gate scaling)."""

    def __init__(self, in_features: int, num_experts: int, out_features: int) -> None:
        super().__init__()
        self.router = nn.Linear(in_features, num_experts)
        self.experts = nn.ModuleList([nn.Linear(in_features, out_features)
                                      for _ in range(num_experts)])

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """The one-hot choice [..., E] of each position."""
        logits = self.router(x)
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(x.dtype)

    def combine(self, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        every = torch.stack([e(x) for e in self.experts], dim=-2)  # [..., E, out]
        return (gates.unsqueeze(-1) * every).sum(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine(x, self.gates(x))


class LIF(nn.Module):
    """polyprobe's ``lif``: leaky integrate-and-fire neurons driven by the input as a constant
    current for ``steps`` steps (``v = beta v + I``, a spike where ``v >= threshold``, then
    reset by subtraction or to zero); the output is the firing rate."""

    def __init__(self, steps: int = 8, beta: float = 0.9, threshold: float = 1.0,
                 reset: str = "subtract") -> None:
        super().__init__()
        if reset not in ("subtract", "zero"):
            raise ValueError(f"LIF: reset must be subtract or zero, got {reset!r}")
        self.steps, self.beta, self.threshold, self.reset = int(steps), float(beta), \
            float(threshold), reset

    def spike(self, v: torch.Tensor) -> torch.Tensor:
        """The Heaviside step at the threshold (a subclass may give it a surrogate gradient)."""
        return (v >= self.threshold).to(v.dtype)

    def forward(self, current: torch.Tensor) -> torch.Tensor:
        v = torch.zeros_like(current)
        spikes = torch.zeros_like(current)
        for _ in range(self.steps):
            v = self.beta * v + current
            s = self.spike(v)
            spikes = spikes + s
            v = v * (1 - s) if self.reset == "zero" else v - s * self.threshold
        return spikes / self.steps

    def extra_repr(self) -> str:
        return (f"steps={self.steps}, beta={self.beta}, threshold={self.threshold}, "
                f"reset={self.reset}")


class CheriBlock(nn.Module):
    """polyprobe's ``cheri_block`` on ``[B, L, C]`` (channels last): a depthwise 3-tap dilated
    convolution (zero padding, no bias), LayerNorm over the whole (L, C) plane (no affine, eps
    1e-3), then ``x + 0.15 * fc2(GELU_tanh(fc1(n)))``."""

    def __init__(self, channels: int, dilation: int = 1, expansion: int = 2) -> None:
        super().__init__()
        self.dilation, self.expansion = int(dilation), int(expansion)
        self.conv_weight = nn.Parameter(torch.empty(3, channels).uniform_(-0.5, 0.5))
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d, length = self.dilation, x.shape[1]
        h = self.conv_weight[1] * x
        if d < length:
            zeros = x.new_zeros(x.shape[0], d, x.shape[2])
            h = h + self.conv_weight[0] * torch.cat([zeros, x[:, :-d]], dim=1)
            h = h + self.conv_weight[2] * torch.cat([x[:, d:], zeros], dim=1)
        n = F.layer_norm(h, h.shape[1:], eps=1e-3)
        return x + 0.15 * self.fc2(F.gelu(self.fc1(n), approximate="tanh"))

    def extra_repr(self) -> str:
        return f"dilation={self.dilation}, expansion={self.expansion}"


def _pair(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        v = [int(a) for a in v]
        return v[0] if all(a == v[0] for a in v) else v
    return int(v)


def _layer_spec(i: int, m: nn.Module) -> Dict[str, Any]:
    name = f"layer {i} ({type(m).__name__})"
    if isinstance(m, TransformedLinear):
        spec = {"kind": "linear", "out_features": m.out_features, "bias": m.bias is not None}
        if m.weight_transform != "identity":
            spec["weight_transform"] = m.weight_transform
        if m.bias_transform != "identity":
            spec["bias_transform"] = m.bias_transform
        if _LEVELS[m.weight_transform] or _LEVELS[m.bias_transform]:
            spec["quant_step"] = m.quant_step
        return spec
    if isinstance(m, nn.Linear):
        return {"kind": "linear", "out_features": m.out_features, "bias": m.bias is not None}
    if isinstance(m, nn.ReLU):
        return {"kind": "relu"}
    if isinstance(m, nn.Tanh):
        return {"kind": "tanh"}
    if isinstance(m, nn.Identity):
        return {"kind": "identity"}
    if isinstance(m, Sign):
        return {"kind": "sign"}
    if isinstance(m, Staircase):
        return {"kind": "staircase", "step": m.step}
    if isinstance(m, nn.GELU):
        return {"kind": "gelu", "approximate": m.approximate}
    if isinstance(m, nn.Flatten):
        if m.start_dim != 1 or m.end_dim != -1:
            raise ValueError(f"{name}: only nn.Flatten() (start_dim=1, end_dim=-1) is supported")
        return {"kind": "flatten"}
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise ValueError(f"{name}: only numeric zero padding is supported")
        return {"kind": "conv1d" if isinstance(m, nn.Conv1d) else "conv2d",
                "out_channels": m.out_channels, "kernel_size": _pair(m.kernel_size),
                "stride": _pair(m.stride), "padding": _pair(m.padding),
                "dilation": _pair(m.dilation), "groups": m.groups, "bias": m.bias is not None}
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        if m.ceil_mode or m.return_indices or _pair(m.dilation) != 1:
            raise ValueError(f"{name}: ceil_mode, return_indices and dilation are not supported")
        return {"kind": "max_pool1d" if isinstance(m, nn.MaxPool1d) else "max_pool2d",
                "kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride),
                "padding": _pair(m.padding)}
    if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d)):
        if m.ceil_mode or not m.count_include_pad or getattr(m, "divisor_override", None):
            raise ValueError(f"{name}: only ceil_mode=False, count_include_pad=True is supported")
        return {"kind": "avg_pool1d" if isinstance(m, nn.AvgPool1d) else "avg_pool2d",
                "kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride),
                "padding": _pair(m.padding)}
    if isinstance(m, nn.LayerNorm):
        if m.elementwise_affine and getattr(m, "bias", True) is None:
            return {"kind": "layer_norm", "normalized_dims": len(m.normalized_shape),
                    "bias": False, "eps": m.eps}
        return {"kind": "layer_norm", "normalized_dims": len(m.normalized_shape),
                "elementwise_affine": m.elementwise_affine, "bias": m.elementwise_affine,
                "eps": m.eps}
    if isinstance(m, LayerNorm):
        return {"kind": "layer_norm", "normalized_dims": len(m.normalized_shape),
                "bias": False, "eps": m.eps}
    if isinstance(m, SelfAttention):
        return {"kind": "self_attention", "num_heads": m.num_heads, "attention": m.attention,
                "bias": m.in_proj_bias is not None, "causal": m.causal}
    if isinstance(m, HardMoE):
        return {"kind": "moe", "num_experts": len(m.experts),
                "out_features": m.experts[0].out_features}
    if isinstance(m, LIF):
        return {"kind": "lif", "steps": m.steps, "beta": m.beta, "threshold": m.threshold,
                "reset": m.reset}
    if isinstance(m, CheriBlock):
        return {"kind": "cheri_block", "dilation": m.dilation, "expansion": m.expansion}
    raise ValueError(f"{name} is not supported by polyprobe.Model.from_torch (supported: Linear, "
                     "ReLU, Tanh, GELU, Identity, Flatten, Conv1d, Conv2d, MaxPool1d/2d, "
                     "AvgPool1d/2d, LayerNorm, and polyprobe.torch's TransformedLinear, Sign, "
                     "Staircase, LayerNorm, SelfAttention, HardMoE, LIF, CheriBlock)")


def from_torch(module: nn.Module, input_shape: Optional[Sequence[int]] = None,
               loss: str = "cross_entropy", l2: float = 0.0) -> Any:
    """See :meth:`polyprobe.Model.from_torch`."""
    from ._model import Model
    if not isinstance(module, nn.Sequential):
        raise ValueError(f"from_torch needs an nn.Sequential, got {type(module).__name__}")
    layers = [_layer_spec(i, m) for i, m in enumerate(module)]
    if input_shape is None:
        if len(module) and isinstance(module[0], nn.Linear):
            input_shape = [module[0].in_features]
        else:
            raise ValueError("from_torch: give input_shape (one sample's shape) unless the first "
                             "layer is nn.Linear")
    params = list(module.parameters())
    dtype = "float64" if params and params[0].dtype == torch.float64 else "float32"
    model = Model({"input_shape": [int(s) for s in input_shape], "dtype": dtype, "loss": loss,
                   "l2": l2, "layers": layers})
    model.load_state_dict({k: v.detach().cpu().double().numpy()
                           for k, v in module.state_dict().items()})
    return model


def _module(i: int, spec: Dict[str, Any], in_shape: List[int],
            weights: Dict[str, Any]) -> nn.Module:
    """The PyTorch module of layer i (``spec``: its normalised attributes; ``in_shape``: one
    sample's input shape)."""
    kind = spec["kind"]
    w = weights.get(f"{i}.weight")
    bias = bool(spec.get("bias", True))
    if kind == "linear":
        wt = spec.get("weight_transform", "identity")
        bt = spec.get("bias_transform", "identity")
        if wt == "identity" and bt == "identity":
            return nn.Linear(w.shape[1], w.shape[0], bias=bias)
        return TransformedLinear(w.shape[1], w.shape[0], bias, wt, bt,
                                 spec.get("quant_step", 1.0 / 64.0))
    simple = {"relu": nn.ReLU, "tanh": nn.Tanh, "identity": nn.Identity, "sign": Sign,
              "flatten": nn.Flatten}
    if kind in simple:
        return simple[kind]()
    if kind == "staircase":
        return Staircase(spec.get("step", 0.25))
    if kind == "gelu":
        return nn.GELU(approximate=spec.get("approximate", "none"))
    if kind in ("conv1d", "conv2d"):
        cls = nn.Conv1d if kind == "conv1d" else nn.Conv2d
        groups = int(spec.get("groups", 1))
        return cls(w.shape[1] * groups, w.shape[0], spec["kernel_size"],
                   stride=spec.get("stride", 1), padding=spec.get("padding", 0),
                   dilation=spec.get("dilation", 1), groups=groups, bias=bias)
    if kind in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
        cls = {"max_pool1d": nn.MaxPool1d, "max_pool2d": nn.MaxPool2d,
               "avg_pool1d": nn.AvgPool1d, "avg_pool2d": nn.AvgPool2d}[kind]
        return cls(spec["kernel_size"], stride=spec.get("stride"), padding=spec.get("padding", 0))
    if kind == "layer_norm":
        shape = in_shape[len(in_shape) - int(spec.get("normalized_dims", 1)):]
        eps = spec.get("eps", 1e-5)
        if not spec.get("elementwise_affine", True):
            return nn.LayerNorm(shape, eps=eps, elementwise_affine=False)
        return nn.LayerNorm(shape, eps=eps) if bias else LayerNorm(shape, eps)
    if kind == "self_attention":
        return SelfAttention(in_shape[-1], int(spec["num_heads"]),
                             spec.get("attention", "softmax"), bias, spec.get("causal", False))
    if kind == "moe":
        router = weights[f"{i}.router.weight"]
        out = weights[f"{i}.experts.0.weight"].shape[0]
        return HardMoE(router.shape[1], router.shape[0], out)
    if kind == "lif":
        return LIF(spec.get("steps", 8), spec.get("beta", 0.9), spec.get("threshold", 1.0),
                   spec.get("reset", "subtract"))
    if kind == "cheri_block":
        return CheriBlock(in_shape[-1], spec.get("dilation", 1), spec.get("expansion", 2))
    raise ValueError(f"to_torch: layer {i} ({kind}) has no PyTorch module in polyprobe.torch "
                     "(a plugin's kind?)")


def to_torch(model: Any) -> nn.Sequential:
    """See :meth:`polyprobe.Model.to_torch`."""
    from ._model import Model
    weights = model.state_dict()
    layers: List[nn.Module] = []
    specs = model.spec["layers"]
    shape = list(model.input_shape)
    for i, spec in enumerate(specs):
        layers.append(_module(i, spec, shape, weights))
        # The next layer's input shape, from the model's own shape chain.
        shape = list(Model({"input_shape": model.input_shape, "layers": specs[:i + 1]}).output_shape)
    seq = nn.Sequential(*layers)
    dtype = torch.float64 if model.dtype == "float64" else torch.float32
    seq = seq.to(dtype)
    seq.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in weights.items()})
    return seq
