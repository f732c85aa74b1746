"""train(), evaluate() and load_data(): the training loop of ``polyprobe train`` from Python."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._model import Model

# `polyprobe train`'s options and defaults (apps/polyprobe/cmd_train.cpp), with dashes as
# underscores. The data options (--data, --validation-fraction, ...) belong to load_data();
# the model ones (--model, --hidden) to Model. Keep this table in step with cmd_train.cpp.
TRAIN_OPTIONS: Dict[str, Tuple[Any, type, str]] = {
    "epochs": (20, int, "passes over the training data"),
    "batch": (128, int, "minibatch size"),
    "seed": (0, int, "seed of the minibatch order and the optimizer"),
    "patience": (0, int, "stop after this many validations without gain (0: never)"),
    "validate_every": (0, int, "validate every this many steps (0: after every epoch)"),
    "time_limit": (0.0, float, "stop after this many seconds (0: none)"),
    "schedule_clock": ("steps", str, "steps, or time: the schedule ends with the epochs or "
                       "time_limit, whichever comes first"),
    "loss": (None, str, "cross_entropy, mse, hinge or zero_one (default: the model's)"),
    "l2": (None, float, "weight of l2 * |theta|^2 (default: the model's)"),
    "metrics": (None, str, "also write JSON lines to this file"),
    "checkpoint": (None, str, "checkpoint file, written after every epoch"),
    "resume": (False, bool, "continue from the checkpoint"),
    "step_radius": (2.0, float, "optimizer step radius"),
    "probe_radius": (2.0, float, "optimizer probe radius"),
    "epsilon": (0.3, float, "radius scale (and OT temperature)"),
    "epsilon_final": (0.02, float, "final epsilon (linear, cosine)"),
    "schedule": ("cosine", str, "constant, linear, cosine, progressive or power"),
    "radius_model": ("quadratic", str, "fixed, adaptive or quadratic"),
    "polytope": ("simplex", str, "simplex, orthoplex or cube"),
    "particle_dim": (2, int, "coordinates per particle"),
    "backend": ("auto", str, "auto, reference, or a plugin name from polyprobe.plugins()"),
    "device": ("cpu", str, "cpu, cuda, or any device a loaded plugin declares"),
    "dtype": ("float32", str, "candidate compute precision: float32 or float64"),
    "candidate_dtype": ("same", str, "candidate_autocast: same, or bf16 / fp16 (cuda, float32)"),
    "threads": (0, int, "worker threads (0: all cores)"),
}
_OPTIMIZER_OPTIONS = ("step_radius", "probe_radius", "epsilon", "epsilon_final", "schedule",
                      "radius_model", "polytope", "particle_dim")


class TrainResult(dict):
    """What :func:`train` returns: a dict (``steps``, ``epochs_completed``, ``evaluations``,
    ``seconds``, ``best_validation_accuracy``, ``best_validation_loss``, ``best_epoch``,
    ``best_step``, ``validations``, ``stopped_early``, ``reached_time_limit``,
    ``interrupted``, ``evaluator``, ``selection``, ``metrics``) whose keys are also
    attributes. ``metrics`` is one dict per step (``pandas.DataFrame(result.metrics)``
    makes a table); ``validation_accuracy`` is set on the steps that validated."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def validations_only(self) -> List[Dict[str, Any]]:
        """The metrics of the steps that measured the validation split."""
        return [m for m in self["metrics"] if m["validation_accuracy"] is not None]


def _check_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, value in options.items():
        if name not in TRAIN_OPTIONS:
            import difflib
            close = difflib.get_close_matches(name, TRAIN_OPTIONS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"train: unknown option '{name}'{hint} (known: "
                             f"{', '.join(TRAIN_OPTIONS)})")
        default, kind, _ = TRAIN_OPTIONS[name]
        if value is not None:
            if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = float(value)
            elif kind is str and isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif kind is int and isinstance(value, (np.integer,)):
                value = int(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"train: option '{name}' must be {kind.__name__}, got "
                                 f"{type(value).__name__}")
        out[name] = value
    full = {name: spec[0] for name, spec in TRAIN_OPTIONS.items()}
    full.update(out)
    full["optimizer"] = {k: full.pop(k) for k in _OPTIMIZER_OPTIONS}
    return full


