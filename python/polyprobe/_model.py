"""Models: model files, safetensors, PyTorch conversion and the forward pass."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core

PathLike = Union[str, "os.PathLike[str]"]


def _ensure_plugins() -> None:
    from . import _ensure_plugins as ensure
    ensure()


def _existing(path: PathLike, what: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} '{path}' does not exist")
    return path


class Model:
    """A sequential model over polyprobe's layers, with its training objective's defaults
    (``loss``, ``l2``): what a model file describes (docs/models.md).

    ``Model(spec, seed=0)`` builds one from a model-file dict or JSON text and initialises
    it as PyTorch would (reproducibly from ``seed``); :func:`load_model` reads files;
    :meth:`from_torch` converts an ``nn.Sequential``. Parameters are one flat float64
    vector in PyTorch's ``model.parameters()`` order, named as ``nn.Sequential`` names them
    (``"0.weight"``, ``"0.bias"``, ...). ``model(x)`` runs the forward pass."""

    def __init__(self, spec: Union[Mapping[str, Any], str], seed: int = 0) -> None:
        _ensure_plugins()
        if isinstance(spec, Mapping):
            spec = dict(spec)
            spec.setdefault("polyprobe_model", 1)
        self._m = _core.Model(spec, seed)

    @classmethod
    def _wrap(cls, m: Any) -> "Model":
        self = cls.__new__(cls)
        self._m = m
        return self

    # --- structure ----------------------------------------------------------------------
    @property
    def spec(self) -> Dict[str, Any]:
        """The model file as a dict (``input_shape``, ``dtype``, ``loss``, ``l2``, ``layers``)."""
        return self._m.spec

    @property
    def input_shape(self) -> List[int]:
        """The shape of one sample, without the batch dimension."""
        return list(self._m.input_shape)

    @property
    def output_shape(self) -> List[int]:
        """The shape of one output."""
        return list(self._m.output_shape)

    @property
    def dtype(self) -> str:
        """``"float32"`` or ``"float64"``: weight storage and forward precision."""
        return self._m.dtype

    @property
    def loss(self) -> str:
        """The default training loss: cross_entropy, mse, hinge or zero_one."""
        return self._m.loss

    @loss.setter
    def loss(self, value: str) -> None:
        self._m.loss = value

    @property
    def l2(self) -> float:
        """Weight of ``l2 * |theta|^2`` in the default objective."""
        return self._m.l2

    @l2.setter
    def l2(self, value: float) -> None:
        self._m.l2 = float(value)

    @property
    def num_parameters(self) -> int:
        return self._m.num_parameters

    # --- parameters ---------------------------------------------------------------------
    @property
    def parameters(self) -> np.ndarray:
        """The flat float64 parameter vector, a writable view (no copy) into the model."""
        return self._m.parameters

    @parameters.setter
    def parameters(self, values: Any) -> None:
        self._m._set_parameters(values)

    def initialize(self, seed: int = 0) -> None:
        """PyTorch-style default initialisation, reproducible from ``seed``."""
        self._m.initialize(seed)

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Named float64 arrays with PyTorch's names and shapes (copies)."""
        return self._m.state_dict()

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        """Sets every parameter from ``tensors`` (numpy arrays or torch tensors): each must be
        present with its exact shape and finite values, none left over (else ValueError,
        and nothing changes)."""
        self._m.load_state_dict(dict(tensors))

    def copy(self) -> "Model":
        """An independent copy (layers are shared, parameters copied)."""
        return Model._wrap(self._m.copy())

    # --- files --------------------------------------------------------------------------
    def save(self, path: PathLike, metadata: Optional[Mapping[str, str]] = None) -> None:
        """Writes the weights to ``path`` (safetensors, in the model's dtype) and the model
        file beside it (``path`` with ``.json``), as ``polyprobe train --save`` does; both
        load with :func:`load_model` and ``polyprobe eval --weights``."""
        path = os.fspath(path)
        if not path.endswith(".safetensors"):
            raise ValueError(f"save: '{path}' should end in .safetensors (the model file goes "
                             "beside it, with .json)")
        self._m.save_weights(path, dict(metadata or {}))
        self._m.save_model_file(os.path.splitext(path)[0] + ".json")

    def save_model_file(self, path: PathLike) -> None:
        """Writes only the model file (JSON structure and objective)."""
        self._m.save_model_file(os.fspath(path))

    def save_weights(self, path: PathLike, metadata: Optional[Mapping[str, str]] = None) -> None:
        """Writes only the weights (safetensors)."""
        self._m.save_weights(os.fspath(path), dict(metadata or {}))

    def load_weights(self, path: PathLike) -> None:
        """Reads weights from a safetensors file (F64, F32, F16 or BF16)."""
        self._m.load_weights(_existing(path, "weights file"))

    # --- compute ------------------------------------------------------------------------
    def __call__(self, x: Any) -> np.ndarray:
        """Outputs ``[B, out]`` for a batch ``[B, *input_shape]`` (or ``[B, numel]``), in the
        model's dtype. float32/float64 C-contiguous arrays are read in place; anything else
        (a torch tensor, a list) is converted once. Runs without the GIL."""
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        return self._m(x)

    def forward(self, x: Any, dtype: str = "float64") -> np.ndarray:
        """Like ``model(x)`` in an explicit precision (float32 or float64)."""
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        return self._m.forward(x, dtype)

    # --- PyTorch ------------------------------------------------------------------------
    @classmethod
    def from_torch(cls, module: Any, input_shape: Optional[Sequence[int]] = None,
                   loss: str = "cross_entropy", l2: float = 0.0) -> "Model":
        """Converts an ``nn.Sequential`` of supported layers (Linear, ReLU, Tanh, GELU,
        Identity, Flatten, Conv1d/2d, Max/AvgPool1d/2d, LayerNorm, and polyprobe.torch's
        TransformedLinear, Sign, Staircase, LayerNorm, SelfAttention, HardMoE, LIF and
        CheriBlock) with its weights. ``input_shape`` (one sample's) is needed unless the
        first layer is Linear. An unsupported module is a ValueError naming it."""
        from . import torch as _torch
        return _torch.from_torch(module, input_shape, loss, l2)

    def to_torch(self) -> Any:
        """The equivalent ``nn.Sequential`` with these weights (float32 or float64 as the
        model's dtype), for every built-in kind: ``torch.nn`` modules where PyTorch has the
        kind, else polyprobe.torch's (sign/int8/int4 weights, sign and staircase units,
        argmax attention, hard MoE, LIF, Cheri block), whose forward is polyprobe's
        arithmetic. A plugin's kind is a ValueError naming the layer."""
        from . import torch as _torch
        return _torch.to_torch(self)

    def __repr__(self) -> str:
        kinds = ", ".join(layer["kind"] for layer in self.spec["layers"])
        return (f"Model(input_shape={self.input_shape}, layers=[{kinds}], "
                f"parameters={self.num_parameters}, dtype={self.dtype}, loss={self.loss})")



