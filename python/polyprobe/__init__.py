"""polyprobe: gradient-free training and black-box optimisation by polytope probing.

The package is a thin layer over polyprobe's C++ core and plugins (no second
implementation): the same optimizer, model files, safetensors, training loop and
evaluator backends as the ``polyprobe`` host app.

Black box::

    import numpy as np, polyprobe
    res = polyprobe.minimize(lambda x: float(np.sum((x - 1) ** 2)), np.zeros(5), budget=2000,
                             config=polyprobe.recommended_minimize_config(5))
    opt = polyprobe.AskTell(np.random.randn(1000, 2))      # a swarm of 1000 points in 2-D
    for _ in range(50):
        X = opt.ask()                                       # every candidate of the step
        opt.tell(np.sum(X ** 2, axis=1))                    # scored at once

Models and training::

    model = polyprobe.Model({"input_shape": [64], "layers": [...]})
    result = polyprobe.train(model, x_train, y_train, validation=(x_val, y_val), epochs=5)

Errors are Python exceptions carrying the core's one-line message: ValueError for bad
input (shapes, option names and values, NaN losses, malformed files), RuntimeError when
the work itself fails (a plugin that cannot serve, I/O). docs/python.md has the guide.
"""
from __future__ import annotations

import os as _os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as _np

from . import _core
from ._core import OptimizerConfig, recommended_minimize_config
from ._model import Model, load_model, read_safetensors, write_safetensors
from ._train import TRAIN_OPTIONS, TrainResult, evaluate, load_data, train

__version__ = "0.1.0"

__all__ = [
    "AskTell", "MinimizeResult", "TRAIN_OPTIONS", "Model", "OptimizerConfig", "TrainResult", "evaluate",
    "devices", "explain", "load_data", "load_model", "minimize", "plugin_dirs", "plugins",
    "read_safetensors", "recommended_minimize_config", "set_plugin_dirs", "train",
    "withhold_operations", "write_safetensors",
]

_extra_plugin_dirs: List[str] = []
_withheld_operations: List[str] = []


def _package_plugin_dir() -> Optional[str]:
    try:
        from . import _layout
    except ImportError:  # a source checkout without a build: no plugins of its own
        return None
    return _os.path.normpath(_os.path.join(_os.path.dirname(__file__), _layout.PLUGIN_DIR))


def _default_plugin_dirs() -> List[str]:
    """The host app's search order: explicit folders, POLYPROBE_PLUGIN_PATH, then this
    package's own plugin folder (the registry's default is relative to the executable,
    which for Python is the interpreter's)."""
    dirs = list(_extra_plugin_dirs)
    for d in _os.environ.get("POLYPROBE_PLUGIN_PATH", "").split(":"):
        if d and not _os.path.isabs(d):
            import warnings
            warnings.warn(f"polyprobe: POLYPROBE_PLUGIN_PATH entry '{d}' is a relative path (it "
                          "would depend on the working folder); ignored: give absolute paths",
                          stacklevel=3)
        elif d:
            dirs.append(d)
    own = _package_plugin_dir()
    if own:
        dirs.append(own)
    return dirs


def _ensure_plugins() -> None:
    if not _core.plugins_loaded():
        _core.load_plugins(_default_plugin_dirs(), _withheld_operations)


def set_plugin_dirs(dirs: Iterable[Union[str, "_os.PathLike[str]"]]) -> None:
    """Searches `dirs` for plugins first, like ``polyprobe --plugin-dir DIR``.

    Plugins are loaded once per process, on the first call that needs them; call this
    before that (a RuntimeError says when it is too late). A folder that does not exist
    is a ValueError."""
    dirs = [_os.fspath(d) for d in dirs]
    for d in dirs:
        if not _os.path.isdir(d):
            raise ValueError(f"plugin dir '{d}' is not a directory")
    if _core.plugins_loaded():
        raise RuntimeError("plugins are already loaded; call polyprobe.set_plugin_dirs() before "
                           "the first call that uses them")
    _extra_plugin_dirs[:] = dirs