class _Progress:
    """tqdm when installed and stderr is a terminal-like stream, else one plain line per
    validation; nothing when quiet."""

    def __init__(self, mode: Union[bool, str, Callable[[Dict[str, Any]], None]]) -> None:
        self.callback: Optional[Callable[[Dict[str, Any]], None]] = None
        self.bar = None
        if callable(mode):
            self.callback = mode
            return
        if mode is False or mode == "none":
            return
        use_tqdm = mode in (True, "auto", "tqdm")
        if use_tqdm:
            try:
                import tqdm  # type: ignore
                self._tqdm = tqdm
            except ImportError:
                if mode == "tqdm":
                    raise
                use_tqdm = False
        self.use_tqdm = use_tqdm
        self.callback = self._update

    def _update(self, p: Dict[str, Any]) -> None:
        va = p["validation_accuracy"]
        if self.use_tqdm:
            if self.bar is None:
                self.bar = self._tqdm.tqdm(total=p["epochs"] * p["steps_per_epoch"],
                                           unit="step", leave=True)
            self.bar.n = p["step"]
            post = {"loss": f"{p['loss']:.4f}", "acc": f"{100 * p['accuracy']:.1f}%"}
            if va is not None:
                post["val"] = f"{100 * va:.1f}%"
            self.bar.set_postfix(post, refresh=False)
            self.bar.set_description(f"epoch {p['epoch'] + 1}/{p['epochs']}", refresh=False)
            self.bar.refresh()
        elif va is not None:
            print(f"epoch {p['epoch'] + 1}/{p['epochs']}  step {p['step']}  loss "
                  f"{p['loss']:.4f}  batch acc {100 * p['accuracy']:.1f}%  val acc "
                  f"{100 * va:.1f}%  {p['seconds']:.1f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(model: Model, x_train: Any, y_train: Any,
          validation: Optional[Tuple[Any, Any]] = None, *,
          progress: Union[bool, str, Callable[[Dict[str, Any]], None]] = True,
          validation_fraction: float = 0.15, **options: Any) -> TrainResult:
    """Trains ``model`` in place without gradients, as ``polyprobe train`` does, and leaves it
    at the best validated state (best validation accuracy, ties broken by loss).

    ``x_train`` is ``[n, *input_shape]`` (or ``[n, numel]``) of floats, ``y_train`` ``[n]``
    class indices; arrays are used as given (``polyprobe train`` standardises with the
    training split's statistics: :func:`load_data` returns data prepared that way).
    ``validation=(x_val, y_val)``; without it ``validation_fraction`` of the training data
    is held out (seeded by ``seed``). ``options`` are ``polyprobe train``'s with the same
    defaults (``polyprobe.TRAIN_OPTIONS`` lists them: epochs=20, batch=128, seed=0,
    patience, validate_every, time_limit, schedule_clock="steps", loss, l2, metrics, checkpoint, resume, the
    optimizer's step_radius=2, probe_radius=2, epsilon=0.3, epsilon_final=0.02,
    schedule="cosine", radius_model="quadratic", polytope="simplex", particle_dim=2, and
    backend="auto", device="cpu", dtype="float32", candidate_dtype="same", threads=0). An
    unknown option is a
    ValueError. ``progress``: True/"auto" (tqdm when installed, else a line per
    validation on stderr), "plain", False (silent), or a callable getting one dict per
    step. The core runs without the GIL; Ctrl-C stops between two steps and raises
    KeyboardInterrupt. Returns a :class:`TrainResult`."""
    from . import _ensure_plugins
    _ensure_plugins()
    opts = _check_options(options)
    if validation is None:
        x = np.asarray(x_train)
        y = np.asarray(y_train)
        if len(x) != len(y):
            raise ValueError(f"train: {len(x)} inputs but {len(y)} labels")
        # Before the split, so that a bad label's row is the caller's, not the shuffled one's.
        _core.check_labels(model._m, y, "training")
        if not 0 < validation_fraction < 1:
            raise ValueError("train: validation_fraction must be in (0, 1)")
        order = np.random.default_rng(opts["seed"]).permutation(len(x))
        n_val = max(1, int(round(validation_fraction * len(x))))
        if n_val >= len(x):
            raise ValueError("train: too few samples to hold out a validation split")
        val, tr = order[:n_val], order[n_val:]
        x_train, y_train, validation = x[tr], y[tr], (x[val], y[val])
    if not (isinstance(validation, (tuple, list)) and len(validation) == 2):
        raise ValueError("train: validation must be a pair (x_val, y_val)")
    display = _Progress(progress)
    try:
        r = _core.train(model._m, x_train, y_train, validation[0], validation[1], opts,
                        display.callback)
    finally:
        display.close()
    return TrainResult(r)


def evaluate(model: Model, x: Any, y: Any, dtype: str = "float32") -> Dict[str, Any]:
    """Loss (mean per sample, without l2) and accuracy of ``model`` on ``(x, y)``."""
    return _core.evaluate(model._m, x, y, dtype)


def load_data(name: str = "digits", seed: int = 0, validation_fraction: float = 0.15,
              test_fraction: float = 0.15) -> Dict[str, Any]:
    """A data set as ``polyprobe train --data NAME`` prepares it: "digits" (embedded),
    "fashion-mnist" (Debian's package), a .csv/.csv.gz file or an IDX images file; split
    (seeded) and standardised with the training split's statistics. Returns
    ``{"train": (x, y), "validation": (x, y), "test": (x, y), "sample_shape",
    "num_classes", "standardizer"}`` with float64 ``x`` and int64 ``y``."""
    return _core.load_data(os.fspath(name), seed, validation_fraction, test_fraction)