def load_model(path: PathLike, weights: Optional[PathLike] = None, seed: int = 0) -> Model:
    """Reads a model: ``path`` is a model file (``.json``) or trained weights
    (``.safetensors``, with the model file beside it as ``polyprobe train --save`` writes).
    Weights come from ``weights`` when given, else from the ``.safetensors`` path, else
    the model is initialised from ``seed``. Malformed files are ValueErrors naming the file
    and the place."""
    _ensure_plugins()
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        weights = path if weights is None else weights
        path = os.path.splitext(path)[0] + ".json"
    m = Model._wrap(_core.Model._read(_existing(path, "model file")))
    if weights is not None:
        m.load_weights(weights)
    else:
        m.initialize(seed)
    return m


def read_safetensors(path: PathLike) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Reads a safetensors file: ({name: float64 array}, metadata)."""
    return _core.read_safetensors(_existing(path, "safetensors file"))


def write_safetensors(path: PathLike, tensors: Mapping[str, Any],
                      metadata: Optional[Mapping[str, str]] = None, dtype: str = "F32") -> None:
    """Writes named arrays (numpy or torch) as a safetensors file, each stored as ``dtype``
    (``"F32"`` or ``"F64"``); atomic."""
    _core.write_safetensors(os.fspath(path), dict(tensors), dict(metadata or {}), dtype)
