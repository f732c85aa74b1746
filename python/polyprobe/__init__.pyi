# Type stubs for editors: the public API of `import polyprobe` (docstrings in the modules).
from os import PathLike
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str
_Path = Union[str, PathLike[str]]
ArrayLike = npt.ArrayLike

class OptimizerConfig:
    particle_dim: int
    subspace_particle_dim: int
    subspace_rotation_interval: int
    polytope: str
    num_probe: int
    rotation: str
    biased_rotation: bool
    metric: str
    step_radius: float
    probe_radius: float
    schedule: str
    epsilon: float
    epsilon_final: float
    total_steps: int
    schedule_decay_steps: float
    schedule_power: float
    schedule_decay_rate: float
    solver: str
    ent_epsilon: float
    sinkhorn_max_iterations: int
    sinkhorn_tolerance: float
    top_k: int
    cost_scaling: str
    nonfinite_margin: float
    blocks: str
    block_group_size: int
    momentum: bool
    momentum_init: float
    momentum_final: float
    velocity_lr: float
    radius_model: str
    stagnation_threshold: float
    stagnation_patience: int
    radius_increase: float
    radius_decrease: float
    radius_min: float
    radius_max: float
    quadratic_max_scale: float
    trust_shrink_below: float
    trust_grow_above: float
    trust_shrink: float
    trust_grow: float
    trust_min: float
    trust_max: float
    trust_scales_probe: bool
    trust_reject: bool
    adaptive_probes: bool
    adaptive_probes_threshold: float
    amortize_steps: int
    amortize_ema: float
    multifidelity_screen: bool
    screen_fidelity: float
    screen_keep_ratio: float
    seed: int
    def __init__(self, **options: Any) -> None: ...
    def validate(self) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def replace(self, **options: Any) -> OptimizerConfig: ...
    @staticmethod
    def options() -> Dict[str, str]: ...

ConfigLike = Union[OptimizerConfig, Mapping[str, Any], None]

def recommended_minimize_config(n: int) -> OptimizerConfig: ...

class MinimizeResult:
    x: np.ndarray
    f: float
    evaluations: int
    steps: int

def minimize(f: Callable[[np.ndarray], float], x0: ArrayLike, budget: int,
             config: ConfigLike = ..., *, allow_nonfinite: bool = ...) -> MinimizeResult: ...

class AskTell:
    def __init__(self, x0: Union[int, ArrayLike], config: ConfigLike = ...) -> None: ...
    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> AskTell: ...
    def ask(self) -> np.ndarray: ...
    def tell(self, losses: ArrayLike, *, allow_nonfinite: bool = ...) -> Dict[str, Any]: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
    @property
    def config(self) -> OptimizerConfig: ...
    @property
    def particles(self) -> np.ndarray: ...
    @property
    def evaluations(self) -> int: ...
    @property
    def best_loss(self) -> float: ...
    @property
    def best_point(self) -> np.ndarray: ...

class Model:
    def __init__(self, spec: Union[Mapping[str, Any], str], seed: int = ...) -> None: ...
    @property
    def spec(self) -> Dict[str, Any]: ...
    @property
    def input_shape(self) -> List[int]: ...
    @property
    def output_shape(self) -> List[int]: ...
    @property
    def dtype(self) -> str: ...
    loss: str
    l2: float
    @property
    def num_parameters(self) -> int: ...
    parameters: np.ndarray
    def initialize(self, seed: int = ...) -> None: ...
    def state_dict(self) -> Dict[str, np.ndarray]: ...
    def load_state_dict(self, tensors: Mapping[str, Any]) -> None: ...
    def copy(self) -> Model: ...
    def save(self, path: _Path, metadata: Optional[Mapping[str, str]] = ...) -> None: ...
    def save_model_file(self, path: _Path) -> None: ...
    def save_weights(self, path: _Path, metadata: Optional[Mapping[str, str]] = ...) -> None: ...
    def load_weights(self, path: _Path) -> None: ...
    def __call__(self, x: ArrayLike) -> np.ndarray: ...
    def forward(self, x: ArrayLike, dtype: str = ...) -> np.ndarray: ...
    @classmethod
    def from_torch(cls, module: Any, input_shape: Optional[Sequence[int]] = ...,
                   loss: str = ..., l2: float = ...) -> Model: ...
    def to_torch(self) -> Any: ...

def load_model(path: _Path, weights: Optional[_Path] = ..., seed: int = ...) -> Model: ...
def read_safetensors(path: _Path) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]: ...
def write_safetensors(path: _Path, tensors: Mapping[str, Any],
                      metadata: Optional[Mapping[str, str]] = ..., dtype: str = ...) -> None: ...

TRAIN_OPTIONS: Dict[str, Tuple[Any, type, str]]

class TrainResult(Dict[str, Any]):
    steps: int
    epochs_completed: int
    evaluations: int
    seconds: float
    best_validation_accuracy: float
    best_validation_loss: float
    best_epoch: int
    best_step: int
    validations: int
    stopped_early: bool
    reached_time_limit: bool
    interrupted: bool
    evaluator: str
    selection: Dict[str, Any]
    metrics: List[Dict[str, Any]]
    def validations_only(self) -> List[Dict[str, Any]]: ...

def train(model: Model, x_train: ArrayLike, y_train: ArrayLike,
          validation: Optional[Tuple[ArrayLike, ArrayLike]] = ..., *,
          progress: Union[bool, str, Callable[[Dict[str, Any]], None]] = ...,
          validation_fraction: float = ..., epochs: int = ..., batch: int = ..., seed: int = ...,
          patience: int = ..., validate_every: int = ..., time_limit: float = ...,
          loss: Optional[str] = ..., l2: Optional[float] = ..., metrics: Optional[_Path] = ...,
          checkpoint: Optional[_Path] = ..., resume: bool = ..., step_radius: float = ...,
          probe_radius: float = ..., epsilon: float = ..., epsilon_final: float = ...,
          schedule: str = ..., radius_model: str = ..., polytope: str = ...,
          particle_dim: int = ..., backend: str = ..., device: str = ..., dtype: str = ...,
          candidate_dtype: str = ..., threads: int = ...) -> TrainResult: ...
def evaluate(model: Model, x: ArrayLike, y: ArrayLike, dtype: str = ...) -> Dict[str, Any]: ...
def load_data(name: str = ..., seed: int = ..., validation_fraction: float = ...,
              test_fraction: float = ...) -> Dict[str, Any]: ...

def set_plugin_dirs(dirs: Iterable[_Path]) -> None: ...
def plugin_dirs() -> List[str]: ...
def plugins() -> List[Dict[str, Any]]: ...
def explain(model: Model, *, particle_dim: int = ..., batch: int = ..., backend: str = ...,
            device: str = ..., dtype: str = ..., threads: int = ...) -> Dict[str, Any]: ...
