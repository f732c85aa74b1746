"""PyTorch interop: ``nn.Sequential`` <-> :class:`polyprobe.Model`, and the step-like
activations PyTorch lacks as modules (:class:`Sign`, :class:`Staircase`), so a model
defined in PyTorch with them trains in polyprobe and comes back with its weights.

Importing this module needs torch (Debian's python3-torch)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

try:
    import torch
    from torch import nn
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("polyprobe.torch needs PyTorch (Debian: apt-get install python3-torch)") from e

__all__ = ["Sign", "Staircase", "from_torch", "to_torch"]


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


def _pair(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        v = [int(a) for a in v]
        return v[0] if all(a == v[0] for a in v) else v
    return int(v)


def _layer_spec(i: int, m: nn.Module) -> Dict[str, Any]:
    name = f"layer {i} ({type(m).__name__})"
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
        return {"kind": "layer_norm", "normalized_dims": len(m.normalized_shape),
                "elementwise_affine": m.elementwise_affine, "bias": m.elementwise_affine,
                "eps": m.eps}
    raise ValueError(f"{name} is not supported by polyprobe.Model.from_torch (supported: Linear, "
                     "ReLU, Tanh, GELU, Identity, Flatten, Conv1d, Conv2d, MaxPool1d/2d, "
                     "AvgPool1d/2d, LayerNorm, polyprobe.torch.Sign, polyprobe.torch.Staircase)")


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


def to_torch(model: Any) -> nn.Sequential:
    """See :meth:`polyprobe.Model.to_torch`."""
    weights = model.state_dict()
    layers: List[nn.Module] = []
    for i, spec in enumerate(model.spec["layers"]):
        kind = spec["kind"]
        w = weights.get(f"{i}.weight")
        bias = bool(spec.get("bias", True))
        if kind == "linear":
            for t in ("weight_transform", "bias_transform"):
                if spec.get(t, "identity") != "identity":
                    raise ValueError(f"to_torch: layer {i} (linear) has {t}={spec[t]!r}, which "
                                     "nn.Linear cannot express")
            layers.append(nn.Linear(w.shape[1], w.shape[0], bias=bias))
        elif kind in ("relu", "tanh", "identity", "sign", "flatten"):
            layers.append({"relu": nn.ReLU, "tanh": nn.Tanh, "identity": nn.Identity,
                           "sign": Sign, "flatten": nn.Flatten}[kind]())
        elif kind == "staircase":
            layers.append(Staircase(spec.get("step", 0.25)))
        elif kind == "gelu":
            layers.append(nn.GELU(approximate=spec.get("approximate", "none")))
        elif kind in ("conv1d", "conv2d"):
            cls = nn.Conv1d if kind == "conv1d" else nn.Conv2d
            groups = int(spec.get("groups", 1))
            layers.append(cls(w.shape[1] * groups, w.shape[0], spec["kernel_size"],
                              stride=spec.get("stride", 1), padding=spec.get("padding", 0),
                              dilation=spec.get("dilation", 1), groups=groups, bias=bias))
        elif kind in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
            cls = {"max_pool1d": nn.MaxPool1d, "max_pool2d": nn.MaxPool2d,
                   "avg_pool1d": nn.AvgPool1d, "avg_pool2d": nn.AvgPool2d}[kind]
            layers.append(cls(spec["kernel_size"], stride=spec.get("stride"),
                              padding=spec.get("padding", 0)))
        elif kind == "layer_norm" and spec.get("elementwise_affine", True) and w is not None:
            layers.append(nn.LayerNorm(list(w.shape), eps=spec.get("eps", 1e-5)))
        else:
            raise ValueError(f"to_torch: layer {i} ({kind}) has no nn.Module equivalent here")
    seq = nn.Sequential(*layers)
    dtype = torch.float64 if model.dtype == "float64" else torch.float32
    seq = seq.to(dtype)
    seq.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in weights.items()})
    return seq