def withhold_operations(names: Iterable[str]) -> None:
    """Leaves the named operations (kernels plugins offer by name: ``sdpa``,
    ``factored_correction``) to the layers' and evaluators' own code, like ``polyprobe
    --no-operation NAME``: to compare a plugin's kernel with that code, or to rule it out.

    Like set_plugin_dirs, call it before the first call that loads the plugins (a
    RuntimeError says when it is too late). A name no loaded plugin offers is a ValueError
    from that first call, listing the names offered."""
    names = [str(n) for n in names]
    if _core.plugins_loaded():
        raise RuntimeError("plugins are already loaded; call polyprobe.withhold_operations() "
                           "before the first call that uses them")
    _withheld_operations[:] = names


def plugin_dirs() -> List[str]:
    """The folders searched for plugins, in order (loads the plugins)."""
    _ensure_plugins()
    return list(_core.plugin_dirs())


def plugins() -> List[Dict[str, Any]]:
    """Every plugin library found, as ``polyprobe plugins --json`` lists them: name,
    version, vendor, summary, path, abi, loaded, available, score, reason (why it is
    unusable, empty when available) and capabilities (component, name, device (its name, as
    ``device=`` takes it), device_type (cpu, gpu or accelerator), dtypes)."""
    _ensure_plugins()
    return list(_core.plugins())


def devices() -> List[str]:
    """The device names ``device=`` accepts, sorted: ``cpu``, ``cuda`` and any device a
    loaded plugin declares (a plugin folder added with :func:`set_plugin_dirs` or
    ``POLYPROBE_PLUGIN_PATH`` can add more). Another name is an error that lists these."""
    _ensure_plugins()
    return list(_core.devices())


class MinimizeResult:
    """What :func:`minimize` returns: the best point evaluated and its value."""

    __slots__ = ("x", "f", "evaluations", "steps")

    def __init__(self, x: _np.ndarray, f: float, evaluations: int, steps: int) -> None:
        self.x, self.f, self.evaluations, self.steps = x, f, evaluations, steps

    def __repr__(self) -> str:
        return (f"MinimizeResult(f={self.f!r}, evaluations={self.evaluations}, "
                f"steps={self.steps}, x={self.x!r})")


ConfigLike = Union[OptimizerConfig, Mapping[str, Any], None]


def minimize(f: Callable[[_np.ndarray], float], x0: Any, budget: int,
             config: ConfigLike = None, *, allow_nonfinite: bool = False) -> MinimizeResult:
    """Minimises the Python callable ``f(x) -> float`` from ``x0`` with at most ``budget``
    calls of ``f`` (a step that would not fit is not started).

    ``x`` is cut into particles of ``config.particle_dim`` coordinates exactly as a
    model's parameters are. For a smooth function pass
    ``recommended_minimize_config(len(x0))``; the defaults (polystep's) are tuned for
    training networks. ``f`` gets a fresh float64 vector each call; the core runs without
    the GIL and takes it only to call ``f``. An exception raised by ``f`` propagates.
    A non-finite value is a ValueError unless ``allow_nonfinite=True``, which scores it as
    a failed evaluation (worse than every finite one).

    Returns a :class:`MinimizeResult` (``x``, ``f``, ``evaluations``, ``steps``)."""
    r = _core.minimize(f, x0, int(budget), _config_arg(config), allow_nonfinite)
    return MinimizeResult(r["x"], r["f"], r["evaluations"], r["steps"])


def _config_arg(config: ConfigLike) -> Any:
    if config is None or isinstance(config, OptimizerConfig):
        return config
    if isinstance(config, Mapping):
        return dict(config)
    raise ValueError("config must be a polyprobe.OptimizerConfig, a dict of options or None, "
                     f"got {type(config).__name__}")


class AskTell:
    """The polytope optimizer over a swarm of points, one batch of candidates at a time.

    ``AskTell(x0, config)``: ``x0`` is a point ``(d,)``, a swarm ``(P, d)`` of P
    independent points, or an int ``d`` (one point at the origin). ``config.particle_dim``
    is taken from ``x0``'s last dimension. Each step, :meth:`ask` returns every candidate
    as one ``(rows, d)`` float64 matrix (the ``P * V * K`` probes, then the incumbents
    when the radius model needs them), the caller scores all rows however it likes (numpy,
    PyTorch, JAX, a cluster), and :meth:`tell` takes the losses in the same order.
    :meth:`state_dict` / :meth:`load_state_dict` resume bit for bit."""

    def __init__(self, x0: Union[int, Any], config: ConfigLike = None) -> None:
        self._opt = _core.AskTell(x0, _config_arg(config))

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "AskTell":
        """A new optimizer continuing exactly where ``state`` (a :meth:`state_dict`) was."""
        if not isinstance(state, Mapping) or state.get("format") != "polyprobe.AskTell":
            raise ValueError("AskTell.from_state_dict: not an AskTell state_dict (a dict from "
                             "AskTell.state_dict(), with format 'polyprobe.AskTell')")
        for key in ("shape", "config"):
            if key not in state:
                raise ValueError(f"AskTell.from_state_dict: the state_dict has no '{key}' (it "
                                 "is damaged, or not from AskTell.state_dict())")
        p, d = state["shape"]
        self = cls(_np.zeros((p, d)), dict(state["config"]))
        self.load_state_dict(state)
        return self

    def ask(self) -> _np.ndarray:
        """The candidates of the coming step, ``(rows, d)`` float64 (a copy: it stays valid).
        Asking again before :meth:`tell` returns the same candidates."""
        return self._opt.ask()

    def tell(self, losses: Any, *, allow_nonfinite: bool = False) -> Dict[str, Any]:
        """Moves the swarm from the losses of the last ask's rows, in order (any array-like
        of floats: numpy, a CPU torch tensor, a list; float64 contiguous arrays are read in
        place). A wrong length or a tell without an ask is a ValueError; so is a NaN or
        infinite loss unless ``allow_nonfinite=True`` (then scored as a failure, worse than
        every finite loss). Returns the step's diagnostics as a dict."""
        if hasattr(losses, "detach"):
            losses = losses.detach().cpu().numpy()
        return self._opt.tell(losses, allow_nonfinite)

    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to continue exactly (config, shape and the core's state as
        bytes); picklable."""
        return self._opt.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state``; the configuration and swarm shape must match."""
        self._opt.load_state_dict(dict(state))

    @property
    def config(self) -> OptimizerConfig:
        """The configuration in use (with ``particle_dim`` from ``x0``)."""
        return self._opt.config

    @property
    def particles(self) -> _np.ndarray:
        """The swarm's current points, ``(P, d)``."""
        return self._opt.particles

    @property
    def evaluations(self) -> int:
        """Losses told so far."""
        return self._opt.evaluations

    @property
    def best_loss(self) -> float:
        """The smallest loss told so far (inf before the first tell)."""
        return self._opt.best_loss

    @property
    def best_point(self) -> _np.ndarray:
        """The asked row that had :attr:`best_loss`."""
        return self._opt.best_point

    def __repr__(self) -> str:
        return (f"AskTell(particles={self._opt.num_particles}, d={self.config.particle_dim}, "
                f"evaluations={self.evaluations}, best_loss={self.best_loss})")


def explain(model: Model, *, particle_dim: int = 2, batch: int = 64, backend: str = "auto",
            device: str = "cpu", dtype: str = "float32", threads: int = 0) -> Dict[str, Any]:
    """Which evaluator serves ``model`` and, per layer and particle block, which evaluation
    path its candidates take and why the faster ones declined, as
    ``polyprobe explain MODEL.json --json``: it scores one step's candidates (every particle
    at every simplex vertex) on a random batch, so the counts are real. Returns
    ``{"selection": ..., "evaluator": ...}``."""
    _ensure_plugins()
    return model._m.explain(particle_dim, batch, backend, device, dtype, threads)
